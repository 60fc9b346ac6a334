// Command broker runs lockbroker: a gRPC service for distributed locks,
// semaphores and leader election on Consul.
//
// Consul is configured by the standard variables (CONSUL_HTTP_ADDR,
// CONSUL_HTTP_TOKEN, CONSUL_CACERT, CONSUL_HTTP_SSL, ...) as Consul's own
// tools read them. With --dev the broker starts and supervises a Consul dev
// agent on loopback instead.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/consul/api"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/consulstore"
	"github.com/lockbroker/lockbroker/internal/consultest"
	"github.com/lockbroker/lockbroker/internal/server"
)

func main() {
	if err := run(os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "broker:", err)
		os.Exit(1)
	}
}

// config is the broker's configuration.
type config struct {
	listen, httpListen string
	dev                bool
	devConsulHTTP      string
	consulBin          string
	logLevel           string
	shutdownTimeout    time.Duration
	healthInterval     time.Duration
}

func env(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

func parseFlags(args []string, out io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("broker", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&c.listen, "listen", env("LOCKBROKER_LISTEN", "127.0.0.1:8700"), "gRPC listen address (env LOCKBROKER_LISTEN)")
	fs.StringVar(&c.httpListen, "http-listen", env("LOCKBROKER_HTTP_LISTEN", "127.0.0.1:8701"), "metrics (/metrics) and health (/healthz) listen address (env LOCKBROKER_HTTP_LISTEN)")
	fs.BoolVar(&c.dev, "dev", false, "start and supervise a Consul dev agent on loopback (from --consul-bin, bin/consul or PATH)")
	fs.StringVar(&c.devConsulHTTP, "dev-consul-http", "127.0.0.1:8500", "with --dev: the dev agent's HTTP address (loopback)")
	fs.StringVar(&c.consulBin, "consul-bin", env("LOCKBROKER_CONSUL", ""), "with --dev: the consul binary (env LOCKBROKER_CONSUL; default bin/consul, then PATH)")
	fs.StringVar(&c.logLevel, "log-level", env("LOCKBROKER_LOG_LEVEL", "info"), "log level: debug, info, warn, error")
	fs.DurationVar(&c.shutdownTimeout, "shutdown-timeout", 10*time.Second, "how long a graceful stop may take before open streams are cut")
	fs.DurationVar(&c.healthInterval, "health-interval", time.Second, "how often Consul's health is checked")
	fs.Usage = func() {
		fmt.Fprintf(out, "usage: broker [flags]\n\nConsul is configured by CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN, CONSUL_CACERT and the other\nstandard Consul variables, unless --dev starts a local dev agent.\n\nflags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	return c, nil
}

func newLogger(level string) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	cfg := zap.NewProductionConfig()
	cfg.Level = zap.NewAtomicLevelAt(lvl)
	cfg.Sampling = nil
	return cfg.Build()
}

func run(args []string, stderr io.Writer) error {
	c, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	log, err := newLogger(c.logLevel)
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	consulCfg := api.DefaultConfig() // reads CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN, ...
	var agentDone <-chan error
	if c.dev {
		p, err := startDevConsul(ctx, c, log)
		if err != nil {
			return err
		}
		defer func() {
			if err := p.Stop(); err != nil {
				log.Warn("stopping consul dev agent", zap.Error(err))
			}
		}()
		consulCfg.Address, consulCfg.Scheme, consulCfg.Token = p.HTTPAddr(), "http", ""
		agentDone = p.Wait()
	}
	client, err := consulstore.NewClient(consulCfg)
	if err != nil {
		return fmt.Errorf("consul client: %w", err)
	}
	log.Info("consul", zap.String("address", consulCfg.Address), zap.Bool("token_set", consulCfg.Token != ""))

	store := consulstore.New(client, 0)
	b := broker.New(store, log)
	srv, err := server.New(b, store, log)
	if err != nil {
		return err
	}

	lis, err := net.Listen("tcp", c.listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err)
	}
	hlis, err := net.Listen("tcp", c.httpListen)
	if err != nil {
		_ = lis.Close()
		return fmt.Errorf("--http-listen: %w", err)
	}
	httpSrv := &http.Server{Handler: srv.HTTPHandler(), ReadHeaderTimeout: 5 * time.Second}

	hctx, stopHealth := context.WithCancel(ctx)
	healthDone := make(chan struct{})
	go func() { defer close(healthDone); srv.WatchHealth(hctx, c.healthInterval) }()
	grpcDone := make(chan error, 1)
	go func() { grpcDone <- srv.GRPC.Serve(lis) }()
	httpDone := make(chan error, 1)
	go func() { httpDone <- httpSrv.Serve(hlis) }()
	log.Info("lockbroker serving", zap.String("grpc", lis.Addr().String()), zap.String("http", hlis.Addr().String()))

	var runErr error
	select {
	case <-ctx.Done():
		log.Info("shutting down")
	case err := <-agentDone:
		runErr = fmt.Errorf("consul dev agent exited: %v", err)
	case err := <-grpcDone:
		runErr = fmt.Errorf("grpc server: %w", err)
	case err := <-httpDone:
		runErr = fmt.Errorf("http server: %w", err)
	}

	// Stop: health NOT_SERVING, end holds (lost: BROKER_SHUTDOWN), drain.
	stopHealth()
	<-healthDone
	srv.Shutdown()
	b.Close()
	graceful := make(chan struct{})
	go func() { srv.GRPC.GracefulStop(); close(graceful) }()
	select {
	case <-graceful:
	case <-time.After(c.shutdownTimeout):
		srv.GRPC.Stop()
		<-graceful
	}
	sctx, cancel := context.WithTimeout(context.Background(), c.shutdownTimeout)
	defer cancel()
	_ = httpSrv.Shutdown(sctx)
	log.Info("stopped")
	return runErr
}

// startDevConsul starts the Consul dev agent for --dev.
func startDevConsul(ctx context.Context, c config, log *zap.Logger) (*consultest.Process, error) {
	host, portStr, err := net.SplitHostPort(c.devConsulHTTP)
	if err != nil || (host != "127.0.0.1" && host != "localhost") {
		return nil, fmt.Errorf("--dev-consul-http must be a loopback host:port, got %q", c.devConsulHTTP)
	}
	var port int
	if _, err := fmt.Sscanf(portStr, "%d", &port); err != nil {
		return nil, fmt.Errorf("--dev-consul-http: bad port %q", portStr)
	}
	bin := c.consulBin
	if bin == "" {
		if bin, err = consultest.Binary(); err != nil {
			return nil, fmt.Errorf("--dev needs a consul binary: run `make consul` (builds bin/consul) or put consul on PATH: %w", err)
		}
	}
	sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	log.Info("starting consul dev agent", zap.String("binary", bin), zap.String("http", c.devConsulHTTP))
	p, err := consultest.StartProcess(sctx, consultest.ProcessConfig{Binary: bin, HTTPPort: port, LogWriter: io.Discard})
	if err != nil {
		return nil, fmt.Errorf("consul dev agent: %w", err)
	}
	return p, nil
}
