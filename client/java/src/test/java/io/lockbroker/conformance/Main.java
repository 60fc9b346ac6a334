package io.lockbroker.conformance;

import io.lockbroker.client.Lease;
import io.lockbroker.client.LockBrokerException;
import io.lockbroker.client.LockClient;
import io.lockbroker.client.LockLostException;
import io.lockbroker.client.LockOptions;
import io.lockbroker.client.LockWatch;
import io.lockbroker.v1.Holder;
import io.lockbroker.v1.LockState;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

/**
 * A small CLI over the Java library, for cross-language conformance runs
 * (test/conformance/scenarios.md, S5) and for trying a deployment by hand:
 *
 * <pre>
 * java -cp "$(make -s -C client/java classpath)" io.lockbroker.conformance.Main \
 *     hold --target 127.0.0.1:8700 --key jobs/x [--limit 3] [--mode read|write] [--also K2 ...]
 *          [--seconds 30] [--ttl 10] [--wait 5] [--value v]
 * java -cp ... io.lockbroker.conformance.Main watch --target 127.0.0.1:8700 --key jobs/x [--prefix] [--seconds 30]
 * </pre>
 *
 * <p>{@code hold} takes a lock ({@code --limit 0}, the default) or a
 * semaphore slot ({@code --limit N}), a read or write hold of a read-write
 * lock ({@code --mode read|write}) or, with {@code --also K} (repeatable),
 * the locks of --key and every --also key as one; holds it for --seconds (or until stdin closes or SIGTERM),
 * releases it, and prints JSON lines: {@code {"event":"acquired",...}} (with
 * {@code "mode"}: read, write, lock or semaphore, and for a multi-key lock
 * {@code "tokens":[...]}, one per key in order), then
 * {@code {"event":"released","release_t":R}} (R: when it started to let go,
 * Unix seconds) or {@code {"event":"lost","reason":...}}
 * (exit 2); failures print {@code {"event":"error",...}} and exit 1.
 * {@code --target} may repeat (replicas). {@code watch} prints
 * {@code {"event":"state",...}} per state.
 */
public final class Main {
  private Main() {}

  public static void main(String[] args) throws Exception {
    System.exit(run(args));
  }

  static int run(String[] args) throws Exception {
    if (args.length == 0 || !(args[0].equals("hold") || args[0].equals("watch"))) {
      System.err.println("usage: Main hold|watch --target ADDR [--target ADDR...] --key K [options]");
      return 2;
    }
    Map<String, String> opts = new LinkedHashMap<>();
    List<String> targets = new ArrayList<>();
    List<String> also = new ArrayList<>();
    boolean prefix = false;
    for (int i = 1; i < args.length; i++) {
      String a = args[i];
      if (a.equals("--prefix")) {
        prefix = true;
        continue;
      }
      if (!a.startsWith("--") || i + 1 >= args.length) {
        System.err.println("bad argument: " + a);
        return 2;
      }
      String v = args[++i];
      if (a.equals("--target")) {
        targets.add(v);
      } else if (a.equals("--also")) {
        also.add(v);
      } else {
        opts.put(a.substring(2), v);
      }
    }
    if (targets.isEmpty() || !opts.containsKey("key")) {
      System.err.println("--target and --key are required");
      return 2;
    }
    // LOCKBROKER_TRACEPARENT: the caller's W3C trace context for every call
    // (the trace test, test/conformance/go).
    String tp = System.getenv("LOCKBROKER_TRACEPARENT");
    // A broker's first answer to a read-write request follows its
    // check-and-set of the key, retried when other contenders arrive at
    // the same moment: on a loaded machine running many CLIs at once that
    // can take more than the default 5 s, which would fail the hold with
    // UNAVAILABLE.
    LockClient.Builder builder = LockClient.builder().targets(targets).callTimeout(Duration.ofSeconds(20));
    if (tp != null && !tp.isEmpty()) {
      builder.traceContext(() -> Map.of("traceparent", tp));
    }
    try (LockClient client = builder.build()) {
      return args[0].equals("hold") ? hold(client, opts, also) : watch(client, opts, prefix);
    }
  }

  private static Duration seconds(String s) {
    return Duration.ofNanos((long) (Double.parseDouble(s) * 1e9));
  }

  private static int hold(LockClient client, Map<String, String> opts, List<String> also) throws Exception {
    String key = opts.get("key");
    int limit = Integer.parseInt(opts.getOrDefault("limit", "0"));
    String mode = opts.getOrDefault("mode", limit > 0 ? "semaphore" : "lock");
    if (!List.of("read", "write", "lock", "semaphore").contains(mode)
        || (mode.equals("semaphore") != (limit > 0))
        || (!also.isEmpty() && !mode.equals("lock"))) {
      System.err.println("--mode is read, write or lock (or semaphore with --limit N > 0); "
          + "--also takes locks only, not with --limit or --mode read|write");
      return 2;
    }
    LockOptions o = LockOptions.defaults().value(opts.getOrDefault("value", ""));
    if (opts.containsKey("ttl")) {
      o = o.ttl(seconds(opts.get("ttl")));
    }
    if (opts.containsKey("wait")) {
      o = o.waitTimeout(seconds(opts.get("wait")));
    }
    Lease lease;
    try {
      switch (mode) {
        case "read":
          lease = client.readLock(key, o);
          break;
        case "write":
          lease = client.writeLock(key, o);
          break;
        case "semaphore":
          lease = client.semaphore(key, limit, o);
          break;
        default:
          if (also.isEmpty()) {
            lease = client.lock(key, o);
          } else {
            List<String> keys = new ArrayList<>();
            keys.add(key);
            keys.addAll(also);
            lease = client.lockAll(keys, o);
          }
          break;
      }
    } catch (LockBrokerException e) {
      emit("event", "error", "error", e.getMessage(), "reason", e.reason(), "type", e.getClass().getSimpleName());
      return 1;
    }
    String acquired = json("event", "acquired", "key", key, "token", lease.token(), "session_id",
        lease.sessionId(), "mode", mode, "deadline_in", lease.timeLeft().toMillis() / 1000.0);
    if (also.isEmpty()) {
      emitRaw(acquired, null, null);
    } else {
      StringBuilder tokens = new StringBuilder("[");
      for (long t : lease.tokens()) {
        tokens.append(tokens.length() > 1 ? "," : "").append(Long.toUnsignedString(t));
      }
      emitRaw(acquired, "tokens", tokens.append(']').toString());
    }
    CountDownLatch stop = new CountDownLatch(1);
    CountDownLatch finished = new CountDownLatch(1);
    lease.onLost(stop::countDown);
    Thread stdin = new Thread(() -> {
      try {
        while (System.in.read(new byte[4096]) >= 0) {
          // discard
        }
      } catch (IOException e) {
        // closed
      }
      stop.countDown();
    }, "stdin");
    stdin.setDaemon(true);
    stdin.start();
    Runtime.getRuntime().addShutdownHook(new Thread(() -> { // SIGTERM: release first
      stop.countDown();
      try {
        finished.await(10, TimeUnit.SECONDS);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
    }));
    stop.await((long) (Double.parseDouble(opts.getOrDefault("seconds", "30")) * 1000), TimeUnit.MILLISECONDS);
    // When the CLI starts to let go: a belief interval ends here, inside
    // the hold (the next holder may print acquired before this one's
    // released line).
    double releaseT = System.currentTimeMillis() / 1000.0;
    try {
      if (lease.isLost()) {
        LockLostException e = lease.lostCause().orElseThrow();
        lease.close();
        emit("event", "lost", "reason", e.reason(), "key", e.key(), "detail", e.detail());
        return 2;
      }
      lease.release();
      emit("event", "released", "token", lease.token(), "mode", mode, "release_t", releaseT);
      return 0;
    } catch (LockLostException e) {
      emit("event", "lost", "reason", e.reason(), "key", e.key(), "detail", e.detail());
      return 2;
    } finally {
      finished.countDown();
    }
  }

  private static int watch(LockClient client, Map<String, String> opts, boolean prefix) throws Exception {
    long end = System.nanoTime() + seconds(opts.getOrDefault("seconds", "30")).toNanos();
    boolean snapshot = false;
    try (LockWatch w = prefix ? client.watchPrefix(opts.get("key")) : client.watch(opts.get("key"))) {
      while (true) {
        long left = end - System.nanoTime();
        if (left <= 0) {
          return 0;
        }
        LockState st = w.poll(Duration.ofNanos(left));
        if (prefix && !snapshot && w.snapshotComplete()) {
          snapshot = true;
          emit("event", "snapshot_complete");
        }
        if (st == null) {
          continue;
        }
        StringBuilder holders = new StringBuilder("[");
        for (Holder h : st.getHoldersList()) {
          if (holders.length() > 1) {
            holders.append(',');
          }
          holders.append(json("session_id", h.getSessionId(), "value",
              h.getValue().toString(StandardCharsets.UTF_8), "token", h.getToken()));
        }
        holders.append(']');
        emitRaw(json("event", "state", "key", st.getKey(), "kind",
            st.getKind().name().replaceFirst("^LOCK_KIND_", "").toLowerCase(Locale.ROOT), "limit",
            st.getLimit()), "holders", holders.toString());
      }
    } catch (LockBrokerException e) {
      emit("event", "error", "error", e.getMessage(), "reason", e.reason(), "type", e.getClass().getSimpleName());
      return 1;
    }
  }

  // ---------------------------------------------------------------- JSON lines

  private static synchronized void emit(Object... kv) {
    emitRaw(json(kv), null, null);
  }

  /** Prints obj (a JSON object) with lang, t and an optional raw field added. */
  private static synchronized void emitRaw(String obj, String rawName, String raw) {
    StringBuilder b = new StringBuilder(obj.substring(0, obj.length() - 1));
    b.append(",\"lang\":\"java\",\"t\":").append(String.format(Locale.ROOT, "%.3f", System.currentTimeMillis() / 1000.0));
    if (rawName != null) {
      b.append(",\"").append(rawName).append("\":").append(raw);
    }
    System.out.println(b.append('}'));
    System.out.flush();
  }

  static String json(Object... kv) {
    StringBuilder b = new StringBuilder("{");
    for (int i = 0; i + 1 < kv.length; i += 2) {
      if (i > 0) {
        b.append(',');
      }
      quote(b, kv[i].toString());
      b.append(':');
      Object v = kv[i + 1];
      if (v instanceof Double) { // seconds: plain notation, millisecond precision
        b.append(String.format(Locale.ROOT, "%.3f", (Double) v));
      } else if (v instanceof Number || v instanceof Boolean) {
        b.append(v instanceof Long ? Long.toUnsignedString((Long) v) : v.toString());
      } else {
        quote(b, String.valueOf(v));
      }
    }
    return b.append('}').toString();
  }

  private static void quote(StringBuilder b, String s) {
    b.append('"');
    for (int i = 0; i < s.length(); i++) {
      char c = s.charAt(i);
      switch (c) {
        case '"':
          b.append("\\\"");
          break;
        case '\\':
          b.append("\\\\");
          break;
        case '\n':
          b.append("\\n");
          break;
        case '\r':
          b.append("\\r");
          break;
        case '\t':
          b.append("\\t");
          break;
        default:
          if (c < 0x20) {
            b.append(String.format("\\u%04x", (int) c));
          } else {
            b.append(c);
          }
      }
    }
    b.append('"');
  }
}
