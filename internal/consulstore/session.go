package consulstore

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/lockbroker/lockbroker/internal/broker"
)

// CreateSession implements broker.Store. It writes the create body itself:
// api.Session.Create leaves out a zero lock-delay and an empty check list,
// and Consul then applies its defaults (15s, serfHealth). spec.Checks are
// node check IDs on the agent's node. A spec Consul
// refuses (a check that is not registered or not passing, a TTL outside the
// agent's bounds) is StoreRejected, although Consul answers it with a 500.
func (s *Store) CreateSession(ctx context.Context, spec broker.SessionSpec) (string, error) {
	behavior := api.SessionBehaviorRelease
	if spec.Delete {
		behavior = api.SessionBehaviorDelete
	}
	body := map[string]any{
		"Name":       spec.Name,
		"TTL":        spec.TTL.String(),
		"LockDelay":  fmt.Sprintf("%dms", spec.LockDelay.Milliseconds()),
		"Behavior":   behavior,
		"NodeChecks": spec.Checks,
	}
	if len(spec.Checks) == 0 {
		// No serfHealth default: the TTL alone decides. Consul reads an
		// empty legacy "Checks" as "no checks" (fixupEmptySessionChecks in
		// agent/session_endpoint.go); a present one, even empty, would
		// also wipe NodeChecks, so it is sent only when there are none.
		body["NodeChecks"] = []string{}
		body["Checks"] = []string{}
	}
	var out struct{ ID string }
	c := s.begin(ctx, opSessionCreate, s.opts.CallTimeout)
	_, err := s.c.Raw().Write("/v1/session/create", body, &out, (&api.WriteOptions{}).WithContext(c.ctx))
	if err == nil && out.ID == "" {
		err = c.fail(broker.StoreUnavailable, errors.New("no session id in the answer"))
	}
	if refusesSpec(err, spec) {
		err = c.fail(broker.StoreRejected, err)
	}
	return out.ID, c.end(err)
}

// refusesSpec reports whether err is Consul's 500 for a session it will not
// create from spec: these are the only messages of Session.Apply (agent/
// consul/session_endpoint.go, state/session_ce.go) that name a property of
// the request, and no status code sets them apart.
func refusesSpec(err error, spec broker.SessionSpec) bool {
	var se api.StatusError
	if !errors.As(err, &se) || se.Code != http.StatusInternalServerError {
		return false
	}
	if strings.Contains(se.Body, "Invalid Session TTL '") || strings.Contains(se.Body, "Session TTL '"+spec.TTL.String()+"' invalid") {
		return true
	}
	for _, id := range spec.Checks {
		if strings.Contains(se.Body, fmt.Sprintf("Missing check '%s' registration", id)) ||
			strings.Contains(se.Body, fmt.Sprintf("Check '%s' is in ", id)) {
			return true
		}
	}
	return false
}

// RenewSession implements broker.Store. Consul's "not found" is confirmed
// by a consistent read (see renewNotFound) before it is ErrSessionNotFound.
func (s *Store) RenewSession(ctx context.Context, id string) (*broker.SessionInfo, error) {
	c := s.begin(ctx, opSessionRenew, s.opts.CallTimeout)
	e, _, err := s.c.Session().Renew(id, (&api.WriteOptions{}).WithContext(c.ctx))
	if err == nil && e == nil {
		err = s.renewNotFound(c, id)
	}
	if err = c.end(err); err != nil {
		return nil, err
	}
	return sessionInfo(e), nil
}

// renewNotFound is the error for a renewal Consul answered "not found".
// Consul answers a renewal from the leader's state without waiting for it
// to be current (Session.Renew reads its state store as it is), and a
// leader elected a moment ago may not have applied the log it inherited:
// after every server restarted, a session made since the last snapshot is
// "not found" there until the leader's first commit (make chaos, seed
// 781186010, consul-restart-all). A consistent read waits until the leader
// is ready for one. The session is gone only when that read says so; a
// session it finds was not renewed, which is StoreUnavailable (retry),
// counted as stale_not_found rather than unavailable.
func (s *Store) renewNotFound(c *call, id string) error {
	_, err := s.Session(c.ctx, id)
	if err == nil {
		c.stale = true
		return c.unavailable(0, fmt.Errorf("renewal of session %s answered \"not found\", but a consistent read finds it (a leader whose state is not current yet)", id))
	}
	return err
}

// DestroySession implements broker.Store.
func (s *Store) DestroySession(ctx context.Context, id string) error {
	c := s.begin(ctx, opSessionDestroy, s.opts.CallTimeout)
	_, err := s.c.Session().Destroy(id, (&api.WriteOptions{}).WithContext(c.ctx))
	return c.end(err)
}

// Session implements broker.Store. A session the token may not read is
// StorePermissionDenied, not ErrSessionNotFound.
func (s *Store) Session(ctx context.Context, id string) (*broker.SessionInfo, error) {
	c := s.begin(ctx, opSessionInfo, s.opts.CallTimeout)
	e, meta, err := s.c.Session().Info(id, (&api.QueryOptions{RequireConsistent: true}).WithContext(c.ctx))
	switch {
	case err != nil:
	case meta.ResultsFilteredByACLs:
		err = c.filtered()
	case e == nil:
		err = fmt.Errorf("%w: %s", broker.ErrSessionNotFound, id)
	}
	if err = c.end(err); err != nil {
		return nil, err
	}
	return sessionInfo(e), nil
}

// Sessions implements broker.Store. A listing Consul filtered by ACLs is
// StorePermissionDenied: a partial list would pass for sessions gone.
func (s *Store) Sessions(ctx context.Context) ([]*broker.SessionInfo, error) {
	c := s.begin(ctx, opSessionList, s.opts.CallTimeout)
	es, meta, err := s.c.Session().List((&api.QueryOptions{RequireConsistent: true}).WithContext(c.ctx))
	if err == nil && meta.ResultsFilteredByACLs {
		err = c.filtered()
	}
	if err = c.end(err); err != nil {
		return nil, err
	}
	out := make([]*broker.SessionInfo, 0, len(es))
	for _, e := range es {
		out = append(out, sessionInfo(e))
	}
	return out, nil
}

// filtered is the error of a read Consul filtered by ACLs.
func (c *call) filtered() error {
	return c.fail(broker.StorePermissionDenied, errors.New("results filtered by ACLs"))
}

func sessionInfo(e *api.SessionEntry) *broker.SessionInfo {
	ttl, _ := time.ParseDuration(e.TTL)
	checks := append([]string(nil), e.NodeChecks...)
	for _, c := range e.ServiceChecks {
		checks = append(checks, c.ID)
	}
	return &broker.SessionInfo{
		ID:          e.ID,
		Name:        e.Name,
		Node:        e.Node,
		TTL:         ttl,
		LockDelay:   e.LockDelay,
		Delete:      e.Behavior == api.SessionBehaviorDelete,
		Checks:      checks,
		CreateIndex: e.CreateIndex,
	}
}
