package io.lockbroker.testing;

import java.io.BufferedReader;
import java.io.File;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;

/**
 * A child process (Consul agent, broker) started under a small bash
 * watchdog: if this JVM dies without cleaning up, the watchdog kills the
 * child within a second, so no agent or broker outlives a test run. The
 * child's output goes to a log file; {@link #pid()} is the child's own pid,
 * for signals (SIGSTOP, SIGKILL).
 */
public final class Proc implements AutoCloseable {
  private static final String WATCHDOG = String.join("\n",
      "log=\"$1\"; parent=\"$2\"; shift 2",
      "\"$@\" >>\"$log\" 2>&1 </dev/null &",
      "c=$!",
      "echo \"$c\"",
      "( while kill -0 \"$parent\" 2>/dev/null; do sleep 0.5; done; kill -CONT \"$c\"; kill -KILL \"$c\" ) >/dev/null 2>&1 &",
      "w=$!",
      "wait \"$c\"; rc=$?",
      "kill \"$w\" 2>/dev/null",
      "exit \"$rc\"");

  private final String name;
  private final Process wrapper;
  private final long pid;
  private final Path log;

  private Proc(String name, Process wrapper, long pid, Path log) {
    this.name = name;
    this.wrapper = wrapper;
    this.pid = pid;
    this.log = log;
  }

  /** Starts argv with env added to this process's environment. */
  public static Proc start(String name, List<String> argv, Map<String, String> env, Path log)
      throws IOException {
    List<String> cmd = new ArrayList<>(List.of("/bin/bash", "-c", WATCHDOG, "watchdog",
        log.toString(), Long.toString(ProcessHandle.current().pid())));
    cmd.addAll(argv);
    ProcessBuilder pb = new ProcessBuilder(cmd).redirectErrorStream(true)
        .redirectInput(ProcessBuilder.Redirect.PIPE);
    pb.environment().putAll(env);
    Process p = pb.start();
    BufferedReader out = new BufferedReader(new InputStreamReader(p.getInputStream(), StandardCharsets.UTF_8));
    String line = out.readLine();
    if (line == null) {
      throw new IOException(name + ": the watchdog did not report a pid");
    }
    return new Proc(name, p, Long.parseLong(line.trim()), log);
  }

  /** The child's pid. */
  public long pid() {
    return pid;
  }

  /** True while the child runs (stopped counts as running). */
  public boolean alive() {
    return wrapper.isAlive();
  }

  /** Sends a signal ("STOP", "CONT", "KILL", "TERM") to the child. */
  public void signal(String sig) {
    try {
      Process k = new ProcessBuilder("kill", "-" + sig, Long.toString(pid)).redirectErrorStream(true).start();
      k.getInputStream().readAllBytes();
      k.waitFor(5, TimeUnit.SECONDS);
    } catch (IOException e) {
      throw new IllegalStateException("kill -" + sig + " " + pid + ": " + e, e);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }

  /**
   * SIGSTOPs the child and returns once every thread of it has stopped
   * (/proc/PID/task/TID/stat in state T), within 5 s: kill(2) returns when
   * the signal is queued, and a thread already running can still answer a
   * request for a few milliseconds on a loaded machine.
   */
  public void stop() {
    signal("STOP");
    long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
    while (!stopped()) {
      if (System.nanoTime() > end) {
        throw new IllegalStateException(name + " (pid " + pid + ") not stopped 5 s after SIGSTOP");
      }
      try {
        Thread.sleep(1);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        return;
      }
    }
  }

  private boolean stopped() {
    File[] tasks = new File("/proc/" + pid + "/task").listFiles();
    if (tasks == null) {
      return true; // gone
    }
    int seen = 0;
    for (File task : tasks) {
      String stat;
      try {
        stat = Files.readString(task.toPath().resolve("stat"), StandardCharsets.ISO_8859_1);
      } catch (IOException e) {
        continue; // the thread exited
      }
      int i = stat.lastIndexOf(") ");
      char state = i < 0 || i + 2 >= stat.length() ? '?' : stat.charAt(i + 2);
      if (state != 'T' && state != 't') {
        return false;
      }
      seen++;
    }
    return seen > 0;
  }

  /** SIGKILLs the child and waits until it is gone. */
  public void kill() {
    if (!wrapper.isAlive()) {
      return;
    }
    signal("CONT");
    signal("KILL");
    awaitExit(10);
  }

  /** Waits up to seconds for the child to exit; true if it did. */
  public boolean awaitExit(long seconds) {
    try {
      return wrapper.waitFor(seconds, TimeUnit.SECONDS);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      return false;
    }
  }

  /** The last n lines of the child's output. */
  public String tail(int n) {
    try {
      List<String> lines = Files.readAllLines(log, StandardCharsets.UTF_8);
      return String.join("\n", lines.subList(Math.max(0, lines.size() - n), lines.size()));
    } catch (IOException e) {
      return "(no log: " + e + ")";
    }
  }

  @Override
  public void close() {
    kill();
    wrapper.destroyForcibly();
  }

  @Override
  public String toString() {
    return name + "(pid " + pid + ")";
  }
}
