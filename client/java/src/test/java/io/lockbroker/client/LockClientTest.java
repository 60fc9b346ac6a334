package io.lockbroker.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.Server;
import io.grpc.ServerBuilder;
import io.grpc.stub.StreamObserver;
import io.lockbroker.testing.Broker;
import io.lockbroker.testing.Cluster;
import io.lockbroker.testing.Link;
import io.lockbroker.v1.AcquireLost;
import io.lockbroker.v1.AcquireQueued;
import io.lockbroker.v1.AcquireRequest;
import io.lockbroker.v1.AcquireResponse;
import io.lockbroker.v1.LockKind;
import io.lockbroker.v1.LockServiceGrpc;
import io.lockbroker.v1.LockState;
import io.lockbroker.v1.LostReason;
import io.lockbroker.v1.ReleaseRequest;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.function.BooleanSupplier;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/** The library's API beyond the conformance scenarios, against real processes. */
@Timeout(value = 90, unit = TimeUnit.SECONDS)
class LockClientTest {
  private static final Duration TTL = Duration.ofSeconds(10);
  /** How often a broker repeats `queued` to a waiter (internal/broker QueuedHeartbeat). */
  private static final Duration BROKER_HEARTBEAT = Duration.ofSeconds(2);

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

  @Test
  void badKeyIsInvalidArgumentNamingTheField() {
    try (LockClient c = shared()) {
      InvalidArgumentException e = assertThrows(InvalidArgumentException.class, () -> c.lock("/leading-slash"));
      assertEquals("INVALID_ARGUMENT", e.reason(), e.toString());
      assertTrue(e.fieldViolations().containsKey("key"), e.fieldViolations().toString());
      assertThrows(InvalidArgumentException.class,
          () -> c.lock(Cluster.key("ttl"), LockOptions.defaults().ttl(Duration.ofSeconds(1))));
    }
  }

  @Test
  void waiterGetsTheLockWhenTheHolderReleases() throws Exception {
    String key = Cluster.key("wait");
    try (LockClient c = shared(); LockClient other = shared()) {
      Lease first = c.lock(key);
      CompletableFuture<Lease> second = CompletableFuture.supplyAsync(() -> {
        try {
          return other.lock(key, LockOptions.defaults().value("second"));
        } catch (InterruptedException e) {
          throw new IllegalStateException(e);
        }
      });
      Thread.sleep(300);
      assertFalse(second.isDone(), "the waiter got a held lock");
      first.close();
      try (Lease l = second.get(10, TimeUnit.SECONDS)) {
        assertTrue(Long.compareUnsigned(l.token(), first.token()) > 0);
        assertEquals("second", other.election(key).leader().orElseThrow().getValue().toString(StandardCharsets.UTF_8));
      }
    }
  }

  @Test
  void interruptWithdrawsTheWait() throws Exception {
    String key = Cluster.key("interrupt");
    try (LockClient c = shared(); LockClient other = shared()) {
      Lease holder = c.lock(key);
      CompletableFuture<Throwable> outcome = new CompletableFuture<>();
      Thread waiter = new Thread(() -> {
        try {
          other.lock(key).close();
          outcome.complete(null);
        } catch (Throwable t) {
          outcome.complete(t);
        }
      });
      waiter.start();
      Thread.sleep(300);
      waiter.interrupt();
      assertTrue(outcome.get(5, TimeUnit.SECONDS) instanceof InterruptedException);
      holder.close();
      Thread.sleep(500); // a waiter that was not withdrawn would take the key now
      assertEquals(0, c.getLock(key).getHoldersCount(), "the interrupted waiter took the lock");
    }
  }

  @Test
  void semaphoreAdmitsUpToTheLimit() throws Exception {
    String prefix = Cluster.key("sem");
    try (LockClient c = shared()) {
      Lease a = c.semaphore(prefix, 2, LockOptions.defaults());
      Lease b = c.semaphore(prefix, 2, LockOptions.defaults());
      assertTrue(c.trySemaphore(prefix, 2, LockOptions.defaults()).isEmpty());
      LockState st = c.getLock(prefix);
      assertEquals(LockKind.LOCK_KIND_SEMAPHORE, st.getKind());
      assertEquals(2, st.getLimit());
      assertEquals(2, st.getHoldersCount());
      LockBrokerException conflict = assertThrows(LockBrokerException.class,
          () -> c.trySemaphore(prefix, 3, LockOptions.defaults()));
      assertEquals("LIMIT_CONFLICT", conflict.reason(), conflict.toString());
      a.close();
      Optional<Lease> third = c.trySemaphore(prefix, 2, LockOptions.defaults());
      assertTrue(third.isPresent());
      third.get().close();
      b.close();
    }
  }

  @Test
  void oneSlotSemaphoreIsASemaphore() throws Exception {
    String prefix = Cluster.key("sem1");
    try (LockClient c = shared(); Lease l = c.semaphore(prefix, 1, LockOptions.defaults())) {
      assertEquals(LockKind.LOCK_KIND_SEMAPHORE, l.sequencer().getKind());
      LockState st = c.getLock(prefix);
      assertEquals(LockKind.LOCK_KIND_SEMAPHORE, st.getKind(), st.toString());
      assertEquals(1, st.getLimit());
      assertTrue(c.trySemaphore(prefix, 1, LockOptions.defaults()).isEmpty());
    }
  }

  @Test
  void setValueKeepsTheToken() throws Exception {
    String key = Cluster.key("value");
    try (LockClient c = shared(); Lease l = c.lock(key, LockOptions.defaults().value("a"))) {
      l.setValue("b".getBytes(StandardCharsets.UTF_8));
      LockState st = c.getLock(key);
      assertEquals("b", st.getHolders(0).getValue().toString(StandardCharsets.UTF_8));
      assertEquals(l.token(), st.getHolders(0).getToken());
      assertTrue(c.checkSequencer(l.sequencer()));
    }
  }

  @Test
  @SuppressWarnings("deprecation")
  void leaderAndCheckSequencerFollowTheHold() throws Exception {
    String key = Cluster.key("leader");
    try (LockClient c = shared()) {
      assertTrue(c.leader(key).isEmpty());
      Lease l = c.lock(key, LockOptions.defaults().value("10.0.0.7:9000"));
      assertEquals("10.0.0.7:9000", c.leader(key).orElseThrow().getValue().toString(StandardCharsets.UTF_8));
      assertTrue(c.checkSequencer(l.sequencer()));
      l.close();
      assertFalse(c.checkSequencer(l.sequencer()));
      assertTrue(c.leader(key).isEmpty());
    }
  }

  @Test
  void electionCampaignsProclaimsObservesAndResigns() throws Exception {
    String key = Cluster.key("election");
    LockOptions opts = LockOptions.defaults().lockDelay(Duration.ZERO);
    try (LockClient c1 = shared(); LockClient c2 = shared()) {
      Election a = c1.election(key, opts);
      Election b = c2.election(key, opts);
      assertEquals(key, a.key());
      try (Election.Observer obs = c2.election(key).observe()) {
        assertTrue(obs.poll(Duration.ofSeconds(10)).isEmpty(), "nobody leads yet");
        assertTrue(a.leader().isEmpty());
        assertThrows(IllegalStateException.class, () -> a.proclaim("x"));
        assertFalse(a.resign(), "nothing to resign");
        assertFalse(a.hasLeadership());

        Lease leadA = a.campaign("alpha");
        assertTrue(a.hasLeadership());
        assertEquals("alpha", value(obs.poll(Duration.ofSeconds(10))));
        assertEquals(leadA.token(), b.leader().orElseThrow().getToken());
        a.proclaim("alpha-2");
        Optional<io.lockbroker.v1.Holder> proclaimed = obs.poll(Duration.ofSeconds(10));
        assertEquals("alpha-2", value(proclaimed));
        assertEquals(leadA.token(), proclaimed.orElseThrow().getToken(), "a proclamation keeps the token");

        CompletableFuture<Lease> bLeads = CompletableFuture.supplyAsync(() -> {
          try {
            return b.campaign("beta");
          } catch (InterruptedException e) {
            throw new RuntimeException(e);
          }
        });
        assertThrows(TimeoutException.class, () -> bLeads.get(300, TimeUnit.MILLISECONDS), "b leads while a does");
        assertTrue(a.resign());
        assertFalse(a.hasLeadership());
        Lease leadB = bLeads.get(10, TimeUnit.SECONDS);
        assertTrue(leadB.token() > leadA.token());
        Optional<io.lockbroker.v1.Holder> h = obs.poll(Duration.ofSeconds(10));
        if (h != null && h.isEmpty()) { // a's resignation, unless b took the key at once
          h = obs.poll(Duration.ofSeconds(10));
        }
        assertEquals("beta", value(h));
        b.close();
        assertTrue(obs.poll(Duration.ofSeconds(10)).isEmpty(), "b resigned: nobody leads");
      }
    }
  }

  private static String value(Optional<io.lockbroker.v1.Holder> h) {
    assertNotNull(h, "no leadership change within the timeout");
    return h.map(x -> x.getValue().toString(StandardCharsets.UTF_8)).orElse(null);
  }

  @Test
  void clientCloseReleasesItsLeases() throws Exception {
    String key = Cluster.key("close");
    try (LockClient observer = shared()) {
      LockClient c = shared();
      Lease l = c.lock(key);
      assertEquals(1, observer.getLock(key).getHoldersCount());
      c.close();
      assertTrue(l.isReleased());
      assertEquals(0, observer.getLock(key).getHoldersCount());
    }
  }

  @Test
  void releaseFromElsewhereIsALoss() throws Exception {
    String key = Cluster.key("released");
    ManagedChannel ch = ManagedChannelBuilder.forTarget(Cluster.get().broker().addr()).usePlaintext().build();
    try (LockClient c = shared()) {
      Lease l = c.lock(key);
      LockServiceGrpc.newBlockingStub(ch).withDeadlineAfter(5, TimeUnit.SECONDS).release(
          ReleaseRequest.newBuilder().setKey(key).setSessionId(l.sessionId()).setToken(l.token()).build());
      assertTrue(l.awaitLost(Duration.ofSeconds(5)), "no loss after a Release from elsewhere");
      assertEquals(LockLostException.RELEASED, l.lostCause().orElseThrow().reason());
    } finally {
      ch.shutdownNow();
    }
  }

  @Test
  void stalledBrokerIsLeftForAnotherReplica() throws Exception {
    String key = Cluster.key("stall");
    try (Broker a = Cluster.get().newBroker("stall-a"); Broker b = Cluster.get().newBroker("stall-b");
        LockClient c = LockClient.builder().targets(a.addr(), b.addr()).build()) {
      Lease l = c.lock(key, LockOptions.defaults().ttl(TTL));
      assertEquals(a.addr(), l.target());
      long token = l.token();
      a.stop();
      try {
        long stopped = System.nanoTime();
        waitFor(() -> l.resumeCount() > 0 || l.isLost(), TTL, "resume on B");
        Cluster.figure("stalled broker left for another replica after", (System.nanoTime() - stopped) / 1e9);
        assertFalse(l.isLost(), String.valueOf(l.lostCause()));
        assertEquals(b.addr(), l.target());
        assertEquals(token, l.token());
      } finally {
        a.cont(); // its old stream now ends with RESUMED_ELSEWHERE, without touching the hold
      }
      long known = l.deadlineNanos();
      waitFor(() -> l.deadlineNanos() != known, TTL, "a keepalive from B");
      assertFalse(l.isLost(), String.valueOf(l.lostCause()));
      assertTrue(c.checkSequencer(l.sequencer()));
      l.release();
    }
  }

  /**
   * A request waiting on a replica that stops is moved to another after
   * three of the broker's heartbeats of silence, and gets the key there when
   * its holder lets go, instead of waiting on the stopped replica until its
   * caller gives up. When the stopped replica continues, the waiter it kept
   * (cancelled by the client) takes nothing from the one that moved.
   */
  @Test
  void stalledWaiterIsMovedToAnother() throws Exception {
    String key = Cluster.key("stalled-waiter");
    LockOptions opts = LockOptions.defaults().ttl(TTL).lockDelay(Duration.ZERO);
    try (Broker a = Cluster.get().newBroker("waiter-a"); Broker b = Cluster.get().newBroker("waiter-b");
        LockClient holderClient = LockClient.builder().target(b.addr()).build();
        LockClient waiterClient = LockClient.builder().targets(a.addr(), b.addr()).build()) {
      Lease holder = holderClient.lock(key, opts);
      CompletableFuture<Long> acquiredAt = new CompletableFuture<>();
      CompletableFuture<Lease> waiter = CompletableFuture.supplyAsync(() -> {
        try {
          Lease l = waiterClient.lock(key, opts);
          acquiredAt.complete(System.nanoTime());
          return l;
        } catch (InterruptedException e) {
          throw new IllegalStateException(e);
        }
      });
      Thread.sleep(500); // the waiter is queued on A (the holder's hold is the only one)
      assertFalse(waiter.isDone(), "the waiter did not wait: " + waiter);
      a.stop();
      long stopped = System.nanoTime();
      Lease moved;
      try {
        Thread.sleep(500);
        holder.release();
        try {
          moved = waiter.get(20, TimeUnit.SECONDS);
        } catch (TimeoutException e) {
          throw new AssertionError("the waiter was still waiting 20 s after the release", e);
        }
        double took = (acquiredAt.join() - stopped) / 1e9;
        Cluster.figure("waiter on a stopped broker got the key on another replica after", took);
        assertEquals(b.addr(), moved.target());
        assertTrue(took < 3 * BROKER_HEARTBEAT.toSeconds() + 3, "moved only after " + took + " s");
      } finally {
        a.cont();
      }
      Thread.sleep(2000); // A reads the cancel it was sent while stopped
      assertFalse(moved.isLost(), String.valueOf(moved.lostCause()));
      assertTrue(holderClient.checkSequencer(moved.sequencer()),
          "the moved waiter's hold did not survive A waking up");
      moved.release();
    }
  }

  /**
   * A watch open on a replica that stops hears nothing from it (a watch
   * hears from its broker only when the key changes, and a stopped broker
   * keeps its connection open): the channel's keepalive (a ping after 10 s
   * of silence, unanswered for 5 s) fails it UNAVAILABLE, and it goes on at
   * the next replica, where it sees the holder taken meanwhile.
   */
  @Test
  void watchOnStoppedBrokerMovesToAnother() throws Exception {
    String key = Cluster.key("stalled-watch");
    try (Broker a = Cluster.get().newBroker("watch-stall-a"); Broker b = Cluster.get().newBroker("watch-stall-b");
        LockClient watcher = LockClient.builder().targets(a.addr(), b.addr()).build();
        LockClient holderClient = LockClient.builder().target(b.addr()).build();
        LockWatch w = watcher.watch(key)) {
      LockState first = w.poll(Duration.ofSeconds(5));
      assertNotNull(first, "no first state from A");
      assertEquals(0, first.getHoldersCount(), first.toString());
      Lease holder;
      a.stop();
      try {
        long stopped = System.nanoTime();
        holder = holderClient.lock(key, LockOptions.defaults().ttl(TTL));
        Duration bound = Duration.ofSeconds(10 + 5 + 3); // keepalive time + its timeout + slack
        long end = stopped + bound.toNanos();
        List<LockState> seen = new ArrayList<>();
        while (true) {
          LockState s = w.poll(Duration.ofNanos(Math.max(1, end - System.nanoTime())));
          if (s == null) {
            fail("the watch did not show the holder within " + bound + " of stopping its broker; saw " + seen);
          }
          if (s.getHoldersCount() > 0) {
            double took = (System.nanoTime() - stopped) / 1e9;
            Cluster.figure("watch on a stopped broker showed the new holder through another replica after", took);
            assertEquals(holder.sessionId(), s.getHolders(0).getSessionId());
            break;
          }
          seen.add(s);
        }
      } finally {
        a.cont();
      }
      holder.release();
    }
  }

  @Test
  void brokerShutdownMovesTheHold() throws Exception {
    String key = Cluster.key("shutdown");
    try (Broker a = Cluster.get().newBroker("drain-a"); Broker b = Cluster.get().newBroker("drain-b");
        LockClient c = LockClient.builder().targets(a.addr(), b.addr()).build()) {
      Lease l = c.lock(key, LockOptions.defaults().ttl(TTL));
      assertEquals(a.addr(), l.target());
      a.proc().signal("TERM");
      waitFor(() -> l.resumeCount() > 0 || l.isLost(), TTL, "resume on B");
      assertFalse(l.isLost(), String.valueOf(l.lostCause()));
      assertEquals(b.addr(), l.target());
      assertTrue(a.proc().awaitExit(20), "broker A did not exit after SIGTERM");
      assertTrue(c.checkSequencer(l.sequencer()), "the hold did not survive the drain of A");
      l.release();
    }
  }

  @Test
  void drainWithNoOtherReplicaIsALossWhenTheDrainEnds() throws Exception {
    String key = Cluster.key("drain-alone");
    try (Broker a = Cluster.get().newBroker("drain-alone", "--drain-timeout", "2s");
        LockClient c = LockClient.builder().target(a.addr()).build(); LockClient observer = shared()) {
      Lease l = c.lock(key, LockOptions.defaults().ttl(TTL));
      long deadline = l.deadlineNanos();
      a.proc().signal("TERM");
      long t0 = System.nanoTime();
      assertTrue(l.awaitLost(TTL), "no loss after the only broker drained");
      Cluster.figure("loss reported after SIGTERM of the only broker (drain 2 s)", (System.nanoTime() - t0) / 1e9);
      assertTrue(System.nanoTime() < deadline, "the loss came after the deadline");
      assertEquals(LockLostException.KEEPALIVE_TIMEOUT, l.lostCause().orElseThrow().reason());
      assertTrue(a.proc().awaitExit(20), "broker did not exit after its drain");
      assertEquals(0, observer.getLock(key).getHoldersCount(), "the drained broker left the hold in Consul");
    }
  }

  @Test
  void watchMovesToAnotherReplica() throws Exception {
    String key = Cluster.key("watch");
    try (Broker a = Cluster.get().newBroker("watch-a");
        LockClient c = LockClient.builder().targets(a.addr(), Cluster.get().broker().addr()).build();
        LockClient holder = shared();
        LockWatch w = c.watch(key)) {
      LockState first = w.poll(Duration.ofSeconds(5));
      assertNotNull(first);
      assertEquals(0, first.getHoldersCount());
      a.kill();
      try (Lease l = holder.lock(key)) {
        long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        List<LockState> seen = new ArrayList<>();
        while (true) {
          LockState s = w.poll(Duration.ofNanos(Math.max(1, end - System.nanoTime())));
          if (s == null) {
            fail("no state with the holder after the watch's broker died; saw " + seen);
          }
          if (s.getHoldersCount() > 0) {
            assertEquals(l.sessionId(), s.getHolders(0).getSessionId());
            break;
          }
          seen.add(s);
        }
      }
    }
  }

  @Test
  void closedWatchEndsTheReader() throws Exception {
    try (LockClient c = shared()) {
      LockWatch w = c.watch(Cluster.key("closed-watch"));
      assertNotNull(w.next());
      w.close();
      LockBrokerException e = assertThrows(LockBrokerException.class, w::next);
      assertEquals(io.grpc.Status.Code.CANCELLED, e.code());
    }
  }

  @Test
  void unreachableTargetIsUnavailable() {
    String dead = "127.0.0.1:" + io.lockbroker.testing.Ports.free();
    try (LockClient c = LockClient.builder().target(dead).callTimeout(Duration.ofSeconds(2)).build()) {
      assertThrows(UnavailableException.class, () -> c.lock(Cluster.key("dead")));
      assertThrows(UnavailableException.class, () -> c.getLock(Cluster.key("dead")));
    }
  }

  @Test
  void firstTargetDownLocksThroughTheNext() throws Exception {
    String dead = "127.0.0.1:" + io.lockbroker.testing.Ports.free();
    try (LockClient c = LockClient.builder().targets(dead, Cluster.get().broker().addr()).build();
        Lease l = c.lock(Cluster.key("failover"))) {
      assertEquals(Cluster.get().broker().addr(), l.target());
    }
  }

  /**
   * A replica cut off from its Consul agent (its link refuses) answers
   * UNAVAILABLE with REPLICA_CUT_OFF, and a lock through it is taken on the
   * next target.
   */
  @Test
  void cutOffFirstTargetLocksThroughTheNext() throws Exception {
    String key = Cluster.key("cut-off");
    String next = Cluster.get().broker().addr();
    try (Link link = Link.open(Cluster.get().consul().httpAddr());
        Broker a = Cluster.get().newBrokerVia("cut-off", link.addr())) {
      link.cut();
      try (LockClient only = LockClient.builder().target(a.addr()).build()) {
        UnavailableException e = assertThrows(UnavailableException.class, () -> only.getLock(key));
        assertEquals("REPLICA_CUT_OFF", e.reason());
      }
      try (LockClient c = LockClient.builder().targets(a.addr(), next).build()) {
        long t0 = System.nanoTime();
        try (Lease l = c.lock(key)) {
          Cluster.figure("lock moved off a replica cut from Consul", (System.nanoTime() - t0) / 1e9);
          assertEquals(next, l.target());
        }
      }
    }
  }

  /**
   * A held lease whose replica is cut off from Consul (its link refuses) is
   * told {@code lost: REPLICA_CUT_OFF} once the replica counts as cut off
   * (no answer for 3 s), and resumes on the next replica, which renews the
   * session: the lease outlives the TTL counted from the cut. Taken for a
   * loss, it would end before that.
   */
  @Test
  void cutOffReplicaMovesTheHold() throws Exception {
    String key = Cluster.key("hold-cut-off");
    String next = Cluster.get().broker().addr();
    try (Link link = Link.open(Cluster.get().consul().httpAddr());
        Broker a = Cluster.get().newBrokerVia("hold-cut-off", link.addr());
        LockClient c = LockClient.builder().targets(a.addr(), next).build()) {
      Lease l = c.lock(key, LockOptions.defaults().ttl(TTL).lockDelay(Duration.ZERO));
      assertEquals(a.addr(), l.target());
      long token = l.sequencer().getToken();
      link.cut();
      long cut = System.nanoTime();
      waitFor(() -> l.resumeCount() > 0 || l.isLost(), TTL, "resume on the next replica");
      Cluster.figure("held lease moved off a replica cut from Consul", (System.nanoTime() - cut) / 1e9);
      assertFalse(l.isLost(), String.valueOf(l.lostCause()));
      assertEquals(next, l.target());
      long left = cut + TTL.plusSeconds(2).toNanos() - System.nanoTime();
      if (left > 0) {
        Thread.sleep(left / 1_000_000);
      }
      assertFalse(l.isLost(), String.valueOf(l.lostCause()));
      assertEquals(token, l.sequencer().getToken());
      assertTrue(c.checkSequencer(l.sequencer()), "the hold did not outlive the TTL from the cut");
      l.release();
    }
  }

  @Test
  void stalledFirstTargetIsLeftForTheNext() throws Exception {
    String key = Cluster.key("stalled-first");
    try (Broker a = Cluster.get().newBroker("stalled-first")) {
      a.stop();
      try (LockClient c = LockClient.builder().targets(a.addr(), Cluster.get().broker().addr())
          .callTimeout(Duration.ofSeconds(1)).build()) {
        try (Lease l = c.lock(key)) {
          assertEquals(Cluster.get().broker().addr(), l.target());
        }
        try (LockWatch w = c.watch(key)) {
          assertEquals(0, w.next().getHoldersCount());
        }
      } finally {
        a.cont();
      }
    }
  }

  /**
   * A broker says {@code lost} instead of {@code acquired} for a grant that
   * came after its session's safe deadline (a path only a stopped broker
   * process reaches): lock fails with SESSION_LOST naming the broker's
   * reason and detail.
   */
  @Test
  void lostBeforeTheGrantIsSessionLost() throws Exception {
    Server server = ServerBuilder.forPort(0).addService(new LockServiceGrpc.LockServiceImplBase() {
      @Override
      public void acquire(AcquireRequest req, StreamObserver<AcquireResponse> out) {
        out.onNext(AcquireResponse.newBuilder().setQueued(AcquireQueued.getDefaultInstance()).build());
        out.onNext(AcquireResponse.newBuilder().setLost(AcquireLost.newBuilder()
            .setReason(LostReason.LOST_REASON_RENEWAL_FAILED)
            .setDetail("the grant came after the session's safe deadline")).build());
        out.onCompleted();
      }
    }).build().start();
    try (LockClient c = LockClient.builder().target("127.0.0.1:" + server.getPort()).build()) {
      LockBrokerException e = assertThrows(LockBrokerException.class,
          () -> c.lock("k", LockOptions.defaults().waitTimeout(Duration.ofSeconds(5))));
      assertEquals("SESSION_LOST", e.reason(), e.toString());
      assertTrue(e.getMessage().contains("the stream ended with lost before the grant: RENEWAL_FAILED: "
          + "the grant came after the session's safe deadline"), e.getMessage());
    } finally {
      server.shutdownNow();
    }
  }
}
