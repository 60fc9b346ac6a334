// Package consulstore is the only package that talks to Consul. Its *Store
// implements the store interface that internal/broker declares, with
// github.com/hashicorp/consul/api.
package consulstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/lockbroker/lockbroker/internal/broker"
)

// Store talks to one Consul agent.
type Store struct {
	c *api.Client
	// blocking counts open blocking queries (for the metric).
	blocking atomic.Int64
	// waitTime bounds each blocking query.
	waitTime time.Duration
}

// MaxConns is how many connections the broker opens to its Consul agent:
// below Consul's default http_max_conns_per_client (200). Blocking queries
// are bounded by the broker's watch budget; the rest serve writes and
// renewals, reused through an idle pool of the same size.
const MaxConns = 180

// NewClient returns a Consul client for cfg with the broker's connection
// limits.
func NewClient(cfg *api.Config) (*api.Client, error) {
	if cfg.Transport == nil {
		cfg.Transport = api.DefaultConfig().Transport
	}
	cfg.Transport.MaxConnsPerHost = MaxConns
	cfg.Transport.MaxIdleConnsPerHost = MaxConns
	return api.NewClient(cfg)
}

// DefaultWaitTime bounds each blocking query. A watch nobody needs any
// more lingers until its query returns (Consul keeps serving an abandoned
// query, and its connection, until then), so this is also how long an
// idle watch holds a connection.
const DefaultWaitTime = 30 * time.Second

// New returns a Store on client. Blocking queries wait at most waitTime
// each (0: DefaultWaitTime).
func New(client *api.Client, waitTime time.Duration) *Store {
	if waitTime <= 0 {
		waitTime = DefaultWaitTime
	}
	return &Store{c: client, waitTime: waitTime}
}

// Client returns the underlying Consul client.
func (s *Store) Client() *api.Client { return s.c }

// OpenBlockingQueries is the number of Consul blocking queries in flight.
func (s *Store) OpenBlockingQueries() int64 { return s.blocking.Load() }

// Healthy reports whether Consul answers and has a leader.
func (s *Store) Healthy(ctx context.Context) error {
	leader, err := s.c.Status().LeaderWithQueryOptions((&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return wrap(err)
	}
	if leader == "" {
		return fmt.Errorf("%w: no leader", broker.ErrUnavailable)
	}
	return nil
}

// CreateSession implements broker.Store. It writes the create body itself:
// api.Session.Create leaves out a zero lock-delay and an empty check list,
// and Consul then applies its defaults (15s, serfHealth).
func (s *Store) CreateSession(ctx context.Context, spec broker.SessionSpec) (string, error) {
	behavior := api.SessionBehaviorRelease
	if spec.Delete {
		behavior = api.SessionBehaviorDelete
	}
	checks := spec.Checks
	if checks == nil {
		checks = []string{} // no serfHealth default: the TTL alone decides
	}
	body := map[string]any{
		"Name":       spec.Name,
		"TTL":        spec.TTL.String(),
		"LockDelay":  fmt.Sprintf("%dms", spec.LockDelay.Milliseconds()),
		"Behavior":   behavior,
		"NodeChecks": checks,
		"Checks":     []string{},
	}
	var out struct{ ID string }
	if _, err := s.c.Raw().Write("/v1/session/create", body, &out, (&api.WriteOptions{}).WithContext(ctx)); err != nil {
		return "", wrap(err)
	}
	return out.ID, nil
}

// RenewSession implements broker.Store.
func (s *Store) RenewSession(ctx context.Context, id string) (*broker.SessionInfo, error) {
	e, _, err := s.c.Session().Renew(id, (&api.WriteOptions{}).WithContext(ctx))
	if err != nil {
		return nil, wrap(err)
	}
	if e == nil {
		return nil, fmt.Errorf("%w: %s", broker.ErrSessionNotFound, id)
	}
	return sessionInfo(e), nil
}

// DestroySession implements broker.Store.
func (s *Store) DestroySession(ctx context.Context, id string) error {
	_, err := s.c.Session().Destroy(id, (&api.WriteOptions{}).WithContext(ctx))
	return wrap(err)
}

// Session implements broker.Store.
func (s *Store) Session(ctx context.Context, id string) (*broker.SessionInfo, error) {
	es, _, err := s.c.Session().Info(id, (&api.QueryOptions{RequireConsistent: true}).WithContext(ctx))
	if err != nil {
		return nil, wrap(err)
	}
	if es == nil {
		return nil, fmt.Errorf("%w: %s", broker.ErrSessionNotFound, id)
	}
	return sessionInfo(es), nil
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

// List implements broker.Store.
func (s *Store) List(ctx context.Context, prefix string, consistent bool) ([]*broker.Entry, uint64, error) {
	pairs, meta, err := s.c.KV().List(prefix, (&api.QueryOptions{RequireConsistent: consistent}).WithContext(ctx))
	if err != nil {
		return nil, 0, wrap(err)
	}
	return entries(pairs), meta.LastIndex, nil
}

// Watch implements broker.Store.
func (s *Store) Watch(ctx context.Context, prefix string, waitIndex uint64) ([]*broker.Entry, uint64, error) {
	q := &api.QueryOptions{WaitIndex: waitIndex, WaitTime: s.waitTime}
	s.blocking.Add(1)
	defer s.blocking.Add(-1)
	pairs, meta, err := s.c.KV().List(prefix, q.WithContext(ctx))
	if err != nil {
		return nil, 0, wrap(err)
	}
	return entries(pairs), meta.LastIndex, nil
}

// Sessions implements broker.Store.
func (s *Store) Sessions(ctx context.Context) ([]*broker.SessionInfo, error) {
	es, _, err := s.c.Session().List((&api.QueryOptions{RequireConsistent: true}).WithContext(ctx))
	if err != nil {
		return nil, wrap(err)
	}
	out := make([]*broker.SessionInfo, 0, len(es))
	for _, e := range es {
		out = append(out, sessionInfo(e))
	}
	return out, nil
}

func entries(pairs api.KVPairs) []*broker.Entry {
	out := make([]*broker.Entry, 0, len(pairs))
	for _, p := range pairs {
		out = append(out, entry(p))
	}
	return out
}

// Txn implements broker.Store.
func (s *Store) Txn(ctx context.Context, ops []broker.Op) ([]*broker.Entry, error) {
	txn := make(api.TxnOps, 0, len(ops))
	for _, op := range ops {
		txn = append(txn, &api.TxnOp{KV: &api.KVTxnOp{
			Verb:    api.KVOp(op.Verb),
			Key:     op.Key,
			Value:   op.Value,
			Flags:   op.Flags,
			Index:   op.Index,
			Session: op.Session,
		}})
	}
	ok, resp, _, err := s.c.Txn().Txn(txn, (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return nil, wrap(err)
	}
	if !ok {
		te := &broker.TxnError{}
		if resp != nil {
			for _, e := range resp.Errors {
				te.Failures = append(te.Failures, broker.TxnFailure{Op: e.OpIndex, Kind: txnFailureKind(e.What)})
			}
		}
		return nil, te
	}
	// Consul returns results only for the ops that produce an entry; put
	// each back at its op's position.
	out := make([]*broker.Entry, len(ops))
	next := 0
	for i, op := range ops {
		switch op.Verb {
		case broker.OpCheckNotExists, broker.OpDelete, broker.OpDeleteCAS:
			continue
		}
		if next < len(resp.Results) && resp.Results[next] != nil && resp.Results[next].KV != nil {
			out[i] = entry(resp.Results[next].KV)
		}
		next++
	}
	return out, nil
}

// txnFailureKind classifies one of Consul's transaction errors (the
// messages of agent/consul/state/txn.go and kvs.go).
func txnFailureKind(what string) broker.TxnFailureKind {
	switch {
	case strings.Contains(what, "due to lock delay"):
		return broker.TxnLockDelay
	case strings.Contains(what, "lock is already held"):
		return broker.TxnLockHeld
	case strings.Contains(what, "invalid session"), strings.Contains(what, "missing session"):
		return broker.TxnSessionInvalid
	case strings.Contains(what, "lock isn't held"):
		return broker.TxnNotHeld
	case strings.Contains(what, "index is stale"), strings.Contains(what, "failed index check"),
		strings.Contains(what, "failed session check"), strings.Contains(what, "doesn't exist"),
		strings.Contains(what, "exists"):
		return broker.TxnCheckFailed
	}
	return broker.TxnOther
}

func entry(p *api.KVPair) *broker.Entry {
	return &broker.Entry{
		Key:         p.Key,
		Value:       p.Value,
		Flags:       p.Flags,
		Session:     p.Session,
		LockIndex:   p.LockIndex,
		CreateIndex: p.CreateIndex,
		ModifyIndex: p.ModifyIndex,
	}
}

// wrap turns transport failures and Consul's 5xx answers into
// broker.ErrUnavailable, and passes context errors through.
func wrap(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	var ne net.Error
	var ue *url.Error
	msg := err.Error()
	if errors.As(err, &ne) || errors.As(err, &ue) ||
		strings.Contains(msg, "No cluster leader") || strings.Contains(msg, "Unexpected response code: 5") ||
		strings.Contains(msg, "Unexpected response code: 429") || strings.Contains(msg, "429 Too Many Requests") ||
		strings.Contains(msg, "connection refused") || strings.Contains(msg, "EOF") {
		return &broker.StoreError{Kind: broker.StoreUnavailable, Op: "request", Err: errors.New(redact(msg))}
	}
	if strings.Contains(msg, "Unexpected response code: 403") || strings.Contains(msg, "Permission denied") {
		return &broker.StoreError{Kind: broker.StorePermissionDenied, Op: "request", Err: errors.New(redact(msg))}
	}
	return &broker.StoreError{Kind: broker.StoreRejected, Op: "request", Err: errors.New(redact(msg))}
}

// redact removes anything that looks like a token parameter from a message.
func redact(msg string) string {
	if i := strings.Index(msg, "token="); i >= 0 {
		return msg[:i] + "token=REDACTED"
	}
	return msg
}

var _ broker.Store = (*Store)(nil)
