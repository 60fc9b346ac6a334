package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// cmdGet implements `lockctl get KEY`: LockService.GetLock.
func cmdGet(ctx context.Context, c *cli, args []string) error {
	var asJSON bool
	fs := c.flagSet("get", "KEY [flags]", "Print who holds KEY (a lock, or a semaphore prefix), read consistently.\n")
	fs.BoolVar(&asJSON, "json", false, "print the GetLockResponse as one line of JSON")
	pos, err := c.parseArgs(fs, args, "KEY")
	if err != nil {
		return err
	}
	conn, err := c.dial(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	resp, err := lockbrokerv1.NewLockServiceClient(conn).GetLock(ctx, &lockbrokerv1.GetLockRequest{Key: pos[0]})
	if err != nil {
		return err
	}
	if asJSON {
		return printJSON(c.stdout, resp)
	}
	printState(c.stdout, resp.GetState())
	return nil
}

// cmdWatch implements `lockctl watch KEY`: LockService.Watch, until
// interrupted (exit 0) or the stream fails (exit 1).
func cmdWatch(ctx context.Context, c *cli, args []string) error {
	var asJSON, prefix bool
	fs := c.flagSet("watch", "KEY [flags]",
		"Print KEY's state now and after every change, one line each, until interrupted.\n"+
			"Lines are \"TIME KEY: STATE\"; with --json, one WatchResponse object per line.\n")
	fs.BoolVar(&asJSON, "json", false, "print each WatchResponse as one line of JSON")
	fs.BoolVar(&prefix, "prefix", false, "watch every lock and semaphore under KEY/ (and KEY itself)")
	pos, err := c.parseArgs(fs, args, "KEY")
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	conn, err := c.dial(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	stream, err := lockbrokerv1.NewLockServiceClient(conn).Watch(ctx, &lockbrokerv1.WatchRequest{Key: pos[0], Prefix: prefix})
	if err != nil {
		return err
	}
	for {
		resp, err := stream.Recv()
		switch {
		case ctx.Err() != nil:
			return nil // interrupted: a normal end for a watch
		case errors.Is(err, io.EOF):
			return status.Error(codes.Unavailable, "the broker ended the watch")
		case err != nil:
			return err
		case asJSON:
			if err := printJSON(c.stdout, resp); err != nil {
				return err
			}
		default:
			line := time.Now().Format(time.RFC3339) + " " + stateLine(resp.GetState())
			if n := resp.GetSkipped(); n > 0 {
				line += fmt.Sprintf(" (%d older states skipped)", n)
			}
			fmt.Fprintln(c.stdout, line)
		}
	}
}

// cmdRelease implements `lockctl release KEY SESSION`: LockService.Release.
func cmdRelease(ctx context.Context, c *cli, args []string) error {
	fs := c.flagSet("release", "KEY SESSION [flags]",
		"End the hold of SESSION on KEY, from anywhere. The process holding it\n"+
			"(e.g. a `lockctl lock`) is told the lock is lost. Releasing a key the\n"+
			"session no longer holds succeeds and says so. --grant-token releases only that\n"+
			"grant; it is required when the broker made the session (a `lockctl lock`'s).\n")
	token := fs.Uint64("grant-token", 0, "the grant's token (acquired.sequencer.token): release only that grant")
	pos, err := c.parseArgs(fs, args, "KEY", "SESSION")
	if err != nil {
		return err
	}
	conn, err := c.dial(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	resp, err := lockbrokerv1.NewLockServiceClient(conn).Release(ctx, &lockbrokerv1.ReleaseRequest{Key: pos[0], SessionId: pos[1], Token: *token})
	if err != nil {
		return err
	}
	if resp.GetReleased() {
		fmt.Fprintf(c.stdout, "released %q (session %s)\n", pos[0], pos[1])
	} else {
		fmt.Fprintf(c.stdout, "%q was already released by session %s\n", pos[0], pos[1])
	}
	return nil
}
