package io.lockbroker.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.lockbroker.testing.Cluster;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/** The example program runs as documented against a live broker. */
class ExampleTest {
  @Test
  void exampleHoldsAndReleases() throws Exception {
    String cp = System.getProperty("lockbroker.classpath", System.getProperty("java.class.path"));
    String key = Cluster.key("example");
    Process p = new ProcessBuilder(Path.of(System.getProperty("java.home"), "bin", "java").toString(), "-cp", cp,
        "io.lockbroker.examples.Example", key, Cluster.get().broker().addr()).redirectErrorStream(true).start();
    p.getOutputStream().close();
    String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
    assertTrue(p.waitFor(60, TimeUnit.SECONDS), out);
    assertEquals(0, p.exitValue(), out);
    assertTrue(out.contains("acquired " + key + " token="), out);
    assertTrue(out.contains("step 3 with fencing token"), out);
    assertTrue(out.contains("released " + key), out);
    try (LockClient c = LockClient.builder().target(Cluster.get().broker().addr()).build()) {
      assertEquals(0, c.getLock(key).getHoldersCount(), "the example left its lock held");
    }
  }
}
