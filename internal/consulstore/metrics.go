package consulstore

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockbroker/lockbroker/internal/broker"
)

// opKind is a kind of Consul call the Store makes.
type opKind uint8

// The kinds of Consul call.
const (
	opSessionCreate opKind = iota
	opSessionRenew
	opSessionDestroy
	opSessionInfo
	opSessionList
	opKVList
	opKVWatch
	opKVTxnWrite
	opKVTxnRead
	opStatusLeader
	numOps
)

// opNames gives each kind its metric label and its name in errors.
var opNames = [numOps]struct{ metric, consul string }{
	opSessionCreate:  {"session_create", "session create"},
	opSessionRenew:   {"session_renew", "session renew"},
	opSessionDestroy: {"session_destroy", "session destroy"},
	opSessionInfo:    {"session_info", "session info"},
	opSessionList:    {"session_list", "session list"},
	opKVList:         {"kv_list", "kv list"},
	opKVWatch:        {"kv_watch", "kv watch"},
	opKVTxnWrite:     {"kv_txn_write", "kv txn"},
	opKVTxnRead:      {"kv_txn_read", "kv txn"},
	opStatusLeader:   {"status_leader", "status leader"},
}

// result is the outcome of a call.
type result uint8

// The outcomes.
const (
	resOK result = iota
	resNotFound
	resUnavailable
	resPermissionDenied
	resRejected
	resTxnRolledBack
	resCanceled
	// resStaleNotFound: a renewal Consul answered "not found" for a session
	// a consistent read then found (a leader whose state is not current
	// yet, see renewNotFound). The caller sees StoreUnavailable, as for an
	// outage; the metric tells the two apart.
	resStaleNotFound
	numResults
)

var resultNames = [numResults]string{
	resOK:               "ok",
	resNotFound:         "not_found",
	resUnavailable:      "unavailable",
	resPermissionDenied: "permission_denied",
	resRejected:         "rejected",
	resTxnRolledBack:    "txn_rolled_back",
	resCanceled:         "canceled",
	resStaleNotFound:    "stale_not_found",
}

// resultOf classifies a call's final error.
func resultOf(err error) result {
	if err == nil {
		return resOK // before the targets of errors.As, which escape to the heap
	}
	var se *broker.StoreError
	var te *broker.TxnError
	switch {
	case errors.As(err, &se):
		switch se.Kind {
		case broker.StorePermissionDenied:
			return resPermissionDenied
		case broker.StoreRejected:
			return resRejected
		}
		return resUnavailable
	case errors.As(err, &te):
		return resTxnRolledBack
	case errors.Is(err, broker.ErrSessionNotFound):
		return resNotFound
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return resCanceled
	}
	return resUnavailable
}

// possible reports whether a call of kind op can end with r, so that the
// collector exports only series that can move.
func possible(op opKind, r result) bool {
	switch r {
	case resNotFound:
		return op == opSessionRenew || op == opSessionInfo
	case resTxnRolledBack:
		return op == opKVTxnWrite || op == opKVTxnRead
	case resStaleNotFound:
		return op == opSessionRenew
	}
	return true
}

// counters counts calls per kind and outcome, lock-free.
type counters struct {
	n [numOps][numResults]atomic.Uint64
}

func (c *counters) add(op opKind, r result) { c.n[op][r].Add(1) }

// OpCounts returns how many Consul calls the Store has made per kind of
// operation, whatever their outcome, keyed by the metric's op label
// (session_create, session_renew, session_destroy, session_info,
// session_list, kv_list, kv_watch, kv_txn_write, kv_txn_read,
// status_leader). Every kind is present. Subtract two snapshots to count
// the calls of a piece of work.
func (s *Store) OpCounts() map[string]uint64 {
	out := make(map[string]uint64, numOps)
	for op := range numOps {
		var n uint64
		for r := range numResults {
			n += s.counts.n[op][r].Load()
		}
		out[opNames[op].metric] = n
	}
	return out
}

// latencies are the Consul calls' durations per kind, whatever their
// outcome; kv_watch is left out, since a blocking query's length is the
// wait Consul was asked for, not a latency.
type latencies struct {
	vec *prometheus.HistogramVec
	by  [numOps]prometheus.Observer // nil for kv_watch
}

func newLatencies() latencies {
	l := latencies{vec: prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "lockbroker_consul_request_duration_seconds",
		Help: "Consul HTTP API calls made by the broker, by operation, from the call to its answer or failure (retries are calls of their own; kv_watch, a blocking query, is left out). " +
			"op=\"session_renew\" is the latency of session renewals.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	}, []string{"op"})}
	for op := range numOps {
		if op != opKVWatch {
			l.by[op] = l.vec.WithLabelValues(opNames[op].metric)
		}
	}
	return l
}

func (l *latencies) observe(op opKind, d time.Duration) {
	if o := l.by[op]; o != nil {
		o.Observe(d.Seconds())
	}
}

var (
	requestsDesc = prometheus.NewDesc("lockbroker_consul_requests_total",
		"Consul HTTP API calls made by the broker, by operation and result "+
			"(ok, not_found, unavailable, permission_denied, rejected, txn_rolled_back, canceled; "+
			"stale_not_found: a renewal answered \"not found\" by a leader not yet current, for a session that lives, retried).",
		[]string{"op", "result"}, nil)
	batchesDesc = prometheus.NewDesc("lockbroker_consul_txn_batches_total",
		"Write transactions of several callers sent to Consul as one (group commit); each is one kv_txn_write request.", nil, nil)
	batchedDesc = prometheus.NewDesc("lockbroker_consul_txn_batched_total",
		"Callers' write transactions sent inside such batches.", nil, nil)
	queuedDesc = prometheus.NewDesc("lockbroker_consul_blocking_queries_queued",
		"Watches waiting for one of the capped Consul blocking-query slots.", nil, nil)
)

// Collector returns a prometheus.Collector for the Store's metrics:
// lockbroker_consul_requests_total{op,result},
// lockbroker_consul_blocking_queries_queued and the group commit's
// lockbroker_consul_txn_batches_total and
// lockbroker_consul_txn_batched_total, and
// lockbroker_consul_request_duration_seconds{op}. Register it once per Store.
// (The number of blocking queries in flight is OpenBlockingQueries; the
// server exports it as lockbroker_consul_blocking_queries.)
func (s *Store) Collector() prometheus.Collector { return collector{s} }

type collector struct{ s *Store }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- requestsDesc
	ch <- queuedDesc
	ch <- batchesDesc
	ch <- batchedDesc
	c.s.latency.vec.Describe(ch)
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	for op := range numOps {
		for r := range numResults {
			if !possible(op, r) {
				continue
			}
			ch <- prometheus.MustNewConstMetric(requestsDesc, prometheus.CounterValue,
				float64(c.s.counts.n[op][r].Load()), opNames[op].metric, resultNames[r])
		}
	}
	ch <- prometheus.MustNewConstMetric(queuedDesc, prometheus.GaugeValue, float64(c.s.queued.Load()))
	batches, batched := c.s.TxnBatches()
	ch <- prometheus.MustNewConstMetric(batchesDesc, prometheus.CounterValue, float64(batches))
	ch <- prometheus.MustNewConstMetric(batchedDesc, prometheus.CounterValue, float64(batched))
	c.s.latency.vec.Collect(ch)
}

// TxnBatches returns how many batches of several write transactions the
// Store has sent (each one Consul call, counted as kv_txn_write; a batch
// sent again after a roll-back counts again) and how many callers'
// transactions they carried.
func (s *Store) TxnBatches() (batches, txns uint64) {
	if s.batch == nil {
		return 0, 0
	}
	return s.batch.batches.Load(), s.batch.batched.Load()
}
