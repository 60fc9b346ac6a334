package io.lockbroker.testing;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.util.ArrayList;
import java.util.List;

/**
 * A TCP relay on a free loopback port to an upstream host:port: a replica's
 * link to its Consul agent. {@link #cut()} closes the listener and every
 * relayed connection, so the replica's calls are refused from then on.
 */
public final class Link implements AutoCloseable {
  private final ServerSocket listener;
  private final String host;
  private final int port;
  private final List<Socket> sockets = new ArrayList<>();

  private Link(ServerSocket listener, String upstream) {
    this.listener = listener;
    int i = upstream.lastIndexOf(':');
    this.host = upstream.substring(0, i);
    this.port = Integer.parseInt(upstream.substring(i + 1));
  }

  /** Opens a relay to upstream (host:port). */
  public static Link open(String upstream) throws IOException {
    ServerSocket s = new ServerSocket();
    s.bind(new InetSocketAddress(InetAddress.getLoopbackAddress(), 0));
    Link l = new Link(s, upstream);
    Thread t = new Thread(l::accept, "link-accept");
    t.setDaemon(true);
    t.start();
    return l;
  }

  /** The relay's address, host:port. */
  public String addr() {
    return "127.0.0.1:" + listener.getLocalPort();
  }

  private void accept() {
    while (true) {
      Socket down;
      try {
        down = listener.accept();
      } catch (IOException e) {
        return; // cut
      }
      Socket up;
      try {
        up = new Socket(host, port);
      } catch (IOException e) {
        closeQuietly(down);
        continue;
      }
      synchronized (sockets) {
        sockets.add(down);
        sockets.add(up);
      }
      pipe(down, up);
      pipe(up, down);
    }
  }

  private static void pipe(Socket from, Socket to) {
    Thread t = new Thread(() -> {
      try (InputStream in = from.getInputStream(); OutputStream out = to.getOutputStream()) {
        in.transferTo(out);
      } catch (IOException e) {
        // the other side closed, or cut
      }
      closeQuietly(from);
      closeQuietly(to);
    }, "link-pipe");
    t.setDaemon(true);
    t.start();
  }

  private static void closeQuietly(Socket s) {
    try {
      s.close();
    } catch (IOException e) {
      // gone
    }
  }

  /** Closes the listener and every relayed connection. */
  public void cut() {
    try {
      listener.close();
    } catch (IOException e) {
      // gone
    }
    synchronized (sockets) {
      sockets.forEach(Link::closeQuietly);
      sockets.clear();
    }
  }

  @Override
  public void close() {
    cut();
  }
}
