package io.lockbroker.testing;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.net.DatagramSocket;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.util.HashSet;
import java.util.Set;

/** Free loopback ports. */
public final class Ports {
  private static final Set<Integer> handedOut = new HashSet<>();

  private Ports() {}

  /** A loopback port free for TCP and UDP now, not handed out before by this JVM. */
  public static synchronized int free() {
    for (int i = 0; i < 50; i++) {
      try (ServerSocket s = new ServerSocket()) {
        s.setReuseAddress(false);
        s.bind(new InetSocketAddress(InetAddress.getLoopbackAddress(), 0));
        int port = s.getLocalPort();
        if (handedOut.contains(port)) {
          continue;
        }
        try (DatagramSocket u = new DatagramSocket(new InetSocketAddress(InetAddress.getLoopbackAddress(), port))) {
          handedOut.add(u.getLocalPort());
          return port;
        } catch (IOException busy) {
          // UDP side taken (Serf needs both): try another
        }
      } catch (IOException e) {
        throw new UncheckedIOException(e);
      }
    }
    throw new IllegalStateException("no free loopback port");
  }

  /** "127.0.0.1:port" with a free port. */
  public static String freeAddr() {
    return "127.0.0.1:" + free();
  }
}
