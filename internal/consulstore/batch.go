package consulstore

import (
	"context"
	"encoding/base64"
	"errors"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/lockbroker/lockbroker/internal/broker"
)

// Group commit of write transactions.
//
// A Store lets at most Options.MaxTxnInFlight write transactions be in
// flight to Consul at once. One that comes while they all are waits, with
// whatever else comes meanwhile, and the first slot to free sends all that
// wait as one transaction: one HTTP request, one Raft entry and one state
// store commit for many holds. With few callers nothing waits and nothing
// changes; under load Consul's cost per hold falls several times (its HTTP
// handling and Raft apply are per request, see the package's
// BenchmarkTxnBatch).
//
// Each caller still gets the answer of its own transaction. A batch is its
// members' ops in the order they queued, applied atomically: when Consul
// applies it, each member's ops are applied as if alone, in that order, at
// one Raft index. When Consul rolls a batch back (HTTP 409), nothing of it
// was applied, and Consul lists every failing op (state/txn.go txnDispatch
// goes on after a failure). A member with a failing op whose keys no
// earlier member of the batch touched failed on the state Consul had, as
// it would have alone: that is its answer. A member whose keys an earlier
// member touched may have failed because of that member's ops, which were
// rolled back with it: it runs again alone. The members with no failing op
// go again together, and again, each round sending fewer.
//
// A batch Consul refuses before applying anything (a 4xx other than 409:
// too large for its txn_max_req_len, say) is sent again member by member.
// A batch that gets no answer leaves each member where a call without an
// answer leaves its caller: the outcome is unknown (StoreUnavailable).

// DefaultMaxTxnInFlight is the default of Options.MaxTxnInFlight.
const DefaultMaxTxnInFlight = 4

// maxBatchBytes bounds the encoded ops of a batch of several members, half
// of Consul's default txn_max_req_len (512 KiB). A single member larger
// than this is sent alone, as it would be without batching.
const maxBatchBytes = 256 << 10

// batcher sends a Store's write transactions (see above).
type batcher struct {
	s   *Store
	max int

	mu       sync.Mutex
	inflight int       // write transactions (or batches) in flight
	queue    []*member // waiting, in order

	batches, batched atomic.Uint64 // batches of several members sent; members in them
}

// member is a caller's transaction waiting in, or sent with, a batch.
type member struct {
	ops  []broker.Op
	size int
	done chan struct{} // closed when the fields below are set
	sent bool          // taken from the queue (under batcher.mu)
	// left: its caller stopped waiting after it was sent (under
	// batcher.mu). A round Consul rolls back applied nothing of it, and
	// it is not sent again (see send).
	left bool

	// The outcome, set before done is closed: err, or ok with the
	// member's own part of Consul's answer (op indexes its own), or solo:
	// the batch could not tell, so the member runs again alone.
	err  error
	ok   bool
	a    *txnAnswer
	solo bool
}

// txn runs a write transaction, alone when a slot is free, else in the
// next batch.
func (b *batcher) txn(ctx context.Context, ops []broker.Op) ([]*broker.Entry, error) {
	b.mu.Lock()
	if b.inflight < b.max && len(b.queue) == 0 {
		b.inflight++
		b.mu.Unlock()
		out, err := b.s.soloTxn(ctx, opKVTxnWrite, ops, true)
		b.next()
		return out, err
	}
	m := &member{ops: ops, size: encodedSize(ops), done: make(chan struct{})}
	b.queue = append(b.queue, m)
	b.mu.Unlock()

	// The member's own bound, as a call of its own would have it.
	c := b.s.begin(ctx, opKVTxnWrite, b.s.opts.CallTimeout)
	defer c.cancel()
	select {
	case <-m.done:
	case <-c.ctx.Done():
		b.mu.Lock()
		if !m.sent {
			b.remove(m)
		}
		m.left = true
		b.mu.Unlock()
		return nil, c.classify(c.ctx.Err())
	}
	switch {
	case m.solo:
		return b.s.soloTxn(ctx, opKVTxnWrite, ops, true)
	case m.err != nil:
		return nil, m.err
	case !m.ok:
		return nil, c.rolledBack(ops, m.a.Errors)
	}
	return c.results(ops, m.a)
}

// remove takes m out of the queue. Called with mu held.
func (b *batcher) remove(m *member) {
	if i := slices.Index(b.queue, m); i >= 0 {
		b.queue = slices.Delete(b.queue, i, i+1)
	}
}

// next is called by the holder of a slot when its call is over: it sends
// what waits, keeping the slot, or frees it.
func (b *batcher) next() {
	b.mu.Lock()
	batch := b.take()
	if batch == nil {
		b.inflight--
	}
	b.mu.Unlock()
	if batch != nil {
		go b.run(batch)
	}
}

// run sends batch, then each batch that waits meanwhile, and frees its
// slot when none does.
func (b *batcher) run(batch []*member) {
	for batch != nil {
		b.send(batch)
		b.mu.Lock()
		batch = b.take()
		if batch == nil {
			b.inflight--
		}
		b.mu.Unlock()
	}
}

// take removes the next batch from the queue: the members in order while
// they fit in MaxTxnOps ops and maxBatchBytes, and at least one. Called
// with mu held.
func (b *batcher) take() []*member {
	if len(b.queue) == 0 {
		return nil
	}
	n, ops, size := 0, 0, 0
	for _, m := range b.queue {
		if n > 0 && (ops+len(m.ops) > broker.MaxTxnOps || size+m.size > maxBatchBytes) {
			break
		}
		m.sent = true
		ops += len(m.ops)
		size += m.size
		n++
	}
	batch := make([]*member, n)
	copy(batch, b.queue)
	rest := copy(b.queue, b.queue[n:])
	clear(b.queue[rest:])
	b.queue = b.queue[:rest]
	return batch
}

// send sends batch as one transaction and settles every member, sending
// again those that passed when others failed, unless their caller has
// left: it was told the outcome is unknown and may have read the state
// since to settle it (a grant it no longer waited for, say); a write sent
// after that read would leave a key held that nobody knows of (issue 41).
func (b *batcher) send(batch []*member) {
	for len(batch) > 0 {
		if len(batch) > 1 {
			b.batches.Add(1)
			b.batched.Add(uint64(len(batch)))
		}
		batch = b.stay(b.round(batch))
	}
}

// stay returns the members of again whose caller still waits, and settles
// the others as not applied.
func (b *batcher) stay(again []*member) []*member {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := again[:0]
	for _, m := range again {
		if m.left {
			m.err = errLeftBeforeResend
			close(m.done)
			continue
		}
		out = append(out, m)
	}
	return out
}

// errLeftBeforeResend settles a member whose caller left before it could
// be sent again: nobody reads it.
var errLeftBeforeResend = errors.New("consulstore: the caller left before its write was sent again")

// round makes one call for batch, settles the members it can and returns
// those to send again.
func (b *batcher) round(batch []*member) []*member {
	var ops []broker.Op
	if len(batch) == 1 {
		ops = batch[0].ops
	} else {
		n := 0
		for _, m := range batch {
			n += len(m.ops)
		}
		ops = make([]broker.Op, 0, n)
		for _, m := range batch {
			ops = append(ops, m.ops...)
		}
	}
	// The batch's call is bounded by the Store's timeout alone: its
	// members each wait within their own bound.
	c := b.s.begin(context.Background(), opKVTxnWrite, b.s.opts.CallTimeout)
	ok, a, err := b.s.txn.do(c.ctx, ops, true)
	switch {
	case err != nil:
		err = c.end(err)
		var se *broker.StoreError
		refused := errors.As(err, &se) && (se.Kind == broker.StoreRejected || se.Kind == broker.StorePermissionDenied)
		for _, m := range batch {
			if refused && len(batch) > 1 {
				// Refused before anything was applied, maybe for one
				// member's sake: each is sent alone.
				m.solo = true
			} else {
				m.err = err
			}
			close(m.done)
		}
		return nil
	case !ok:
		_ = c.end(&broker.TxnError{})
		return rolledBackRound(batch, a.Errors)
	default:
		_ = c.end(nil)
		settleResults(batch, a.Results)
		return nil
	}
}

// rolledBackRound settles the members of a batch Consul rolled back, and
// returns those with no failing op, to send again.
func rolledBackRound(batch []*member, errs []txnErr) []*member {
	failed := make([][]txnErr, len(batch))
	start := 0
	for i, m := range batch {
		for _, e := range errs {
			if e.OpIndex >= start && e.OpIndex < start+len(m.ops) {
				failed[i] = append(failed[i], txnErr{OpIndex: e.OpIndex - start, What: e.What})
			}
		}
		start += len(m.ops)
	}
	attributed := 0
	for _, f := range failed {
		attributed += len(f)
	}
	var again []*member
	touched := make(map[string]struct{})
	for i, m := range batch {
		switch {
		case attributed != len(errs) || attributed == 0:
			// An error of no member's op: nothing was applied, but who
			// failed is not known.
			m.solo = true
		case len(failed[i]) == 0:
			again = append(again, m)
		case touches(m, touched):
			m.solo = true
		default:
			m.a = &txnAnswer{Errors: failed[i]}
		}
		for _, op := range m.ops {
			touched[op.Key] = struct{}{}
		}
		if m.solo || m.a != nil {
			close(m.done)
		}
	}
	return again
}

// touches reports whether any of m's ops is on a key in keys.
func touches(m *member, keys map[string]struct{}) bool {
	for _, op := range m.ops {
		if _, ok := keys[op.Key]; ok {
			return true
		}
	}
	return false
}

// settleResults gives each member of an applied batch its results. Consul
// returns one for each op whose verb produces one, in order, less those
// its ACLs filter out (by key: ops on one key are all filtered or none). A
// member missing one gets fewer results than its ops want, which
// call.results reports as filtered.
func settleResults(batch []*member, res []struct{ KV *txnKV }) {
	want := 0
	for _, m := range batch {
		want += resultsWanted(m.ops)
	}
	next := 0
	for _, m := range batch {
		a := &txnAnswer{}
		for _, op := range m.ops {
			if !verbs[op.Verb].result || next >= len(res) {
				continue
			}
			// With every result there, they are in op order; with some
			// filtered, an op's result is the next one only if its key
			// matches.
			if len(res) == want || (res[next].KV != nil && res[next].KV.Key == op.Key) {
				a.Results = append(a.Results, res[next])
				next++
			}
		}
		m.ok, m.a = true, a
		close(m.done)
	}
}

// encodedSize estimates the bytes of ops in a request body, as encodeTxn
// sizes its buffer.
func encodedSize(ops []broker.Op) int {
	n := 0
	for _, op := range ops {
		n += 96 + len(op.Key) + base64.StdEncoding.EncodedLen(len(op.Value)) + len(op.Session)
	}
	return n
}
