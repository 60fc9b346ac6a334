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
	// val validates a unary request once its caller is known, before
	// anything reads what the request names (see unary).
	val *validation
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
	methodSetValue       = lockbrokerv1.LockService_SetValue_FullMethodName
	methodRenewSession   = lockbrokerv1.SessionService_RenewSession_FullMethodName
	methodGetLock        = lockbrokerv1.LockService_GetLock_FullMethodName
	methodCheckSequencer = lockbrokerv1.LockService_CheckSequencer_FullMethodName
	methodGetSession     = lockbrokerv1.SessionService_GetSession_FullMethodName
	methodListSessions   = lockbrokerv1.SessionService_ListSessions_FullMethodName
	methodWatch          = lockbrokerv1.LockService_Watch_FullMethodName
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
	// release gives back what admission took.
	release func()
	// track follows an Acquire stream's events for the replica's and the
	// tenant's gauges (set by streams.intercept, joined to the tenant by
	// admitRequest).
	track *holdTracker
	// foreign reports whether the broker refused the call a session of
	// another tenant (or of none): nil for a call of no tenant.
	foreign func() bool
}

// unary checks a call in three steps: who calls and may it call the
// method at all (admitCall, which reads nothing of the request), is the
// request valid (INVALID_ARGUMENT), and may the caller's tenant name what
// it names, within its quotas (admitRequest). A request is read for the
// audit log and the tenant checks only once it is valid: nothing over
// the API's limits is logged or echoed, whoever sends it.
func (a *access) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if exempt(info.FullMethod) {
		if err := a.val.check(req); err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
	c := newCall(ctx, info.FullMethod)
	defer c.done() // also when the handler panics (recovery is outside)
	ctx, err := a.admitCall(ctx, c)
	if err != nil {
		a.val.codec.forget(req) // never validated: the codec forgets its decode error
	} else if err = a.val.check(req); err == nil {
		c.req = req
		err = a.admitRequest(ctx, c)
	}
	if err != nil {
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
	ctx, c.foreign = broker.ContextWithForeignNotice(ctx)
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
			return permissionDenied("key %q is outside the prefixes of tenant %q", clip(k), t.Name).withKey(clip(k))
		}
	}
	switch c.method {
	case methodAcquire, methodTryAcquire:
		if err := a.quotas.takeRate(t); err != nil {
			return err
		}
		if err := a.quotas.takeBytes(t, len(valueOf(c.req))); err != nil {
			return err
		}
		kind := holdKind(c.req)
		release, err := a.quotas.takeHold(ctx, t, kind)
		if err != nil {
			return err
		}
		c.release = release
		if c.method == methodAcquire && c.track != nil {
			var granted func()
			if kind == holdClientStream {
				granted = release
			}
			c.track.join(a.quotas.of(t), granted)
		}
	case methodSetValue:
		if err := a.quotas.takeWrite(t); err != nil {
			return err
		}
		return a.quotas.takeBytes(t, len(valueOf(c.req)))
	case methodRenewSession:
		return a.quotas.takeWrite(t)
	case methodGetLock, methodCheckSequencer, methodGetSession, methodListSessions, methodWatch:
		return a.quotas.takeRead(t)
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
		code == codes.ResourceExhausted || code == codes.Unauthenticated ||
		code == codes.NotFound && c.foreign != nil && c.foreign() {
		a.record(c, err)
	}
}

// forget drops the decode error the codec kept for req, if any: for a
// request refused before it was validated.
func (c *requestCodec) forget(req any) {
	if msg, ok := req.(proto.Message); ok {
		_ = c.takeError(msg)
	}
}

// holdKind is how a request may make a hold, for max_holds. A resume
// carries on a hold counted already: refused, a rolling restart would
// lose the holds of a tenant at its limit.
func holdKind(req any) int {
	r, ok := req.(*lockbrokerv1.AcquireRequest)
	switch {
	case !ok:
		return holdClient
	case r.GetSessionId() != "":
		return holdClientStream
	case r.GetResume() != nil:
		return holdResume
	}
	return holdStream
}
