package io.lockbroker.client;

/**
 * A request field is bad (INVALID_ARGUMENT): {@link #fieldViolations()} names
 * it. Nothing was written to Consul.
 */
public class InvalidArgumentException extends LockBrokerException {
  private static final long serialVersionUID = 1L;

  InvalidArgumentException(Details d, Throwable cause) {
    super(d, cause);
  }
}
