package main

import (
	"fmt"
	"net"
	"sync"

	"github.com/hashicorp/consul/api"
	"go.uber.org/zap"

	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/consulstore"
	"github.com/lockbroker/lockbroker/internal/server"
	"github.com/lockbroker/lockbroker/internal/tenant"
)

// security is what the broker reloads on SIGHUP: its TLS material and the
// tenants file, with the tenants' own Consul stores.
type security struct {
	log         *zap.Logger
	tls         *server.TLS // nil: plaintext
	tenantsPath string      // "": single-tenant
	tenants     *tenant.Config
	stores      *tenantStores
	srv         *server.Server
}

// newSecurity reads the TLS files and the tenants file, and opens a Consul
// store per tenant that has its own token. Any mistake is an error: the
// broker does not start.
func newSecurity(c config, consulCfg *api.Config, log *zap.Logger) (*security, error) {
	s := &security{log: log, tenantsPath: c.tenantsFile}
	if c.tlsCert != "" || c.tlsKey != "" || c.tlsClientCA != "" {
		t, err := server.NewTLS(server.TLSFiles{Cert: c.tlsCert, Key: c.tlsKey, ClientCA: c.tlsClientCA})
		if err != nil {
			return nil, fmt.Errorf("--tls-cert/--tls-key/--tls-client-ca: %w", err)
		}
		s.tls = t
	}
	if c.tenantsFile != "" {
		cfg, err := tenant.Load(c.tenantsFile)
		if err != nil {
			return nil, fmt.Errorf("--tenants: %w", err)
		}
		s.tenants = cfg
		s.stores = &tenantStores{base: *consulCfg, opts: consulstore.Options{
			MaxConns: c.tenantConsulMaxConns, MaxBlocking: 1, CallTimeout: c.consul.CallTimeout,
			MaxTxnInFlight: c.consul.MaxTxnInFlight, Tracer: c.consul.Tracer,
		}}
		if err := s.stores.update(cfg); err != nil {
			return nil, fmt.Errorf("--tenants: %w", err)
		}
	}
	return s, nil
}

// serverOptions are the server's options for TLS and tenants.
func (s *security) serverOptions() []server.Option {
	var opts []server.Option
	if s.tls != nil {
		opts = append(opts, server.WithTransportCredentials(s.tls.Credentials()))
	}
	if s.tenants != nil {
		opts = append(opts, server.WithTenants(s.tenants))
	}
	return opts
}

// brokerOptions give tenants with a Consul token their own store.
func (s *security) brokerOptions() []broker.Option {
	if s.stores == nil {
		return nil
	}
	return []broker.Option{broker.WithTenantStore(s.stores.get)}
}

// reload reads the TLS files and the tenants file again (SIGHUP). Each
// part that fails keeps what is in force and is logged with the reason
// (the tenants file's errors name their lines). Connections, streams and
// holds already open are left alone.
func (s *security) reload() {
	if s.tls != nil {
		if err := s.tls.Reload(); err != nil {
			s.log.Error("reload: TLS files refused, the certificate in force stays", zap.Error(err))
		} else {
			s.log.Info("reload: TLS certificate reloaded")
		}
	}
	if s.tenantsPath == "" {
		if s.tls == nil {
			s.log.Info("reload: nothing to reload (no --tls-cert, no --tenants)")
		}
		return
	}
	cfg, err := tenant.Load(s.tenantsPath)
	if err == nil {
		err = s.stores.update(cfg)
	}
	if err == nil {
		err = s.srv.SetTenants(cfg)
	}
	if err != nil {
		s.log.Error("reload: tenants file refused, the tenants in force stay", zap.Error(err))
		return
	}
	s.tenants = cfg
	s.log.Info("reload: tenants file reloaded", zap.Strings("tenants", cfg.Names()), zap.Int("admins", len(cfg.Admins)))
}

// warn says at start what is open to whom.
func (s *security) warn(listen string) {
	loopback := isLoopback(listen)
	switch {
	case s.tls == nil && s.tenants == nil && !loopback:
		s.log.Warn("listening on a non-loopback address without TLS and without --tenants: anyone who can reach it can take, watch and release any key and end any session",
			zap.String("listen", listen))
	case s.tls == nil && s.tenants != nil && !loopback:
		s.log.Warn("listening on a non-loopback address without TLS: bearer tokens travel in clear", zap.String("listen", listen))
	case s.tls != nil && !s.tls.MutualTLS() && s.tenants == nil && !loopback:
		s.log.Warn("serving TLS without --tls-client-ca or --tenants: any client that reaches the broker can use every key",
			zap.String("listen", listen))
	}
}

// isLoopback reports whether a listen address only accepts loopback
// connections.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// tenantStores holds one Consul store per tenant with a consul_token_file,
// on a small connection budget of its own.
type tenantStores struct {
	base api.Config
	opts consulstore.Options

	mu     sync.RWMutex
	byName map[string]*tenantStore
}

type tenantStore struct {
	token tenant.Secret
	store *consulstore.Store
}

// update opens stores for cfg's tenants with a token, reusing a store
// whose token did not change. On error nothing changes. Stores no longer
// used are left to the holds still using them; their idle connections
// close on the transport's idle timeout.
func (ts *tenantStores) update(cfg *tenant.Config) error {
	ts.mu.RLock()
	old := ts.byName
	ts.mu.RUnlock()
	next := map[string]*tenantStore{}
	for _, t := range cfg.Tenants {
		if t.ConsulToken == "" {
			continue
		}
		if prev := old[t.Name]; prev != nil && prev.token == t.ConsulToken {
			next[t.Name] = prev
			continue
		}
		c := ts.base
		c.Token, c.TokenFile = t.ConsulToken.Reveal(), ""
		st, err := consulstore.Open(&c, ts.opts)
		if err != nil {
			return fmt.Errorf("tenant %q: Consul client: %w", t.Name, err)
		}
		next[t.Name] = &tenantStore{token: t.ConsulToken, store: st}
	}
	ts.mu.Lock()
	ts.byName = next
	ts.mu.Unlock()
	return nil
}

// get is the store of tenant's holds; nil for the broker's own.
func (ts *tenantStores) get(name string) broker.Store {
	ts.mu.RLock()
	defer ts.mu.RUnlock()
	if s := ts.byName[name]; s != nil {
		return s.store
	}
	return nil
}

// close closes every store.
func (ts *tenantStores) close() {
	if ts == nil {
		return
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	for _, s := range ts.byName {
		s.store.Close()
	}
}
