package io.lockbroker.client;

/**
 * A bounded wait for a key ran out (DEADLINE_EXCEEDED, reason WAIT_TIMEOUT).
 * {@link #holders()} names who still holds the key.
 */
public class WaitTimeoutException extends LockBrokerException {
  private static final long serialVersionUID = 1L;

  WaitTimeoutException(Details d, Throwable cause) {
    super(d, cause);
  }
}
