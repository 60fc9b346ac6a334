package io.lockbroker.conformance;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import io.grpc.Status;
import io.lockbroker.client.Lease;
import io.lockbroker.client.LockBrokerException;
import io.lockbroker.client.LockClient;
import io.lockbroker.client.LockHeldException;
import io.lockbroker.client.LockLostException;
import io.lockbroker.client.LockOptions;
import io.lockbroker.client.LockWatch;
import io.lockbroker.client.PermissionDeniedException;
import io.lockbroker.client.UnavailableException;
import io.lockbroker.client.WaitTimeoutException;
import io.lockbroker.testing.Broker;
import io.lockbroker.testing.Cluster;
import io.lockbroker.testing.Pki;
import io.lockbroker.v1.Holder;
import io.lockbroker.v1.LockKind;
import io.lockbroker.v1.LockState;
import java.io.IOException;
import java.lang.reflect.Method;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.MessageDigest;
import java.security.SecureRandom;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.TreeSet;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.BooleanSupplier;
import java.util.function.Predicate;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.extension.ExtendWith;
import org.junit.jupiter.api.extension.ExtensionContext;
import org.junit.jupiter.api.extension.TestExecutionExceptionHandler;
import org.opentest4j.TestAbortedException;

/**
 * The conformance scenarios of test/conformance/scenarios.md, Java runner.
 * Each test is named after its scenario id ({@code s1_...}); {@link
 * #everyScenarioCovered()} checks that every id in the file has one. Real
 * processes only: a Consul dev agent and broker binaries.
 */
@Timeout(value = 120, unit = TimeUnit.SECONDS)
@ExtendWith(ConformanceTest.ScenariosMustRun.class)
class ConformanceTest {
  private static final Duration TTL = Duration.ofSeconds(10);

  private static LockClient client(String... targets) {
    return LockClient.builder().targets(targets).build();
  }

  private static LockClient shared() {
    return client(Cluster.get().broker().addr());
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

  private static double seconds(long nanos) {
    return nanos / 1e9;
  }

  private static Path repo() {
    return Path.of(System.getProperty("lockbroker.repo", "../.."));
  }

  @Test
  void everyScenarioCovered() throws IOException {
    Path file = repo().resolve("test/conformance/scenarios.md");
    Assumptions.assumeTrue(Files.exists(file), "no " + file + " in this checkout");
    Matcher m = Pattern.compile("(?m)^## (S\\d+)\\b").matcher(Files.readString(file));
    Set<String> ids = new TreeSet<>();
    while (m.find()) {
      ids.add(m.group(1));
    }
    assertFalse(ids.isEmpty(), "no scenario ids in " + file);
    Set<String> here = new TreeSet<>();
    for (Method method : ConformanceTest.class.getDeclaredMethods()) {
      Matcher t = Pattern.compile("^s(\\d+)_").matcher(method.getName());
      if (t.find() && method.isAnnotationPresent(Test.class)) {
        here.add("S" + t.group(1));
      }
    }
    ids.removeAll(here);
    assertTrue(ids.isEmpty(), "scenarios without a Java test: " + ids);
  }

  // ---------------------------------------------------------------- S1

  @Test
  void s1_lockReleaseBusyTimeout() throws Exception {
    String key = Cluster.key("s1");
    try (LockClient c = shared(); LockClient other = shared()) {
      Lease lease = c.lock(key, LockOptions.defaults().value("a"));
      assertNotEquals(0, lease.token());
      LockState st = other.getLock(key);
      assertEquals(1, st.getHoldersCount(), st.toString());
      assertEquals(lease.sessionId(), st.getHolders(0).getSessionId());
      assertEquals("a", st.getHolders(0).getValue().toString(StandardCharsets.UTF_8));

      Optional<Lease> busy = other.tryLock(key);
      busy.ifPresent(Lease::close);
      assertTrue(busy.isEmpty(), "tryLock of a held key returned a lease");
      LockHeldException held = assertThrows(LockHeldException.class,
          () -> other.lock(key, LockOptions.defaults().waitTimeout(Duration.ZERO)));
      assertEquals("LOCK_HELD", held.reason(), held.toString());
      assertTrue(sessions(held.holders()).contains(lease.sessionId()), held.toString());

      long t0 = System.nanoTime();
      WaitTimeoutException timeout = assertThrows(WaitTimeoutException.class,
          () -> other.lock(key, LockOptions.defaults().waitTimeout(Duration.ofSeconds(1))));
      double took = seconds(System.nanoTime() - t0);
      Cluster.figure("S1 bounded wait of 1 s timed out after", took);
      assertTrue(took >= 0.9 && took <= 10, "bounded wait of 1s ended after " + took + "s");
      assertEquals("WAIT_TIMEOUT", timeout.reason(), timeout.toString());
      assertTrue(sessions(timeout.holders()).contains(lease.sessionId()), timeout.toString());

      lease.release();
      assertTrue(lease.isReleased());
      assertFalse(lease.isLost());
      assertEquals(0, other.getLock(key).getHoldersCount());
      try (Lease again = other.lock(key, LockOptions.defaults().waitTimeout(Duration.ofSeconds(10)))) {
        assertTrue(Long.compareUnsigned(again.token(), lease.token()) > 0,
            "new grant token " + again.token() + " not above " + lease.token());
      }
    }
  }

  private static List<String> sessions(List<Holder> holders) {
    List<String> out = new ArrayList<>();
    holders.forEach(h -> out.add(h.getSessionId()));
    return out;
  }

  // ---------------------------------------------------------------- S2

  @Test
  void s2_lossWhenSessionDestroyed() throws Exception {
    String key = Cluster.key("s2");
    try (LockClient c = shared()) {
      Lease lease = c.lock(key, LockOptions.defaults().lockDelay(Duration.ZERO));
      CompletableFuture<Long> lostAt = new CompletableFuture<>();
      lease.onLost(() -> lostAt.complete(System.nanoTime()));
      long t0 = System.nanoTime();
      Cluster.get().consul().destroySession(lease.sessionId());
      long at = lostAt.get(10, TimeUnit.SECONDS);
      double latency = seconds(at - t0);
      Cluster.figure("S2 loss reported after the session destroy", latency);
      assertTrue(latency <= 1.0, "loss reported " + latency + "s after the destroy");
      LockLostException e = lease.lostCause().orElseThrow();
      assertTrue(Set.of("SESSION_INVALIDATED", "RELEASED_BY_OTHER", "DELETED_BY_OTHER").contains(e.reason()),
          e.toString());
      assertTrue(lease.isLost());
      assertThrows(LockLostException.class, lease::check);
      assertThrows(LockLostException.class, lease::release);
    }
  }

  // ---------------------------------------------------------------- S3

  @Test
  void s3_deadlineWithStoppedBroker() throws Exception {
    String key = Cluster.key("s3");
    try (Broker r = Cluster.get().newBroker("s3-stopped")) {
      try (LockClient c = client(r.addr())) {
        Lease lease = c.lock(key, LockOptions.defaults().ttl(TTL));
        long first = lease.deadlineNanos();
        waitFor(() -> lease.deadlineNanos() != first, Duration.ofSeconds(10), "a keepalive");
        CompletableFuture<Long> lostAt = new CompletableFuture<>();
        lease.onLost(() -> lostAt.complete(System.nanoTime()));
        r.stop();
        long stoppedAt = System.nanoTime();
        long known = lease.deadlineNanos();
        long reported = lostAt.get(known - System.nanoTime() + TimeUnit.SECONDS.toNanos(5), TimeUnit.NANOSECONDS);
        boolean sessionThere = Cluster.get().consul().sessionExists(lease.sessionId());
        double margin = seconds(known - reported);
        Cluster.figure("S3 loss reported before the deadline by", margin);
        Cluster.figure("S3 loss reported after SIGSTOP", seconds(reported - stoppedAt));
        LockLostException e = lease.lostCause().orElseThrow();
        assertEquals(LockLostException.KEEPALIVE_TIMEOUT, e.reason(), e.toString());
        assertEquals(known, lease.deadlineNanos(), "a keepalive arrived from a stopped broker");
        assertTrue(margin > 0 && margin <= 1.0, "loss reported " + margin + "s before the deadline");
        assertTrue(sessionThere, "the session was gone when the loss was reported: the guarantee was false");
      } finally {
        r.cont();
      }
    }
  }

  // ---------------------------------------------------------------- S4

  @Test
  void s4_resumeThenLossWithNoReplicaLeft() throws Exception {
    String key = Cluster.key("s4");
    try (Broker a = Cluster.get().newBroker("s4-a"); Broker b = Cluster.get().newBroker("s4-b");
        LockClient c = client(a.addr(), b.addr()); LockClient observer = client(b.addr())) {
      Lease lease = c.lock(key, LockOptions.defaults().ttl(TTL));
      assertEquals(a.addr(), lease.target());
      long token = lease.token();
      long known = lease.deadlineNanos();
      a.kill();
      long killed = System.nanoTime();
      waitFor(() -> lease.target().equals(b.addr()) && lease.resumeCount() > 0,
          Duration.ofNanos(Math.max(0, known - System.nanoTime())), "resume on B");
      Cluster.figure("S4 resumed on B after SIGKILL of A", seconds(System.nanoTime() - killed));
      assertFalse(lease.isLost(), String.valueOf(lease.lostCause()));
      assertEquals(token, lease.token());
      LockState st = observer.getLock(key);
      assertEquals(1, st.getHoldersCount(), st.toString());
      assertEquals(lease.sessionId(), st.getHolders(0).getSessionId());
      assertEquals(token, st.getHolders(0).getToken());
      waitFor(() -> lease.deadlineNanos() - known > TimeUnit.SECONDS.toNanos(1), Duration.ofSeconds(10),
          "keepalives from B");
      assertFalse(lease.isLost(), String.valueOf(lease.lostCause()));
      lease.check();

      CompletableFuture<Long> lostAt = new CompletableFuture<>();
      lease.onLost(() -> lostAt.complete(System.nanoTime()));
      b.kill();
      long known2 = lease.deadlineNanos();
      long reported = lostAt.get(known2 - System.nanoTime() + TimeUnit.SECONDS.toNanos(5), TimeUnit.NANOSECONDS);
      double margin = seconds(known2 - reported);
      Cluster.figure("S4 loss with no replica left, before the deadline by", margin);
      LockLostException e = lease.lostCause().orElseThrow();
      assertEquals(LockLostException.KEEPALIVE_TIMEOUT, e.reason(), e.toString());
      assertTrue(margin > 0 && margin <= 1.0, "loss reported " + margin + "s before the deadline");
    }
  }

  // ---------------------------------------------------------------- S5

  @Test
  void s5_semaphoreLimitAcrossProcesses() throws Exception {
    String key = Cluster.key("s5");
    String addr = Cluster.get().broker().addr();
    List<List<String>> commands = new ArrayList<>();
    commands.add(Cli.java(addr, key, 3, 60));
    commands.add(Cli.java(addr, key, 3, 60));
    if (Cli.pythonAvailable(repo())) {
      commands.add(Cli.python(repo(), addr, key, 3, 60));
    } else {
      commands.add(Cli.java(addr, key, 3, 60));
    }
    if (Cli.nodeAvailable(repo())) {
      commands.add(Cli.node(repo(), addr, key, 3, 60));
    } else {
      commands.add(Cli.java(addr, key, 3, 60));
    }
    AtomicInteger seenMax = new AtomicInteger();
    AtomicBoolean stop = new AtomicBoolean();
    List<Cli> clis = new ArrayList<>();
    try (LockClient c = shared(); LockWatch w = c.watch(key)) {
      Thread observer = new Thread(() -> {
        try {
          while (!stop.get()) {
            LockState s = w.poll(Duration.ofMillis(200));
            if (s != null) {
              seenMax.accumulateAndGet(s.getHoldersCount(), Math::max);
            }
          }
        } catch (InterruptedException | RuntimeException e) {
          // the watch closes at the end
        }
      });
      observer.setDaemon(true);
      observer.start();
      try {
        for (List<String> cmd : commands) {
          clis.add(Cli.start(cmd, repo()));
        }
        waitFor(() -> clis.stream().filter(x -> x.has("acquired")).count() == 3, Duration.ofSeconds(60),
            "three holders");
        Thread.sleep(1000); // the fourth keeps waiting while the three hold
        List<Cli> holding = new ArrayList<>();
        List<Cli> waiting = new ArrayList<>();
        for (Cli x : clis) {
          (x.has("acquired") ? holding : waiting).add(x);
        }
        assertEquals(3, holding.size(), clis.toString());
        assertEquals(1, waiting.size(), clis.toString());
        assertEquals(3, c.getLock(key).getHoldersCount());
        holding.get(0).release();
        holding.get(0).await("released", Duration.ofSeconds(15));
        waiting.get(0).await("acquired", Duration.ofSeconds(15));
        assertEquals(3, c.getLock(key).getHoldersCount());
      } finally {
        stop.set(true);
        for (Cli x : clis) {
          x.close();
        }
        observer.join(5000);
      }
    }
    assertTrue(seenMax.get() <= 3, "an observer saw " + seenMax.get() + " holders");
    Set<String> langs = new TreeSet<>();
    for (Cli x : clis) {
      x.first("acquired").ifPresent(ev -> langs.add(Cli.field(ev, "lang")));
    }
    System.out.println("FIGURE S5 languages holding: " + String.join(",", langs));
  }

  // ---------------------------------------------------------------- S6

  @Test
  void s6_watchHolderThenNone() throws Exception {
    String key = Cluster.key("s6");
    try (LockClient c = shared(); LockClient other = shared(); LockWatch w = c.watch(key)) {
      LockState first = until(w, s -> true);
      assertEquals(LockKind.LOCK_KIND_NONE, first.getKind(), first.toString());
      assertEquals(0, first.getHoldersCount());
      Lease lease = other.lock(key, LockOptions.defaults().value("w"));
      LockState held = until(w, s -> s.getHoldersCount() > 0);
      assertEquals(lease.sessionId(), held.getHolders(0).getSessionId());
      assertEquals("w", held.getHolders(0).getValue().toString(StandardCharsets.UTF_8));
      lease.release();
      LockState none = until(w, s -> s.getHoldersCount() == 0);
      assertEquals(0, none.getHoldersCount(), none.toString());
    }
  }

  private static LockState until(LockWatch w, Predicate<LockState> pred) throws InterruptedException {
    long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
    List<LockState> seen = new ArrayList<>();
    while (true) {
      long left = end - System.nanoTime();
      LockState s = left > 0 ? w.poll(Duration.ofNanos(left)) : null;
      if (s == null) {
        fail("no matching state within 5s; saw " + seen);
      }
      if (pred.test(s)) {
        return s;
      }
      seen.add(s);
    }
  }

  // ---------------------------------------------------------------- S7

  /**
   * S7's brokers, on the shared Consul: one serves TLS with a server
   * certificate of a CA made here, the other also requires a client
   * certificate of that CA. One tenants file: tenant payments (prefix
   * payments/) is the bearer token and cn:payments-api, the client
   * certificate's Common Name.
   */
  @Test
  void s7_tlsAndToken() throws Exception {
    Path dir = Files.createTempDirectory("lockbroker-java-s7-");
    try {
      Pki pki = Pki.make(dir, "payments-api");
      byte[] raw = new byte[32];
      new SecureRandom().nextBytes(raw);
      String token = HexFormat.of().formatHex(raw);
      String identity = "token-sha256:" + HexFormat.of().formatHex(
          MessageDigest.getInstance("SHA-256").digest(token.getBytes(StandardCharsets.UTF_8)));
      Path tenants = dir.resolve("tenants.yaml");
      Files.writeString(tenants, "tenants:\n  - name: payments\n"
          + "    identities: [\"" + identity + "\", \"cn:" + pki.clientCn + "\"]\n"
          + "    prefixes: [\"payments/\"]\n");
      List<String> flags = List.of("--tls-cert", pki.serverCert.toString(), "--tls-key", pki.serverKey.toString(),
          "--tenants", tenants.toString());
      List<String> mtlsFlags = new ArrayList<>(flags);
      mtlsFlags.addAll(List.of("--tls-client-ca", pki.ca.toString()));
      try (Broker tls = Cluster.get().newBroker("s7-tls", flags.toArray(new String[0]));
           Broker mtls = Cluster.get().newBroker("s7-mtls", mtlsFlags.toArray(new String[0]))) {
        s7(pki, token, tls.addr(), mtls.addr());
      }
    } finally {
      try (var files = Files.walk(dir)) {
        files.sorted(Comparator.reverseOrder()).forEach(f -> f.toFile().delete());
      }
    }
  }

  private static void s7(Pki pki, String token, String tls, String mtls) throws Exception {
    String tag = UUID.randomUUID().toString().substring(0, 8);
    String key = "payments/java/" + tag;
    String outside = "orders/java/" + tag;
    LockOptions opts = LockOptions.defaults().value("s7").waitTimeout(Duration.ofSeconds(5));

    // TLS with the CA and the token; mTLS with the token; mTLS alone (the
    // certificate's cn:payments-api is the identity): lock and release.
    List<Map.Entry<String, LockClient.Builder>> setups = List.of(
        Map.entry("TLS and token", LockClient.builder().target(tls).tls(pki.ca).token(token)),
        Map.entry("mTLS and token",
            LockClient.builder().target(mtls).tls(pki.ca, pki.clientCert, pki.clientKey).token(token)),
        Map.entry("mTLS without token", LockClient.builder().target(mtls).tls(pki.ca, pki.clientCert, pki.clientKey)));
    long last = 0;
    for (Map.Entry<String, LockClient.Builder> setup : setups) {
      String what = setup.getKey();
      try (LockClient c = setup.getValue().build()) {
        long t0 = System.nanoTime();
        Lease lease = c.lock(key, opts);
        Cluster.figure("S7 lock over " + what, seconds(System.nanoTime() - t0));
        assertTrue(Long.compareUnsigned(lease.token(), last) > 0, what + ": token " + lease.token());
        last = lease.token();
        LockState st = c.getLock(key);
        assertEquals(1, st.getHoldersCount(), what + ": " + st);
        assertEquals(lease.sessionId(), st.getHolders(0).getSessionId(), what);
        assertEquals("s7", st.getHolders(0).getValue().toString(StandardCharsets.UTF_8), what);
        lease.release();
        assertTrue(lease.isReleased(), what);
        assertFalse(lease.isLost(), what);
        assertEquals(0, c.getLock(key).getHoldersCount(), what);

        // A key outside the tenant's prefixes: PERMISSION_DENIED naming it.
        PermissionDeniedException denied = assertThrows(PermissionDeniedException.class, () -> c.lock(outside, opts));
        assertEquals(Status.Code.PERMISSION_DENIED, denied.code(), what + ": " + denied);
        assertEquals("PERMISSION_DENIED", denied.reason(), what + ": " + denied);
        assertTrue(denied.getMessage().contains(outside), what + ": " + denied);
        assertEquals(outside, denied.metadata().get("key"), what + ": " + denied);
      }
    }

    // TLS without a token (and without a certificate), or with a token the
    // tenants file does not know: UNAUTHENTICATED (Java's
    // PermissionDeniedException with that code and reason).
    for (String[] c : new String[][] {{"no token", null}, {"an unknown token", "not-" + token}}) {
      try (LockClient client = LockClient.builder().target(tls).tls(pki.ca).token(c[1]).build()) {
        PermissionDeniedException unauth = assertThrows(PermissionDeniedException.class, () -> client.lock(key, opts));
        assertEquals(Status.Code.UNAUTHENTICATED, unauth.code(), c[0] + ": " + unauth);
        assertEquals("UNAUTHENTICATED", unauth.reason(), c[0] + ": " + unauth);
        System.out.println("S7 with " + c[0] + ": " + unauth);
      }
    }

    // Without the CA (system roots), with another CA, in plaintext, or
    // without the client certificate mTLS asks for: no connection.
    List<Map.Entry<String, LockClient.Builder>> refused = List.of(
        Map.entry("system roots, not the CA", LockClient.builder().target(tls).tls().token(token)),
        Map.entry("another CA", LockClient.builder().target(tls).tls(pki.otherCa).token(token)),
        Map.entry("plaintext", LockClient.builder().target(tls).token(token)),
        Map.entry("mTLS without a client certificate", LockClient.builder().target(mtls).tls(pki.ca).token(token)));
    for (Map.Entry<String, LockClient.Builder> r : refused) {
      try (LockClient c = r.getValue().build()) {
        long t0 = System.nanoTime();
        UnavailableException e = assertThrows(UnavailableException.class, () -> c.lock(key, opts), r.getKey());
        Cluster.figure("S7 refused connection (" + r.getKey() + ") after", seconds(System.nanoTime() - t0));
        assertEquals(Status.Code.UNAVAILABLE, e.code(), r.getKey() + ": " + e);
        System.out.println("S7 with " + r.getKey() + ": " + e);
      }
    }
    try (LockClient c = LockClient.builder().target(tls).tls(pki.ca).token(token).build()) {
      assertEquals(0, c.getLock(key).getHoldersCount(), "nothing was held through a refused connection");
    }
  }

  // ---------------------------------------------------------------- S8

  @Test
  void s8_readWriteLock() throws Exception {
    String base = Cluster.key("s8");
    String key = base + "/k";
    String plain = base + "/l";
    LockOptions bounded = LockOptions.defaults().waitTimeout(Duration.ofSeconds(30));
    try (LockClient c1 = shared(); LockClient c2 = shared(); LockClient c3 = shared(); LockClient c4 = shared();
        LockClient observer = shared()) {
      // 1. Two readers at once.
      Lease r1 = c1.readLock(key, bounded.value("r1"));
      Lease r2 = c2.readLock(key, bounded.value("r2"));
      assertTrue(r1.isRead() && r2.isRead(), r1 + " " + r2);
      assertFalse(r1.isLost() || r2.isLost());
      LockState st = observer.getLock(key);
      assertEquals(LockKind.LOCK_KIND_RWLOCK, st.getKind(), st.toString());
      assertEquals(Set.of(r1.sessionId(), r2.sessionId()), new TreeSet<>(sessions(st.getHoldersList())), st.toString());
      for (Holder h : st.getHoldersList()) {
        assertTrue(h.getRead(), "a reader listed with read false: " + st);
      }
      assertTrue(Long.compareUnsigned(r2.token(), r1.token()) > 0,
          "second reader's token " + r2.token() + " not above the first's " + r1.token());

      // 2. A writer waits; a reader that arrives after it waits too.
      CompletableFuture<String> writerQueued = new CompletableFuture<>();
      CompletableFuture<Lease> writer = async(() -> c3.writeLock(key,
          bounded.value("w").onQueued(q -> writerQueued.complete(q.getSessionId()))));
      writerQueued.get(10, TimeUnit.SECONDS);
      CompletableFuture<String> readerQueued = new CompletableFuture<>();
      CompletableFuture<Lease> reader3 = async(() -> c4.readLock(key,
          bounded.value("r3").onQueued(q -> readerQueued.complete(q.getSessionId()))));
      String r3Session = readerQueued.get(10, TimeUnit.SECONDS);
      Thread.sleep(1000);
      assertFalse(writer.isDone(), "the writer was granted beside two readers: " + writer);
      assertFalse(reader3.isDone(), "a reader behind a queued writer was granted: " + reader3);
      st = observer.getLock(key);
      assertFalse(sessions(st.getHoldersList()).contains(r3Session), "the third reader holds: " + st);
      assertEquals(2, st.getHoldersCount(), st.toString());

      // 3. Readers release: the writer is granted, the third reader still waits.
      long t0 = System.nanoTime();
      r1.release();
      r2.release();
      Lease w = writer.get(10, TimeUnit.SECONDS);
      Cluster.figure("S8 writer granted after the readers released", seconds(System.nanoTime() - t0));
      assertFalse(w.isRead(), w.toString());
      assertTrue(Long.compareUnsigned(w.token(), r1.token()) > 0 && Long.compareUnsigned(w.token(), r2.token()) > 0,
          "writer token " + w.token() + " not above the readers' " + r1.token() + ", " + r2.token());
      Thread.sleep(500);
      assertFalse(reader3.isDone(), "the third reader was granted beside the writer");
      st = observer.getLock(key);
      assertEquals(1, st.getHoldersCount(), st.toString());
      assertEquals(w.sessionId(), st.getHolders(0).getSessionId(), st.toString());
      assertFalse(st.getHolders(0).getRead(), "the writer listed as a reader: " + st);
      w.release();
      Lease r3 = reader3.get(10, TimeUnit.SECONDS);
      assertEquals(r3Session, r3.sessionId(), "the third reader was granted with another session than it waited with");
      assertTrue(Long.compareUnsigned(r3.token(), w.token()) > 0,
          "third reader's token " + r3.token() + " not above the writer's " + w.token());
      assertTrue(r3.isRead());

      // 4. Kind conflicts, both ways; nothing changes in Consul.
      Lease plainLease = c1.lock(plain, bounded);
      String before = kv(base);
      LockBrokerException onRw = assertThrows(LockBrokerException.class, () -> {
        c2.tryLock(key).ifPresent(Lease::close);
      });
      assertKindConflict(onRw, LockKind.LOCK_KIND_RWLOCK, "RWLOCK");
      LockBrokerException onLock = assertThrows(LockBrokerException.class, () -> {
        c2.tryReadLock(plain).ifPresent(Lease::close);
      });
      assertKindConflict(onLock, LockKind.LOCK_KIND_LOCK, "LOCK");
      assertEquals(before, kv(base), "a refused request changed the keys in Consul");
      assertFalse(r3.isLost() || plainLease.isLost());
      r3.release();
      plainLease.release();
    }
  }

  private static void assertKindConflict(LockBrokerException e, LockKind kind, String name) {
    System.out.println("S8 kind conflict: " + e.getMessage());
    assertEquals(Status.Code.FAILED_PRECONDITION, e.code(), e.toString());
    assertEquals("LIMIT_CONFLICT", e.reason(), e.toString());
    assertTrue(e.isKindConflict(), e.toString());
    boolean named = e.lockState().map(s -> s.getKind() == kind).orElse(false)
        || e.getMessage().toUpperCase(java.util.Locale.ROOT).contains(name);
    assertTrue(named, "the refusal does not name " + name + ": " + e + " state " + e.lockState());
  }

  /** Every Consul KV entry under prefix (the raw JSON), "" when none. */
  private static String kv(String prefix) throws IOException, InterruptedException {
    try {
      return Cluster.get().consul().call("GET", "/v1/kv/" + prefix + "/?recurse", null);
    } catch (IOException e) {
      if (e.getMessage().contains(": 404 ")) {
        return "";
      }
      throw e;
    }
  }

  interface Acquire {
    Lease get() throws Exception;
  }

  /** Runs a blocking acquire on its own thread. */
  private static CompletableFuture<Lease> async(Acquire a) {
    CompletableFuture<Lease> f = new CompletableFuture<>();
    Thread t = new Thread(() -> {
      try {
        f.complete(a.get());
      } catch (Throwable e) {
        f.completeExceptionally(e);
      }
    }, "s-acquire");
    t.setDaemon(true);
    t.start();
    return f;
  }

  // ---------------------------------------------------------------- S9

  @Test
  void s9_multiKeyLock() throws Exception {
    String base = Cluster.key("s9");
    String a = base + "/a";
    String b = base + "/b";
    String c = base + "/c";
    String d = base + "/d";
    LockOptions bounded = LockOptions.defaults().waitTimeout(Duration.ofSeconds(30)).lockDelay(Duration.ZERO);
    try (LockClient c1 = shared(); LockClient c2 = shared(); LockClient observer = shared()) {
      // 1. A, B, C as one: one session, one token per key in order.
      Lease first = c1.lockAll(List.of(a, b, c), bounded.value("first"));
      assertEquals(List.of(a, b, c), first.keys());
      assertEquals(3, first.tokens().size(), first.sequencers().toString());
      assertEquals(a, first.key());
      assertEquals(first.tokens().get(0).longValue(), first.token());
      for (int i = 0; i < 3; i++) {
        assertNotEquals(0L, first.tokens().get(i).longValue(), first.sequencers().toString());
        assertEquals(first.sessionId(), first.sequencers().get(i).getSessionId(), first.sequencers().toString());
        LockState st = observer.getLock(first.keys().get(i));
        assertEquals(1, st.getHoldersCount(), st.toString());
        assertEquals(first.sessionId(), st.getHolders(0).getSessionId(), st.toString());
        assertEquals(first.tokens().get(i).longValue(), st.getHolders(0).getToken(), st.toString());
      }

      // 2. B is busy for a second client; C+D waits, holding neither.
      LockHeldException busy = assertThrows(LockHeldException.class,
          () -> c2.lock(b, LockOptions.defaults().waitTimeout(Duration.ZERO)));
      assertEquals("LOCK_HELD", busy.reason(), busy.toString());
      assertTrue(sessions(busy.holders()).contains(first.sessionId()), busy.toString());
      CompletableFuture<String> queued = new CompletableFuture<>();
      CompletableFuture<Lease> second = async(() -> c2.lockAll(List.of(c, d),
          bounded.value("second").onQueued(q -> queued.complete(q.getSessionId()))));
      queued.get(10, TimeUnit.SECONDS);
      long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(1);
      while (System.nanoTime() < end) { // a waiting multi-key request never holds a subset
        LockState st = observer.getLock(d);
        assertEquals(0, st.getHoldersCount(), "D held while C+D waits: " + st);
        Thread.sleep(100);
      }
      assertFalse(second.isDone(), "C+D granted while C was held: " + second);

      // 3. Release the first: C and D together.
      long t0 = System.nanoTime();
      first.release();
      Lease l2 = second.get(10, TimeUnit.SECONDS);
      Cluster.figure("S9 C+D granted after the release of A+B+C", seconds(System.nanoTime() - t0));
      assertEquals(List.of(c, d), l2.keys());
      for (String k : List.of(a, b)) {
        assertEquals(0, observer.getLock(k).getHoldersCount(), k + " still held after the release");
      }
      for (int i = 0; i < 2; i++) {
        LockState st = observer.getLock(l2.keys().get(i));
        assertEquals(1, st.getHoldersCount(), st.toString());
        assertEquals(l2.sessionId(), st.getHolders(0).getSessionId(), st.toString());
        assertEquals(l2.tokens().get(i).longValue(), st.getHolders(0).getToken(), st.toString());
      }
      assertTrue(Long.compareUnsigned(l2.tokens().get(0), first.tokens().get(2)) > 0,
          "C's new token " + l2.tokens().get(0) + " not above its last " + first.tokens().get(2));

      // 4. D deleted behind the broker's back: the whole lease is lost, naming D.
      CompletableFuture<Long> lostAt = new CompletableFuture<>();
      l2.onLost(() -> lostAt.complete(System.nanoTime()));
      long del = System.nanoTime();
      Cluster.get().consul().call("DELETE", "/v1/kv/" + d, null);
      long at = lostAt.get(10, TimeUnit.SECONDS);
      double latency = seconds(at - del);
      Cluster.figure("S9 loss reported after the delete of D", latency);
      LockLostException e = l2.lostCause().orElseThrow();
      System.out.println("S9 loss: " + e.getMessage());
      assertTrue(latency <= 1.0, "loss reported " + latency + "s after the delete");
      assertEquals(Optional.of(d), l2.lostKey(), e.toString());
      assertEquals(d, e.key());
      waitFor(() -> observer.getLock(c).getHoldersCount() == 0, Duration.ofSeconds(5), "C released after D's loss");
      assertThrows(LockLostException.class, l2::release);
    }
  }

  // ---------------------------------------------------------------- S10

  /**
   * S10 is the Go runner's (every language's CLI at once); here the Java
   * CLI alone, in separate processes: readers share, no writer overlaps
   * anyone, writers' tokens increase, and a multi-key hold prints one token
   * per key. A holder's belief interval runs, as in the Go runner, from its
   * {@code acquired} line's {@code t} to when the test asked it to release
   * (closed its stdin): never wider than the truth.
   */
  @Test
  void s10_readWriteAcrossProcesses() throws Exception {
    String key = Cluster.key("s10");
    String addr = Cluster.get().broker().addr();
    List<Cli> writers = new ArrayList<>();
    List<Cli> all = new ArrayList<>();
    Map<Cli, Double> asked = new java.util.HashMap<>();
    try (LockClient c = shared()) {
      for (int i = 0; i < 2; i++) {
        all.add(Cli.start(Cli.javaHold(addr, key, "--mode", "read", "--seconds", "60", "--wait", "60"), repo()));
      }
      for (Cli r : all) {
        r.await("acquired", Duration.ofSeconds(60));
      }
      for (int i = 0; i < 2; i++) {
        writers.add(Cli.start(Cli.javaHold(addr, key, "--mode", "write", "--seconds", "60", "--wait", "60"), repo()));
      }
      all.addAll(writers);
      all.add(Cli.start(Cli.javaHold(addr, key, "--mode", "read", "--seconds", "60", "--wait", "60"), repo()));
      Thread.sleep(2000); // the writers and the third reader arrive and wait
      // Each holder is asked to release 0.5 s after its acquired line was
      // seen (the first two readers now), until every CLI has exited.
      Map<Cli, Long> seen = new java.util.HashMap<>();
      long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(60);
      while (!all.stream().allMatch(x -> x.has("exit"))) {
        if (System.nanoTime() > end) {
          fail("the holders did not all finish within 60 s: " + all);
        }
        for (Cli x : all) {
          if (!x.has("acquired") || asked.containsKey(x)) {
            continue;
          }
          seen.putIfAbsent(x, System.nanoTime());
          boolean firstReaders = all.indexOf(x) < 2;
          if (firstReaders || System.nanoTime() - seen.get(x) > TimeUnit.MILLISECONDS.toNanos(500)) {
            asked.put(x, System.currentTimeMillis() / 1000.0);
            x.release();
          }
        }
        Thread.sleep(20);
      }
      // [acquired t, asked to release at, token, writer?]
      List<double[]> intervals = new ArrayList<>();
      for (Cli x : all) {
        String acq = x.first("acquired").orElseThrow(() -> new AssertionError("never acquired: " + x));
        x.first("released").orElseThrow(() -> new AssertionError("no released: " + x));
        boolean writer = writers.contains(x);
        assertEquals(writer ? "write" : "read", Cli.field(acq, "mode"), acq);
        String rel = x.first("released").orElseThrow();
        double releaseT = Cli.number(rel, "release_t");
        assertFalse(Double.isNaN(releaseT), "no release_t on " + rel);
        assertTrue(releaseT >= asked.get(x) - 0.01, "release_t " + releaseT + " before the test asked at " + asked.get(x));
        intervals.add(new double[] {Cli.number(acq, "t"), asked.get(x), Cli.unsigned(acq, "token"), writer ? 1 : 0});
      }
      double t0 = intervals.stream().mapToDouble(x -> x[0]).min().orElse(0);
      for (double[] x : intervals) {
        System.out.printf("S10 %s token %d held from %.3f s to %.3f s%n", x[3] == 1 ? "writer" : "reader",
            (long) x[2], x[0] - t0, x[1] - t0);
      }
      int readerOverlaps = 0;
      for (int i = 0; i < intervals.size(); i++) {
        for (int j = i + 1; j < intervals.size(); j++) {
          double[] x = intervals.get(i);
          double[] y = intervals.get(j);
          boolean overlap = x[0] < y[1] && y[0] < x[1];
          if (overlap && (x[3] == 1 || y[3] == 1)) {
            fail("a writer's interval overlaps another holder's: " + all + "\nasked to release: " + asked);
          }
          if (overlap) {
            readerOverlaps++;
          }
        }
      }
      assertTrue(readerOverlaps >= 1, "no two readers' intervals overlap: " + all);
      List<double[]> ws = new ArrayList<>();
      for (double[] x : intervals) {
        if (x[3] == 1) {
          ws.add(x);
        }
      }
      ws.sort(Comparator.comparingDouble(x -> x[0]));
      for (int i = 1; i < ws.size(); i++) {
        assertTrue(ws.get(i)[2] > ws.get(i - 1)[2], "writers' tokens do not increase: " + all);
      }
      assertEquals(0, c.getLock(key).getHoldersCount());

      // A multi-key hold: "tokens", one per key in order, as GetLock shows them.
      String base = Cluster.key("s10-multi");
      Cli multi = Cli.start(Cli.javaHold(addr, base + "/a", "--also", base + "/b", "--also", base + "/c",
          "--seconds", "30"), repo());
      all.add(multi);
      String acq = multi.await("acquired", Duration.ofSeconds(60));
      List<Long> tokens = Cli.unsignedList(acq, "tokens");
      assertEquals(3, tokens.size(), acq);
      assertEquals("lock", Cli.field(acq, "mode"), acq);
      List<String> keys = List.of(base + "/a", base + "/b", base + "/c");
      for (int i = 0; i < 3; i++) {
        LockState st = c.getLock(keys.get(i));
        assertEquals(1, st.getHoldersCount(), st.toString());
        assertEquals(Cli.field(acq, "session_id"), st.getHolders(0).getSessionId(), st.toString());
        assertEquals(tokens.get(i).longValue(), st.getHolders(0).getToken(), st.toString());
      }
      multi.release();
      multi.await("released", Duration.ofSeconds(15));
      for (String k : keys) {
        assertEquals(0, c.getLock(k).getHoldersCount(), k + " held after the CLI released");
      }
    } finally {
      for (Cli x : all) {
        x.close();
      }
    }
  }

  /**
   * Every scenario runs: a scenario test that skips (an assumption, an
   * abort) fails with the reason instead.
   */
  static final class ScenariosMustRun implements TestExecutionExceptionHandler {
    @Override
    public void handleTestExecutionException(ExtensionContext ctx, Throwable t) throws Throwable {
      String name = ctx.getRequiredTestMethod().getName();
      if (t instanceof TestAbortedException && name.matches("s\\d+_.*")) {
        throw new AssertionError(name + " must run, not skip: " + t.getMessage(), t);
      }
      throw t;
    }
  }
}
