package io.lockbroker.client;

import io.grpc.stub.ClientCallStreamObserver;
import io.grpc.stub.ClientResponseObserver;
import io.lockbroker.v1.AcquireRequest;
import io.lockbroker.v1.AcquireResponse;

/**
 * One Acquire stream on one replica. Its events go to a {@link Listener}:
 * first the caller waiting in {@link LockClient#lock}, then the lease.
 */
final class AcquireCall implements ClientResponseObserver<AcquireRequest, AcquireResponse> {
  /** Receives the stream's events, in order, on gRPC's callback threads. */
  interface Listener {
    /** An event; receivedNanos is System.nanoTime() when it arrived. */
    void onResponse(AcquireCall call, AcquireResponse response, long receivedNanos);

    /** The stream ended: error is null when the broker closed it with OK. */
    void onEnd(AcquireCall call, Throwable error);
  }

  final int replica;
  private volatile Listener listener;
  private volatile ClientCallStreamObserver<AcquireRequest> call;

  AcquireCall(int replica, Listener listener) {
    this.replica = replica;
    this.listener = listener;
  }

  void setListener(Listener l) {
    listener = l;
  }

  @Override
  public void beforeStart(ClientCallStreamObserver<AcquireRequest> requestStream) {
    call = requestStream;
  }

  @Override
  public void onNext(AcquireResponse value) {
    listener.onResponse(this, value, System.nanoTime());
  }

  @Override
  public void onError(Throwable t) {
    listener.onEnd(this, t);
  }

  @Override
  public void onCompleted() {
    listener.onEnd(this, null);
  }

  /** Cancels the stream (the broker then ends a hold it owns). Idempotent. */
  void cancel(String why) {
    ClientCallStreamObserver<AcquireRequest> c = call;
    if (c != null) {
      c.cancel(why, null);
    }
  }
}
