package server

import (
	"context"
	"fmt"
	"net/http"
	"runtime/debug"
	"sync"
	"time"

	"buf.build/go/protovalidate"
	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	pvmw "github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/protovalidate"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/broker"
)

// Consul is what the server reads about Consul for health and metrics.
type Consul interface {
	// Healthy fails when Consul does not answer or has no leader.
	Healthy(ctx context.Context) error
	// OpenBlockingQueries is the number of blocking queries in flight.
	OpenBlockingQueries() int64
}

// Server is the gRPC server with its health and metrics.
type Server struct {
	GRPC    *grpc.Server
	Health  *health.Server
	Metrics *prometheus.Registry
	consul  Consul
	log     *zap.Logger

	mu      sync.Mutex
	healthy bool
}

// New wires the gRPC server: logging, recovery (INTERNAL, panic logged)
// and protovalidate interceptors, both services, health and reflection.
func New(b *broker.Broker, consul Consul, log *zap.Logger) (*Server, error) {
	validator, err := protovalidate.New()
	if err != nil {
		return nil, fmt.Errorf("protovalidate: %w", err)
	}
	reg := prometheus.NewRegistry()
	srvMetrics := grpcprom.NewServerMetrics()
	reg.MustRegister(srvMetrics,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "lockbroker_consul_blocking_queries",
			Help: "Consul blocking queries this replica has open (one per watched key).",
		}, func() float64 { return float64(consul.OpenBlockingQueries()) }),
	)
	recoverOpt := recovery.WithRecoveryHandler(func(p any) error {
		log.Error("panic in handler", zap.Any("panic", p), zap.ByteString("stack", debug.Stack()))
		return status.Error(codes.Internal, "internal error")
	})
	logOpts := []logging.Option{logging.WithLogOnEvents(logging.FinishCall)}
	g := grpc.NewServer(
		grpc.ChainUnaryInterceptor(
			srvMetrics.UnaryServerInterceptor(),
			logging.UnaryServerInterceptor(zapLogger(log), logOpts...),
			recovery.UnaryServerInterceptor(recoverOpt),
			pvmw.UnaryServerInterceptor(validator),
		),
		grpc.ChainStreamInterceptor(
			srvMetrics.StreamServerInterceptor(),
			logging.StreamServerInterceptor(zapLogger(log), logOpts...),
			recovery.StreamServerInterceptor(recoverOpt),
			pvmw.StreamServerInterceptor(validator),
		),
	)
	lockbrokerv1.RegisterLockServiceServer(g, NewLockService(b, log))
	lockbrokerv1.RegisterSessionServiceServer(g, NewSessionService(b, log))
	hs := health.NewServer()
	healthpb.RegisterHealthServer(g, hs)
	reflection.Register(g)
	srvMetrics.InitializeMetrics(g)
	s := &Server{GRPC: g, Health: hs, Metrics: reg, consul: consul, log: log}
	s.setServing(false)
	return s, nil
}

// services are the names health reports on ("" is the whole server).
var services = []string{"", lockbrokerv1.LockService_ServiceDesc.ServiceName, lockbrokerv1.SessionService_ServiceDesc.ServiceName}

func (s *Server) setServing(ok bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ok {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.mu.Lock()
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

// Shutdown marks every service NOT_SERVING for good.
func (s *Server) Shutdown() { s.Health.Shutdown() }

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

// zapLogger adapts zap to the logging interceptor.
func zapLogger(l *zap.Logger) logging.Logger {
	return logging.LoggerFunc(func(_ context.Context, lvl logging.Level, msg string, fields ...any) {
		f := make([]zap.Field, 0, len(fields)/2)
		for i := 0; i+1 < len(fields); i += 2 {
			key, _ := fields[i].(string)
			f = append(f, zap.Any(key, fields[i+1]))
		}
		lg := l.WithOptions(zap.AddCallerSkip(1)).With(f...)
		switch lvl {
		case logging.LevelDebug:
			lg.Debug(msg)
		case logging.LevelInfo:
			lg.Info(msg)
		case logging.LevelWarn:
			lg.Warn(msg)
		default:
			lg.Error(msg)
		}
	})
}
