package io.lockbroker.client;

import com.google.protobuf.ByteString;
import io.lockbroker.v1.AcquireKind;
import io.lockbroker.v1.AcquireQueued;
import io.lockbroker.v1.AcquireRequest;
import io.lockbroker.v1.SessionBehavior;
import io.lockbroker.v1.SessionOptions;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.List;
import java.util.Objects;
import java.util.function.Consumer;

/**
 * Options of one {@link LockClient#lock}, {@link LockClient#tryLock},
 * {@link LockClient#semaphore}, {@link LockClient#readLock},
 * {@link LockClient#writeLock} or {@link LockClient#lockAll} call (their
 * try variants too). Immutable: every method returns a new
 * instance, so a shared base can be specialised per call:
 *
 * <pre>{@code
 * LockOptions opts = LockOptions.defaults().ttl(Duration.ofSeconds(10)).value("host-a");
 * }</pre>
 *
 * <p>The broker checks the values (INVALID_ARGUMENT with the field named,
 * thrown as {@link InvalidArgumentException}); nothing is written to Consul
 * for a bad request.
 */
public final class LockOptions {
  private static final LockOptions DEFAULTS =
      new LockOptions(ByteString.EMPTY, null, null, false, "", List.of(), null, 0, false, false, null);

  private final ByteString value;
  private final Duration ttl;
  private final Duration lockDelay;
  private final boolean deleteBehavior;
  private final String sessionName;
  private final List<String> checks;
  private final Duration waitTimeout;
  private final int limit;
  private final boolean semaphore;
  private final boolean fair;
  private final Consumer<AcquireQueued> onQueued;

  private LockOptions(ByteString value, Duration ttl, Duration lockDelay, boolean deleteBehavior,
      String sessionName, List<String> checks, Duration waitTimeout, int limit, boolean semaphore,
      boolean fair, Consumer<AcquireQueued> onQueued) {
    this.value = value;
    this.ttl = ttl;
    this.lockDelay = lockDelay;
    this.deleteBehavior = deleteBehavior;
    this.sessionName = sessionName;
    this.checks = checks;
    this.waitTimeout = waitTimeout;
    this.limit = limit;
    this.semaphore = semaphore;
    this.fair = fair;
    this.onQueued = onQueued;
  }

  /**
   * The defaults: empty value, the broker's session defaults (TTL 15s,
   * lock-delay 15s, RELEASE behaviour), an exclusive lock, and for
   * {@link LockClient#lock} no bound on the wait.
   */
  public static LockOptions defaults() {
    return DEFAULTS;
  }

  private LockOptions with(ByteString value, Duration ttl, Duration lockDelay, boolean deleteBehavior,
      String sessionName, List<String> checks, Duration waitTimeout, int limit, boolean semaphore,
      boolean fair) {
    return new LockOptions(value, ttl, lockDelay, deleteBehavior, sessionName, checks, waitTimeout,
        limit, semaphore, fair, onQueued);
  }

  /**
   * The holder's value: its identity (leader address, host name). At most 256 KiB
   * (INVALID_ARGUMENT beyond).
   */
  public LockOptions value(byte[] value) {
    return with(ByteString.copyFrom(value), ttl, lockDelay, deleteBehavior, sessionName, checks,
        waitTimeout, limit, semaphore, fair);
  }

  /** The holder's value as UTF-8. */
  public LockOptions value(String value) {
    return value(value.getBytes(StandardCharsets.UTF_8));
  }

  /**
   * Session TTL (default 15s; 10s to 24h). The broker renews the session every
   * TTL/3 while the stream is open; a longer TTL rides out longer broker or
   * network outages but keeps a crashed holder's lock longer.
   */
  public LockOptions ttl(Duration ttl) {
    return with(value, Objects.requireNonNull(ttl), lockDelay, deleteBehavior, sessionName, checks,
        waitTimeout, limit, semaphore, fair);
  }

  /**
   * Consul's lock-delay (default 15s; 0 to 60s): after the session is
   * invalidated nobody can take the key for this long. An explicit release
   * never triggers it.
   */
  public LockOptions lockDelay(Duration lockDelay) {
    return with(value, ttl, Objects.requireNonNull(lockDelay), deleteBehavior, sessionName, checks,
        waitTimeout, limit, semaphore, fair);
  }

  /** Consul deletes the key (not just releases it) when the session is invalidated. */
  public LockOptions deleteOnInvalidate() {
    return with(value, ttl, lockDelay, true, sessionName, checks, waitTimeout, limit, semaphore, fair);
  }

  /** The Consul session's name (default "lockbroker"; at most 128 bytes). */
  public LockOptions sessionName(String name) {
    return with(value, ttl, lockDelay, deleteBehavior, Objects.requireNonNull(name), checks,
        waitTimeout, limit, semaphore, fair);
  }

  /** Consul health checks (on the broker's agent) that must stay passing. */
  public LockOptions checks(List<String> checks) {
    return with(value, ttl, lockDelay, deleteBehavior, sessionName, List.copyOf(checks), waitTimeout,
        limit, semaphore, fair);
  }

  /**
   * How long {@link LockClient#lock} waits (default: until the calling thread
   * is interrupted). A wait that runs out throws {@link WaitTimeoutException}
   * naming the holders. {@link Duration#ZERO} tries once (as
   * {@link LockClient#tryLock}, but throwing {@link LockHeldException}).
   */
  public LockOptions waitTimeout(Duration waitTimeout) {
    return with(value, ttl, lockDelay, deleteBehavior, sessionName, checks,
        Objects.requireNonNull(waitTimeout), limit, semaphore, fair);
  }

  /** Semaphores: admit waiters oldest first (default off). */
  public LockOptions fair(boolean fair) {
    return with(value, ttl, lockDelay, deleteBehavior, sessionName, checks, waitTimeout, limit,
        semaphore, fair);
  }

  /**
   * Called with each {@code queued} event while the request waits, on a gRPC
   * thread (it must not block): {@code getPosition()} is the request's place
   * in the key's shared queue, which every broker replica serves in arrival
   * order (1 is next; 0 when the broker does not say),
   * {@code getState().getWaiting()} how many broker requests wait in all,
   * {@code getState()} who holds the key. A wait that moves to another
   * target keeps its place. Default: none.
   */
  public LockOptions onQueued(Consumer<AcquireQueued> listener) {
    return new LockOptions(value, ttl, lockDelay, deleteBehavior, sessionName, checks, waitTimeout,
        limit, semaphore, fair, Objects.requireNonNull(listener));
  }

  Consumer<AcquireQueued> onQueued() {
    return onQueued;
  }

  LockOptions semaphore(int limit) {
    if (limit < 1) {
      throw new IllegalArgumentException("semaphore limit must be at least 1, got " + limit);
    }
    return with(value, ttl, lockDelay, deleteBehavior, sessionName, checks, waitTimeout, limit, true,
        fair);
  }

  Duration waitTimeout() {
    return waitTimeout;
  }

  boolean hasSessionOptions() {
    return ttl != null || lockDelay != null || deleteBehavior || !sessionName.isEmpty()
        || !checks.isEmpty();
  }

  AcquireRequest toRequest(String key) {
    AcquireRequest.Builder b = AcquireRequest.newBuilder().setKey(key).setValue(value).setFair(fair);
    if (semaphore) {
      b.setKind(AcquireKind.ACQUIRE_KIND_SEMAPHORE).setLimit(limit);
    }
    if (waitTimeout != null) {
      b.setWaitTimeout(Protos.duration(waitTimeout));
    }
    if (hasSessionOptions()) {
      SessionOptions.Builder s = SessionOptions.newBuilder().setName(sessionName).addAllChecks(checks);
      if (ttl != null) {
        s.setTtl(Protos.duration(ttl));
      }
      if (lockDelay != null) {
        s.setLockDelay(Protos.duration(lockDelay));
      }
      if (deleteBehavior) {
        s.setBehavior(SessionBehavior.SESSION_BEHAVIOR_DELETE);
      }
      b.setNewSession(s);
    }
    return b.build();
  }

  @Override
  public String toString() {
    return "LockOptions{ttl=" + ttl + ", lockDelay=" + lockDelay + ", waitTimeout=" + waitTimeout
        + (semaphore ? ", limit=" + limit : "") + (fair ? ", fair" : "")
        + (deleteBehavior ? ", delete" : "") + ", value=" + value.size() + " bytes}";
  }
}
