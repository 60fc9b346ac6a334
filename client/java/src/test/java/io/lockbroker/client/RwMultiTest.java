package io.lockbroker.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.lockbroker.testing.Broker;
import io.lockbroker.testing.Cluster;
import io.lockbroker.v1.Holder;
import io.lockbroker.v1.LockKind;
import io.lockbroker.v1.LockServiceGrpc;
import io.lockbroker.v1.LockState;
import io.lockbroker.v1.ReleaseRequest;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Optional;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/**
 * Read-write and multi-key leases beyond the conformance scenarios (S8,
 * S9): resume on another replica keeping the kind and every key, try
 * variants, release from elsewhere, bad input. Real Consul and brokers.
 */
@Timeout(value = 90, unit = TimeUnit.SECONDS)
class RwMultiTest {
  private static final Duration TTL = Duration.ofSeconds(10);
  private static final LockOptions BOUNDED = LockOptions.defaults().ttl(TTL).waitTimeout(Duration.ofSeconds(20));

  private static LockClient shared() {
    return LockClient.builder().target(Cluster.get().broker().addr()).build();
  }

  private static void waitFor(BooleanSupplier cond, Duration timeout, String what) throws InterruptedException {
    long end = System.nanoTime() + timeout.toNanos();
    while (!cond.getAsBoolean()) {
      if (System.nanoTime() > end) {
        fail(what + ": not within " + timeout);
      }
      Thread.sleep(20);
    }
  }

  private static Holder holder(LockState st, String session) {
    for (Holder h : st.getHoldersList()) {
      if (h.getSessionId().equals(session)) {
        return h;
      }
    }
    throw new AssertionError("session " + session + " does not hold: " + st);
  }

  @Test
  void readLeaseResumesOnAnotherReplicaAsAReader() throws Exception {
    String key = Cluster.key("rw-resume-read");
    try (Broker a = Cluster.get().newBroker("rw-read-a"); Broker b = Cluster.get().newBroker("rw-read-b");
        LockClient c = LockClient.builder().targets(a.addr(), b.addr()).build(); LockClient other = shared()) {
      Lease r = c.readLock(key, BOUNDED);
      Lease r2 = other.readLock(key, BOUNDED);
      assertEquals(a.addr(), r.target());
      assertTrue(r.isRead());
      long token = r.token();
      a.kill();
      waitFor(() -> r.resumeCount() > 0 || r.isLost(), TTL, "resume on B");
      assertFalse(r.isLost(), String.valueOf(r.lostCause()));
      assertEquals(b.addr(), r.target());
      assertEquals(token, r.token());
      LockState st = other.getLock(key);
      assertEquals(LockKind.LOCK_KIND_RWLOCK, st.getKind(), st.toString());
      assertEquals(2, st.getHoldersCount(), st.toString());
      assertTrue(holder(st, r.sessionId()).getRead(), "resumed as a writer: " + st);
      assertEquals(token, holder(st, r.sessionId()).getToken(), st.toString());
      assertTrue(other.checkSequencer(r.sequencer()), "the resumed reader's sequencer is not current");
      assertTrue(r.sequencer().getRead() && r.sequencer().getKind() == LockKind.LOCK_KIND_RWLOCK, r.sequencer().toString());
      // Still a shared hold: another reader joins, a writer cannot.
      Optional<Lease> w = other.tryWriteLock(key, BOUNDED);
      w.ifPresent(Lease::close);
      assertTrue(w.isEmpty(), "a writer was granted beside resumed readers");
      Optional<Lease> r3 = other.tryReadLock(key, BOUNDED);
      assertTrue(r3.isPresent(), "a reader was refused beside resumed readers");
      r3.get().release();
      r.release();
      r2.release();
      assertEquals(0, other.getLock(key).getHoldersCount());
    }
  }

  @Test
  void writeLeaseResumesOnAnotherReplicaAsTheWriter() throws Exception {
    String key = Cluster.key("rw-resume-write");
    try (Broker a = Cluster.get().newBroker("rw-write-a"); Broker b = Cluster.get().newBroker("rw-write-b");
        LockClient c = LockClient.builder().targets(a.addr(), b.addr()).build(); LockClient other = shared()) {
      Lease w = c.writeLock(key, BOUNDED);
      assertFalse(w.isRead());
      long token = w.token();
      a.kill();
      waitFor(() -> w.resumeCount() > 0 || w.isLost(), TTL, "resume on B");
      assertFalse(w.isLost(), String.valueOf(w.lostCause()));
      assertEquals(token, w.token());
      LockState st = other.getLock(key);
      assertEquals(1, st.getHoldersCount(), st.toString());
      assertFalse(holder(st, w.sessionId()).getRead(), "resumed as a reader: " + st);
      Optional<Lease> r = other.tryReadLock(key, BOUNDED);
      r.ifPresent(Lease::close);
      assertTrue(r.isEmpty(), "a reader was granted beside the resumed writer");
      LockHeldException held = assertThrows(LockHeldException.class,
          () -> other.readLock(key, BOUNDED.waitTimeout(Duration.ZERO)));
      assertTrue(held.holders().stream().anyMatch(h -> h.getSessionId().equals(w.sessionId())), held.toString());
      w.release();
      try (Lease next = other.writeLock(key, BOUNDED)) {
        assertTrue(Long.compareUnsigned(next.token(), token) > 0, "next writer's token not above " + token);
      }
    }
  }

  /**
   * A reader waiting behind a writer on A moves to B when A is killed, and
   * is granted there as a reader (the moved wait keeps its kind), with the
   * session it waited with.
   */
  @Test
  void readWaitMovesToAnotherReplicaAsAReader() throws Exception {
    String key = Cluster.key("rw-wait-move");
    try (Broker a = Cluster.get().newBroker("rw-wait-a"); Broker b = Cluster.get().newBroker("rw-wait-b");
        LockClient c = LockClient.builder().targets(a.addr(), b.addr()).build(); LockClient other = shared()) {
      Lease w = other.writeLock(key, BOUNDED);
      java.util.concurrent.CompletableFuture<String> queued = new java.util.concurrent.CompletableFuture<>();
      java.util.concurrent.CompletableFuture<Void> heartbeat = new java.util.concurrent.CompletableFuture<>();
      java.util.concurrent.atomic.AtomicInteger beats = new java.util.concurrent.atomic.AtomicInteger();
      java.util.concurrent.CompletableFuture<Lease> reader = new java.util.concurrent.CompletableFuture<>();
      Thread t = new Thread(() -> {
        try {
          reader.complete(c.readLock(key, BOUNDED.waitTimeout(Duration.ofSeconds(30))
              .onQueued(q -> {
                queued.complete(q.getSessionId());
                if (beats.incrementAndGet() >= 2) {
                  heartbeat.complete(null);
                }
              })));
        } catch (Throwable e) {
          reader.completeExceptionally(e);
        }
      });
      t.setDaemon(true);
      t.start();
      String session = queued.get(10, TimeUnit.SECONDS);
      // A's broker writes the wait's record after its first queued (the
      // wait cannot move with its place before that: see the report); a
      // heartbeat later it has.
      heartbeat.get(10, TimeUnit.SECONDS);
      a.kill();
      Thread.sleep(1000); // the wait moves to B
      assertFalse(reader.isDone(), "the reader was granted beside the writer: " + reader);
      w.release();
      Lease r = reader.get(10, TimeUnit.SECONDS);
      assertEquals(b.addr(), r.target());
      boolean keptPlace = session.equals(r.sessionId());
      assertTrue(r.isRead(), r.toString());
      assertTrue(holder(other.getLock(key), r.sessionId()).getRead());
      Optional<Lease> r2 = other.tryReadLock(key, BOUNDED);
      assertTrue(r2.isPresent(), "a second reader was refused beside the moved reader");
      r2.get().release();
      r.release();
      assertTrue(keptPlace, "a read wait moved to another replica did not keep its place (a new session)");
    }
  }

  @Test
  void multiKeyLeaseResumesOnAnotherReplicaWithEveryKey() throws Exception {
    String base = Cluster.key("multi-resume");
    List<String> keys = List.of(base + "/x", base + "/y", base + "/z");
    try (Broker a = Cluster.get().newBroker("multi-a"); Broker b = Cluster.get().newBroker("multi-b");
        LockClient c = LockClient.builder().targets(a.addr(), b.addr()).build(); LockClient other = shared()) {
      Lease l = c.lockAll(keys, BOUNDED);
      assertEquals(keys, l.keys());
      List<Long> tokens = l.tokens();
      a.kill();
      waitFor(() -> l.resumeCount() > 0 || l.isLost(), TTL, "resume on B");
      assertFalse(l.isLost(), String.valueOf(l.lostCause()));
      assertEquals(tokens, l.tokens());
      for (int i = 0; i < keys.size(); i++) {
        LockState st = other.getLock(keys.get(i));
        assertEquals(1, st.getHoldersCount(), st.toString());
        assertEquals(tokens.get(i).longValue(), holder(st, l.sessionId()).getToken(), st.toString());
      }
      assertTrue(other.tryLock(keys.get(2)).isEmpty(), "the last key was free after the resume");
      for (io.lockbroker.v1.Sequencer seq : l.sequencers()) {
        assertTrue(other.checkSequencer(seq), "not current after the resume: " + seq);
      }
      waitFor(() -> l.deadlineNanos() - System.nanoTime() > TimeUnit.SECONDS.toNanos(7), TTL, "keepalives from B");
      l.release();
      for (String k : keys) {
        assertEquals(0, other.getLock(k).getHoldersCount(), k + " held after the release");
      }
      for (io.lockbroker.v1.Sequencer seq : l.sequencers()) {
        assertFalse(other.checkSequencer(seq), "still current after the release: " + seq);
      }
    }
  }

  /**
   * A multi-key request waiting on A (one of its keys held) moves to B when
   * A is killed, keeps its session, and is granted every key there
   * together: the moved wait carries its keys, and never holds a subset.
   */
  @Test
  void multiKeyWaitMovesToAnotherReplicaWithEveryKey() throws Exception {
    String base = Cluster.key("multi-wait-move");
    List<String> keys = List.of(base + "/x", base + "/y");
    try (Broker a = Cluster.get().newBroker("multi-wait-a"); Broker b = Cluster.get().newBroker("multi-wait-b");
        LockClient c = LockClient.builder().targets(a.addr(), b.addr()).build(); LockClient other = shared()) {
      Lease y = other.lock(keys.get(1), BOUNDED);
      java.util.concurrent.CompletableFuture<String> queued = new java.util.concurrent.CompletableFuture<>();
      java.util.concurrent.CompletableFuture<Void> heartbeat = new java.util.concurrent.CompletableFuture<>();
      java.util.concurrent.atomic.AtomicInteger beats = new java.util.concurrent.atomic.AtomicInteger();
      java.util.concurrent.CompletableFuture<Lease> waiting = new java.util.concurrent.CompletableFuture<>();
      Thread t = new Thread(() -> {
        try {
          waiting.complete(c.lockAll(keys, BOUNDED.waitTimeout(Duration.ofSeconds(30)).onQueued(q -> {
            queued.complete(q.getSessionId());
            if (beats.incrementAndGet() >= 2) {
              heartbeat.complete(null);
            }
          })));
        } catch (Throwable e) {
          waiting.completeExceptionally(e);
        }
      });
      t.setDaemon(true);
      t.start();
      String session = queued.get(10, TimeUnit.SECONDS);
      heartbeat.get(10, TimeUnit.SECONDS);
      a.kill();
      long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(1);
      while (System.nanoTime() < end) {
        assertEquals(0, other.getLock(keys.get(0)).getHoldersCount(), "x held while x+y waits");
        Thread.sleep(100);
      }
      assertFalse(waiting.isDone(), "x+y granted while y was held: " + waiting);
      y.release();
      Lease l = waiting.get(10, TimeUnit.SECONDS);
      assertEquals(b.addr(), l.target());
      assertEquals(keys, l.keys());
      boolean keptPlace = session.equals(l.sessionId());
      for (int i = 0; i < keys.size(); i++) {
        assertEquals(l.tokens().get(i).longValue(), holder(other.getLock(keys.get(i)), l.sessionId()).getToken());
      }
      l.release();
      assertTrue(keptPlace, "a multi-key wait moved to another replica did not keep its place (a new session)");
    }
  }

  /** A watch of a read-write lock shows its readers, then its writer, then no holder. */
  @Test
  void watchShowsTheReadersThenTheWriter() throws Exception {
    String key = Cluster.key("rw-watch");
    try (LockClient c = shared(); LockClient other = shared(); LockWatch w = c.watch(key)) {
      Lease r1 = other.readLock(key, BOUNDED);
      Lease r2 = c.readLock(key, BOUNDED);
      LockState readers = until(w, s -> s.getHoldersCount() == 2);
      assertEquals(LockKind.LOCK_KIND_RWLOCK, readers.getKind(), readers.toString());
      assertTrue(readers.getHoldersList().stream().allMatch(Holder::getRead), readers.toString());
      r1.release();
      r2.release();
      Lease wr = other.writeLock(key, BOUNDED);
      LockState writer = until(w, s -> s.getHoldersCount() == 1 && s.getHolders(0).getSessionId().equals(wr.sessionId()));
      assertFalse(writer.getHolders(0).getRead(), writer.toString());
      assertEquals(wr.token(), writer.getHolders(0).getToken(), writer.toString());
      wr.release();
      LockState none = until(w, s -> s.getHoldersCount() == 0);
      assertEquals(0, none.getHoldersCount());
    }
  }

  private static LockState until(LockWatch w, java.util.function.Predicate<LockState> pred) throws InterruptedException {
    long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
    List<LockState> seen = new ArrayList<>();
    while (true) {
      long left = end - System.nanoTime();
      LockState s = left > 0 ? w.poll(Duration.ofNanos(left)) : null;
      if (s == null) {
        fail("no matching state within 10 s; saw " + seen);
      }
      if (pred.test(s)) {
        return s;
      }
      seen.add(s);
    }
  }

  /** A multi-key lease whose broker drains (SIGTERM) moves whole to the next target. */
  @Test
  void multiKeyLeaseMovesWholeWhenItsBrokerDrains() throws Exception {
    String base = Cluster.key("multi-drain");
    List<String> keys = List.of(base + "/u", base + "/v");
    try (Broker a = Cluster.get().newBroker("multi-drain-a"); Broker b = Cluster.get().newBroker("multi-drain-b");
        LockClient c = LockClient.builder().targets(a.addr(), b.addr()).build(); LockClient other = shared()) {
      Lease l = c.lockAll(keys, BOUNDED);
      List<Long> tokens = l.tokens();
      a.proc().signal("TERM");
      waitFor(() -> l.resumeCount() > 0 || l.isLost(), TTL, "resume on B");
      assertFalse(l.isLost(), String.valueOf(l.lostCause()));
      assertEquals(b.addr(), l.target());
      assertEquals(tokens, l.tokens());
      assertTrue(a.proc().awaitExit(20), "broker A did not exit after SIGTERM");
      for (int i = 0; i < keys.size(); i++) {
        LockState st = other.getLock(keys.get(i));
        assertEquals(tokens.get(i).longValue(), holder(st, l.sessionId()).getToken(), st.toString());
        assertTrue(other.checkSequencer(l.sequencers().get(i)), "not current after the drain: " + keys.get(i));
      }
      l.release();
      for (String k : keys) {
        assertEquals(0, other.getLock(k).getHoldersCount(), k + " held after the release");
      }
    }
  }

  @Test
  void releaseOfOneKeyFromElsewhereEndsTheWholeLease() throws Exception {
    String base = Cluster.key("multi-released");
    List<String> keys = List.of(base + "/p", base + "/q");
    ManagedChannel ch = ManagedChannelBuilder.forTarget(Cluster.get().broker().addr()).usePlaintext().build();
    try (LockClient c = shared()) {
      Lease l = c.lockAll(keys, BOUNDED);
      LockServiceGrpc.newBlockingStub(ch).withDeadlineAfter(5, TimeUnit.SECONDS).release(
          ReleaseRequest.newBuilder().setKey(keys.get(1)).setSessionId(l.sessionId())
              .setToken(l.tokens().get(1)).build());
      assertTrue(l.awaitLost(Duration.ofSeconds(5)), "no loss after a Release from elsewhere");
      assertEquals(LockLostException.RELEASED, l.lostCause().orElseThrow().reason());
      for (String k : keys) {
        assertEquals(0, c.getLock(k).getHoldersCount(), k + " held after the Release of " + keys.get(1));
      }
    } finally {
      ch.shutdownNow();
    }
  }

  @Test
  void tryLockAllIsEmptyWhenAnyKeyIsHeldAndTakesNone() throws Exception {
    String base = Cluster.key("multi-try");
    try (LockClient c = shared(); LockClient other = shared()) {
      Lease held = c.lock(base + "/2", BOUNDED);
      Optional<Lease> all = other.tryLockAll(List.of(base + "/1", base + "/2", base + "/3"), BOUNDED);
      all.ifPresent(Lease::close);
      assertTrue(all.isEmpty(), "lockAll granted with a key held");
      for (String k : List.of(base + "/1", base + "/3")) {
        assertEquals(0, other.getLock(k).getHoldersCount(), k + " held by a refused lockAll");
      }
      LockHeldException e = assertThrows(LockHeldException.class,
          () -> other.lockAll(List.of(base + "/1", base + "/2"), BOUNDED.waitTimeout(Duration.ZERO)));
      assertEquals("LOCK_HELD", e.reason(), e.toString());
      held.release();
      try (Lease l = other.tryLockAll(List.of(base + "/1", base + "/2", base + "/3"), BOUNDED).orElseThrow()) {
        assertEquals(3, l.tokens().size());
        assertFalse(l.isRead());
      }
      try (Lease one = other.lockAll(List.of(base + "/solo"), BOUNDED)) { // one key: a plain lock
        assertEquals(List.of(base + "/solo"), one.keys());
        assertEquals(List.of(one.token()), one.tokens());
      }
    }
  }

  @Test
  void badKeysAreRefusedAndNothingIsHeld() throws Exception {
    String base = Cluster.key("multi-bad");
    try (LockClient c = shared()) {
      assertThrows(IllegalArgumentException.class, () -> c.lockAll(List.of()));
      assertThrows(NullPointerException.class, () -> c.lockAll(Arrays.asList(base + "/a", null)));
      InvalidArgumentException dup = assertThrows(InvalidArgumentException.class,
          () -> c.lockAll(List.of(base + "/a", base + "/b", base + "/b"), BOUNDED));
      assertTrue(dup.fieldViolations().keySet().stream().anyMatch(f -> f.startsWith("keys")),
          "no violation names keys: " + dup);
      InvalidArgumentException bad = assertThrows(InvalidArgumentException.class,
          () -> c.lockAll(List.of(base + "/a", "/leading-slash"), BOUNDED));
      assertTrue(bad.fieldViolations().keySet().stream().anyMatch(f -> f.startsWith("keys")),
          "no violation names keys: " + bad);
      List<String> many = new ArrayList<>();
      for (int i = 0; i < 65; i++) {
        many.add(base + "/m" + i);
      }
      InvalidArgumentException tooMany = assertThrows(InvalidArgumentException.class, () -> c.lockAll(many, BOUNDED));
      assertTrue(tooMany.fieldViolations().keySet().stream().anyMatch(f -> f.startsWith("keys")),
          "no violation names keys: " + tooMany);
      for (String k : List.of(base + "/a", base + "/b", base + "/m0")) {
        assertEquals(0, c.getLock(k).getHoldersCount(), k + " held after a refused request");
      }
    }
  }
}
