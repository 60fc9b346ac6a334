package io.lockbroker.client;

/**
 * The caller may not use the key or method, or Consul's ACLs refused the
 * broker (PERMISSION_DENIED), or the call carries no accepted identity
 * (UNAUTHENTICATED).
 */
public class PermissionDeniedException extends LockBrokerException {
  private static final long serialVersionUID = 1L;

  PermissionDeniedException(Details d, Throwable cause) {
    super(d, cause);
  }
}
