package io.lockbroker.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import io.lockbroker.testing.Broker;
import io.lockbroker.testing.Cluster;
import io.lockbroker.v1.AcquireQueued;
import java.io.IOException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.function.Predicate;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * The key's shared queue through the library, against real processes: a
 * waiter hears its place (onQueued), and a wait that moves to another
 * target keeps it.
 */
@Timeout(value = 90, unit = TimeUnit.SECONDS)
class QueueTest {
  private static final LockOptions OPTS =
      LockOptions.defaults().ttl(Duration.ofSeconds(10)).lockDelay(Duration.ZERO);

  /** A lock(key) waiting on a thread of its own; heard collects what its onQueued hears. */
  private static final class Waiter {
    final BlockingQueue<AcquireQueued> heard = new LinkedBlockingQueue<>();
    final CompletableFuture<Lease> lease = new CompletableFuture<>();

    Waiter(LockClient client, String key) {
      this(client, key, 0);
    }

    /** With limit > 0, a slot of the semaphore at key with that limit. */
    Waiter(LockClient client, String key, int limit) {
      Thread t = new Thread(() -> {
        try {
          LockOptions o = OPTS.onQueued(heard::add);
          lease.complete(limit > 0 ? client.semaphore(key, limit, o) : client.lock(key, o));
        } catch (Throwable e) {
          lease.completeExceptionally(e);
        }
      }, "test-waiter " + key);
      t.setDaemon(true);
      t.start();
    }

    /** The first queued heard from now on that says place n (and, unless -1, that waiting wait). */
    AcquireQueued place(int n, int waiting) throws InterruptedException {
      long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
      List<String> seen = new ArrayList<>();
      while (true) {
        AcquireQueued q = heard.poll(Math.max(0, end - System.nanoTime()), TimeUnit.NANOSECONDS);
        if (q == null) {
          fail("no place " + n + " (waiting " + waiting + ") within 10 s; heard [place, waiting] " + seen);
        }
        if (q.getPosition() == n && (waiting < 0 || q.getState().getWaiting() == waiting)) {
          return q;
        }
        seen.add("[" + q.getPosition() + ", " + q.getState().getWaiting() + "]");
      }
    }

    Lease granted() throws Exception {
      try {
        return lease.get(10, TimeUnit.SECONDS);
      } catch (TimeoutException e) {
        throw new AssertionError("not granted within 10 s", e);
      }
    }
  }

  /** A ticket of the key's shared queue in Consul. */
  private record Ticket(long createIndex, long modifyIndex, String session) {}

  private static final Pattern ENTRY = Pattern.compile("\\{[^{}]*\\}");

  /**
   * The live tickets of key's queue, oldest first (a ticket whose session
   * ended stays, unlocked, until a broker deletes it).
   */
  private static List<Ticket> tickets(String key) throws IOException, InterruptedException {
    return liveEntries(key + "/.queue/");
  }

  /** The live contender entries of the semaphore at prefix, oldest first. */
  private static List<Ticket> contenders(String prefix) throws IOException, InterruptedException {
    return liveEntries(prefix + "/");
  }

  /** The entries under dir acquired by a session (but a semaphore's .lock), oldest first. */
  private static List<Ticket> liveEntries(String dir) throws IOException, InterruptedException {
    String body;
    try {
      body = Cluster.get().consul().call("GET", "/v1/kv/" + dir + "?recurse&consistent", null);
    } catch (IOException e) {
      if (e.getMessage().contains(": 404 ")) {
        return List.of();
      }
      throw e;
    }
    List<Ticket> out = new ArrayList<>();
    Matcher m = ENTRY.matcher(body);
    while (m.find()) {
      String e = m.group();
      String session = field(e, "\"Session\"\\s*:\\s*\"([^\"]*)\"");
      if (session != null && !session.isEmpty() && !e.contains("/.lock\"")) {
        out.add(new Ticket(Long.parseLong(field(e, "\"CreateIndex\"\\s*:\\s*(\\d+)")),
            Long.parseLong(field(e, "\"ModifyIndex\"\\s*:\\s*(\\d+)")), session));
      }
    }
    out.sort(Comparator.comparingLong(Ticket::createIndex));
    return out;
  }

  private static String field(String entry, String regex) {
    Matcher m = Pattern.compile(regex).matcher(entry);
    return m.find() ? m.group(1) : null;
  }

  /** The first ticket that matches within timeout; fails once moved ended instead. */
  private static Ticket awaitTicket(String key, Predicate<Ticket> p, Waiter moved, Duration timeout, String what)
      throws Exception {
    long end = System.nanoTime() + timeout.toNanos();
    while (true) {
      if (moved.lease.isDone()) { // the wait ended instead of moving
        moved.lease.get();
      }
      for (Ticket t : tickets(key)) {
        if (p.test(t)) {
          return t;
        }
      }
      if (System.nanoTime() > end) {
        fail(what + ": not within " + timeout + "; tickets " + tickets(key));
      }
      Thread.sleep(20);
    }
  }

  /**
   * Two waiters behind a holder hear places 1 and 2 (with how many wait and
   * who holds the key); when the holder lets go, the first gets the key and
   * the second moves up to 1.
   */
  @Test
  void onQueuedTellsThePlace() throws Exception {
    String key = Cluster.key("queue-place");
    String addr = Cluster.get().broker().addr();
    try (LockClient hc = LockClient.builder().target(addr).build();
        LockClient c1 = LockClient.builder().target(addr).build();
        LockClient c2 = LockClient.builder().target(addr).build()) {
      Lease holder = hc.lock(key, OPTS);
      Waiter first = new Waiter(c1, key);
      AcquireQueued q1 = first.place(1, -1);
      assertEquals(holder.sessionId(), q1.getState().getHolders(0).getSessionId());
      Waiter second = new Waiter(c2, key);
      // The first `queued` may count the waiters before the second's
      // ticket; the next one (at once) counts it.
      AcquireQueued q2 = second.place(2, 2);
      assertEquals(holder.sessionId(), q2.getState().getHolders(0).getSessionId());
      second.heard.clear();
      holder.release();
      Lease lease = first.granted();
      assertEquals(lease.sessionId(), second.place(1, -1).getState().getHolders(0).getSessionId());
    }
  }

  /**
   * A wait queued on target A behind a holder, with later waiters queued on
   * B and the shared broker after it, moves to B when A is SIGKILLed: it
   * resumes with its session, so its ticket keeps its place (same session,
   * same CreateIndex, written again by B), and it is granted before the
   * later waiters.
   */
  @Test
  void movedWaitKeepsItsPlace() throws Exception {
    String key = Cluster.key("queue-move");
    Broker shared = Cluster.get().broker();
    try (Broker a = Cluster.get().newBroker("queue-move-a"); Broker b = Cluster.get().newBroker("queue-move-b");
        LockClient hc = LockClient.builder().target(shared.addr()).build();
        LockClient mc = LockClient.builder().targets(a.addr(), b.addr()).build();
        LockClient lb = LockClient.builder().target(b.addr()).build();
        LockClient ls = LockClient.builder().target(shared.addr()).build()) {
      Lease holder = hc.lock(key, OPTS);
      Waiter moved = new Waiter(mc, key);
      moved.place(1, -1);
      Ticket first = awaitTicket(key, t -> true, moved, Duration.ofSeconds(5), "the wait's ticket");
      assertEquals(1, tickets(key).size(), tickets(key).toString());
      List<Waiter> later = new ArrayList<>();
      for (LockClient c : List.of(lb, ls)) { // one after the other: arrival order
        Waiter w = new Waiter(c, key);
        later.add(w);
        w.place(later.size() + 1, -1);
      }

      a.kill();
      long killed = System.nanoTime();
      Ticket again = awaitTicket(key,
          t -> t.session().equals(first.session()) && t.modifyIndex() != first.modifyIndex(), moved,
          Duration.ofSeconds(10), "the wait's ticket written again by B (same session)");
      Cluster.figure("a wait moved to B with its place after A was killed", (System.nanoTime() - killed) / 1e9);
      assertEquals(first.createIndex(), again.createIndex(), "the moved wait's ticket lost its place");

      holder.release();
      Lease lease = moved.granted();
      assertEquals(b.addr(), lease.target());
      assertEquals(first.session(), lease.sessionId(), "the moved wait was granted on another session");
      for (Waiter w : later) {
        assertFalse(w.lease.isDone(), "a later waiter was granted before the moved one");
      }
      lease.release();
      Lease next = later.get(0).granted();
      assertTrue(Long.compareUnsigned(next.token(), lease.token()) > 0);
    }
  }

  /**
   * movedWaitKeepsItsPlace with a slot of a limit-1 semaphore: the moved
   * wait resumes on B with its session, its contender entry keeps its
   * place (same CreateIndex), it hears place 1 again, and it gets the slot
   * before the later waiters.
   */
  @Test
  void movedSemaphoreWaitKeepsItsPlace() throws Exception {
    String key = Cluster.key("sem-move");
    Broker shared = Cluster.get().broker();
    try (Broker a = Cluster.get().newBroker("sem-move-a"); Broker b = Cluster.get().newBroker("sem-move-b");
        LockClient hc = LockClient.builder().target(shared.addr()).build();
        LockClient mc = LockClient.builder().targets(a.addr(), b.addr()).build();
        LockClient lb = LockClient.builder().target(b.addr()).build();
        LockClient ls = LockClient.builder().target(shared.addr()).build()) {
      Lease holder = hc.semaphore(key, 1, OPTS);
      Waiter moved = new Waiter(mc, key, 1);
      moved.place(1, -1);
      Ticket first = null;
      for (Ticket t : contenders(key)) {
        if (!t.session().equals(holder.sessionId())) {
          first = t;
        }
      }
      assertNotEquals(null, first, "the wait's contender entry: " + contenders(key));
      List<Waiter> later = new ArrayList<>();
      for (LockClient c : List.of(lb, ls)) { // one after the other: arrival order
        Waiter w = new Waiter(c, key, 1);
        later.add(w);
        w.place(later.size() + 1, -1);
      }

      a.kill();
      moved.heard.clear(); // what A said before it was killed
      moved.place(1, -1); // B says it once the wait moved
      String session = first.session();
      Ticket again = contenders(key).stream().filter(t -> t.session().equals(session)).findFirst().orElse(null);
      assertNotEquals(null, again, "the moved wait lost its contender entry");
      assertEquals(first.createIndex(), again.createIndex(), "the moved wait lost its place");

      holder.release();
      Lease lease = moved.granted();
      assertEquals(b.addr(), lease.target());
      assertEquals(session, lease.sessionId(), "the moved wait was granted on another session");
      for (Waiter w : later) {
        assertFalse(w.lease.isDone(), "a later waiter was granted before the moved one");
      }
      lease.release();
      Lease next = later.get(0).granted();
      assertTrue(Long.compareUnsigned(next.token(), lease.token()) > 0);
    }
  }

  /**
   * A wait whose session ended while its target was stopped cannot resume
   * its place on the next one (FAILED_PRECONDITION or NOT_FOUND): the
   * library sends its original request there, a fresh wait, which gets
   * the key when the holder lets go.
   */
  @Test
  void movedWaitWhosePlaceIsGoneWaitsAnew() throws Exception {
    String key = Cluster.key("queue-gone");
    try (Broker a = Cluster.get().newBroker("queue-gone-a"); Broker b = Cluster.get().newBroker("queue-gone-b");
        LockClient hc = LockClient.builder().target(Cluster.get().broker().addr()).build();
        LockClient mc = LockClient.builder().targets(a.addr(), b.addr()).build()) {
      Lease holder = hc.lock(key, OPTS);
      Waiter moved = new Waiter(mc, key);
      moved.place(1, -1);
      Ticket first = awaitTicket(key, t -> true, moved, Duration.ofSeconds(5), "the wait's ticket");
      a.stop();
      try {
        Cluster.get().consul().destroySession(first.session());
        // The wait moves after three heartbeats of silence, is refused its
        // place, and queues anew with another session.
        Ticket fresh = awaitTicket(key, t -> !t.session().equals(first.session()), moved,
            Duration.ofSeconds(15), "a fresh ticket");
        holder.release();
        Lease lease = moved.granted();
        assertEquals(b.addr(), lease.target());
        assertEquals(fresh.session(), lease.sessionId());
        assertNotEquals(first.session(), lease.sessionId());
      } finally {
        a.cont();
      }
    }
  }
}
