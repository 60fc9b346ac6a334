package server

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"buf.build/go/protovalidate"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	noopmetric "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/buildinfo"
	"github.com/lockbroker/lockbroker/internal/tenant"
)

// Consul is what the server reads about Consul for health and metrics.
type Consul interface {
	// Healthy fails when Consul does not answer or has no leader.
	Healthy(ctx context.Context) error
	// OpenBlockingQueries is the number of blocking queries in flight.
	OpenBlockingQueries() int64
	// Collector exports the counts of Consul calls.
	Collector() prometheus.Collector
}

// Server is the gRPC server with its health and metrics.
type Server struct {
	GRPC    *grpc.Server
	Health  *health.Server
	Metrics *prometheus.Registry
	consul  Consul
	log     *zap.Logger
	access  *access

	mu       sync.Mutex
	healthy  bool
	draining bool // set by Shutdown: NOT_SERVING for good
}

// Server keepalive defaults: the promise that a vanished client's
// broker-owned hold is released within 20 s rests on them (ping after
// DefaultKeepaliveTime without reads from the client, give the connection
// up DefaultKeepaliveTimeout later; the hold is then kept until the last
// guaranteed_for promised, at most broker.DefaultPromiseBound, plus half
// a second, since the client may be resuming it: 3 + 2 + 14.5 + 0.5).
const (
	DefaultKeepaliveTime    = 3 * time.Second
	DefaultKeepaliveTimeout = 2 * time.Second
	// KeepaliveMinClientInterval is the shortest interval at which clients
	// may ping the server, with or without open streams; pinging more
	// often gets the connection closed (ENHANCE_YOUR_CALM).
	KeepaliveMinClientInterval = 5 * time.Second
)

// streamWorkers is the number of goroutines the gRPC server keeps to run
// calls on (grpc.NumStreamWorkers): two per P. A call that finds them all
// busy (each open Acquire or Watch stream keeps one for its whole life)
// runs on a goroutine of its own, as without workers. A worker keeps the
// stack its calls grew, where a call on a new goroutine copies its stack
// several times on its way down gRPC, the interceptors, the broker and
// the Consul client. gRPC hands a call to the worker idle the longest, so
// a few workers stay in cache and many do not: measured side by side
// (two replicas on one agent in one process, calls alternated between
// them; test/bench TestSideBySide), 4 workers took 56-78 µs off a warm
// Acquire+Release cycle, 84-113 µs off one after an idle pause and 41-77
// µs off a hand-off; 16 workers 26 µs off the warm cycle; 256 workers
// nothing.
func streamWorkers() uint32 { return uint32(2 * runtime.GOMAXPROCS(0)) }

// Option configures New.
type Option func(*options)

type options struct {
	keepaliveTime, keepaliveTimeout time.Duration
	tenants                         *tenant.Config
	creds                           credentials.TransportCredentials
	workers                         uint32
	tracing                         stats.Handler
}

// WithStreamWorkers sets how many stream workers run calls (0: none, every
// call on a goroutine of its own). Default: two per P (see streamWorkers).
func WithStreamWorkers(n uint32) Option {
	return func(o *options) { o.workers = n }
}

// WithTenants makes the broker a shared service: every LockService,
// SessionService and AdminService call needs an identity the tenants
// file knows (UNAUTHENTICATED otherwise), a tenant's calls are limited to
// its prefixes and quotas, and AdminService to the admins. Without it the
// broker is single-tenant: every caller may do everything. SetTenants
// replaces the file later.
func WithTenants(cfg *tenant.Config) Option {
	return func(o *options) { o.tenants = cfg }
}

// WithTracing gives every RPC but health checks a server span from tp,
// child of the trace context the client sent (W3C traceparent, read by
// prop), so that the Consul calls made for it (consulstore's
// Options.Tracer) nest under it. Default: no tracing, and no cost.
func WithTracing(tp trace.TracerProvider, prop propagation.TextMapPropagator) Option {
	return func(o *options) {
		o.tracing = otelgrpc.NewServerHandler(
			otelgrpc.WithTracerProvider(tp),
			otelgrpc.WithPropagators(prop),
			otelgrpc.WithMeterProvider(noopmetric.NewMeterProvider()), // Prometheus has the metrics
			otelgrpc.WithFilter(func(info *stats.RPCTagInfo) bool {
				return !strings.HasPrefix(info.FullMethodName, "/grpc.health.v1.Health/")
			}),
		)
	}
}

// WithTransportCredentials serves gRPC over creds (TLS, mTLS) instead of
// plaintext.
func WithTransportCredentials(creds credentials.TransportCredentials) Option {
	return func(o *options) { o.creds = creds }
}

// WithKeepalive sets the server keepalive: ping a client after idle with
// no reads from it, and close the connection when the ping is not
// answered within timeout; every stream on it ends (a broker-owned hold is
// released). Defaults: DefaultKeepaliveTime and DefaultKeepaliveTimeout.
// gRPC raises an idle below 1 s to 1 s.
func WithKeepalive(idle, timeout time.Duration) Option {
	return func(o *options) { o.keepaliveTime, o.keepaliveTimeout = idle, timeout }
}

// New wires the gRPC server: metrics, access logging (finished calls at
// debug when OK, otherwise at info and above), recovery (INTERNAL, panic
// logged), access (identity, then validation: INVALID_ARGUMENT with
// details, so that no refusal logs or echoes a request over the API's
// limits; then tenant prefixes, quotas, audit log; see WithTenants) and cut-off
// (REPLICA_CUT_OFF while the replica cannot reach Consul) interceptors,
// server keepalive and its enforcement policy, the three services, health
// and reflection.
func New(b *broker.Broker, consul Consul, log *zap.Logger, opts ...Option) (*Server, error) {
	o := options{keepaliveTime: DefaultKeepaliveTime, keepaliveTimeout: DefaultKeepaliveTimeout, workers: streamWorkers()}
	for _, opt := range opts {
		opt(&o)
	}
	validator, err := protovalidate.New()
	if err != nil {
		return nil, fmt.Errorf("protovalidate: %w", err)
	}
	srvMetrics := newGRPCMetrics()
	reg := newRegistry(consul, srvMetrics)
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "lockbroker_replica_cut_off_total",
		Help: "Requests and streams this replica ended UNAVAILABLE with REPLICA_CUT_OFF: cut off from its Consul agent, it sent them to another replica.",
	}, func() float64 { return float64(b.CutOffAnswers()) }), prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "lockbroker_replica_cut_off",
		Help: "1 while this replica counts as cut off from its Consul agent (no answer for 3 s), sending requests and streams to other replicas; 0 otherwise.",
	}, func() float64 {
		if b.Admit() != nil {
			return 1
		}
		return 0
	}))
	recovered := func(p any) error {
		log.Error("panic in handler", zap.Any("panic", p), zap.ByteString("stack", debug.Stack()))
		return status.Error(codes.Internal, "internal error")
	}
	accessLog := accessLog{log: log}
	gate := cutOffGate{b: b, log: log}
	val := &validation{validator: validator, codec: newRequestCodec()}
	acc := &access{audit: log.Named(AuditLoggerName), val: val}
	acc.quotas = newQuotas(func(ctx context.Context, t string) (int, error) {
		if err := b.Admit(); err != nil {
			return 0, err // cut off: at once, not after the list's timeout
		}
		return clientOwnedSessions(ctx, b, t)
	}, func(ctx context.Context, t string) (int, error) {
		if err := b.Admit(); err != nil {
			return 0, err
		}
		return b.CountClientHolds(ctx, t)
	}, func(err error) error { return toStatus(log, b.Placed(err)) })
	acc.cfg.Store(o.tenants)
	reg.MustRegister(newTenantCollector(acc))
	holds := newHoldMetrics()
	reg.MustRegister(holds.collectors()...)
	serverOpts := []grpc.ServerOption{
		grpc.ForceServerCodecV2(val.codec),
		grpc.NumStreamWorkers(o.workers),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: o.keepaliveTime, Timeout: o.keepaliveTimeout}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: KeepaliveMinClientInterval, PermitWithoutStream: true}),
		grpc.ChainUnaryInterceptor(
			srvMetrics.unary,
			accessLog.unary,
			recovery.UnaryServerInterceptor(recovery.WithRecoveryHandler(recovered)),
			acc.unary, // who calls, validation (every request the codec decoded), for which tenant, may it, quotas
			gate.unary,
		),
		// The same six for streams, in one frame (see streams).
		grpc.StreamInterceptor((&streams{metrics: srvMetrics, log: accessLog, recovered: recovered, access: acc, val: val, gate: gate, holds: holds}).intercept),
	}
	if o.creds != nil {
		serverOpts = append(serverOpts, grpc.Creds(o.creds))
	}
	if o.tracing != nil {
		serverOpts = append(serverOpts, grpc.StatsHandler(o.tracing))
	}
	g := grpc.NewServer(serverOpts...)
	lockbrokerv1.RegisterLockServiceServer(g, NewLockService(b, log))
	lockbrokerv1.RegisterSessionServiceServer(g, NewSessionService(b, log))
	lockbrokerv1.RegisterAdminServiceServer(g, NewAdminService(b, log))
	hs := health.NewServer()
	healthpb.RegisterHealthServer(g, hs)
	reflection.Register(g)
	srvMetrics.init(g)
	s := &Server{GRPC: g, Health: hs, Metrics: reg, consul: consul, log: log, access: acc}
	s.setServing(false)
	return s, nil
}

// services are the names health reports on ("" is the whole server).
var services = []string{"", lockbrokerv1.LockService_ServiceDesc.ServiceName, lockbrokerv1.SessionService_ServiceDesc.ServiceName,
	lockbrokerv1.AdminService_ServiceDesc.ServiceName}

func (s *Server) setServing(ok bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ok {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.mu.Lock()
	if s.draining {
		s.mu.Unlock()
		return
	}
	changed := s.healthy != ok
	s.healthy = ok
	s.mu.Unlock()
	if changed {
		s.log.Info("health changed", zap.Bool("serving", ok))
	}
	for _, name := range services {
		s.Health.SetServingStatus(name, st)
	}
}

// WatchHealth checks Consul every interval and sets the health status:
// SERVING only while Consul answers and has a leader. It returns when ctx
// ends.
func (s *Server) WatchHealth(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		cctx, cancel := context.WithTimeout(ctx, interval)
		err := s.consul.Healthy(cctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			s.log.Debug("consul unhealthy", zap.Error(err))
		}
		s.setServing(err == nil)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Shutdown marks every service NOT_SERVING for good, on gRPC health and
// /healthz, at once; WatchHealth no longer changes it.
func (s *Server) Shutdown() {
	s.mu.Lock()
	first := !s.draining
	s.draining, s.healthy = true, false
	s.mu.Unlock()
	s.Health.Shutdown()
	if first {
		s.log.Info("health changed", zap.Bool("serving", false), zap.String("why", "shutting down"))
	}
}

// HTTPHandler serves /metrics (Prometheus) and /healthz (200 while
// SERVING, 503 otherwise).
func (s *Server) HTTPHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(s.Metrics, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		s.mu.Lock()
		ok := s.healthy
		s.mu.Unlock()
		if !ok {
			http.Error(w, "NOT_SERVING", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("SERVING\n"))
	})
	return mux
}

// newRegistry is the server's metrics registry: gRPC server metrics, Go
// and process collectors, and Consul's (blocking queries, calls).
func newRegistry(consul Consul, grpcMetrics *grpcMetrics) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(grpcMetrics.collectors()...)
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "lockbroker_consul_blocking_queries",
			Help: "Consul blocking queries this replica has open.",
		}, func() float64 { return float64(consul.OpenBlockingQueries()) }),
		consul.Collector(),
		buildInfoMetric(),
	)
	return reg
}

// buildInfoMetric is lockbroker_build_info: 1, with the running build as
// labels, so that a dashboard can show which versions a fleet runs (as
// Prometheus's own prometheus_build_info does).
func buildInfoMetric() prometheus.Collector {
	bi := buildinfo.Read()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "lockbroker_build_info",
		Help:        "Always 1; the labels say which build of the broker this replica runs.",
		ConstLabels: prometheus.Labels{"version": bi.Version, "revision": bi.Revision, "goversion": bi.GoVersion},
	})
	g.Set(1)
	return g
}
