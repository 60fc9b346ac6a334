// Command cli is the Go client's conformance CLI (test/conformance/scenarios.md,
// S5): it holds a lock or semaphore slot through package client and prints
// JSON lines, so that cross-language runs can drive Go holders as they drive
// the Python, Node and Java ones.
//
//	go run ./test/conformance/go/cli hold --target 127.0.0.1:8700 --key jobs/x [--limit 3] [--seconds 30]
//	go run ./test/conformance/go/cli hold --target 127.0.0.1:8700 --key jobs/x --mode read|write
//	go run ./test/conformance/go/cli hold --target 127.0.0.1:8700 --key a --also b --also c
//	go run ./test/conformance/go/cli watch --target 127.0.0.1:8700 --key jobs/x [--prefix] [--seconds 30]
//
// `hold` takes a lock (--limit 0, the default), a slot of a semaphore of
// --limit, a read or write hold of a read-write lock (--mode read|write,
// S8 and S10), or a multi-key lock of --key and every --also (S9), holds it for --seconds (or until SIGTERM, or until stdin ends
// when stdin is a pipe or a socket), releases it and prints
// {"event":"acquired","token":T,"mode":M,"session_id":S,"lang":"go",...}
// (M: read, write, lock or semaphore; a multi-key lock adds "keys":[...]
// and "tokens":[...], one per key in order), then
// {"event":"released","release_t":R,...} (R: when the release was asked
// for; the hold ended between R and the line's t); a loss prints {"event":"lost","reason":R} and
// exits 2, a failure {"event":"error","error":E,"reason":R} and exits 1.
// `watch` prints {"event":"state",...} per state (and
// {"event":"snapshot_complete"} with --prefix). --target may repeat
// (replicas); --wait S bounds the wait; --ttl S, --value V, --token T.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/lockbroker/lockbroker/client"
)

func main() { os.Exit(run(os.Args[1:])) }

type targets []string

// also is the repeatable --also.
type also []string

func (a *also) String() string     { return strings.Join(*a, ",") }
func (a *also) Set(v string) error { *a = append(*a, v); return nil }

func (t *targets) String() string     { return strings.Join(*t, ",") }
func (t *targets) Set(v string) error { *t = append(*t, v); return nil }

var outMu sync.Mutex

// emit prints one JSON line with lang and t (Unix seconds) added.
func emit(kv map[string]any) {
	kv["lang"] = "go"
	kv["t"] = float64(time.Now().UnixMicro()) / 1e6
	b, _ := json.Marshal(kv)
	outMu.Lock()
	defer outMu.Unlock()
	_, _ = os.Stdout.Write(append(b, '\n'))
}

func fail(err error) int {
	reason := ""
	var se *client.StatusError
	if errors.As(err, &se) {
		reason = se.Reason
	}
	emit(map[string]any{"event": "error", "error": err.Error(), "reason": reason})
	return 1
}

func run(args []string) int {
	if len(args) == 0 || (args[0] != "hold" && args[0] != "watch") {
		fmt.Fprintln(os.Stderr, "usage: cli hold|watch --target ADDR [--target ADDR] --key KEY [--limit N | --mode read|write | --also KEY ...] [--seconds S]")
		return 2
	}
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	var tg targets
	fs.Var(&tg, "target", "broker address (repeat for replicas)")
	key := fs.String("key", "", "lock key or semaphore prefix")
	seconds := fs.Float64("seconds", 30, "how long to hold (or watch)")
	token := fs.String("token", "", "bearer token (sent over plaintext: loopback tests)")
	limit := fs.Uint("limit", 0, "0: a lock; N: a slot of a semaphore of N")
	ttl := fs.Float64("ttl", 0, "session TTL in seconds (default: the broker's)")
	wait := fs.Float64("wait", -1, "seconds to wait (default: no bound)")
	value := fs.String("value", "", "the holder's value")
	prefix := fs.Bool("prefix", false, "watch: every key under the prefix")
	mode := fs.String("mode", "", "read or write: a hold of the read-write lock --key")
	var more also
	fs.Var(&more, "also", "another key taken with --key, all or nothing (repeat; a multi-key lock)")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	if len(tg) == 0 || *key == "" {
		fmt.Fprintln(os.Stderr, "--target and --key are required")
		return 2
	}
	if *mode != "" && *mode != "read" && *mode != "write" {
		fmt.Fprintln(os.Stderr, "--mode is read or write")
		return 2
	}
	if (*mode != "" && (len(more) > 0 || *limit > 0)) || (len(more) > 0 && *limit > 0) {
		fmt.Fprintln(os.Stderr, "--mode, --also and --limit exclude each other")
		return 2
	}
	var dialOpts []client.DialOption
	if *token != "" {
		dialOpts = append(dialOpts, client.WithToken(*token), client.WithTokenOverPlaintext())
	}
	dopts, err := client.DialOptions(dialOpts...)
	if err != nil {
		return fail(err)
	}
	var conns []grpc.ClientConnInterface
	for _, addr := range tg {
		conn, err := grpc.NewClient(addr, dopts...)
		if err != nil {
			return fail(err)
		}
		defer conn.Close()
		conns = append(conns, conn)
	}
	c := client.New(conns[0], client.WithReplicas(conns[1:]...))
	d := time.Duration(*seconds * float64(time.Second))
	if args[0] == "watch" {
		return watch(c, *key, *prefix, d)
	}
	opts := []client.LockOption{client.WithValue([]byte(*value))}
	if *limit > 0 {
		opts = append(opts, client.WithLimit(uint32(*limit)))
	}
	if len(more) > 0 {
		opts = append(opts, client.WithKeys(more...))
	}
	if *ttl > 0 {
		opts = append(opts, client.WithTTL(time.Duration(*ttl*float64(time.Second))))
	}
	if *wait >= 0 {
		opts = append(opts, client.WithWaitTimeout(time.Duration(*wait*float64(time.Second))))
	}
	take, held := c.Lock, "lock"
	switch {
	case *mode == "read":
		take, held = func(ctx context.Context, key string, opts ...client.LockOption) (*client.Lease, error) {
			return c.RWLock(key).RLock(ctx, opts...)
		}, "read"
	case *mode == "write":
		take, held = func(ctx context.Context, key string, opts ...client.LockOption) (*client.Lease, error) {
			return c.RWLock(key).Lock(ctx, opts...)
		}, "write"
	case *limit > 0:
		held = "semaphore"
	}
	return hold(take, held, *key, d, opts)
}

// taker takes a lease: Client.Lock, or an RWMutex's RLock or Lock.
type taker func(ctx context.Context, key string, opts ...client.LockOption) (*client.Lease, error)

func hold(take taker, mode, key string, d time.Duration, opts []client.LockOption) int {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, os.Interrupt)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if tp := os.Getenv("LOCKBROKER_TRACEPARENT"); tp != "" {
		// The caller's W3C trace context (the trace test): an
		// OpenTelemetry client handler would put it there the same way.
		ctx = metadata.AppendToOutgoingContext(ctx, "traceparent", tp)
	}
	go func() { // SIGTERM while waiting withdraws the request
		select {
		case <-sigs:
			cancel()
		case <-ctx.Done():
		}
	}()
	lease, err := take(ctx, key, opts...)
	if err != nil {
		if ctx.Err() != nil { // SIGTERM while waiting: withdrawn, not a failure
			return 143
		}
		return fail(err)
	}
	seq := lease.Sequencer()
	acq := map[string]any{"event": "acquired", "key": key, "token": seq.GetToken(), "session_id": seq.GetSessionId(),
		"mode": mode, "deadline_in": time.Until(lease.Deadline()).Seconds()}
	if seqs := lease.Sequencers(); len(seqs) > 1 {
		var keys []string
		var tokens []uint64
		for _, s := range seqs {
			keys, tokens = append(keys, s.GetKey()), append(tokens, s.GetToken())
		}
		acq["keys"], acq["tokens"] = keys, tokens
	}
	emit(acq)
	stop := make(chan struct{})
	var once sync.Once
	done := func() { once.Do(func() { close(stop) }) }
	go func() {
		select {
		case <-ctx.Done(): // SIGTERM
			done()
		case <-stop:
		}
	}()
	if stdinIsPipe() { // its end is a request to release
		go func() {
			_, _ = io.Copy(io.Discard, os.Stdin)
			done()
		}()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-stop:
	case <-timer.C:
	case <-lease.Lost():
	}
	var le *client.LostError
	if err := lease.Err(); errors.As(err, &le) {
		emitLost(le)
		return 2
	}
	releaseT := float64(time.Now().UnixMicro()) / 1e6
	rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer rcancel()
	if err := lease.Release(rctx); err != nil {
		if errors.As(err, &le) {
			emitLost(le)
			return 2
		}
		return fail(err)
	}
	emit(map[string]any{"event": "released", "token": seq.GetToken(), "mode": mode, "release_t": releaseT})
	return 0
}

// emitLost prints the lost line, with the lost key when there is one.
func emitLost(le *client.LostError) {
	ev := map[string]any{"event": "lost", "reason": le.Cause, "detail": le.Detail}
	if le.Key != "" {
		ev["key"] = le.Key
	}
	emit(ev)
}

func stdinIsPipe() bool {
	fi, err := os.Stdin.Stat()
	if err != nil {
		return false
	}
	m := fi.Mode()
	return m&os.ModeNamedPipe != 0 || m&os.ModeSocket != 0
}

func watch(c *client.Client, key string, prefix bool, d time.Duration) int {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var opts []client.WatchOption
	if prefix {
		opts = append(opts, client.WithPrefix())
	}
	w, err := c.Watch(ctx, key, opts...)
	if err != nil {
		if ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) {
			return 0
		}
		return fail(err)
	}
	for resp := range w.C {
		if resp.GetSnapshotComplete() {
			emit(map[string]any{"event": "snapshot_complete"})
			continue
		}
		st := resp.GetState()
		var holders []map[string]any
		for _, h := range st.GetHolders() {
			holders = append(holders, map[string]any{"session_id": h.GetSessionId(), "value": string(h.GetValue()), "token": h.GetToken()})
		}
		emit(map[string]any{"event": "state", "key": st.GetKey(),
			"kind": strings.ToLower(strings.TrimPrefix(st.GetKind().String(), "LOCK_KIND_")), "limit": st.GetLimit(), "holders": holders})
	}
	if err := w.Err(); err != nil && ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) {
		return fail(err)
	}
	return 0
}
