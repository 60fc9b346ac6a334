package server

import (
	"context"
	"strings"
	"sync/atomic"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/tenant"
)

// access enforces the shared-service rules in front of every handler:
// who the caller is (client certificate or bearer token), which tenant it
// acts for, which keys it may name, its quotas; and it writes the audit
// log. Without a tenants file the broker is single-tenant: every call is
// let in (AdminService too) and only admin calls are audited.
//
// Health and reflection are never checked: they stay reachable without an
// identity.
type access struct {
	cfg    atomic.Pointer[tenant.Config] // nil: single-tenant
	quotas *quotas
	audit  *zap.Logger
	// drop forgets what the request codec kept for a request that is
	// refused before the validation interceptor saw it.
	drop func(req any)
}

// exempt methods need no identity.
func exempt(method string) bool {
	return strings.HasPrefix(method, "/grpc.health.v1.Health/") ||
		strings.HasPrefix(method, "/grpc.reflection.v1.ServerReflection/") ||
		strings.HasPrefix(method, "/grpc.reflection.v1alpha.ServerReflection/")
}

var (
	lockServicePrefix    = "/" + lockbrokerv1.LockService_ServiceDesc.ServiceName + "/"
	adminServicePrefix   = "/" + lockbrokerv1.AdminService_ServiceDesc.ServiceName + "/"
	methodAcquire        = lockbrokerv1.LockService_Acquire_FullMethodName
	methodTryAcquire     = lockbrokerv1.LockService_TryAcquire_FullMethodName
	methodCreateSession  = lockbrokerv1.SessionService_CreateSession_FullMethodName
	authorizationHeader  = "authorization"
	bearerScheme         = "bearer "
	maxAuthorizationSize = 4096
)

// call is one call as access sees it.
type call struct {
	method string
	ctx    context.Context // the call's, for its peer
	caller tenant.Caller
	// req is the request; named is what it names, worked out only when a
	// tenant check or the audit log needs it (names).
	req      any
	named    named
	hasNamed bool
	// release gives back what admission took (a max_holds slot).
	release func()
	// track follows an Acquire stream's events for the replica's and the
	// tenant's gauges (set by streams.intercept, joined to the tenant by
	// admitRequest).
	track *holdTracker
}

func (a *access) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if exempt(info.FullMethod) {
		return handler(ctx, req)
	}
	c := newCall(ctx, info.FullMethod)
	defer c.done() // also when the handler panics (recovery is outside)
	c.req = req
	ctx, err := a.admitCall(ctx, c)
	if err == nil {
		err = a.admitRequest(ctx, c)
	}
	if err != nil {
		a.drop(req)
		a.finish(c, err)
		return nil, err
	}
	resp, err := handler(ctx, req)
	if err == nil && info.FullMethod == methodTryAcquire {
		a.quotas.granted(c.caller.Tenant)
	}
	a.finish(c, err)
	return resp, err
}

func newCall(ctx context.Context, method string) *call {
	return &call{method: method, ctx: ctx}
}

// names is what the call's request names (worked out once).
func (c *call) names() *named {
	if !c.hasNamed {
		c.named, c.hasNamed = namedBy(c.req), true
	}
	return &c.named
}

// peer is the caller's address, "" if unknown.
func (c *call) peer() string {
	if p, ok := peer.FromContext(c.ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}

// done gives back what the call took (once).
func (c *call) done() {
	if c.release != nil {
		c.release()
		c.release = nil
	}
	if c.track != nil {
		c.track.end()
	}
}

// admitCall identifies the caller and checks that it may call the
// method at all; the returned context carries its tenant for the broker.
func (a *access) admitCall(ctx context.Context, c *call) (context.Context, error) {
	cfg := a.cfg.Load()
	if cfg == nil { // single-tenant: anyone may; admin calls still say who, for the audit log
		if strings.HasPrefix(c.method, adminServicePrefix) {
			c.caller.Identity = presented(ctx)
		}
		return ctx, nil
	}
	caller, err := identify(ctx, cfg)
	c.caller = caller
	if err != nil {
		return ctx, err
	}
	if strings.HasPrefix(c.method, adminServicePrefix) {
		if !caller.Admin {
			return ctx, permissionDenied("%s: only admins may call AdminService", caller.Identity)
		}
		return ctx, nil
	}
	if caller.Tenant == nil {
		return ctx, permissionDenied("%s belongs to no tenant", caller.Identity)
	}
	return broker.ContextWithTenant(ctx, caller.Tenant.Name), nil
}

// admitRequest checks what the request names against the caller's
// prefixes, before any Consul call, then the tenant's quotas.
func (a *access) admitRequest(ctx context.Context, c *call) error {
	t := c.caller.Tenant
	if t == nil || strings.HasPrefix(c.method, adminServicePrefix) {
		return nil // single-tenant, or an admin
	}
	n := c.names()
	if !n.covered && strings.HasPrefix(c.method, lockServicePrefix) {
		return permissionDenied("%s: %s is not open to tenants", c.caller.Identity, c.method)
	}
	for i, k := range n.keys {
		if !t.Allows(k) {
			n.keys[0], n.keys[i] = k, n.keys[0] // the audit log names the refused key
			return permissionDenied("key %q is outside the prefixes of tenant %q", k, t.Name).withKey(k)
		}
	}
	switch c.method {
	case methodAcquire:
		if err := a.quotas.takeRate(t); err != nil {
			return err
		}
		release, err := a.quotas.takeHold(t)
		if err != nil {
			return err
		}
		c.release = release
		c.track.join(a.quotas.of(t))
	case methodTryAcquire:
		return a.quotas.takeRate(t)
	case methodCreateSession:
		release, err := a.quotas.takeSession(ctx, t)
		if err != nil {
			return err
		}
		c.release = release
	}
	return nil
}

// finish counts and audits the call's outcome.
func (a *access) finish(c *call, err error) {
	code := status.Code(err)
	if code == codes.PermissionDenied {
		a.quotas.denied(c.caller.Tenant)
	}
	if strings.HasPrefix(c.method, adminServicePrefix) || code == codes.PermissionDenied ||
		code == codes.ResourceExhausted || code == codes.Unauthenticated {
		a.record(c, err)
	}
}

// forget drops the decode error the codec kept for req, if any: for a
// request refused before the validation interceptor saw it.
func (c *requestCodec) forget(req any) {
	if msg, ok := req.(proto.Message); ok {
		_ = c.takeError(msg)
	}
}
