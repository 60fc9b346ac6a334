package server

import (
	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
)

// named is what a request names, for tenant checks and the audit log.
// Values are never taken: they are the tenants' data.
type named struct {
	// keys are the lock keys, semaphore prefixes or watched prefixes the
	// request would touch; every one must be inside the caller's prefixes.
	keys []string
	// session is the session id the request acts on, if any.
	session string
	// tenant is the tenant an admin request asks about.
	tenant string
	// covered: the request type is known here. A LockService request that
	// is not covered is refused in multi-tenant mode (fail closed), so a
	// new RPC cannot slip past the prefix check.
	covered bool
}

// namedBy lists what req names.
func namedBy(req any) named {
	switch r := req.(type) {
	case *lockbrokerv1.AcquireRequest:
		n := named{keys: []string{r.GetKey()}, session: r.GetSessionId(), covered: true}
		n.keys = append(n.keys, r.GetKeys()...) // a multi-key lock: every key is checked
		if res := r.GetResume(); res != nil {
			n.keys = append(n.keys, res.GetKey())
			n.session = res.GetSessionId()
		}
		return n
	case *lockbrokerv1.TryAcquireRequest:
		return named{keys: []string{r.GetKey()}, session: r.GetSessionId(), covered: true}
	case *lockbrokerv1.ReleaseRequest:
		return named{keys: []string{r.GetKey()}, session: r.GetSessionId(), covered: true}
	case *lockbrokerv1.WatchRequest:
		return named{keys: []string{r.GetKey()}, covered: true}
	case *lockbrokerv1.GetLockRequest:
		return named{keys: []string{r.GetKey()}, covered: true}
	case *lockbrokerv1.SetValueRequest:
		return named{keys: []string{r.GetKey()}, session: r.GetSessionId(), covered: true}
	case *lockbrokerv1.CheckSequencerRequest:
		return named{keys: []string{r.GetSequencer().GetKey()}, session: r.GetSequencer().GetSessionId(), covered: true}
	case *lockbrokerv1.CreateSessionRequest, *lockbrokerv1.ListSessionsRequest:
		return named{covered: true}
	case *lockbrokerv1.RenewSessionRequest:
		return named{session: r.GetSessionId(), covered: true}
	case *lockbrokerv1.DestroySessionRequest:
		return named{session: r.GetSessionId(), covered: true}
	case *lockbrokerv1.GetSessionRequest:
		return named{session: r.GetSessionId(), covered: true}
	// AdminService: admins may name any key; these are for the audit log.
	case *lockbrokerv1.ForceReleaseRequest:
		return named{keys: []string{r.GetKey()}, covered: true}
	case *lockbrokerv1.ListHoldsRequest:
		return named{keys: []string{r.GetKeyPrefix()}, covered: true}
	case *lockbrokerv1.AdminServiceListSessionsRequest:
		return named{tenant: r.GetTenant(), covered: true}
	}
	return named{}
}

// valueOf is the value a request writes (nil for none), for
// write_bytes_rate.
func valueOf(req any) []byte {
	switch r := req.(type) {
	case *lockbrokerv1.AcquireRequest:
		return r.GetValue()
	case *lockbrokerv1.TryAcquireRequest:
		return r.GetValue()
	case *lockbrokerv1.SetValueRequest:
		return r.GetValue()
	}
	return nil
}
