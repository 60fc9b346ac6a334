import os
import grpc
from lockbroker.v1 import lock_pb2, lock_pb2_grpc

with grpc.insecure_channel(os.environ.get("LOCKBROKER_ADDR", "127.0.0.1:8700")) as channel:
    locks = lock_pb2_grpc.LockServiceStub(channel)
    # The broker keeps the lock's session alive for as long as this stream is open.
    stream = locks.Acquire(lock_pb2.AcquireRequest(key="jobs/nightly-report", value=b"worker-1"))
    for event in stream:
        if event.HasField("acquired"):
            print(f"acquired token={event.acquired.sequencer.token}")
            break  # do the work here; a "lost" event on the stream means stop
    stream.cancel()  # closing the stream releases the lock
