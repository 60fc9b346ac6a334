package bench

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
)

// The hop floor: what any process between the client and Consul costs on
// this machine, with no broker in it. A relay in a process of its own
// serves the broker's Acquire and Release with nothing but the floor's two
// Consul writes (KV acquire and release with a session kept for the
// relay's life, through an api.Client): no validation, no records, no
// fencing, no renewal, no logging. The table's client drives it with the
// same raw stubs and the same cycle as the broker row, so the difference
// between the two rows is the broker's own cost, and the hop floor against
// the floor is the cost of the hop itself.

// hopEnv names the agent's HTTP address in the environment of the test
// binary when it runs as the relay (TestMain).
const hopEnv = "LOCKBROKER_BENCH_HOP_CONSUL"

func TestMain(m *testing.M) {
	if addr := os.Getenv(hopEnv); addr != "" {
		if err := serveHop(addr); err != nil {
			fmt.Fprintln(os.Stderr, "hop:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// hop is the relay's LockService: Acquire and Release only, for locks.
// A busy key queues its Acquire; a Release with a waiter hands the key
// over in one transaction (unlock, and lock with the waiter's session),
// as the broker's hand-off does, but with no records or checks. Two
// sessions, kept for the relay's life, take turns: a hand-off gives the
// waiter the one its holder does not have.
type hop struct {
	lockbrokerv1.UnimplementedLockServiceServer
	c        *api.Client
	sessions [2]string

	mu    sync.Mutex
	locks map[string]*hopLock
}

// hopLock is a key the relay holds or is taking, and its waiters in order.
type hopLock struct {
	holder  string        // the holding (or acquiring) session
	done    chan struct{} // closed when the holder's hold ends by Release
	waiters []*hopWaiter
}

type hopWaiter struct {
	session string        // set by the hand-off, before granted closes
	granted chan struct{} // closed when the key is handed over
	done    chan struct{}
}

// serveHop runs the relay on a loopback port until stdin closes (the
// parent went away), after printing "HOP <addr>".
func serveHop(consulAddr string) error {
	c, err := api.NewClient(&api.Config{Address: consulAddr, Transport: pooledTransport()})
	if err != nil {
		return err
	}
	h := &hop{c: c, locks: map[string]*hopLock{}}
	for i := range h.sessions {
		id, _, err := c.Session().Create(&api.SessionEntry{TTL: "600s", Behavior: api.SessionBehaviorRelease}, nil)
		if err != nil {
			return err
		}
		defer func() { _, _ = c.Session().Destroy(id, nil) }()
		h.sessions[i] = id
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	s := grpc.NewServer()
	lockbrokerv1.RegisterLockServiceServer(s, h)
	healthpb.RegisterHealthServer(s, health.NewServer())
	go func() { _ = s.Serve(lis) }()
	fmt.Printf("HOP %s\n", lis.Addr())
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n') // EOF when the parent ends
	s.Stop()
	return nil
}

func (h *hop) Acquire(req *lockbrokerv1.AcquireRequest, stream lockbrokerv1.LockService_AcquireServer) error {
	ctx := stream.Context()
	key := req.GetKey()
	h.mu.Lock()
	l := h.locks[key]
	if l != nil {
		// Busy: queue, and wait for the hand-off.
		w := &hopWaiter{granted: make(chan struct{}), done: make(chan struct{})}
		l.waiters = append(l.waiters, w)
		h.mu.Unlock()
		err := stream.Send(&lockbrokerv1.AcquireResponse{Event: &lockbrokerv1.AcquireResponse_Queued{Queued: &lockbrokerv1.AcquireQueued{}}})
		if err == nil {
			select {
			case <-w.granted:
				return h.hold(stream, key, w.session, w.done)
			case <-ctx.Done():
				err = ctx.Err()
			}
		}
		h.mu.Lock()
		select {
		case <-w.granted: // handed over meanwhile: this stream holds it (and hold releases it)
			h.mu.Unlock()
			return h.hold(stream, key, w.session, w.done)
		default:
			l.waiters = slices.DeleteFunc(l.waiters, func(x *hopWaiter) bool { return x == w })
			h.mu.Unlock()
			return err
		}
	}
	l = &hopLock{holder: h.sessions[0], done: make(chan struct{})}
	h.locks[key] = l
	h.mu.Unlock()
	wctx, cancel := context.WithTimeout(ctx, opTimeout)
	ok, _, err := h.c.KV().Acquire(&api.KVPair{Key: key, Session: l.holder, Flags: api.LockFlagValue}, (&api.WriteOptions{}).WithContext(wctx))
	cancel()
	if err != nil || !ok {
		h.mu.Lock()
		delete(h.locks, key) // waiters that came meanwhile wait for their own ends
		h.mu.Unlock()
		return status.Errorf(codes.Aborted, "acquire %s: %v %v", key, ok, err)
	}
	return h.hold(stream, key, l.holder, l.done)
}

// hold announces the grant and keeps the stream until the hold's Release
// (then `released`) or the client's going away (then the key is released
// or handed on, as by a Release).
func (h *hop) hold(stream lockbrokerv1.LockService_AcquireServer, key, session string, done chan struct{}) error {
	err := stream.Send(&lockbrokerv1.AcquireResponse{Event: &lockbrokerv1.AcquireResponse_Acquired{Acquired: &lockbrokerv1.AcquireAcquired{
		Sequencer: &lockbrokerv1.Sequencer{Key: key, SessionId: session, Token: 1}}}})
	if err == nil {
		select {
		case <-done:
			return stream.Send(&lockbrokerv1.AcquireResponse{Event: &lockbrokerv1.AcquireResponse_Released{Released: &lockbrokerv1.AcquireReleased{}}})
		case <-stream.Context().Done():
			err = stream.Context().Err()
		}
	}
	_ = h.release(context.Background(), key, session, done)
	return err
}

func (h *hop) Release(ctx context.Context, req *lockbrokerv1.ReleaseRequest) (*lockbrokerv1.ReleaseResponse, error) {
	if err := h.release(ctx, req.GetKey(), req.GetSessionId(), nil); err != nil {
		return nil, status.Errorf(codes.Aborted, "release %s: %v", req.GetKey(), err)
	}
	return &lockbrokerv1.ReleaseResponse{Released: true}, nil
}

// release ends session's hold of key: it hands the key to the first waiter
// in one transaction, or releases it. A session that does not hold key
// (its hold ended already) changes nothing, nor does a stream's own
// release (done not nil) once its hold has ended.
func (h *hop) release(ctx context.Context, key, session string, done chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	h.mu.Lock()
	defer h.mu.Unlock() // one release or hand-off at a time: enough for a bench
	l := h.locks[key]
	if l == nil || l.holder != session || (done != nil && l.done != done) {
		return nil
	}
	opts := (&api.QueryOptions{}).WithContext(ctx)
	if len(l.waiters) == 0 {
		ok, _, err := h.c.KV().Release(&api.KVPair{Key: key, Session: session, Flags: api.LockFlagValue}, (&api.WriteOptions{}).WithContext(ctx))
		if err != nil || !ok {
			return fmt.Errorf("kv release: %v %v", ok, err)
		}
		delete(h.locks, key)
		close(l.done)
		return nil
	}
	w := l.waiters[0]
	w.session = h.sessions[0]
	if session == w.session {
		w.session = h.sessions[1]
	}
	ok, _, _, err := h.c.Txn().Txn(api.TxnOps{
		{KV: &api.KVTxnOp{Verb: api.KVUnlock, Key: key, Flags: api.LockFlagValue, Session: session}},
		{KV: &api.KVTxnOp{Verb: api.KVLock, Key: key, Flags: api.LockFlagValue, Session: w.session}},
	}, opts)
	if err != nil || !ok {
		return fmt.Errorf("hand-off txn: %v %v", ok, err)
	}
	l.waiters = l.waiters[1:]
	close(l.done)
	l.holder, l.done = w.session, w.done
	close(w.granted)
	return nil
}

// hopProcess is the relay running as a child of this test binary.
type hopProcess struct {
	bd     brokerDriver
	health healthpb.HealthClient
	pid    int
}

// startHop runs the relay on the agent at consulAddr and connects to it as
// the table's client connects to the broker.
func startHop(t testing.TB, consulAddr string) *hopProcess {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), hopEnv+"="+consulAddr)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = stdin.Close()
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(exited) }()
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	line := make(chan string, 1)
	go func() {
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			if addr, ok := strings.CutPrefix(s.Text(), "HOP "); ok {
				line <- addr
				return
			}
		}
		close(line)
	}()
	var addr string
	select {
	case a, ok := <-line:
		if !ok {
			t.Fatal("hop relay ended before it listened")
		}
		addr = a
	case <-time.After(30 * time.Second):
		t.Fatal("hop relay did not listen within 30 s")
	}
	conn := dial(t, addr)
	return &hopProcess{bd: newDriver(conn), health: healthpb.NewHealthClient(conn), pid: cmd.Process.Pid}
}

// check is one gRPC round trip with nothing behind it.
func (p *hopProcess) check() error {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	_, err := p.health.Check(ctx, &healthpb.HealthCheckRequest{})
	return err
}
