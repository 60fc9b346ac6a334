// Package consulstore is the only package that talks to Consul. Its *Store
// implements the store interface that internal/broker declares, with
// github.com/hashicorp/consul/api.
//
// # Connection budgets
//
// A Store keeps two HTTP transports to its agent, built from one api.Config:
// one for blocking queries (Watch), capped at Options.MaxBlocking
// connections, and one for everything else (session renewals, transactions,
// reads), capped at Options.MaxConns. The second carries its calls over a
// pool of HTTP/1.1 connections of its own (connPool: no goroutines per
// connection) unless the config needs a proxy or a custom TLS dialer.
// Watch also takes one of MaxBlocking slots before it asks Consul, and
// waits for a free one, so however many keys the broker watches, a burst
// of watches can never take the connections a renewal needs. A third
// transport, of one connection, carries the probe that tells whether the
// agent answers (Reachable): renewals held up by a leader election cannot
// keep it waiting. With the defaults (32 + 64 + 1) one replica stays under
// 100 connections: two replicas on one host fit under Consul's default
// http_max_conns_per_client of 200.
//
// # Group commit
//
// At most Options.MaxTxnInFlight write transactions are in flight; writes
// that come while they are wait and go to Consul together, as one
// transaction, when one ends. Each caller gets its own ops' answer (see
// batch.go for how a batch Consul rolls back is settled).
//
// # Errors
//
// Every method returns the typed errors internal/broker declares, built
// from the HTTP status Consul answered with (recorded by the Store's own
// transport), api.StatusError, the ACL-filtering header and, for a
// transaction Consul rolled back, the message of each failing operation
// compared with the exact text Consul builds for that verb and key. A
// caller's context error comes back as it is; a timeout the Store imposed
// is StoreUnavailable. No error text carries the ACL token.
package consulstore

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/hashicorp/consul/api"
	"go.opentelemetry.io/otel/trace"

	"github.com/lockbroker/lockbroker/internal/broker"
)

// Defaults for Options.
const (
	// DefaultWaitTime bounds each blocking query. A watch nobody needs any
	// more lingers until its query returns (Consul keeps serving an
	// abandoned query, and its connection, until then), so this is also
	// how long an idle watch holds a connection.
	DefaultWaitTime = 30 * time.Second
	// DefaultMaxBlocking is the default cap on concurrent blocking queries.
	DefaultMaxBlocking = 32
	// DefaultMaxConns is the default cap on connections for every call
	// that is not a blocking query.
	DefaultMaxConns = 64
	// DefaultCallTimeout bounds each call that is not a blocking query.
	DefaultCallTimeout = 10 * time.Second
)

// maxWaitTime is Consul's own cap on a blocking query's wait.
const maxWaitTime = 10 * time.Minute

// Options tunes a Store. The zero value selects every default.
type Options struct {
	// WaitTime bounds each blocking query (Watch); default
	// DefaultWaitTime (30s). Consul adds up to WaitTime/16 of jitter. A
	// value above Consul's cap of 10m, or negative, is an error.
	WaitTime time.Duration
	// MaxBlocking caps the blocking queries in flight (Watch calls beyond
	// it wait for a slot) and the connections of their transport; default
	// DefaultMaxBlocking (32). Negative is an error.
	MaxBlocking int
	// MaxConns caps the connections used by every other call (renewals,
	// transactions, reads); default DefaultMaxConns (64). Calls beyond it
	// wait for a connection, within their timeout. Negative is an error.
	// Keep MaxBlocking + MaxConns at most half of the agent's
	// http_max_conns_per_client (200 by default) to leave room for a
	// second replica on the same host.
	MaxConns int
	// CallTimeout bounds each call that is not a blocking query when ctx
	// has no earlier deadline; default DefaultCallTimeout (10s). A Watch is
	// bounded by WaitTime + WaitTime/16 + CallTimeout. A call the timeout
	// ends fails with StoreUnavailable. Negative is an error.
	CallTimeout time.Duration
	// MaxTxnInFlight caps the write transactions in flight to Consul; a
	// write that comes while that many are waits, and all that wait go
	// together as one transaction when a call ends (group commit, see
	// batch.go); default DefaultMaxTxnInFlight (4). Each caller still gets
	// its own transaction's answer. Negative is an error.
	MaxTxnInFlight int
	// Tracer, when set, gives each call made in a sampled trace (the
	// context of an RPC the server traces) a client span of its own,
	// "consul <operation>", child of the caller's. Calls outside a trace
	// (renewals, the session pool, a group commit's batch) make none.
	// Default nil: no spans.
	Tracer trace.Tracer
}

// withDefaults returns o with zero fields set to their defaults, or an
// error for a bad value.
func (o Options) withDefaults() (Options, error) {
	switch {
	case o.WaitTime < 0 || o.WaitTime > maxWaitTime:
		return o, fmt.Errorf("consulstore: WaitTime %v outside [0, %v]", o.WaitTime, maxWaitTime)
	case o.MaxBlocking < 0:
		return o, fmt.Errorf("consulstore: negative MaxBlocking %d", o.MaxBlocking)
	case o.MaxConns < 0:
		return o, fmt.Errorf("consulstore: negative MaxConns %d", o.MaxConns)
	case o.CallTimeout < 0:
		return o, fmt.Errorf("consulstore: negative CallTimeout %v", o.CallTimeout)
	case o.MaxTxnInFlight < 0:
		return o, fmt.Errorf("consulstore: negative MaxTxnInFlight %d", o.MaxTxnInFlight)
	}
	if o.WaitTime == 0 {
		o.WaitTime = DefaultWaitTime
	}
	if o.MaxBlocking == 0 {
		o.MaxBlocking = DefaultMaxBlocking
	}
	if o.MaxConns == 0 {
		o.MaxConns = DefaultMaxConns
	}
	if o.CallTimeout == 0 {
		o.CallTimeout = DefaultCallTimeout
	}
	if o.MaxTxnInFlight == 0 {
		o.MaxTxnInFlight = DefaultMaxTxnInFlight
	}
	return o, nil
}

// watchTimeout is how long a Watch may take: Consul's wait plus its
// jitter, plus the time a plain call gets.
func (o Options) watchTimeout() time.Duration {
	return o.WaitTime + o.WaitTime/16 + o.CallTimeout
}

// Store talks to one Consul agent. Its methods are safe for concurrent use.
type Store struct {
	opts Options
	// c serves every call but Watch and the reach probe; blockingC
	// serves Watch; probeC the probe (Reachable, Healthy) over one
	// connection of its own (c for a Store built by New).
	c, blockingC, probeC *api.Client
	// txn makes the transaction calls of c without the api package (nil
	// for a Store built by New: api.Txn then).
	txn *txnEndpoint
	// batch sends the write transactions of txn (nil with txn).
	batch *batcher
	// transports are closed by Close (nil for a Store built by New).
	transports []*http.Transport
	// pool carries c's calls when it can (see connPool); nil otherwise;
	// probePool probeC's.
	pool, probePool *connPool
	// secrets are redacted from every error text.
	secrets []string

	slots    chan struct{} // one per blocking query allowed in flight
	blocking atomic.Int64  // blocking queries in flight
	queued   atomic.Int64  // Watch calls waiting for a slot
	counts   counters
	latency  latencies
}

// Open returns a Store for the agent cfg names. It builds two clients from
// cfg, each on a new transport of its own (see the package comment) with
// cfg.Transport's settings if set, else those of api.DefaultConfig's.
// TLS works as in api.NewClient: cfg.TLSConfig, with the CONSUL_CACERT,
// CONSUL_CLIENT_CERT, ... variables filling what it leaves empty, applies to
// both transports unless cfg.Transport already carries a TLS config. cfg is
// not modified; cfg.HttpClient must be nil (the Store needs its own).
func Open(cfg *api.Config, opts Options) (*Store, error) {
	if cfg == nil {
		cfg = api.DefaultConfig()
	}
	if cfg.HttpClient != nil {
		return nil, errors.New("consulstore: cfg.HttpClient is set; the store builds its own clients")
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	c, tr, pool, txn, err := newClient(*cfg, opts.MaxConns, true)
	if err != nil {
		return nil, err
	}
	bc, btr, _, _, err := newClient(*cfg, opts.MaxBlocking, false)
	if err != nil {
		tr.CloseIdleConnections()
		return nil, err
	}
	// The probe that tells whether the agent answers at all has a
	// connection of its own: behind MaxConns renewals that an election
	// holds up, it would wait past the broker's grace and every replica
	// would count as cut off (issue 41).
	pc, ptr, ppool, _, err := newClient(*cfg, 1, true)
	if err != nil {
		tr.CloseIdleConnections()
		btr.CloseIdleConnections()
		return nil, err
	}
	s := newStore(c, bc, opts)
	s.probeC = pc
	s.transports = []*http.Transport{tr, btr, ptr}
	s.pool, s.probePool = pool, ppool
	s.txn = txn
	s.batch = &batcher{s: s, max: opts.MaxTxnInFlight}
	s.secrets = secretsOf(cfg, txn.token())
	return s, nil
}

func newStore(c, blockingC *api.Client, opts Options) *Store {
	return &Store{opts: opts, c: c, blockingC: blockingC, probeC: c, slots: make(chan struct{}, opts.MaxBlocking), latency: newLatencies()}
}

// Close releases the Store's idle connections. Call it once no call is in
// flight; the Store must not be used afterwards.
func (s *Store) Close() {
	for _, tr := range s.transports {
		tr.CloseIdleConnections()
	}
	for _, p := range []*connPool{s.pool, s.probePool} {
		if p != nil {
			p.CloseIdleConnections()
		}
	}
}

// MaxConns is the connection cap NewClient gives its client.
//
// Deprecated: Open sizes two budgets (Options.MaxBlocking and
// Options.MaxConns) instead.
const MaxConns = 180

// NewClient returns a Consul client for cfg with one transport capped at
// MaxConns connections. It sets cfg.Transport if nil and changes its limits.
//
// Deprecated: use Open, which keeps blocking queries and the other calls on
// separate connection budgets. NewClient and New remain until every caller
// has moved.
func NewClient(cfg *api.Config) (*api.Client, error) {
	if cfg.Transport == nil {
		cfg.Transport = api.DefaultConfig().Transport
	}
	cfg.Transport.MaxConnsPerHost = MaxConns
	cfg.Transport.MaxIdleConnsPerHost = MaxConns
	c, err := api.NewClient(cfg)
	if err != nil {
		return nil, err
	}
	if hc := cfg.HttpClient; hc != nil {
		hc.Transport = recorder{next: hc.Transport}
	}
	return c, nil
}

// New returns a Store on client, whose blocking queries wait at most
// waitTime each (0: DefaultWaitTime). Watch and every other call share
// client's connections; Watch still holds at most DefaultMaxBlocking
// queries in flight.
//
// Deprecated: use Open. A client not made by NewClient loses the HTTP
// status of some failures (they become StoreUnavailable).
func New(client *api.Client, waitTime time.Duration) *Store {
	opts, err := Options{WaitTime: waitTime}.withDefaults()
	if err != nil {
		opts, _ = Options{}.withDefaults()
	}
	return newStore(client, client, opts)
}

// Client returns the Consul client of the Store's non-blocking calls.
// Calls made through it are not counted and their errors not classified;
// it is meant for tests and tools.
func (s *Store) Client() *api.Client { return s.c }

// OpenBlockingQueries is the number of Consul blocking queries in flight;
// never more than Options.MaxBlocking.
func (s *Store) OpenBlockingQueries() int64 { return s.blocking.Load() }

// QueuedBlockingQueries is the number of Watch calls waiting for a
// blocking-query slot.
func (s *Store) QueuedBlockingQueries() int64 { return s.queued.Load() }

// Options returns the Store's options, defaults filled in.
func (s *Store) Options() Options { return s.opts }

// Healthy reports whether Consul answers and has a leader: nil, a
// *broker.StoreError, or ctx's error.
func (s *Store) Healthy(ctx context.Context) error {
	return s.statusLeader(ctx, true)
}

// Reachable implements broker.Store: Consul's agent answers its status
// call, with or without a cluster leader.
func (s *Store) Reachable(ctx context.Context) error {
	return s.statusLeader(ctx, false)
}

func (s *Store) statusLeader(ctx context.Context, needLeader bool) error {
	c := s.begin(ctx, opStatusLeader, s.opts.CallTimeout)
	leader, err := s.probeC.Status().LeaderWithQueryOptions((&api.QueryOptions{}).WithContext(c.ctx))
	if err == nil && leader == "" && needLeader {
		err = &broker.StoreError{Kind: broker.StoreUnavailable, Op: c.opName(), Err: errors.New("no cluster leader")}
	}
	return c.end(err)
}

var _ broker.Store = (*Store)(nil)
