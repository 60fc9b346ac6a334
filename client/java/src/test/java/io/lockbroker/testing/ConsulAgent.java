package io.lockbroker.testing;

import java.io.IOException;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.List;
import java.util.Map;

/**
 * A `consul agent -dev` on free loopback ports, configured as the Go tests'
 * internal/consultest does (DNS, gRPC and HTTPS off; warn logging), and a
 * small HTTP client to act behind the broker's back.
 */
public final class ConsulAgent implements AutoCloseable {
  private static final Duration START_TIMEOUT = Duration.ofSeconds(30);

  private final Proc proc;
  private final String httpAddr;
  private final int serverPort;
  private final Path dataDir;
  private final HttpClient http = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(5)).build();

  private ConsulAgent(Proc proc, String httpAddr, int serverPort, Path dataDir) {
    this.proc = proc;
    this.httpAddr = httpAddr;
    this.serverPort = serverPort;
    this.dataDir = dataDir;
  }

  /** Starts an agent from the binary and waits until it is leader and takes KV writes. */
  public static ConsulAgent start(String binary) throws IOException, InterruptedException {
    IOException last = null;
    for (int attempt = 0; attempt < 3; attempt++) { // a port may be taken before the agent binds it
      int http = Ports.free();
      int server = Ports.free();
      int serfLan = Ports.free();
      int serfWan = Ports.free();
      Path dir = Files.createTempDirectory("lockbroker-java-consul-");
      String hcl = "bind_addr = \"127.0.0.1\"\nclient_addr = \"127.0.0.1\"\nadvertise_addr = \"127.0.0.1\"\n"
          + "advertise_addr_wan = \"127.0.0.1\"\nlog_level = \"warn\"\n"
          + "limits { http_max_conns_per_client = 200 }\n"
          + String.format("ports { http = %d  server = %d  serf_lan = %d  serf_wan = %d"
              + "  dns = -1  grpc = -1  grpc_tls = -1  https = -1 }", http, server, serfLan, serfWan);
      Proc p = Proc.start("consul", List.of(binary, "agent", "-dev",
          "-node=javatest-" + ProcessHandle.current().pid() + "-" + attempt,
          "-data-dir=" + dir, "-hcl=" + hcl), Map.of(), dir.resolve("agent.log"));
      ConsulAgent a = new ConsulAgent(p, "127.0.0.1:" + http, server, dir);
      try {
        a.waitReady();
        return a;
      } catch (IOException e) {
        last = new IOException(e.getMessage() + "\n--- agent output ---\n" + p.tail(30), e);
        a.close();
      }
    }
    throw last;
  }

  private void waitReady() throws IOException, InterruptedException {
    long end = System.nanoTime() + START_TIMEOUT.toNanos();
    String want = "\"127.0.0.1:" + serverPort + "\"";
    String last = "nothing tried";
    while (System.nanoTime() < end) {
      if (!proc.alive()) {
        throw new IOException("consul agent exited during startup");
      }
      try {
        String leader = call("GET", "/v1/status/leader", null);
        if (want.equals(leader.trim())) {
          call("PUT", "/v1/kv/_javatest/ready", "1");
          return;
        }
        last = "leader " + leader;
      } catch (IOException e) {
        last = e.toString();
      }
      Thread.sleep(100);
    }
    throw new IOException("consul agent on " + httpAddr + " not ready: " + last);
  }

  /** "127.0.0.1:port" of the HTTP API. */
  public String httpAddr() {
    return httpAddr;
  }

  /** One HTTP call; returns the body, throws on a non-2xx status. */
  public String call(String method, String path, String body) throws IOException, InterruptedException {
    HttpRequest.Builder b = HttpRequest.newBuilder(URI.create("http://" + httpAddr + path))
        .timeout(Duration.ofSeconds(10))
        .method(method, body == null ? HttpRequest.BodyPublishers.noBody() : HttpRequest.BodyPublishers.ofString(body));
    HttpResponse<String> r = http.send(b.build(), HttpResponse.BodyHandlers.ofString());
    if (r.statusCode() / 100 != 2) {
      throw new IOException(method + " " + path + ": " + r.statusCode() + " " + r.body());
    }
    return r.body();
  }

  /** Destroys a session behind the broker's back. */
  public void destroySession(String id) throws IOException, InterruptedException {
    call("PUT", "/v1/session/destroy/" + id, null);
  }

  /** True while Consul knows the session. */
  public boolean sessionExists(String id) throws IOException, InterruptedException {
    String body = call("GET", "/v1/session/info/" + id + "?consistent", null).trim();
    return !body.equals("null") && !body.equals("[]") && !body.isEmpty();
  }

  @Override
  public void close() {
    proc.close();
    try (var files = Files.walk(dataDir)) {
      files.sorted(java.util.Comparator.reverseOrder()).forEach(f -> f.toFile().delete());
    } catch (IOException e) {
      // a leftover temp dir is harmless
    }
  }
}
