package io.lockbroker.testing;

import java.io.IOException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;

/** A broker process (the binary under test) against a Consul agent. */
public final class Broker implements AutoCloseable {
  private static final Duration START_TIMEOUT = Duration.ofSeconds(30);

  private final String name;
  private final Proc proc;
  private final String addr;
  private final String httpAddr;

  private Broker(String name, Proc proc, String addr, String httpAddr) {
    this.name = name;
    this.proc = proc;
    this.addr = addr;
    this.httpAddr = httpAddr;
  }

  /** Starts the broker and waits until /healthz says SERVING. */
  public static Broker start(String name, String binary, ConsulAgent consul, String... flags)
      throws IOException, InterruptedException {
    return start(name, binary, consul.httpAddr(), flags);
  }

  /** As above, reaching the agent at consulAddr (a {@link Link} to it, say). */
  public static Broker start(String name, String binary, String consulAddr, String... flags)
      throws IOException, InterruptedException {
    String addr = Ports.freeAddr();
    String httpAddr = Ports.freeAddr();
    List<String> argv = new ArrayList<>(List.of(binary, "--listen", addr, "--http-listen", httpAddr,
        "--log-level", "warn"));
    argv.addAll(List.of(flags));
    Path log = Files.createTempFile("lockbroker-java-broker-" + name + "-", ".log");
    Proc p = Proc.start("broker " + name, argv,
        Map.of("CONSUL_HTTP_ADDR", consulAddr, "CONSUL_HTTP_TOKEN", ""), log);
    Broker b = new Broker(name, p, addr, httpAddr);
    try {
      b.waitServing();
    } catch (IOException | RuntimeException e) {
      b.close();
      throw new IOException("broker " + name + ": " + e.getMessage() + "\n--- broker output ---\n"
          + p.tail(30), e);
    }
    return b;
  }

  private void waitServing() throws IOException, InterruptedException {
    HttpClient http = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(2)).build();
    long end = System.nanoTime() + START_TIMEOUT.toNanos();
    String last = "nothing tried";
    while (System.nanoTime() < end) {
      if (!proc.alive()) {
        throw new IOException("exited during startup");
      }
      try {
        HttpResponse<String> r = http.send(HttpRequest.newBuilder(URI.create("http://" + httpAddr + "/healthz"))
            .timeout(Duration.ofSeconds(2)).build(), HttpResponse.BodyHandlers.ofString());
        if (r.statusCode() == 200) {
          return;
        }
        last = r.statusCode() + " " + r.body().trim();
      } catch (IOException e) {
        last = e.toString();
      }
      Thread.sleep(50);
    }
    throw new IOException("not SERVING after " + START_TIMEOUT + " (" + last + ")");
  }

  /** The gRPC address, "127.0.0.1:port". */
  public String addr() {
    return addr;
  }

  /** The broker process. */
  public Proc proc() {
    return proc;
  }

  /** SIGKILL: a crash, no cleanup. */
  public void kill() {
    proc.kill();
  }

  /** SIGSTOP: the process stays, silent (returns once it has stopped). */
  public void stop() {
    proc.stop();
  }

  /** SIGCONT. */
  public void cont() {
    proc.signal("CONT");
  }

  @Override
  public void close() {
    proc.close();
  }

  @Override
  public String toString() {
    return "broker " + name + " at " + addr;
  }
}
