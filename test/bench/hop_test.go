package bench

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
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
// Consul writes (KV acquire and release with one session kept for the
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

// hop is the relay's LockService: Acquire and Release only.
type hop struct {
	lockbrokerv1.UnimplementedLockServiceServer
	kv      *api.KV
	session string

	mu   sync.Mutex
	held map[string]chan struct{} // key → closed by its Release
}

// serveHop runs the relay on a loopback port until stdin closes (the
// parent went away), after printing "HOP <addr>".
func serveHop(consulAddr string) error {
	c, err := api.NewClient(&api.Config{Address: consulAddr, Transport: pooledTransport()})
	if err != nil {
		return err
	}
	id, _, err := c.Session().Create(&api.SessionEntry{TTL: "600s", Behavior: api.SessionBehaviorRelease}, nil)
	if err != nil {
		return err
	}
	defer func() { _, _ = c.Session().Destroy(id, nil) }()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	s := grpc.NewServer()
	lockbrokerv1.RegisterLockServiceServer(s, &hop{kv: c.KV(), session: id, held: map[string]chan struct{}{}})
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
	done := make(chan struct{})
	h.mu.Lock()
	if _, busy := h.held[key]; busy {
		h.mu.Unlock()
		return status.Error(codes.Aborted, "held")
	}
	h.held[key] = done
	h.mu.Unlock()
	wctx, cancel := context.WithTimeout(ctx, opTimeout)
	ok, _, err := h.kv.Acquire(&api.KVPair{Key: key, Session: h.session, Flags: api.LockFlagValue}, (&api.WriteOptions{}).WithContext(wctx))
	cancel()
	if err != nil || !ok {
		h.forget(key)
		return status.Errorf(codes.Aborted, "acquire %s: %v %v", key, ok, err)
	}
	err = stream.Send(&lockbrokerv1.AcquireResponse{Event: &lockbrokerv1.AcquireResponse_Acquired{Acquired: &lockbrokerv1.AcquireAcquired{
		Sequencer: &lockbrokerv1.Sequencer{Key: key, SessionId: h.session, Token: 1}}}})
	if err != nil {
		h.release(key)
		return err
	}
	select {
	case <-done:
		return stream.Send(&lockbrokerv1.AcquireResponse{Event: &lockbrokerv1.AcquireResponse_Released{Released: &lockbrokerv1.AcquireReleased{}}})
	case <-ctx.Done():
		h.release(key)
		return ctx.Err()
	}
}

func (h *hop) Release(ctx context.Context, req *lockbrokerv1.ReleaseRequest) (*lockbrokerv1.ReleaseResponse, error) {
	wctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	ok, _, err := h.kv.Release(&api.KVPair{Key: req.GetKey(), Session: h.session, Flags: api.LockFlagValue}, (&api.WriteOptions{}).WithContext(wctx))
	if err != nil || !ok {
		return nil, status.Errorf(codes.Aborted, "release %s: %v %v", req.GetKey(), ok, err)
	}
	if done := h.forget(req.GetKey()); done != nil {
		close(done)
	}
	return &lockbrokerv1.ReleaseResponse{Released: true}, nil
}

// release is a stream's own release when its client went away.
func (h *hop) release(key string) {
	if h.forget(key) != nil {
		_, _, _ = h.kv.Release(&api.KVPair{Key: key, Session: h.session, Flags: api.LockFlagValue}, nil)
	}
}

func (h *hop) forget(key string) chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	done := h.held[key]
	delete(h.held, key)
	return done
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
