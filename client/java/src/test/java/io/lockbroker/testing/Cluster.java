package io.lockbroker.testing;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.UUID;

/**
 * The processes the tests share: one Consul dev agent and one broker for
 * the whole run, started on first use and stopped when the JVM exits.
 * Tests that kill or stop a broker start their own with {@link #newBroker}.
 *
 * <p>System properties (set by the Makefile): {@code lockbroker.consul} the
 * consul binary, {@code lockbroker.broker} the broker binary.
 */
public final class Cluster {
  private static Cluster instance;

  private final ConsulAgent consul;
  private final Broker broker;
  private final String brokerBinary;

  private Cluster(ConsulAgent consul, Broker broker, String brokerBinary) {
    this.consul = consul;
    this.broker = broker;
    this.brokerBinary = brokerBinary;
  }

  /** The shared cluster, started on first call. */
  public static synchronized Cluster get() {
    if (instance == null) {
      String consulBin = binary("lockbroker.consul", "LOCKBROKER_CONSUL");
      String brokerBin = binary("lockbroker.broker", "LOCKBROKER_BIN");
      ConsulAgent c = null;
      try {
        c = ConsulAgent.start(consulBin);
        Broker b = Broker.start("shared", brokerBin, c);
        instance = new Cluster(c, b, brokerBin);
        Runtime.getRuntime().addShutdownHook(new Thread(instance::close));
      } catch (IOException e) {
        if (c != null) {
          c.close();
        }
        throw new UncheckedIOException(e);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new IllegalStateException(e);
      }
    }
    return instance;
  }

  private static String binary(String property, String env) {
    String v = System.getProperty(property, System.getenv(env));
    if (v == null || !Files.isExecutable(Path.of(v))) {
      throw new IllegalStateException("set -D" + property + " (or " + env + ") to an executable; got " + v
          + " (run the tests with `make -C client/java test`)");
    }
    return v;
  }

  /** The Consul agent. */
  public ConsulAgent consul() {
    return consul;
  }

  /** The shared broker: do not stop or kill it. */
  public Broker broker() {
    return broker;
  }

  /** A broker of the test's own against the shared agent; the caller closes it. */
  public Broker newBroker(String name, String... flags) throws IOException, InterruptedException {
    return Broker.start(name, brokerBinary, consul, flags);
  }

  /** As newBroker, reaching the shared agent at consulAddr (a {@link Link} to it). */
  public Broker newBrokerVia(String name, String consulAddr, String... flags)
      throws IOException, InterruptedException {
    return Broker.start(name, brokerBinary, consulAddr, flags);
  }

  /** A key no other test uses. */
  public static String key(String test) {
    return "java-test/" + test + "/" + UUID.randomUUID().toString().substring(0, 8);
  }

  /** Prints a timing figure (S2 loss latency, S3 margin, ...), one line each. */
  public static void figure(String what, double seconds) {
    System.out.printf("FIGURE %s: %.3f s%n", what, seconds);
  }

  private void close() {
    broker.close();
    consul.close();
  }
}
