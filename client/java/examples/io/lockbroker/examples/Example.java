package io.lockbroker.examples;

import io.lockbroker.client.Lease;
import io.lockbroker.client.LockClient;
import io.lockbroker.client.LockHeldException;
import io.lockbroker.client.LockOptions;
import java.time.Duration;
import java.util.Arrays;

/**
 * Holds a lock, does guarded work in steps, and releases it.
 *
 * <pre>
 * java -cp "$(make -s -C client/java classpath)" io.lockbroker.examples.Example \
 *     [KEY [TARGET...]]          (default: jobs/nightly 127.0.0.1:8700)
 * </pre>
 *
 * <p>A lease is not a mutex: it can be lost at any moment. The work checks
 * the lease before each step and passes the fencing token to what it
 * changes, so a store that refuses tokens lower than the highest it has seen
 * stays safe even if this process is paused past its lease.
 */
public final class Example {
  private Example() {}

  public static void main(String[] args) throws InterruptedException {
    String key = args.length > 0 ? args[0] : "jobs/nightly";
    String[] targets = args.length > 1 ? Arrays.copyOfRange(args, 1, args.length) : new String[] {"127.0.0.1:8700"};

    try (LockClient client = LockClient.builder().targets(targets).build()) {
      LockOptions opts = LockOptions.defaults()
          .value("example-" + ProcessHandle.current().pid())
          .ttl(Duration.ofSeconds(10))
          .waitTimeout(Duration.ofSeconds(30));
      try (Lease lease = client.lock(key, opts)) {
        lease.onLost(() -> System.err.println("lost " + key + ": " + lease.lostCause().orElseThrow().getMessage()));
        System.out.println("acquired " + key + " token=" + Long.toUnsignedString(lease.token())
            + " guaranteed for " + lease.timeLeft().toMillis() + " ms");
        for (int step = 1; step <= 3; step++) {
          lease.check(); // throws LockLostException once the lease is lost
          System.out.println("step " + step + " with fencing token " + Long.toUnsignedString(lease.token()));
          Thread.sleep(200);
        }
      } // close() releases the lock
      System.out.println("released " + key);
    } catch (LockHeldException e) {
      System.err.println("busy: " + e.holders());
      System.exit(1);
    }
  }
}
