package io.lockbroker.client;

import io.grpc.Status;
import io.lockbroker.v1.AcquireQueued;
import io.lockbroker.v1.AcquireRequest;
import io.lockbroker.v1.Sequencer;

/**
 * A waiting request's place in its key's shared queue, carried from target
 * to target as the Go client does ({@code client/lease.go} openAt).
 *
 * <p>{@code queued} names the session the request waits with. When the
 * wait moves (its stream failed UNAVAILABLE, or its broker went silent),
 * the request on the next target resumes the wait with that session and
 * no token ({@code AcquireRequest.resume}), so it keeps its place. When
 * the broker answers that the place is gone (FAILED_PRECONDITION or
 * NOT_FOUND: the session ended), the original request waits anew on the
 * same target. A request that names its own session_id keeps sending it.
 */
final class WaitPlace {
  private final AcquireRequest req;
  /** The session of the last {@code queued}; set on gRPC threads. */
  private volatile String sessionId = "";
  /** The last {@link #request()} resumed the wait. */
  private boolean resuming;

  WaitPlace(AcquireRequest req) {
    this.req = req;
  }

  /** The request to send to the next target. */
  AcquireRequest request() {
    String sid = sessionId;
    resuming = !sid.isEmpty() && req.getSessionCase() != AcquireRequest.SessionCase.SESSION_ID;
    if (!resuming) {
      return req;
    }
    return req.toBuilder()
        .setResume(Sequencer.newBuilder().setKey(req.getKey()).setSessionId(sid))
        .build();
  }

  /**
   * Whether e refuses a resumed wait because its place is gone: the
   * original request is to be sent instead.
   */
  boolean gone(LockBrokerException e) {
    if (!resuming
        || (e.code() != Status.Code.FAILED_PRECONDITION && e.code() != Status.Code.NOT_FOUND)) {
      return false;
    }
    resuming = false;
    sessionId = "";
    return true;
  }

  /** Notes the session a {@code queued} event names. */
  void heard(AcquireQueued q) {
    if (!q.getSessionId().isEmpty()) {
      sessionId = q.getSessionId();
    }
  }
}
