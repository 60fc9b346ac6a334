import os, sys, threading
import grpc
from lockbroker.v1 import lock_pb2, lock_pb2_grpc

def work(stop):  # the job; it must give up as soon as stop is set
    stop.wait(float(os.environ.get("WORK_SECONDS", "1")))

with grpc.insecure_channel(os.environ.get("LOCKBROKER_ADDR", "127.0.0.1:8700")) as channel:
    locks = lock_pb2_grpc.LockServiceStub(channel)
    # The broker keeps the lock's session alive for as long as this stream is open.
    stream = locks.Acquire(lock_pb2.AcquireRequest(key="jobs/nightly-report", value=b"worker-1"))
    stop, done, deadline = threading.Event(), threading.Event(), threading.Timer(0, stream.cancel)
    try:
        for event in stream:
            kind = event.WhichOneof("event")
            if kind == "acquired":
                print(f"acquired token={event.acquired.sequencer.token}", flush=True)
                threading.Thread(target=lambda: (work(stop), done.set(), stream.cancel())).start()
            if kind in ("acquired", "keepalive"):  # no keepalive within guaranteed_for: lost
                deadline.cancel()
                deadline = threading.Timer(getattr(event, kind).guaranteed_for.ToTimedelta().total_seconds(), stream.cancel)
                deadline.start()
            elif kind != "queued":
                break  # lost (or released by someone else)
    except grpc.RpcError:
        pass  # cancelled: the work is done or the deadline passed; or the broker is gone
    lost = not done.is_set()
    deadline.cancel(); stop.set(); stream.cancel()  # stop working; closing the stream releases the lock
    sys.exit("lost" if lost else 0)
