package io.lockbroker.client;

import io.grpc.Status;
import io.grpc.stub.ClientCallStreamObserver;
import io.grpc.stub.ClientResponseObserver;
import io.lockbroker.v1.LockState;
import io.lockbroker.v1.WatchRequest;
import io.lockbroker.v1.WatchResponse;
import java.time.Duration;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;

/**
 * A running watch of a key (or prefix): read its states with {@link #next()}
 * or {@link #poll(Duration)}, and {@link #close()} it when done.
 *
 * <p>The client reads one state from the broker per state the caller takes,
 * so a slow reader gets the newest state (the broker drops the ones in
 * between and counts them in {@link #skipped()}) instead of an ever-growing
 * backlog. When the broker goes away (UNAVAILABLE; a stopped broker too,
 * after about 15 s, when the channel's keepalive ping goes unanswered) the
 * watch moves to the next target and starts again with the state now; any
 * other end is reported by {@link #next()}.
 */
public final class LockWatch implements AutoCloseable {
  private static final long BACKOFF_MIN_NANOS = TimeUnit.MILLISECONDS.toNanos(50);
  private static final long BACKOFF_MAX_NANOS = TimeUnit.SECONDS.toNanos(2);

  /** A state, or the end of the watch (state null). */
  private static final class Item {
    final LockState state;
    final LockBrokerException error;

    Item(LockState state, LockBrokerException error) {
      this.state = state;
      this.error = error;
    }
  }

  private final LockClient client;
  private final WatchRequest request;
  private final LinkedBlockingQueue<Item> queue = new LinkedBlockingQueue<>();
  private final Object lock = new Object();
  // guarded by lock
  private Stream stream;
  private int replica;
  private long backoffNanos = BACKOFF_MIN_NANOS;
  private ScheduledFuture<?> retry;
  private boolean closed;
  private Item end;

  private volatile boolean snapshotComplete;
  private volatile long skipped;

  LockWatch(LockClient client, WatchRequest request) throws InterruptedException {
    this.client = client;
    this.request = request;
    // The first state (or the refusal) must come from the first target that
    // answers: try them in turn while they are unavailable.
    for (int r = 0; ; r++) {
      Stream s;
      synchronized (lock) {
        replica = r;
        s = open(true);
      }
      Item first;
      try {
        first = s.first.poll(client.callTimeoutNanos(), TimeUnit.NANOSECONDS);
      } catch (InterruptedException e) {
        close();
        throw e;
      }
      if (first == null) { // a stalled broker: leave it for the next target
        s.call.cancel("no first state in time", null);
        first = new Item(null, new UnavailableException(LockBrokerException.local(Status.Code.UNAVAILABLE, "",
            "no state from the broker at " + client.target(r) + " in time"), null));
      }
      if (first.error == null) {
        queue.add(first);
        s.request(); // and the state after it
        return;
      }
      if (first.error.code() != Status.Code.UNAVAILABLE || r + 1 >= client.targetCount()) {
        close();
        throw first.error;
      }
    }
  }

  /**
   * The next state; blocks until there is one.
   *
   * @throws LockBrokerException the watch ended with this error (it was
   *     refused, or closed: then CANCELLED)
   */
  public LockState next() throws InterruptedException {
    return take(queue.take());
  }

  /** The next state, or null if none arrives within timeout. */
  public LockState poll(Duration timeout) throws InterruptedException {
    Item it = queue.poll(timeout.toNanos(), TimeUnit.NANOSECONDS);
    return it == null ? null : take(it);
  }

  private LockState take(Item it) {
    if (it.state == null) {
      queue.add(it); // the end stays the end for later calls
      throw it.error;
    }
    synchronized (lock) {
      if (stream != null) {
        stream.request();
      }
    }
    return it.state;
  }

  /** Prefix watches: true once every key's initial state has been delivered. */
  public boolean snapshotComplete() {
    return snapshotComplete;
  }

  /** How many states the broker dropped because this reader was slow. */
  public long skipped() {
    return skipped;
  }

  /** Ends the watch; a blocked {@link #next()} then throws (CANCELLED). */
  @Override
  public void close() {
    synchronized (lock) {
      if (closed) {
        return;
      }
      closed = true;
      if (retry != null) {
        retry.cancel(false);
      }
      if (stream != null) {
        stream.call.cancel("watch closed", null);
        stream = null;
      }
      finish(new LockBrokerException(Status.Code.CANCELLED, "", "the watch was closed"));
    }
  }

  // guarded by lock
  private void finish(LockBrokerException e) {
    if (end == null) {
      end = new Item(null, e);
      queue.add(end);
    }
  }

  // guarded by lock
  private Stream open(boolean initial) {
    Stream s = new Stream(initial);
    stream = s;
    client.asyncStub(replica).watch(request, s);
    return s;
  }

  private void reconnect() {
    synchronized (lock) {
      retry = null;
      if (closed) {
        return;
      }
      replica = (replica + 1) % client.targetCount();
      client.resetConnectBackoff(replica);
      open(false);
    }
  }

  /**
   * One Watch stream. The constructor's streams (initial) hand their first
   * state, or their refusal, to `first`; everything else goes to the queue.
   */
  private final class Stream implements ClientResponseObserver<WatchRequest, WatchResponse> {
    final LinkedBlockingQueue<Item> first = new LinkedBlockingQueue<>();
    final boolean initial;
    volatile ClientCallStreamObserver<WatchRequest> call;
    boolean gotFirst; // only touched by gRPC's serialized callbacks

    Stream(boolean initial) {
      this.initial = initial;
    }

    @Override
    public void beforeStart(ClientCallStreamObserver<WatchRequest> requestStream) {
      call = requestStream;
      requestStream.disableAutoRequestWithInitial(1);
    }

    void request() {
      call.request(1);
    }

    @Override
    public void onNext(WatchResponse r) {
      skipped += r.getSkipped();
      if (r.getSnapshotComplete()) {
        snapshotComplete = true;
        call.request(1);
        return;
      }
      Item it = new Item(r.getState(), null);
      if (initial && !gotFirst) {
        gotFirst = true;
        first.add(it);
        return;
      }
      gotFirst = true;
      synchronized (lock) {
        backoffNanos = BACKOFF_MIN_NANOS;
        if (stream != this || closed) {
          return;
        }
      }
      queue.add(it);
    }

    @Override
    public void onError(Throwable t) {
      ended(LockBrokerException.from(t));
    }

    @Override
    public void onCompleted() {
      ended(new LockBrokerException(Status.Code.UNAVAILABLE, "", "the broker ended the watch"));
    }

    private void ended(LockBrokerException e) {
      if (initial && !gotFirst) {
        first.add(new Item(null, e));
        return;
      }
      synchronized (lock) {
        if (stream != this || closed) {
          return;
        }
        stream = null;
        if (e.code() != Status.Code.UNAVAILABLE) {
          finish(e);
          return;
        }
        long wait = backoffNanos;
        backoffNanos = Math.min(2 * backoffNanos, BACKOFF_MAX_NANOS);
        retry = client.schedule(LockWatch.this::reconnect, wait);
      }
    }
  }
}
