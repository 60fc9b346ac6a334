package server

import (
	"context"
	"errors"

	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/tenant"
)

// SetTenants replaces the tenants file (a reload): calls that start from
// now on are checked against cfg; streams already open keep the tenant
// they started with, and usage counts carry over by tenant name. A server
// started without tenants stays single-tenant.
func (s *Server) SetTenants(cfg *tenant.Config) error {
	if cfg == nil {
		return errors.New("server: no tenants")
	}
	if s.access.cfg.Load() == nil {
		return errors.New("server: started without tenants (single-tenant); restart with --tenants")
	}
	s.access.cfg.Store(cfg)
	return nil
}

// Tenants returns the tenants file in force (nil when single-tenant).
func (s *Server) Tenants() *tenant.Config { return s.access.cfg.Load() }

// clientOwnedSessions counts tenant's client-owned sessions alive in
// Consul (all replicas), for max_sessions.
func clientOwnedSessions(ctx context.Context, b *broker.Broker, tenant string) (int, error) {
	list, err := b.ListSessions(ctx, tenant)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, s := range list {
		if !s.BrokerOwned {
			n++
		}
	}
	return n, nil
}
