"""A small CLI over the library, for cross-language conformance runs
(test/conformance/scenarios.md, S5) and for trying a deployment by hand.

    python -m lockbroker.conformance hold --target 127.0.0.1:8700 --key jobs/x [--limit 3] [--seconds 30]
    python -m lockbroker.conformance hold --target 127.0.0.1:8700 --key jobs/x --mode read|write
    python -m lockbroker.conformance hold --target 127.0.0.1:8700 --key jobs/a --also jobs/b --also jobs/c
    python -m lockbroker.conformance watch --target 127.0.0.1:8700 --key jobs/x [--seconds 30]

`hold` takes a lock (limit 0), a semaphore slot (limit > 0), a read-write
lock's read or write hold (--mode), or the key and every --also key as one
multi-key lock; holds it for --seconds (or until SIGTERM, or until stdin
closes when it is a pipe), releases it, and prints JSON lines:
{"event":"acquired","mode":M,...} (M: lock, semaphore, read or write; a
multi-key hold adds "keys" and "tokens", one per key in order), then
{"event":"releasing"} (when it starts to let go: its belief that it holds
ends there) and {"event":"released","release_t":T} (T: that same time), or {"event":"lost","reason":...}
(exit 2); failures
print {"event":"error",...} and exit 1. `watch` prints {"event":"state",...}
per state.
"""

import argparse
import json
import os
import signal
import stat
import sys
import threading
import time

from . import Client, InvalidArgument, LockbrokerError
from ._types import SNAPSHOT_COMPLETE


def _emit(**kw):
    kw.setdefault("lang", "python")
    kw.setdefault("t", time.time())
    sys.stdout.write(json.dumps(kw, sort_keys=True) + "\n")
    sys.stdout.flush()


def _error(e):
    _emit(event="error", error=str(e), reason=getattr(e, "reason", None), type=type(e).__name__)
    return 1


def _stdin_is_pipe():
    try:
        mode = os.fstat(0).st_mode
        return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)
    except OSError:
        return False


def _hold(client, args):
    value = (args.value or "").encode()
    opts = dict(ttl=args.ttl, wait=args.wait, value=value)
    try:
        if (args.mode or args.also) and args.limit > 0:
            raise InvalidArgument("--mode and --also take locks: not with --limit")
        if args.mode and args.also:
            raise InvalidArgument("--also takes plain locks: not with --mode")
        if args.limit > 0:
            lease = client.semaphore(args.key, args.limit, **opts)
        elif args.mode == "read":
            lease = client.read_lock(args.key, **opts)
        elif args.mode == "write":
            lease = client.write_lock(args.key, **opts)
        elif args.also:
            lease = client.lock_all([args.key, *args.also], **opts)
        else:
            lease = client.lock(args.key, **opts)
    except LockbrokerError as e:
        return _error(e)
    extra = dict(keys=list(lease.keys), tokens=list(lease.tokens)) if args.also else {}
    _emit(event="acquired", key=args.key, mode=lease.mode, token=lease.token, session_id=lease.session_id,
          deadline_in=round(lease.deadline - time.monotonic(), 3), **extra)
    stop = threading.Event()
    lease.on_lost(lambda err: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def stdin_closed():
        try:
            while sys.stdin.read(4096):
                pass
        except (OSError, ValueError):
            pass
        stop.set()

    if _stdin_is_pipe():  # not /dev/null or a terminal: its end is a request to release
        threading.Thread(target=stdin_closed, daemon=True).start()
    stop.wait(args.seconds)
    err = lease.error  # set before lease.lost and the on_lost callbacks
    if err is not None:
        _emit(event="lost", reason=err.reason, detail=err.detail, key=err.key)
        return 2
    # The hold is given up from here on: what the holder believes it holds
    # ends now, before the next holder may be granted (S10 reads it).
    release_t = time.time()
    _emit(event="releasing", token=lease.token, t=release_t)
    lease.release()
    _emit(event="released", token=lease.token, release_t=release_t)
    return 0


def _watch(client, args):
    end = time.monotonic() + args.seconds
    stream = client.watch(args.key, prefix=args.prefix)
    timer = threading.Timer(args.seconds, stream.close)
    timer.daemon = True
    timer.start()
    try:
        for st in stream:
            if st is SNAPSHOT_COMPLETE:
                _emit(event="snapshot_complete")
                continue
            _emit(event="state", key=st.key, kind=st.kind, limit=st.limit,
                  holders=[{"session_id": h.session_id, "value": h.value.decode(errors="replace"),
                            "token": h.token, "read": h.read} for h in st.holders])
            if time.monotonic() >= end:
                break
    except LockbrokerError as e:
        if time.monotonic() < end:
            return _error(e)
    finally:
        timer.cancel()
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m lockbroker.conformance", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("hold", "watch"):
        p = sub.add_parser(name)
        p.add_argument("--target", action="append", required=True, help="broker address (repeat for replicas)")
        p.add_argument("--key", required=True)
        p.add_argument("--seconds", type=float, default=30.0)
        p.add_argument("--token", default=None, help="bearer token")
        if name == "hold":
            p.add_argument("--limit", type=int, default=0, help="0: a lock; N: a semaphore slot of N")
            p.add_argument("--ttl", type=float, default=None)
            p.add_argument("--wait", type=float, default=None, help="seconds to wait (default: no bound)")
            p.add_argument("--value", default=None)
            p.add_argument("--mode", choices=("read", "write"), default=None,
                           help="a read-write lock's read (shared) or write (exclusive) hold")
            p.add_argument("--also", action="append", default=[], metavar="KEY",
                           help="another key to lock together with --key, all or nothing (repeat)")
        else:
            p.add_argument("--prefix", action="store_true")
    args = ap.parse_args(argv)
    # LOCKBROKER_TRACEPARENT: the caller's W3C trace context for every call
    # (the trace test, test/conformance/go).
    tp = os.environ.get("LOCKBROKER_TRACEPARENT")
    client = Client(args.target[0], targets=args.target[1:], token=args.token,
                    trace_context=(lambda: {"traceparent": tp}) if tp else None)
    try:
        return _hold(client, args) if args.cmd == "hold" else _watch(client, args)
    finally:
        client.close()


if __name__ == "__main__":
    sys.exit(main())
