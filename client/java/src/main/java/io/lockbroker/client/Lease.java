package io.lockbroker.client;

import com.google.protobuf.ByteString;
import io.grpc.Status;
import io.lockbroker.v1.AcquireAcquired;
import io.lockbroker.v1.AcquireRequest;
import io.lockbroker.v1.AcquireResponse;
import io.lockbroker.v1.LostReason;
import io.lockbroker.v1.Sequencer;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.List;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Executor;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

/**
 * A held lock, semaphore slot, read or write hold of a read-write lock, or
 * multi-key lock: a lease, not a mutex. It can be lost at any
 * moment (a partition, a paused process, an operator destroying the
 * session), so work that must never overlap passes {@link #token()} to the
 * resources it changes, and those refuse tokens lower than the highest they
 * have seen.
 *
 * <p>The lease keeps itself: the broker renews the session and sends a
 * keepalive after each renewal with how long the hold is guaranteed; the
 * lease moves its {@link #deadline()} accordingly. When the stream breaks,
 * the broker shuts down, or no keepalive comes for 60% of the last
 * guaranteed time, the lease resumes the hold on the next target (same
 * session, same token). When it hears nothing and cannot resume before the
 * deadline less a margin (default 250 ms), it reports the loss itself:
 * {@link #isLost()} turns true and the {@link #onLost} callbacks run, before
 * the deadline passes.
 *
 * <p>A multi-key lock ({@link LockClient#lockAll}) is one lease with one
 * session: {@link #sequencers()} and {@link #tokens()} have one entry per
 * key, and losing any key loses the whole lease ({@link #lostKey()} names
 * it). A resume carries the request's kind (read, write) and keys.
 *
 * <p>{@link #close()} (try-with-resources) releases the hold, every key of
 * it. Thread-safe.
 */
public final class Lease implements AutoCloseable {
  private enum State { HELD, RESUMING, RELEASING, RELEASED, LOST }

  /** How long close() waits for the broker to confirm a release. */
  private static final long RELEASE_WAIT_NANOS = TimeUnit.SECONDS.toNanos(3);
  /** Share of the last guaranteed time without a keepalive that counts as a stall. */
  private static final double STALL_FRACTION = 0.6;
  /** Pause between rounds over all targets while resuming. */
  private static final long RESUME_BACKOFF_NANOS = TimeUnit.MILLISECONDS.toNanos(200);

  private final LockClient client;
  private final AcquireRequest request;
  private final Sequencer sequencer;
  private final List<Sequencer> sequencers; // one per key, in the request's order
  private final Executor serial; // every state change runs here, one at a time
  private final long marginNanos;
  private final CompletableFuture<Void> done = new CompletableFuture<>();
  private final List<Runnable> lostCallbacks = new ArrayList<>(); // guarded by itself

  // Only touched on `serial`.
  private State state = State.HELD;
  private AcquireCall current; // the stream that holds (or is resuming) the lease
  private AcquireCall stale; // a quiet stream left open until a resume succeeds
  private boolean staleDraining; // stale's broker said BROKER_SHUTDOWN or REPLICA_CUT_OFF
  private int replica;
  private int resumeTries;
  private long lastHeardNanos;
  private ScheduledFuture<?> giveUpTimer;
  private ScheduledFuture<?> stallTimer;
  private ScheduledFuture<?> backoffTimer;

  private volatile long deadlineNanos;
  private volatile LockLostException lostCause;
  private volatile boolean released;
  private volatile int currentReplica;
  private volatile int resumes;

  Lease(LockClient client, AcquireRequest request, AcquireCall call, AcquireAcquired acquired,
      long receivedNanos) {
    this.client = client;
    this.request = request;
    this.sequencer = acquired.getSequencer();
    this.sequencers = acquired.getSequencersCount() > 0 ? List.copyOf(acquired.getSequencersList())
        : List.of(sequencer);
    this.serial = client.newSerialExecutor();
    this.marginNanos = client.lossMarginNanos();
    this.current = call;
    this.replica = call.replica;
    this.currentReplica = call.replica;
    this.lastHeardNanos = receivedNanos;
    this.deadlineNanos = receivedNanos + Protos.nanos(acquired.getGuaranteedFor());
    call.setListener(new Listener());
    serial.execute(this::armTimers);
  }

  // ---------------------------------------------------------------- accessors

  /** The lock key or semaphore prefix; a multi-key lock's first key. */
  public String key() {
    return sequencer.getKey();
  }

  /**
   * Every key the lease holds, in the order asked for: one for a lock,
   * semaphore slot or read-write hold, all of them for
   * {@link LockClient#lockAll}.
   */
  public List<String> keys() {
    List<String> out = new ArrayList<>(sequencers.size());
    for (Sequencer s : sequencers) {
      out.add(s.getKey());
    }
    return List.copyOf(out);
  }

  /**
   * One grant per key, in the order of {@link #keys()} (a multi-key lock
   * has one per key, each with its own token; otherwise the list holds
   * {@link #sequencer()} alone).
   */
  public List<Sequencer> sequencers() {
    return sequencers;
  }

  /** The fencing token of each key, in the order of {@link #keys()} (compare unsigned). */
  public List<Long> tokens() {
    List<Long> out = new ArrayList<>(sequencers.size());
    for (Sequencer s : sequencers) {
      out.add(s.getToken());
    }
    return List.copyOf(out);
  }

  /** True for a read (shared) hold of a read-write lock ({@link LockClient#readLock}). */
  public boolean isRead() {
    return sequencer.getRead();
  }

  /**
   * Once the lease is lost, the key whose loss ended it: for a multi-key
   * lock the key the broker found lost first (it released the others);
   * otherwise, and for a loss of the whole hold (no keepalive, a refused
   * resume, a release from elsewhere), {@link #key()}. Empty while the
   * lease is not lost. The same as {@code lostCause().get().key()}.
   */
  public Optional<String> lostKey() {
    return lostCause().map(LockLostException::key);
  }

  /**
   * The fencing token: strictly increases with every new grant of the key,
   * kept by resumes. Pass it to protected resources (compare unsigned).
   */
  public long token() {
    return sequencer.getToken();
  }

  /** The grant: key, session, Consul lock index and token. */
  public Sequencer sequencer() {
    return sequencer;
  }

  /** The Consul session holding the grant. */
  public String sessionId() {
    return sequencer.getSessionId();
  }

  /**
   * Until when the hold is guaranteed if no further keepalive arrives, from
   * the last {@code acquired} or {@code keepalive} ({@code guaranteed_for}
   * counted from when it was received). Wall-clock view of
   * {@link #deadlineNanos()}.
   */
  public Instant deadline() {
    return Instant.now().plusNanos(deadlineNanos - System.nanoTime());
  }

  /** {@link #deadline()} on the {@link System#nanoTime()} clock. */
  public long deadlineNanos() {
    return deadlineNanos;
  }

  /** How long the hold is still guaranteed (zero once past the deadline). */
  public Duration timeLeft() {
    return Duration.ofNanos(Math.max(0, deadlineNanos - System.nanoTime()));
  }

  /**
   * True once the lease is lost: reported by the broker, or the deadline
   * (less the margin) passed without a keepalive or a resume. Also true when
   * that time has passed but the timer has not run yet (a paused JVM).
   * False after a plain release.
   */
  public boolean isLost() {
    if (lostCause != null) {
      return true;
    }
    return !released && System.nanoTime() - (deadlineNanos - marginNanos) >= 0;
  }

  /** True after {@link #close()} or {@link #release()} released the hold. */
  public boolean isReleased() {
    return released;
  }

  /** Why the lease was lost, once it is. */
  public Optional<LockLostException> lostCause() {
    LockLostException e = lostCause;
    if (e == null && isLost()) {
      e = LockLostException.fromClient(key(), LockLostException.KEEPALIVE_TIMEOUT,
          "the guaranteed deadline passed before a keepalive arrived");
    }
    return Optional.ofNullable(e);
  }

  /** Throws the loss if the lease is lost; use it before each step of guarded work. */
  public void check() {
    Optional<LockLostException> e = lostCause();
    if (e.isPresent()) {
      throw e.get();
    }
  }

  /**
   * Runs callback once when the lease is lost (at once, on another thread, if
   * it already is). Not run after a plain release. Callbacks run on the
   * client's callback threads and must not block for long.
   */
  public void onLost(Runnable callback) {
    boolean now;
    synchronized (lostCallbacks) {
      now = lostCause != null;
      if (!now) {
        lostCallbacks.add(callback);
      }
    }
    if (now) {
      client.callbackExecutor().execute(callback);
    }
  }

  /** Waits up to timeout for the lease to end; true if it was lost by then. */
  public boolean awaitLost(Duration timeout) throws InterruptedException {
    try {
      done.get(timeout.toNanos(), TimeUnit.NANOSECONDS);
    } catch (ExecutionException | TimeoutException e) {
      // fall through: report the state now
    }
    return lostCause != null;
  }

  /** The target (from the builder) whose broker holds the lease's stream now. */
  public String target() {
    return client.target(currentReplica);
  }

  /** How many times the hold was resumed on a replica. */
  public int resumeCount() {
    return resumes;
  }

  /**
   * Changes the holder's value without giving the hold up; the token stays.
   * For a multi-key lock, the value of {@link #key()} (the first key) only.
   * Throws {@link LockBrokerException} (FAILED_PRECONDITION, NOT_HOLDER) when
   * this grant no longer holds the key.
   */
  public void setValue(byte[] value) {
    check();
    client.setValue(currentReplica, sequencer, ByteString.copyFrom(value));
  }

  // ---------------------------------------------------------------- release

  /**
   * Releases the hold and waits (up to a few seconds) until the broker
   * confirms it; the stream is cancelled in any case, which makes the broker
   * release it too. Idempotent, never throws; on a lost lease it only
   * cleans up. Use {@link #release()} to learn about a loss instead.
   */
  @Override
  public void close() {
    end();
  }

  /**
   * As {@link #close()}, but throws {@link LockLostException} if the lease
   * had been lost before the release: work done under it may have overlapped
   * with another holder.
   */
  public void release() {
    if (end() == State.LOST) {
      throw lostCause().orElseThrow();
    }
  }

  /**
   * Releases unless already ended; returns how the lease ended: LOST when it
   * was lost before the broker confirmed the release, else RELEASED.
   */
  private State end() {
    CompletableFuture<State> begin = new CompletableFuture<>();
    serial.execute(() -> {
      State s = state;
      if (s == State.HELD || s == State.RESUMING) {
        state = State.RELEASING;
        cancelTimers();
      }
      begin.complete(s);
    });
    State before = begin.join();
    if (before == State.HELD || before == State.RESUMING) {
      try {
        client.release(currentReplica, sequencer);
      } catch (LockBrokerException e) {
        // The broker still releases the hold when the stream is cancelled
        // below, or Consul when the session's TTL runs out.
      }
      boolean interrupted = false;
      long until = System.nanoTime() + RELEASE_WAIT_NANOS;
      while (!done.isDone()) {
        long left = until - System.nanoTime();
        if (left <= 0) {
          break;
        }
        try {
          done.get(left, TimeUnit.NANOSECONDS);
        } catch (InterruptedException e) {
          interrupted = true;
          break;
        } catch (ExecutionException | TimeoutException e) {
          break;
        }
      }
      serial.execute(this::finishReleased);
      done.join();
      if (interrupted) {
        Thread.currentThread().interrupt();
      }
    } else if (before == State.RELEASING) {
      done.join(); // another thread is releasing
    }
    client.forget(this);
    return lostCause != null ? State.LOST : State.RELEASED;
  }

  // ---------------------------------------------------------------- events (on `serial`)

  private final class Listener implements AcquireCall.Listener {
    @Override
    public void onResponse(AcquireCall call, AcquireResponse response, long receivedNanos) {
      serial.execute(() -> handle(call, response, receivedNanos));
    }

    @Override
    public void onEnd(AcquireCall call, Throwable error) {
      serial.execute(() -> ended(call, error));
    }
  }

  private void handle(AcquireCall call, AcquireResponse r, long now) {
    if (call != null && call == stale) {
      handleStale(r, now);
      return;
    }
    if (call != current) {
      return; // a stream the lease has moved away from
    }
    switch (r.getEventCase()) {
      case KEEPALIVE:
        if (state == State.HELD) {
          extend(now, Protos.nanos(r.getKeepalive().getGuaranteedFor()));
        }
        break;
      case ACQUIRED:
        if (state != State.RESUMING) {
          break;
        }
        if (!sameGrant(r.getAcquired())) {
          lose(LockLostException.fromClient(key(), LockLostException.RESUME_REFUSED,
              "resume returned another grant (token "
              + Long.toUnsignedString(r.getAcquired().getSequencer().getToken()) + ")"));
          break;
        }
        state = State.HELD;
        resumes++;
        currentReplica = call.replica;
        AcquireCall old = stale;
        stale = null;
        if (old != null) {
          old.cancel("hold resumed on another replica");
        }
        extend(now, Protos.nanos(r.getAcquired().getGuaranteedFor()));
        break;
      case RELEASED:
        if (state == State.RELEASING) {
          finishReleased();
        } else {
          lose(releasedElsewhere());
        }
        break;
      case LOST:
        if (movesAway(r.getLost().getReason()) && state == State.HELD) {
          startResume();
          staleDraining = true;
        } else if (state == State.RELEASING
            && (movesAway(r.getLost().getReason())
                || r.getLost().getReason() == LostReason.LOST_REASON_RESUMED_ELSEWHERE)) {
          finishReleased(); // closing the stream makes that broker release the hold
        } else { // also while releasing: the hold was lost before the release took effect
          lose(LockLostException.fromBroker(lostKeyOf(r), r.getLost().getReason(), r.getLost().getDetail()));
        }
        break;
      default:
        break;
    }
  }

  /**
   * Whether a resume's acquired is this lease's grant: the same token, and
   * for a multi-key lock the same token for every key.
   */
  private boolean sameGrant(AcquireAcquired a) {
    if (a.getSequencer().getToken() != sequencer.getToken()) {
      return false;
    }
    if (a.getSequencersCount() == 0) {
      return true;
    }
    if (a.getSequencersCount() != sequencers.size()) {
      return false;
    }
    for (int i = 0; i < sequencers.size(); i++) {
      Sequencer got = a.getSequencers(i);
      if (!got.getKey().equals(sequencers.get(i).getKey()) || got.getToken() != sequencers.get(i).getToken()) {
        return false;
      }
    }
    return true;
  }

  /** The key a broker's lost names (a multi-key lock's lost key), else {@link #key()}. */
  private String lostKeyOf(AcquireResponse r) {
    String k = r.getLost().getKey();
    return k.isEmpty() ? key() : k;
  }

  /**
   * An event on the quiet stream the lease is resuming away from: its broker
   * was only slow. A keepalive still proves the session renewed; if no
   * resume attempt is in flight the lease goes back to that stream (an
   * attempt in flight is never cancelled: its broker may already own the
   * hold, and closing its stream would release it).
   */
  private void handleStale(AcquireResponse r, long now) {
    if (state != State.RESUMING) {
      return;
    }
    switch (r.getEventCase()) {
      case KEEPALIVE:
        if (current == null) {
          current = stale;
          stale = null;
          state = State.HELD;
        }
        extend(now, Protos.nanos(r.getKeepalive().getGuaranteedFor()));
        break;
      case LOST:
        switch (r.getLost().getReason()) {
          case LOST_REASON_BROKER_SHUTDOWN:
          case LOST_REASON_REPLICA_CUT_OFF:
          case LOST_REASON_RESUMED_ELSEWHERE:
            break;
          default:
            lose(LockLostException.fromBroker(lostKeyOf(r), r.getLost().getReason(), r.getLost().getDetail()));
            break;
        }
        break;
      case RELEASED:
        lose(releasedElsewhere());
        break;
      default:
        break;
    }
  }

  /**
   * Whether a `lost` of this reason ends the stream but not the hold: that
   * broker drains, or is cut off from Consul, and keeps the hold until
   * another replica resumes it (or until the stream ends).
   */
  private static boolean movesAway(LostReason reason) {
    return reason == LostReason.LOST_REASON_BROKER_SHUTDOWN
        || reason == LostReason.LOST_REASON_REPLICA_CUT_OFF;
  }

  private void ended(AcquireCall call, Throwable error) {
    if (call == stale) {
      stale = null;
      if (staleDraining && state == State.RESUMING) {
        // The drain (or the cut-off broker's last promise) is over: that
        // broker released the hold unless it had moved. Safe side: report
        // the loss now, not at the deadline.
        lose(LockLostException.fromClient(key(), LockLostException.KEEPALIVE_TIMEOUT,
            "the draining (or cut-off) broker ended the hold before another replica resumed it"));
      }
      return;
    }
    if (call != current) {
      return;
    }
    switch (state) {
      case RELEASING:
        finishReleased();
        break;
      case HELD:
        startResume();
        break;
      case RESUMING:
        resumeFailed(error);
        break;
      default:
        break;
    }
  }

  private void armTimers() {
    if (state == State.HELD) {
      extend(lastHeardNanos, deadlineNanos - lastHeardNanos);
    }
  }

  /** A keepalive or grant arrived at now, guaranteeing the hold for gf nanos. */
  private void extend(long now, long gf) {
    lastHeardNanos = now;
    deadlineNanos = now + gf;
    cancelTimers();
    long giveUpIn = deadlineNanos - marginNanos - System.nanoTime();
    giveUpTimer = client.schedule(() -> serial.execute(this::giveUpIfDue), giveUpIn);
    long stallIn = now + (long) (gf * STALL_FRACTION) - System.nanoTime();
    if (stallIn < giveUpIn) {
      stallTimer = client.schedule(() -> serial.execute(this::resumeIfStalled), stallIn);
    }
  }

  private void cancelTimers() {
    for (ScheduledFuture<?> f : new ScheduledFuture<?>[] {giveUpTimer, stallTimer, backoffTimer}) {
      if (f != null) {
        f.cancel(false);
      }
    }
    giveUpTimer = stallTimer = backoffTimer = null;
  }

  private void giveUpIfDue() {
    if (state != State.HELD && state != State.RESUMING) {
      return;
    }
    long left = deadlineNanos - marginNanos - System.nanoTime();
    if (left > 0) { // the deadline moved after the timer was set
      giveUpTimer = client.schedule(() -> serial.execute(this::giveUpIfDue), left);
      return;
    }
    lose(LockLostException.fromClient(key(), LockLostException.KEEPALIVE_TIMEOUT, state == State.HELD
        ? "no keepalive from the broker before the guaranteed deadline"
        : "no broker replica could resume the hold before its guaranteed deadline"));
  }

  private void resumeIfStalled() {
    if (state == State.HELD && current != null) {
      startResume();
    }
  }

  /**
   * Moves the hold to the next replica. The old stream stays open until the
   * resume succeeds: its broker may only be slow, or draining (it releases
   * the hold of a stream closed before the hold moved), and once the hold
   * has moved that broker can no longer touch it.
   */
  private void startResume() {
    state = State.RESUMING;
    if (stale != null) {
      stale.cancel("superseded");
    }
    staleDraining = false;
    stale = current;
    current = null;
    resumeTries = 0;
    nextResume();
  }

  private void nextResume() {
    backoffTimer = null;
    if (state != State.RESUMING || current != null) {
      return;
    }
    if (System.nanoTime() - (deadlineNanos - marginNanos) >= 0) {
      giveUpIfDue();
      return;
    }
    replica = (replica + 1) % client.targetCount();
    resumeTries++;
    AcquireRequest resume = request.toBuilder().setResume(sequencer).build();
    current = client.openAcquire(replica, resume, new Listener());
  }

  private void resumeFailed(Throwable error) {
    current = null;
    Status st = error == null ? Status.UNAVAILABLE.withDescription("stream ended before acquired")
        : Status.fromThrowable(error);
    switch (st.getCode()) {
      case FAILED_PRECONDITION:
      case NOT_FOUND:
      case INVALID_ARGUMENT:
      case PERMISSION_DENIED:
      case UNAUTHENTICATED:
        lose(LockLostException.fromClient(key(), LockLostException.RESUME_REFUSED, "resume refused on "
            + client.target(replica) + ": " + LockBrokerException.from(error).getMessage()));
        return;
      default:
        break;
    }
    client.resetConnectBackoff(replica);
    if (resumeTries % client.targetCount() != 0) {
      nextResume();
      return;
    }
    long wait = Math.min(RESUME_BACKOFF_NANOS, deadlineNanos - marginNanos - System.nanoTime());
    backoffTimer = client.schedule(() -> serial.execute(this::nextResume), Math.max(0, wait));
  }

  private LockLostException releasedElsewhere() {
    return LockLostException.fromClient(key(), LockLostException.RELEASED,
        "a Release call for this session from elsewhere ended the hold");
  }

  private void lose(LockLostException cause) {
    if (state == State.LOST || state == State.RELEASED) {
      return;
    }
    state = State.LOST;
    cancelTimers();
    cancelStreams("lease lost");
    List<Runnable> callbacks;
    synchronized (lostCallbacks) {
      lostCause = cause;
      callbacks = new ArrayList<>(lostCallbacks);
      lostCallbacks.clear();
    }
    done.complete(null);
    for (Runnable r : callbacks) {
      client.callbackExecutor().execute(r);
    }
    client.forget(this);
  }

  private void finishReleased() {
    if (state == State.LOST || state == State.RELEASED) {
      return;
    }
    state = State.RELEASED;
    released = true;
    cancelTimers();
    cancelStreams("lease released");
    done.complete(null);
    synchronized (lostCallbacks) {
      lostCallbacks.clear();
    }
  }

  private void cancelStreams(String why) {
    if (current != null) {
      current.cancel(why);
      current = null;
    }
    if (stale != null) {
      stale.cancel(why);
      stale = null;
    }
  }

  /** Ends a lease nobody will see (the caller of lock() gave up): cancel its stream. */
  void abandon() {
    serial.execute(() -> {
      if (state == State.HELD || state == State.RESUMING) {
        state = State.RELEASING;
        finishReleased();
      }
    });
  }

  @Override
  public String toString() {
    StringBuilder keys = new StringBuilder();
    for (int i = 1; i < sequencers.size(); i++) {
      keys.append(i == 1 ? ", with=[" : ", ").append(sequencers.get(i).getKey());
    }
    if (keys.length() > 0) {
      keys.append(']');
    }
    return "Lease{key=" + key() + keys + (isRead() ? ", read" : "") + ", token="
        + Long.toUnsignedString(token()) + ", session="
        + sessionId() + (isLost() ? ", lost" : released ? ", released" : ", held") + "}";
  }
}
