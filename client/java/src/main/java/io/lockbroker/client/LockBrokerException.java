package io.lockbroker.client;

import com.google.protobuf.Any;
import com.google.protobuf.InvalidProtocolBufferException;
import io.grpc.Metadata;
import io.grpc.Status;
import io.lockbroker.client.internal.rpc.BadRequest;
import io.lockbroker.client.internal.rpc.ErrorInfo;
import io.lockbroker.client.internal.rpc.QuotaFailure;
import io.lockbroker.client.internal.rpc.RetryInfo;
import io.lockbroker.v1.ErrorReason;
import io.lockbroker.v1.Holder;
import io.lockbroker.v1.LockState;
import java.time.Duration;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;

/**
 * A call to the broker failed. Carries the gRPC status code and the
 * {@code google.rpc} details the broker attaches to every error (AIP-193):
 * the stable {@link #reason()} from {@code ErrorInfo}, the key's
 * {@link #lockState()} (who holds it) for busy keys and timed-out waits,
 * {@link #retryDelay()}, and {@link #fieldViolations()} for bad requests.
 *
 * <p>Subclasses name the cases callers handle: {@link LockHeldException},
 * {@link WaitTimeoutException}, {@link UnavailableException},
 * {@link PermissionDeniedException}, {@link InvalidArgumentException}.
 */
public class LockBrokerException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  /** The ErrorInfo domain of the broker's reasons. */
  public static final String DOMAIN = "lockbroker.v1";

  static final Metadata.Key<byte[]> DETAILS_KEY =
      Metadata.Key.of("grpc-status-details-bin", Metadata.BINARY_BYTE_MARSHALLER);

  private final Status.Code code;
  private final String reason;
  private final Map<String, String> metadata;
  private transient volatile LockState lockState;
  private final Duration retryDelay;
  private final Map<String, String> fieldViolations;

  /** Details decoded from a status; package-private plumbing for subclasses. */
  static final class Details {
    Status.Code code = Status.Code.UNKNOWN;
    String message = "";
    String reason = "";
    Map<String, String> metadata = Map.of();
    LockState lockState;
    Duration retryDelay;
    Map<String, String> fieldViolations = Map.of();
    final StringBuilder quota = new StringBuilder();
  }

  LockBrokerException(Details d, Throwable cause) {
    super(describe(d), cause);
    this.code = d.code;
    this.reason = d.reason;
    this.metadata = d.metadata;
    this.lockState = d.lockState;
    this.retryDelay = d.retryDelay;
    this.fieldViolations = d.fieldViolations;
  }

  /** A client-side failure with the given code and message. */
  LockBrokerException(Status.Code code, String reason, String message) {
    this(local(code, reason, message), null);
  }

  static Details local(Status.Code code, String reason, String message) {
    Details d = new Details();
    d.code = code;
    d.reason = reason;
    d.message = message;
    return d;
  }

  private static String describe(Details d) {
    StringBuilder b = new StringBuilder(d.code.name());
    if (!d.reason.isEmpty()) {
      b.append(" (").append(d.reason).append(')');
    }
    b.append(": ").append(d.message);
    if (d.lockState != null && d.lockState.getHoldersCount() > 0) {
      b.append(" [holders:");
      for (Holder h : d.lockState.getHoldersList()) {
        b.append(' ').append(h.getSessionId());
        if (h.getToken() != 0) {
          b.append("@").append(Long.toUnsignedString(h.getToken()));
        }
      }
      b.append(']');
    }
    if (d.quota.length() > 0) {
      b.append(" [quota:").append(d.quota).append(']');
    }
    return b.toString();
  }

  /** The gRPC status code. */
  public Status.Code code() {
    return code;
  }

  /**
   * The stable reason from the status's {@code google.rpc.ErrorInfo} (domain
   * {@value #DOMAIN}), e.g. {@code "LOCK_HELD"}; empty when the broker sent
   * none.
   */
  public String reason() {
    return reason;
  }

  /** {@link #reason()} as the proto enum; UNSPECIFIED when absent or unknown. */
  public ErrorReason errorReason() {
    if (reason.isEmpty()) {
      return ErrorReason.ERROR_REASON_UNSPECIFIED;
    }
    try {
      return ErrorReason.valueOf("ERROR_REASON_" + reason);
    } catch (IllegalArgumentException e) {
      return ErrorReason.ERROR_REASON_UNSPECIFIED;
    }
  }

  /**
   * Whether the key is another kind than the request asked for
   * (FAILED_PRECONDITION, reason {@code LIMIT_CONFLICT}): a lock asked for
   * on a semaphore prefix or a read-write lock, a read or write hold on a
   * plain lock or semaphore, or a semaphore limit that differs from the
   * stored one. The message, and {@link #lockState()} when the broker sends
   * it, name the kind found.
   */
  public boolean isKindConflict() {
    return code == Status.Code.FAILED_PRECONDITION && reason.equals("LIMIT_CONFLICT");
  }

  /** The ErrorInfo metadata (empty when none). */
  public Map<String, String> metadata() {
    return metadata;
  }

  /** The key's state sent with the error (busy key, timed-out wait, not holder). */
  public Optional<LockState> lockState() {
    return Optional.ofNullable(lockState);
  }

  /** Attaches the key's state read after the error, when the broker sent none. */
  void fillLockState(LockState state) {
    if (lockState == null) {
      lockState = state;
    }
  }

  /** The current holders from {@link #lockState()}; empty when none were sent. */
  public List<Holder> holders() {
    return lockState == null ? List.of() : lockState.getHoldersList();
  }

  /** When a retry may work ({@code google.rpc.RetryInfo}). */
  public Optional<Duration> retryDelay() {
    return Optional.ofNullable(retryDelay);
  }

  /** Bad request fields: field path to description ({@code google.rpc.BadRequest}). */
  public Map<String, String> fieldViolations() {
    return fieldViolations;
  }

  /** Converts any throwable from a gRPC call into the matching exception. */
  static LockBrokerException from(Throwable t) {
    if (t instanceof LockBrokerException) {
      return (LockBrokerException) t;
    }
    Details d = details(t);
    switch (d.code) {
      case ABORTED:
        if (d.reason.isEmpty() || d.reason.equals("LOCK_HELD") || d.reason.equals("LOCK_DELAY")) {
          return new LockHeldException(d, t);
        }
        break;
      case DEADLINE_EXCEEDED:
        if (d.reason.equals("WAIT_TIMEOUT")) {
          return new WaitTimeoutException(d, t);
        }
        break;
      case UNAVAILABLE:
        return new UnavailableException(d, t);
      case PERMISSION_DENIED:
      case UNAUTHENTICATED:
        return new PermissionDeniedException(d, t);
      case INVALID_ARGUMENT:
        return new InvalidArgumentException(d, t);
      default:
        break;
    }
    return new LockBrokerException(d, t);
  }

  /** Decodes the status of t and its {@code grpc-status-details-bin} trailer. */
  static Details details(Throwable t) {
    Details d = new Details();
    Status st = Status.fromThrowable(t);
    d.code = st.getCode();
    d.message = st.getDescription() == null ? "" : st.getDescription();
    Metadata trailers = Status.trailersFromThrowable(t);
    byte[] raw = trailers == null ? null : trailers.get(DETAILS_KEY);
    if (raw == null) {
      return d;
    }
    io.lockbroker.client.internal.rpc.Status rpc;
    try {
      rpc = io.lockbroker.client.internal.rpc.Status.parseFrom(raw);
    } catch (InvalidProtocolBufferException e) {
      return d;
    }
    Map<String, String> violations = new LinkedHashMap<>();
    for (Any any : rpc.getDetailsList()) {
      String type = any.getTypeUrl().substring(any.getTypeUrl().lastIndexOf('/') + 1);
      try {
        switch (type) {
          case "google.rpc.ErrorInfo": {
            ErrorInfo info = ErrorInfo.parseFrom(any.getValue());
            if (d.reason.isEmpty() || info.getDomain().equals(DOMAIN)) {
              d.reason = info.getReason();
              d.metadata = Collections.unmodifiableMap(new LinkedHashMap<>(info.getMetadataMap()));
            }
            break;
          }
          case "google.rpc.RetryInfo": {
            com.google.protobuf.Duration p = RetryInfo.parseFrom(any.getValue()).getRetryDelay();
            d.retryDelay = Duration.ofSeconds(p.getSeconds(), p.getNanos());
            break;
          }
          case "google.rpc.BadRequest":
            for (BadRequest.FieldViolation v : BadRequest.parseFrom(any.getValue()).getFieldViolationsList()) {
              violations.put(v.getField(), v.getDescription());
            }
            break;
          case "google.rpc.QuotaFailure":
            for (QuotaFailure.Violation v : QuotaFailure.parseFrom(any.getValue()).getViolationsList()) {
              d.quota.append(' ').append(v.getSubject()).append(": ").append(v.getDescription());
            }
            break;
          case "lockbroker.v1.LockState":
            d.lockState = LockState.parseFrom(any.getValue());
            break;
          default:
            break;
        }
      } catch (InvalidProtocolBufferException e) {
        // A malformed detail is skipped; the status itself still counts.
      }
    }
    d.fieldViolations = Collections.unmodifiableMap(violations);
    return d;
  }
}
