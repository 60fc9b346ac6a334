package io.lockbroker.client;

import io.lockbroker.v1.LostReason;

/**
 * A lease was lost. {@link #reason()} is one of the names shared by every
 * lockbroker client library (test/conformance/scenarios.md):
 *
 * <ul>
 *   <li>the broker's {@link LostReason} without its prefix:
 *       {@code SESSION_INVALIDATED}, {@code RELEASED_BY_OTHER},
 *       {@code DELETED_BY_OTHER}, {@code RENEWAL_FAILED},
 *       {@code LIMIT_CONFLICT}, {@code RESUMED_ELSEWHERE};
 *   <li>{@code KEEPALIVE_TIMEOUT}: no keepalive from any replica, and no
 *       resume, before the guaranteed deadline less the loss margin;
 *   <li>{@code RESUME_REFUSED}: a replica refused to resume the hold (the
 *       grant is no longer current);
 *   <li>{@code RELEASED}: a Release call from elsewhere ended the hold.
 * </ul>
 *
 * <p>Whatever was done under the lease after this point may overlap with a
 * new holder: protected resources must check the fencing token.
 */
public class LockLostException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  /** No keepalive and no resume before the guaranteed deadline, less the margin. */
  public static final String KEEPALIVE_TIMEOUT = "KEEPALIVE_TIMEOUT";
  /** A replica refused to resume the hold. */
  public static final String RESUME_REFUSED = "RESUME_REFUSED";
  /** A Release call from elsewhere ended the hold. */
  public static final String RELEASED = "RELEASED";

  private final String key;
  private final String reason;
  private final LostReason brokerReason;
  private final String detail;

  LockLostException(String key, String reason, LostReason brokerReason, String detail) {
    super("lease on " + key + " lost: " + reason + ": " + detail);
    this.key = key;
    this.reason = reason;
    this.brokerReason = brokerReason;
    this.detail = detail;
  }

  /** A loss the broker reported. */
  static LockLostException fromBroker(String key, LostReason r, String detail) {
    return new LockLostException(key, reasonName(r), r, detail);
  }

  /** The broker's reason without LOST_REASON_, as every library names it. */
  static String reasonName(LostReason r) {
    return r.name().startsWith("LOST_REASON_") ? r.name().substring("LOST_REASON_".length()) : r.name();
  }

  /** A loss the client decided. */
  static LockLostException fromClient(String key, String reason, String detail) {
    return new LockLostException(key, reason, LostReason.LOST_REASON_UNSPECIFIED, detail);
  }

  /**
   * The lock key or semaphore prefix; for a multi-key lock
   * ({@link LockClient#lockAll}) the key whose loss ended the hold (the
   * broker released the others), or the first key when the whole hold was
   * lost at once (no keepalive, a refused resume).
   */
  public String key() {
    return key;
  }

  /** Why the lease was lost, in the shared vocabulary above. */
  public String reason() {
    return reason;
  }

  /** The broker's reason; UNSPECIFIED when the client decided the loss. */
  public LostReason brokerReason() {
    return brokerReason;
  }

  /** Details for humans. */
  public String detail() {
    return detail;
  }
}
