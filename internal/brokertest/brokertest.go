// Package brokertest runs real lockbroker replicas for tests, against real
// Consul agents: in-process (Start: a real gRPC listener on loopback) or as
// child processes of the broker binary (StartProcess with a consultest
// agent, StartDev with the broker's own --dev agent) that a test can pause,
// crash or terminate. Build and RepoRoot build the repository's other
// binaries (lockctl, pinned tools) for process tests.
package brokertest

import (
	"net"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/consulstore"
	"github.com/lockbroker/lockbroker/internal/consultest"
	"github.com/lockbroker/lockbroker/internal/server"
)

// Replica is one in-process broker on a loopback listener.
type Replica struct {
	Addr   string
	Broker *broker.Broker
	Store  *consulstore.Store
	srv    *server.Server
	done   chan struct{}
	conns  []*grpc.ClientConn
}

// Option configures an in-process replica.
type Option func(*options)

type options struct {
	waitTime   time.Duration
	consulAddr string
	server     []server.Option
	broker     []broker.Option
}

// WithBrokerOptions passes options to broker.New (session pool, ...).
func WithBrokerOptions(opts ...broker.Option) Option {
	return func(o *options) { o.broker = append(o.broker, opts...) }
}

// WithWaitTime bounds each Consul blocking query (default
// consulstore.DefaultWaitTime); an idle watch lingers that long.
func WithWaitTime(d time.Duration) Option { return func(o *options) { o.waitTime = d } }

// WithConsulAddress makes the replica reach the agent at addr (a proxy in
// front of it, say) instead of the agent's own address.
func WithConsulAddress(addr string) Option { return func(o *options) { o.consulAddr = addr } }

// WithServerOptions passes options to server.New (keepalive, ...).
func WithServerOptions(opts ...server.Option) Option {
	return func(o *options) { o.server = append(o.server, opts...) }
}

// Start runs a broker replica against agent until the test ends. agent
// may be nil with WithConsulAddress (an agent of a consultest.Cluster).
func Start(t testing.TB, agent *consultest.Agent, opts ...Option) *Replica {
	t.Helper()
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	var cfg *api.Config
	if agent != nil {
		cfg = agent.Config()
	} else {
		cfg = &api.Config{Scheme: "http"}
	}
	if o.consulAddr != "" {
		cfg.Address = o.consulAddr
	}
	store, err := consulstore.Open(cfg, consulstore.Options{WaitTime: o.waitTime})
	if err != nil {
		t.Fatalf("consul store: %v", err)
	}
	b := broker.New(store, log, o.broker...)
	srv, err := server.New(b, store, log, o.server...)
	if err != nil {
		t.Fatalf("server: %v", err)
	}
	srv.Health.SetServingStatus("", 1)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	r := &Replica{Addr: lis.Addr().String(), Broker: b, Store: store, srv: srv, done: make(chan struct{})}
	go func() { defer close(r.done); _ = srv.GRPC.Serve(server.TrackConns(lis)) }()
	t.Cleanup(r.Stop)
	return r
}

// Stop shuts the replica down gracefully (holds end with BROKER_SHUTDOWN).
// It is idempotent.
func (r *Replica) Stop() {
	select {
	case <-r.done:
		return
	default:
	}
	for _, c := range r.conns {
		_ = c.Close()
	}
	r.Broker.Close()
	stopped := make(chan struct{})
	go func() { r.srv.GRPC.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		r.srv.GRPC.Stop()
	}
	<-r.done
	r.Store.Close()
}

// Conn dials the replica; the connection closes with the replica.
func (r *Replica) Conn(t testing.TB) *grpc.ClientConn {
	t.Helper()
	c, err := grpc.NewClient(r.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	r.conns = append(r.conns, c)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Locks returns a LockService client on a new connection.
func (r *Replica) Locks(t testing.TB) lockbrokerv1.LockServiceClient {
	return lockbrokerv1.NewLockServiceClient(r.Conn(t))
}

// Sessions returns a SessionService client on a new connection.
func (r *Replica) Sessions(t testing.TB) lockbrokerv1.SessionServiceClient {
	return lockbrokerv1.NewSessionServiceClient(r.Conn(t))
}
