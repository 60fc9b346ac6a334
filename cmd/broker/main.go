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
	"github.com/lockbroker/lockbroker/internal/buildinfo"
	"github.com/lockbroker/lockbroker/internal/consulstore"
	"github.com/lockbroker/lockbroker/internal/consultest"
	"github.com/lockbroker/lockbroker/internal/server"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "broker:", err)
		os.Exit(1)
	}
}

// errVersion marks a --version that was answered: exit 0.
var errVersion = errors.New("version printed")

// config is the broker's configuration.
type config struct {
	listen, httpListen string
	dev                bool
	devConsulHTTP      string
	consulBin          string
	logLevel           string
	drainTimeout       time.Duration
	healthInterval     time.Duration
	keepaliveTime      time.Duration
	keepaliveTimeout   time.Duration
	consul             consulstore.Options
	// Shared service (see security.go).
	tlsCert, tlsKey, tlsClientCA string
	tenantsFile                  string
	tenantConsulMaxConns         int
}

// Bounds of the keepalive flags: DESIGN.md's ping after at most 10 s of
// silence and a timeout of at most 5 s; gRPC does not ping more often than
// once a second. A vanished client's hold is released within keepalive
// time + timeout + the promise bound (see promiseBound) + 0.5 s = 20 s.
const (
	maxKeepaliveTime    = 10 * time.Second
	maxKeepaliveTimeout = 5 * time.Second
	minKeepalive        = time.Second
)

func env(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

// parseFlags parses args. --help prints the usage on out and returns
// flag.ErrHelp; --version prints the build on out and returns errVersion.
// A bad flag is only returned, for main to print once (without the usage).
func parseFlags(args []string, out io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("broker", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // the flag package prints its errors there: main prints them, once
	version := fs.Bool("version", false, "print the broker's version, VCS revision and Go version, and exit")
	fs.StringVar(&c.listen, "listen", env("LOCKBROKER_LISTEN", "127.0.0.1:8700"), "gRPC listen address (env LOCKBROKER_LISTEN)")
	fs.StringVar(&c.httpListen, "http-listen", env("LOCKBROKER_HTTP_LISTEN", "127.0.0.1:8701"), "metrics (/metrics) and health (/healthz) listen address (env LOCKBROKER_HTTP_LISTEN)")
	fs.BoolVar(&c.dev, "dev", false, "start and supervise a Consul dev agent on loopback (from --consul-bin, bin/consul or PATH)")
	fs.StringVar(&c.devConsulHTTP, "dev-consul-http", "127.0.0.1:8500", "with --dev: the dev agent's HTTP address (loopback)")
	fs.StringVar(&c.consulBin, "consul-bin", env("LOCKBROKER_CONSUL", ""), "with --dev: the consul binary (env LOCKBROKER_CONSUL; default bin/consul, then PATH)")
	fs.StringVar(&c.logLevel, "log-level", env("LOCKBROKER_LOG_LEVEL", "info"), "log level: debug, info, warn, error")
	fs.DurationVar(&c.drainTimeout, "drain-timeout", 15*time.Second, "on SIGTERM/SIGINT: how long holders have to resume on another replica and streams to end before the broker releases what is left, cuts every stream and exits")
	fs.DurationVar(&c.drainTimeout, "shutdown-timeout", 15*time.Second, "deprecated: the same as --drain-timeout")
	fs.DurationVar(&c.healthInterval, "health-interval", time.Second, "how often Consul's health is checked")
	fs.IntVar(&c.consul.MaxBlocking, "consul-max-blocking", consulstore.DefaultMaxBlocking, "at most this many Consul blocking queries (watches) at once, on connections of their own; more watches share them or wait")
	fs.IntVar(&c.consul.MaxConns, "consul-max-conns", consulstore.DefaultMaxConns, "at most this many Consul connections for everything else (renewals, lock writes, reads), so watches never starve them; keep both caps together under half of Consul's http_max_conns_per_client (200) for two replicas per host")
	fs.IntVar(&c.consul.MaxTxnInFlight, "consul-txn-inflight", consulstore.DefaultMaxTxnInFlight, "at most this many lock writes (Consul transactions) in flight at once; writes that come meanwhile go together as one transaction when one ends (group commit), each with its own answer")
	fs.DurationVar(&c.keepaliveTime, "keepalive-time", server.DefaultKeepaliveTime, "ping a client after this long without hearing from it (1s to 10s)")
	fs.DurationVar(&c.keepaliveTimeout, "keepalive-timeout", server.DefaultKeepaliveTimeout, "close a client's connection when a ping is not answered within this (1s to 5s); its holds are kept until their last promise")
	fs.StringVar(&c.tlsCert, "tls-cert", env("LOCKBROKER_TLS_CERT", ""), "serve gRPC over TLS with this certificate chain (PEM; with --tls-key; reloaded on SIGHUP) (env LOCKBROKER_TLS_CERT)")
	fs.StringVar(&c.tlsKey, "tls-key", env("LOCKBROKER_TLS_KEY", ""), "the private key of --tls-cert (PEM) (env LOCKBROKER_TLS_KEY)")
	fs.StringVar(&c.tlsClientCA, "tls-client-ca", env("LOCKBROKER_TLS_CLIENT_CA", ""), "require client certificates signed by these CAs (PEM; mTLS): a connection without one fails its handshake; a caller is then cn:<Common Name> or uri:<URI SAN> (env LOCKBROKER_TLS_CLIENT_CA)")
	fs.StringVar(&c.tenantsFile, "tenants", env("LOCKBROKER_TENANTS", ""), "tenants file (YAML: identities, key prefixes, quotas, Consul tokens, admins; reloaded on SIGHUP); without it the broker is single-tenant and lets every caller use every key (env LOCKBROKER_TENANTS)")
	fs.IntVar(&c.tenantConsulMaxConns, "tenant-consul-max-conns", 8, "at most this many Consul connections per tenant with its own consul_token_file (its sessions, renewals and lock writes)")
	usage := func() {
		fmt.Fprintf(out, "usage: broker [flags]\n\nConsul is configured by CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN, CONSUL_CACERT and the other\nstandard Consul variables, unless --dev starts a local dev agent.\n\nSIGHUP reloads --tls-cert, --tls-key, --tls-client-ca and --tenants without dropping\nconnections, streams or holds; a file that fails to load leaves what is in force.\n\nflags:\n")
		fs.SetOutput(out)
		fs.PrintDefaults()
	}
	fs.Usage = func() {} // called on every error too: the error alone says it
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			usage()
			return c, err
		}
		return c, fmt.Errorf("%w (broker --help lists the flags)", err)
	}
	if *version {
		fmt.Fprintln(out, "broker", buildinfo.Read())
		return c, errVersion
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	return c, c.validate()
}

// validate checks the flags' values.
func (c *config) validate() error {
	switch {
	case c.drainTimeout <= 0:
		return fmt.Errorf("--drain-timeout must be positive, got %v", c.drainTimeout)
	case c.consul.MaxBlocking <= 0 || c.consul.MaxConns <= 0:
		return fmt.Errorf("--consul-max-blocking and --consul-max-conns must be positive, got %d and %d", c.consul.MaxBlocking, c.consul.MaxConns)
	case c.consul.MaxTxnInFlight <= 0:
		return fmt.Errorf("--consul-txn-inflight must be positive, got %d", c.consul.MaxTxnInFlight)
	case c.healthInterval <= 0:
		return fmt.Errorf("--health-interval must be positive, got %v", c.healthInterval)
	case c.keepaliveTime < minKeepalive || c.keepaliveTime > maxKeepaliveTime:
		return fmt.Errorf("--keepalive-time must be between %v and %v (a vanished client's hold is released within 20s), got %v", minKeepalive, maxKeepaliveTime, c.keepaliveTime)
	case c.keepaliveTimeout < minKeepalive || c.keepaliveTimeout > maxKeepaliveTimeout:
		return fmt.Errorf("--keepalive-timeout must be between %v and %v (a vanished client's hold is released within 20s), got %v", minKeepalive, maxKeepaliveTimeout, c.keepaliveTimeout)
	case (c.tlsCert == "") != (c.tlsKey == ""):
		return errors.New("--tls-cert and --tls-key go together")
	case c.tlsClientCA != "" && c.tlsCert == "":
		return errors.New("--tls-client-ca needs --tls-cert and --tls-key (the broker must serve TLS to ask for client certificates)")
	case c.tenantConsulMaxConns <= 0:
		return fmt.Errorf("--tenant-consul-max-conns must be positive, got %d", c.tenantConsulMaxConns)
	}
	return nil
}

// newLogger logs JSON lines at level and above on w, each with its time
// in ISO 8601 (RFC 3339, UTC, milliseconds: "ts":"2026-11-28T11:19:50.123Z").
func newLogger(level string, w io.Writer) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	enc := zap.NewProductionEncoderConfig()
	enc.EncodeTime = func(t time.Time, pe zapcore.PrimitiveArrayEncoder) {
		pe.AppendString(t.UTC().Format("2006-01-02T15:04:05.000Z07:00"))
	}
	core := zapcore.NewCore(zapcore.NewJSONEncoder(enc), zapcore.Lock(zapcore.AddSync(w)), lvl)
	return zap.New(core, zap.AddCaller(), zap.AddStacktrace(zapcore.ErrorLevel),
		zap.ErrorOutput(zapcore.Lock(zapcore.AddSync(w)))), nil
}

// run runs the broker until a signal or a failure: --help and --version
// go to stdout, the logs to stderr.
func run(args []string, stdout, stderr io.Writer) error {
	c, err := parseFlags(args, stdout)
	if errors.Is(err, flag.ErrHelp) || errors.Is(err, errVersion) {
		return nil
	}
	if err != nil {
		return err
	}
	log, err := newLogger(c.logLevel, stderr)
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()
	build := buildinfo.Read()
	log.Info("lockbroker starting", zap.String("version", build.Version), zap.String("revision", build.Revision),
		zap.String("go", build.GoVersion))

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	tr, err := newTracing(ctx, log) // OTEL_* variables; off by default
	if err != nil {
		return err
	}
	defer tr.shutdown(log)
	c.consul.Tracer = tr.tracer()

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
	store, err := consulstore.Open(consulCfg, c.consul)
	if err != nil {
		return fmt.Errorf("consul client: %w", err)
	}
	defer store.Close()
	log.Info("consul", zap.String("address", consulCfg.Address), zap.Bool("token_set", consulCfg.Token != ""),
		zap.Int("max_blocking", c.consul.MaxBlocking), zap.Int("max_conns", c.consul.MaxConns),
		zap.Int("txn_inflight", c.consul.MaxTxnInFlight))

	// The hub keeps its dedicated watches within the store's blocking budget;
	// the session pool takes session creation off the critical path.
	sec, err := newSecurity(c, consulCfg, log)
	if err != nil {
		return err
	}
	defer sec.stores.close()
	b := broker.New(store, log, append([]broker.Option{broker.WithMaxBlocking(c.consul.MaxBlocking), broker.WithSessionPool(),
		broker.WithPromiseBound(promiseBound(c.keepaliveTime, c.keepaliveTimeout))},
		sec.brokerOptions()...)...)
	srv, err := server.New(b, store, log, append(append(sec.serverOptions(), tr.serverOptions()...), server.WithKeepalive(c.keepaliveTime, c.keepaliveTimeout))...)
	if err != nil {
		return err
	}
	sec.srv = srv
	sec.warn(c.listen)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

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
	go func() { grpcDone <- srv.GRPC.Serve(server.TrackConns(lis)) }()
	httpDone := make(chan error, 1)
	go func() { httpDone <- httpSrv.Serve(hlis) }()
	log.Info("lockbroker serving", zap.String("grpc", lis.Addr().String()), zap.String("http", hlis.Addr().String()),
		zap.Bool("tls", sec.tls != nil), zap.Bool("mtls", sec.tls != nil && sec.tls.MutualTLS()), zap.Bool("tenants", sec.tenants != nil))

	var runErr error
wait:
	for {
		select {
		case <-hup:
			sec.reload()
			continue
		case <-ctx.Done():
			log.Info("shutting down")
		case err := <-agentDone:
			runErr = fmt.Errorf("consul dev agent exited: %v", err)
		case err := <-grpcDone:
			runErr = fmt.Errorf("grpc server: %w", err)
		case err := <-httpDone:
			runErr = fmt.Errorf("http server: %w", err)
		}
		break wait
	}

	stop() // a second SIGINT/SIGTERM kills the process at once
	drain(log, c.drainTimeout, srv, b, httpSrv)
	stopHealth()
	<-healthDone
	log.Info("stopped")
	return runErr
}

// drain stops the broker within limit whatever clients do: health turns
// NOT_SERVING at once and the gRPC server stops taking connections; the
// broker tells every holder `lost: BROKER_SHUTDOWN` and keeps the holds
// for their clients to resume elsewhere until limit less a release window
// (a third of limit, at most 3 s), in which it releases the holds nobody
// resumed; at limit every stream still open is cut (which also unblocks a
// Send to a client that stopped reading) and the process goes on to exit.
func drain(log *zap.Logger, limit time.Duration, srv *server.Server, b *broker.Broker, httpSrv *http.Server) {
	start := time.Now()
	srv.Shutdown()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	bctx, bcancel := context.WithTimeout(ctx, limit-min(limit/3, 3*time.Second))
	defer bcancel()
	log.Info("draining", zap.Duration("drain_timeout", limit))

	brokerDone := make(chan struct{})
	go func() { defer close(brokerDone); shutdownBroker(bctx, ctx, b) }()
	grpcDone := make(chan struct{})
	go func() { defer close(grpcDone); srv.GRPC.GracefulStop() }()

	for brokerDone != nil || grpcDone != nil {
		select {
		case <-brokerDone:
			brokerDone = nil
		case <-grpcDone:
			grpcDone = nil
		case <-ctx.Done():
			log.Warn("drain deadline passed: cutting the streams still open", zap.Duration("drain_timeout", limit))
			srv.GRPC.Stop()
			waitAtMost(brokerDone, time.Second)
			waitAtMost(grpcDone, time.Second)
			brokerDone, grpcDone = nil, nil
		}
	}
	hctx, hcancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer hcancel()
	_ = httpSrv.Shutdown(hctx)
	log.Info("drained", zap.Duration("took", time.Since(start).Round(time.Millisecond)))
}

// shutdownBroker ends the broker's holds and watches: every hold is told
// lost BROKER_SHUTDOWN and kept for its client to resume elsewhere until
// resume ends, then the holds nobody resumed are released (Shutdown returns
// shortly after resume ends); hard bounds the wait in any case.
func shutdownBroker(resume, hard context.Context, b *broker.Broker) {
	done := make(chan struct{})
	go func() { defer close(done); b.Shutdown(resume) }()
	select {
	case <-done:
	case <-hard.Done():
	}
}

// waitAtMost waits until ch is closed or d has passed; a nil ch is closed.
func waitAtMost(ch <-chan struct{}, d time.Duration) {
	if ch == nil {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
	}
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

// promiseBound is the longest guaranteed_for the broker may send so that a
// client that vanishes is released within 20 s: the server notices it
// after keepalive time + timeout, then keeps the hold until the last
// deadline it promised (the client may be resuming it), plus 0.5 s.
func promiseBound(keepaliveTime, keepaliveTimeout time.Duration) time.Duration {
	return 20*time.Second - keepaliveTime - keepaliveTimeout - 500*time.Millisecond
}
