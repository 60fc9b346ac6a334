package io.lockbroker.client;

import io.lockbroker.v1.Holder;
import io.lockbroker.v1.LockState;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Objects;
import java.util.Optional;

/**
 * Leader election on one key: the same object as in the Go, Python and Node
 * libraries (etcd's {@code concurrency.Election} shape), and a
 * {@code LeaderLatch} for Curator users.
 *
 * <pre>{@code
 * Election e = client.election("service/leader", LockOptions.defaults().ttl(Duration.ofSeconds(10)));
 * Lease lead = e.campaign("10.0.0.7:8080"); // blocks until leading
 * lead.onLost(() -> stopLeading());         // leadership can end at any moment
 * ...
 * e.resign();                               // or e.close()
 * }</pre>
 *
 * <p>Leadership is a {@link Lease}: pass its {@link Lease#token()} to what
 * the leader writes to. Observers, candidates or not, follow the leader
 * with {@link #leader()} and {@link #observe()}. Thread-safe; one campaign
 * at a time.
 */
public final class Election implements AutoCloseable {
  private final LockClient client;
  private final String key;
  private final LockOptions options;
  private Lease lease; // the last campaign's, until resign; guarded by this

  Election(LockClient client, String key, LockOptions options) {
    this.client = client;
    this.key = Objects.requireNonNull(key, "key");
    this.options = Objects.requireNonNull(options, "options");
  }

  /** The election's lock key. */
  public String key() {
    return key;
  }

  /**
   * Waits until this candidate leads (holds the key with value as its
   * value: its identity, e.g. an address) and returns the leadership. Errors
   * are {@link LockClient#lock(String, LockOptions)}'s.
   */
  public Lease campaign(byte[] value) throws InterruptedException {
    Lease l = client.lock(key, options.value(value));
    synchronized (this) {
      lease = l;
    }
    return l;
  }

  /** {@link #campaign(byte[])} with the value as UTF-8. */
  public Lease campaign(String value) throws InterruptedException {
    return campaign(value.getBytes(StandardCharsets.UTF_8));
  }

  /** Whether this candidate leads now (Curator's {@code hasLeadership}). */
  public synchronized boolean hasLeadership() {
    return lease != null && !lease.isLost() && !lease.isReleased();
  }

  /**
   * Gives the leadership from the last campaign up, so that another
   * candidate can lead at once. False when there was none to give up (no
   * campaign, resigned already, or lost).
   */
  public boolean resign() {
    Lease l;
    synchronized (this) {
      l = lease;
      lease = null;
    }
    if (l == null || l.isLost() || l.isReleased()) {
      if (l != null) {
        l.close();
      }
      return false;
    }
    l.close();
    return !l.isLost();
  }

  /**
   * Changes the leader's value without giving the leadership up; the token
   * stays.
   *
   * @throws IllegalStateException this candidate does not lead
   */
  public void proclaim(byte[] value) {
    Lease l;
    synchronized (this) {
      l = lease;
    }
    if (l == null || l.isLost() || l.isReleased()) {
      throw new IllegalStateException("not the leader of " + key + ": campaign first");
    }
    l.setValue(value);
  }

  /** {@link #proclaim(byte[])} with the value as UTF-8. */
  public void proclaim(String value) {
    proclaim(value.getBytes(StandardCharsets.UTF_8));
  }

  /** The leader now (its value is the leader's identity), read consistently; empty when nobody leads. */
  public Optional<Holder> leader() {
    return firstHolder(client.getLock(key));
  }

  /**
   * Follows the leader: the leader now, then after every change of
   * leadership (a new leader, a new value proclaimed), empty when nobody
   * leads (a resignation, a failure). Close the observer to stop.
   */
  public Observer observe() throws InterruptedException {
    return new Observer(client.watch(key));
  }

  /** Resigns (see {@link #resign()}). */
  @Override
  public void close() {
    resign();
  }

  private static Optional<Holder> firstHolder(LockState st) {
    return st.getHoldersCount() == 0 ? Optional.empty() : Optional.of(st.getHolders(0));
  }

  /** The leader after every change of leadership; see {@link Election#observe()}. */
  public static final class Observer implements AutoCloseable {
    private final LockWatch watch;
    private boolean first = true;
    private Optional<Holder> last = Optional.empty();

    Observer(LockWatch watch) {
      this.watch = watch;
    }

    /**
     * The next leader (empty: nobody leads); blocks until leadership
     * changes.
     *
     * @throws LockBrokerException the observation ended with this error
     *     (CANCELLED once closed)
     */
    public Optional<Holder> next() throws InterruptedException {
      for (;;) {
        Optional<Holder> h = firstHolder(watch.next());
        if (changed(h)) {
          return h;
        }
      }
    }

    /** The next leader, or null if leadership does not change within timeout. */
    public Optional<Holder> poll(Duration timeout) throws InterruptedException {
      long end = System.nanoTime() + timeout.toNanos();
      for (;;) {
        LockState st = watch.poll(Duration.ofNanos(Math.max(0, end - System.nanoTime())));
        if (st == null) {
          return null;
        }
        Optional<Holder> h = firstHolder(st);
        if (changed(h)) {
          return h;
        }
      }
    }

    private boolean changed(Optional<Holder> h) {
      boolean same = !first && sameLeader(last, h);
      first = false;
      last = h;
      return !same;
    }

    private static boolean sameLeader(Optional<Holder> a, Optional<Holder> b) {
      if (a.isEmpty() || b.isEmpty()) {
        return a.isEmpty() == b.isEmpty();
      }
      Holder x = a.get();
      Holder y = b.get();
      return x.getSessionId().equals(y.getSessionId()) && x.getToken() == y.getToken()
          && x.getValue().equals(y.getValue());
    }

    /** Ends the observation. */
    @Override
    public void close() {
      watch.close();
    }
  }
}
