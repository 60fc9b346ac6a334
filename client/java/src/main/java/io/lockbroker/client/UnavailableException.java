package io.lockbroker.client;

/**
 * The broker or Consul cannot serve the call now (UNAVAILABLE): Consul
 * unreachable, a broker shutting down, no replica reachable. Retrying later
 * (see {@link #retryDelay()}) may work.
 */
public class UnavailableException extends LockBrokerException {
  private static final long serialVersionUID = 1L;

  UnavailableException(Details d, Throwable cause) {
    super(d, cause);
  }
}
