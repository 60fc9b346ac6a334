package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/lockbroker/lockbroker/client"
)

// Ledger records which tasks are done. Every worker shares it: in
// production a database table or shared storage; here a directory
// (FileLedger) or, in tests, memory.
type Ledger interface {
	// Done reports whether task was completed.
	Done(ctx context.Context, task string) (bool, error)
	// Complete records that task was completed under the lock grant with
	// this fencing token. It refuses, with ErrStaleToken, a token lower
	// than one it has already seen for task: a worker that lost its lock
	// without knowing it (paused past its lease) cannot overwrite the
	// record of a newer holder.
	Complete(ctx context.Context, task, worker string, token uint64) error
}

// ErrStaleToken is a Ledger's refusal of an outdated lock grant.
var ErrStaleToken = errors.New("stale fencing token")

// Task does one task's work while its worker holds the task's lock. ctx
// ends when the lock is lost or the worker stops, and the work must then
// stop. Pass lease.Sequencer().Token to anything it changes.
type Task func(ctx context.Context, task string, lease *client.Lease) error

// Worker takes tasks from a shared list: for each task not yet done it
// tries the task's lock once (a busy lock means another worker has it),
// runs the tasks it wins, records each in the Ledger, releases the lock
// and moves on. It goes over the list again, after Retry, until the
// Ledger shows every task done.
//
// The locks are try-once locks with Consul's DELETE behaviour, so task
// keys do not pile up in Consul, and no lock-delay by default: the Ledger
// is fenced by the lock's token, so a worker that lost its lock late
// cannot record a task over a newer holder.
type Worker struct {
	// Name identifies the worker: the lock's value while it holds a task.
	Name string
	// Client reaches the brokers.
	Client *client.Client
	// Prefix is where the task locks live: Prefix/<task>.
	Prefix string
	// Tasks is the shared list; every worker should have the same.
	Tasks []string
	// Ledger records which tasks are done.
	Ledger Ledger
	// Do runs one task.
	Do Task
	// Retry is the pause between passes over the list while other workers
	// hold tasks (default 100ms).
	Retry time.Duration
	// TTL is the lock session's TTL (default 10s, the shortest): how long
	// the lock outlives a worker that vanishes without closing its
	// connection.
	TTL time.Duration
	// LockDelay is Consul's lock-delay for the task locks (default 0).
	LockDelay time.Duration
	// Log receives one line per event; nil discards them.
	Log io.Writer
}

// Run works until every task is done (nil), ctx ends (ctx's error), or
// the brokers fail (the error). A task whose work fails is tried again in
// a later pass.
func (w *Worker) Run(ctx context.Context) error {
	retry := w.Retry
	if retry <= 0 {
		retry = 100 * time.Millisecond
	}
	for {
		left := 0
		for _, task := range w.Tasks {
			if err := ctx.Err(); err != nil {
				return err
			}
			done, err := w.Ledger.Done(ctx, task)
			if err != nil {
				return fmt.Errorf("ledger: %w", err)
			}
			if done {
				continue
			}
			settled, err := w.try(ctx, task)
			if err != nil {
				return err
			}
			if !settled {
				left++
			}
		}
		if left == 0 {
			w.logf("%s: no task left", w.Name)
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(retry):
		}
	}
}

// try takes task's lock once and, if it gets it, runs the task. settled
// is true when the task is done (by this worker or, as it turns out, by
// another), false when it is held elsewhere or its work failed.
func (w *Worker) try(ctx context.Context, task string) (settled bool, err error) {
	ttl := w.TTL
	if ttl <= 0 {
		ttl = 10 * time.Second
	}
	lease, err := w.Client.TryLock(ctx, w.Prefix+"/"+task,
		client.WithValue([]byte(w.Name)), client.WithDeleteBehavior(), client.WithTTL(ttl), client.WithLockDelay(w.LockDelay))
	if errors.Is(err, client.ErrBusy) {
		return false, nil // another worker has it
	}
	if err != nil {
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		return false, fmt.Errorf("lock %s: %w", task, err)
	}
	defer w.release(ctx, task, lease)

	// Check again under the lock: another worker may have finished it
	// between our check and our lock.
	if done, err := w.Ledger.Done(ctx, task); err != nil || done {
		return done, err
	}
	token := lease.Sequencer().GetToken()
	wctx, cancel := context.WithCancel(ctx)
	go func() { // the work stops when the lock is lost
		select {
		case <-lease.Lost():
			cancel()
		case <-wctx.Done():
		}
	}()
	err = w.Do(wctx, task, lease)
	cancel()
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return false, ctx.Err()
	case lease.Err() != nil:
		w.logf("%s: lost %s while running it (token %d): %v", w.Name, task, token, lease.Err())
		return false, nil
	default:
		w.logf("%s: %s failed (token %d): %v", w.Name, task, token, err)
		return false, nil
	}
	if err := w.Ledger.Complete(ctx, task, w.Name, token); err != nil {
		w.logf("%s: cannot record %s (token %d): %v", w.Name, task, token, err)
		return false, nil
	}
	w.logf("%s: ran %s (token %d)", w.Name, task, token)
	return true, nil
}

// release gives the task's lock up, even when ctx has ended.
func (w *Worker) release(ctx context.Context, task string, lease *client.Lease) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	var lost *client.LostError
	if err := lease.Release(rctx); err != nil && !errors.As(err, &lost) {
		w.logf("%s: release %s: %v", w.Name, task, err)
	}
}

func (w *Worker) logf(format string, args ...any) {
	if w.Log != nil {
		fmt.Fprintf(w.Log, format+"\n", args...)
	}
}
