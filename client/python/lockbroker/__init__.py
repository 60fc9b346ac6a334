"""lockbroker: distributed locks, semaphores and leader election on Consul,
through a lockbroker broker.

    import lockbroker

    client = lockbroker.Client("127.0.0.1:8700", targets=["127.0.0.1:8710"])
    with client.lock("jobs/nightly", ttl=15, wait=30, value=b"host-a") as lease:
        do_work(fencing_token=lease.token)
        lease.check()           # raises LockLost if the hold is gone

    with client.read_lock("config/routes") as lease: ...      # shared; write_lock: exclusive
    with client.lock_all(["accounts/a", "accounts/b"]) as lease:  # all or nothing
        lease.tokens            # one fencing token per key, in order

The library never asks you to renew anything: a hold lives while its lease
is open. It watches the guaranteed deadline the broker reports, moves the
hold to another replica when its replica goes away, and reports a loss
(`lease.lost`, `lease.on_lost`, `lease.check()`) before the deadline when it
cannot. A lease can be lost at any moment: pass `lease.token` to what you
protect. `lockbroker.aio` is the same API for asyncio.
"""

from ._core import TLS
from ._sessions import SessionInfo, SessionSummary
from ._sync import Client, Election, Lease
from ._types import SNAPSHOT_COMPLETE, Holder, Queued, Sequencer, State
from .errors import (Busy, Cancelled, Conflict, Internal, InvalidArgument, LockbrokerError, LockDelay, LockHeld,
                     LockLost, NotHolder, NotLeader, PermissionDenied, QuotaExceeded, Rejected, ResumeRefused, SessionLost,
                     SessionNotFound, Unauthenticated, Unavailable, Unimplemented, WaitTimeout)

__version__ = "0.1.0"

__all__ = [
    "Client", "Lease", "Election", "TLS", "Sequencer", "Holder", "State", "Queued", "SNAPSHOT_COMPLETE", "SessionInfo",
    "SessionSummary", "LockbrokerError", "Busy", "LockHeld", "LockDelay", "WaitTimeout", "InvalidArgument",
    "Conflict", "Rejected", "NotHolder", "NotLeader", "ResumeRefused", "SessionNotFound", "SessionLost", "PermissionDenied",
    "Unauthenticated", "QuotaExceeded", "Unavailable", "Unimplemented", "Cancelled", "Internal", "LockLost",
]
