package io.lockbroker.client;

/**
 * The key is held: a try-once found it busy (ABORTED, reason LOCK_HELD), or inside
 * Consul's lock-delay after a holder's session ended (LOCK_DELAY, with a
 * {@link #retryDelay()} when known). {@link #holders()} names the holders.
 */
public class LockHeldException extends LockBrokerException {
  private static final long serialVersionUID = 1L;

  LockHeldException(Details d, Throwable cause) {
    super(d, cause);
  }
}
