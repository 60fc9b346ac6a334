package io.lockbroker.conformance;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Optional;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * One `hold` CLI process of any language (scenarios.md S5) and the JSON
 * lines it prints. Closing its stdin makes it release and exit.
 */
final class Cli {
  private final List<String> argv;
  private final Process proc;
  private final List<String> events = new ArrayList<>(); // guarded by itself
  private final StringBuilder stderr = new StringBuilder();

  private Cli(List<String> argv, Process proc) {
    this.argv = argv;
    this.proc = proc;
    Thread out = new Thread(this::readStdout, "cli-stdout");
    out.setDaemon(true);
    out.start();
    Thread err = new Thread(this::readStderr, "cli-stderr");
    err.setDaemon(true);
    err.start();
  }

  static Cli start(List<String> argv, Path cwd) throws IOException {
    ProcessBuilder pb = new ProcessBuilder(argv).directory(cwd.toFile());
    if (argv.get(0).endsWith("python3")) {
      pb.environment().put("PYTHONPATH", cwd.resolve("client/python").toString());
    }
    return new Cli(argv, pb.start());
  }

  static List<String> java(String addr, String key, int limit, int seconds) {
    String cp = System.getProperty("lockbroker.classpath", System.getProperty("java.class.path"));
    return List.of(Path.of(System.getProperty("java.home"), "bin", "java").toString(), "-cp", cp,
        Main.class.getName(), "hold", "--target", addr, "--key", key, "--limit", Integer.toString(limit),
        "--seconds", Integer.toString(seconds));
  }

  /** A Java hold CLI with any options after --target and --key (--mode, --also, --seconds, ...). */
  static List<String> javaHold(String addr, String key, String... options) {
    String cp = System.getProperty("lockbroker.classpath", System.getProperty("java.class.path"));
    List<String> argv = new ArrayList<>(List.of(Path.of(System.getProperty("java.home"), "bin", "java").toString(),
        "-cp", cp, Main.class.getName(), "hold", "--target", addr, "--key", key));
    argv.addAll(List.of(options));
    return argv;
  }

  /** A number field of a JSON line; NaN when absent. */
  static double number(String json, String name) {
    Matcher m = Pattern.compile("\"" + Pattern.quote(name) + "\"\\s*:\\s*(-?[0-9][0-9.eE+-]*)").matcher(json);
    return m.find() ? Double.parseDouble(m.group(1)) : Double.NaN;
  }

  /** An unsigned integer field of a JSON line (a token); throws when absent. */
  static long unsigned(String json, String name) {
    Matcher m = Pattern.compile("\"" + Pattern.quote(name) + "\"\\s*:\\s*([0-9]+)").matcher(json);
    if (!m.find()) {
      throw new AssertionError("no " + name + " in " + json);
    }
    return Long.parseUnsignedLong(m.group(1));
  }

  /** An array of unsigned integers of a JSON line ("tokens"); empty when absent. */
  static List<Long> unsignedList(String json, String name) {
    Matcher m = Pattern.compile("\"" + Pattern.quote(name) + "\"\\s*:\\s*\\[([0-9,\\s]*)\\]").matcher(json);
    List<Long> out = new ArrayList<>();
    if (m.find()) {
      for (String t : m.group(1).split(",")) {
        if (!t.isBlank()) {
          out.add(Long.parseUnsignedLong(t.trim()));
        }
      }
    }
    return out;
  }

  /** Waits up to timeout for the process to exit; its exit status, or -1 if it still runs. */
  int waitExit(Duration timeout) throws InterruptedException {
    return proc.waitFor(timeout.toNanos(), TimeUnit.NANOSECONDS) ? proc.exitValue() : -1;
  }

  static boolean pythonAvailable(Path repo) {
    return Files.exists(repo.resolve("client/python/lockbroker/conformance.py"))
        && Files.isExecutable(Path.of("/usr/bin/python3"))
        && succeeds("/usr/bin/python3", "-c", "import grpc, google.protobuf");
  }

  private static boolean succeeds(String... argv) {
    try {
      Process p = new ProcessBuilder(argv).redirectErrorStream(true).start();
      p.getInputStream().readAllBytes();
      return p.waitFor(30, TimeUnit.SECONDS) && p.exitValue() == 0;
    } catch (IOException e) {
      return false;
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      return false;
    }
  }

  static List<String> python(Path repo, String addr, String key, int limit, int seconds) {
    return List.of("/usr/bin/python3", "-m", "lockbroker.conformance", "hold", "--target", addr, "--key", key,
        "--limit", Integer.toString(limit), "--seconds", Integer.toString(seconds));
  }

  static boolean nodeAvailable(Path repo) {
    if (!Files.exists(repo.resolve("client/node/conformance.mjs"))
        || !Files.isDirectory(repo.resolve("client/node/node_modules/@connectrpc"))) {
      return false; // not installed: `npm ci --prefix client/node`
    }
    return succeeds("node", "--version");
  }

  static List<String> node(Path repo, String addr, String key, int limit, int seconds) {
    return List.of("node", repo.resolve("client/node/conformance.mjs").toString(), "hold", "--target", addr,
        "--key", key, "--limit", Integer.toString(limit), "--seconds", Integer.toString(seconds));
  }

  /** A string field of a JSON line (enough for the flat objects the CLIs print). */
  static String field(String json, String name) {
    Matcher m = Pattern.compile("\"" + Pattern.quote(name) + "\"\\s*:\\s*\"((?:[^\"\\\\]|\\\\.)*)\"").matcher(json);
    return m.find() ? m.group(1) : "";
  }

  private void readStdout() {
    try (BufferedReader r = new BufferedReader(new InputStreamReader(proc.getInputStream(), StandardCharsets.UTF_8))) {
      for (String line = r.readLine(); line != null; line = r.readLine()) {
        if (line.trim().startsWith("{")) {
          synchronized (events) {
            events.add(line.trim());
            events.notifyAll();
          }
        }
      }
    } catch (IOException e) {
      // process gone
    }
    synchronized (events) {
      events.add("{\"event\":\"exit\"}");
      events.notifyAll();
    }
  }

  private void readStderr() {
    try (BufferedReader r = new BufferedReader(new InputStreamReader(proc.getErrorStream(), StandardCharsets.UTF_8))) {
      for (String line = r.readLine(); line != null; line = r.readLine()) {
        synchronized (stderr) {
          if (stderr.length() < 20000) {
            stderr.append(line).append('\n');
          }
        }
      }
    } catch (IOException e) {
      // process gone
    }
  }

  boolean has(String event) {
    return first(event).isPresent();
  }

  Optional<String> first(String event) {
    synchronized (events) {
      return events.stream().filter(e -> field(e, "event").equals(event)).findFirst();
    }
  }

  /** Waits for event; fails on an error, lost or exit event first. */
  String await(String event, Duration timeout) throws InterruptedException {
    long end = System.nanoTime() + timeout.toNanos();
    synchronized (events) {
      while (true) {
        for (String e : events) {
          String name = field(e, "event");
          if (name.equals(event)) {
            return e;
          }
          if (name.equals("error") || name.equals("lost") || name.equals("exit")) {
            throw new AssertionError(this + " failed: " + e + "\nstderr: " + stderrText());
          }
        }
        long left = end - System.nanoTime();
        if (left <= 0) {
          throw new AssertionError("no " + event + " within " + timeout + " from " + this + "\nstderr: "
              + stderrText());
        }
        TimeUnit.NANOSECONDS.timedWait(events, left);
      }
    }
  }

  private String stderrText() {
    synchronized (stderr) {
      return stderr.toString();
    }
  }

  /** Closes stdin: the CLI releases and exits. */
  void release() {
    try {
      proc.getOutputStream().close();
    } catch (IOException e) {
      // already gone
    }
  }

  /** Releases and waits for the process to exit (killing it after 15 s). */
  void close() throws InterruptedException {
    release();
    if (!proc.waitFor(15, TimeUnit.SECONDS)) {
      proc.destroyForcibly();
      proc.waitFor(5, TimeUnit.SECONDS);
    }
  }

  @Override
  public String toString() {
    synchronized (events) {
      return "CLI" + argv.subList(Math.max(0, argv.size() - 10), argv.size()) + " events=" + events;
    }
  }
}
