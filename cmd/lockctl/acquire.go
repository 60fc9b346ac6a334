package main

import (
	"context"
	"errors"
	"fmt"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
)

// acquireHelp is the description in `lockctl acquire --help`.
const acquireHelp = `Take a lock on KEY (or, with -n N, one of N semaphore slots under the prefix
KEY) for SESSION, a client-owned session (lockctl session create), and print
the grant: the hold outlives lockctl. It lasts until 'lockctl release KEY
SESSION' or until the session ends (destroyed, or not renewed within its TTL:
lockctl session renew). Waits for the key through LockService.Acquire
(--timeout bounds the wait; without it, until interrupted). A session that
already holds KEY gets its current grant back.

Prints "KEY TOKEN SESSION", or with --json the Sequencer. Pass the token to
the resources you protect.

` + exitCodesHelp

// tryAcquireHelp is the description in `lockctl try-acquire --help`.
const tryAcquireHelp = `Take a lock on KEY (or one of N semaphore slots with -n N) for SESSION, a
client-owned session (lockctl session create), now or not at all, through
LockService.TryAcquire, and print the grant as acquire does. A busy key names
its holders and exits 73. The hold lasts until 'lockctl release KEY SESSION'
or until the session ends.

` + exitCodesHelp

// cmdAcquire implements `lockctl acquire KEY SESSION` and, with try,
// `lockctl try-acquire KEY SESSION`.
func cmdAcquire(try bool) func(ctx context.Context, c *cli, args []string) error {
	return func(ctx context.Context, c *cli, args []string) error {
		name, help := "acquire", acquireHelp
		if try {
			name, help = "try-acquire", tryAcquireHelp
		}
		var (
			slots   uint
			value   string
			timeout optDuration
			asJSON  bool
		)
		fs := c.flagSet(name, "KEY SESSION [flags]", help)
		fs.UintVar(&slots, "n", 1, "semaphore slots: one of `N` slots under the prefix KEY (1: an exclusive lock)")
		fs.StringVar(&value, "value", defaultValue(), "the holder's value (its identity), shown to others")
		if !try {
			fs.Var(&timeout, "timeout", "wait at most `DURATION` for KEY, then exit 74 (0: try once, exit 73 if busy)")
		}
		fs.BoolVar(&asJSON, "json", false, "print the Sequencer as one line of JSON")
		pos, err := c.parseArgs(fs, args, "KEY", "SESSION")
		if err != nil {
			return err
		}
		if slots > 1024 {
			return usageErrorf("-n must be at most 1024, got %d", slots)
		}
		key, session := pos[0], pos[1]
		conn, err := c.dial(ctx)
		if err != nil {
			return err
		}
		defer conn.Close()
		lc := lockbrokerv1.NewLockServiceClient(conn)
		var seq *lockbrokerv1.Sequencer
		if try {
			resp, err := lc.TryAcquire(ctx, &lockbrokerv1.TryAcquireRequest{
				Key: key, Value: []byte(value), Limit: uint32(slots), SessionId: session,
			})
			if err != nil {
				return waitError(err)
			}
			seq = resp.GetSequencer()
		} else if seq, err = acquireFor(ctx, lc, &lockbrokerv1.AcquireRequest{
			Key: key, Value: []byte(value), Limit: uint32(slots), WaitTimeout: timeout.proto(),
			Session: &lockbrokerv1.AcquireRequest_SessionId{SessionId: session},
		}); err != nil {
			return err
		}
		if asJSON {
			return printJSON(c.stdout, seq)
		}
		fmt.Fprintf(c.stdout, "%s %d %s\n", seq.GetKey(), seq.GetToken(), seq.GetSessionId())
		return nil
	}
}

// acquireFor waits on an Acquire stream for a client-owned session until
// the grant, and returns it; the stream is then closed, which leaves the
// hold to the session.
func acquireFor(ctx context.Context, lc lockbrokerv1.LockServiceClient, req *lockbrokerv1.AcquireRequest) (*lockbrokerv1.Sequencer, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := lc.Acquire(ctx, req)
	if err != nil {
		return nil, err
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			return nil, waitError(err)
		}
		switch e := resp.GetEvent().(type) {
		case *lockbrokerv1.AcquireResponse_Acquired:
			return e.Acquired.GetSequencer(), nil
		case *lockbrokerv1.AcquireResponse_Lost:
			return nil, fmt.Errorf("lost before the grant: %s", lostText(e.Lost))
		case *lockbrokerv1.AcquireResponse_Released:
			return nil, errors.New("released before the grant")
		}
	}
}
