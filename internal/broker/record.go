package broker

import (
	"context"
	"encoding/json"
	"maps"
	"slices"
	"time"
)

// The broker's own keys. Tenants can never use this prefix.
const (
	// BrokerPrefix is the root of every key the broker writes for itself.
	BrokerPrefix = "lockbroker/"
	// recordPrefix holds one record per session the broker made a grant
	// for: lockbroker/sessions/<session id>.
	recordPrefix = BrokerPrefix + "sessions/"
)

func recordKey(session string) string { return recordPrefix + session }

// record is what Consul knows about a session the broker granted holds
// to. It is the one place every replica agrees on:
//   - Owner: the replica that renews a broker-owned session ("" for a
//     client-owned one). Every write a replica makes for a broker-owned
//     session is conditioned, in the same transaction, on the record's
//     index, and a resume moves Owner by check-and-set: a late or paused
//     replica can change nothing after a resume.
//   - Holds: the fencing token of each grant the session holds, by key.
//     A token of 0 means "this record's own ModifyIndex": the granting
//     transaction writes the record, so both get the grant's Raft index.
//     A Release (on any replica) drops the key in the releasing
//     transaction, so a hold that sees its key released tells a Release
//     (the key gone from a live record: `released`) from a loss.
//
// The record entry is acquired by its session, so Consul releases (or
// deletes) it when the session ends; a record whose entry has no session
// is garbage.
type record struct {
	Owner  string `json:"owner,omitempty"`
	Tenant string `json:"tenant,omitempty"`
	// Delete: the session has DELETE behavior (a release deletes the key).
	Delete bool `json:"delete,omitempty"`
	// Prev is the index of the record this one replaced. Consul skips a
	// write that changes nothing (the ModifyIndex stays), so every write of
	// a record must differ from the last: a grant that re-adds the same
	// pending token would otherwise get no index of its own.
	Prev uint64 `json:"prev,omitempty"`
	// Since is when each hold was granted (Unix milliseconds), for
	// operators.
	Since map[string]int64  `json:"since,omitempty"`
	Holds map[string]uint64 `json:"holds"`
	// Again lists the held keys whose grant is not the session's first of
	// that key (a pooled session given a key again), for operators:
	// releasing or setting the value of any grant of a broker-owned
	// session needs its token (see tokenRequired).
	Again map[string]bool `json:"again,omitempty"`
	// Waiting is the lock key the session waits for with a ticket in its
	// shared queue (ticket.go), for ListHolds; a grant clears it.
	Waiting string `json:"waiting,omitempty"`
	// Keys are the keys of a multi-key hold (AcquireSpec.Keys), `key`
	// first: they are held, released and lost together (multikey.go).
	Keys []string `json:"keys,omitempty"`

	session string // the session id (from the key)
	index   uint64 // the entry's ModifyIndex; 0 when there is no record
	live    bool   // the entry is still acquired by its session
}

// waited are the lock keys whose shared queue the record's session waited
// in: every key of a multi-key request, else the one it waits for.
func (r *record) waited() []string {
	switch {
	case r.Waiting == "":
		return nil
	case len(r.Keys) > 1:
		return r.Keys
	}
	return []string{r.Waiting}
}

// newRecord is an absent record for session.
func newRecord(session, owner string) *record {
	return &record{session: session, Owner: owner, Holds: map[string]uint64{}}
}

// decodeRecord reads a record entry; a malformed body counts as empty.
func decodeRecord(session string, e *Entry) *record {
	r := newRecord(session, "")
	if e == nil {
		return r
	}
	_ = json.Unmarshal(e.Value, r)
	if r.Holds == nil {
		r.Holds = map[string]uint64{}
	}
	r.index, r.live = e.ModifyIndex, e.Session == session
	return r
}

// token is the fencing token of the session's grant of key, or 0.
func (r *record) token(key string) uint64 {
	t, ok := r.Holds[key]
	if !ok {
		return 0
	}
	if t == 0 {
		return r.index
	}
	return t
}

// next returns a copy to write: pending tokens (0) become the index of
// the write that made them, which is the record's index now.
func (r *record) next() *record {
	n := *r
	n.Prev = r.index
	n.Holds = maps.Clone(r.Holds)
	n.Since = maps.Clone(r.Since)
	if n.Since == nil {
		n.Since = map[string]int64{}
	}
	n.Again = maps.Clone(r.Again)
	if n.Again == nil {
		n.Again = map[string]bool{}
	}
	for k, t := range n.Holds {
		if t == 0 {
			n.Holds[k] = r.index
		}
	}
	return &n
}

// with is next with a new (pending) grant of key; again marks a key the
// session held before (see Again).
func (r *record) with(key string, again bool) *record {
	n := r.next()
	n.Holds[key] = 0
	n.Since[key] = time.Now().UnixMilli()
	if n.Waiting == key {
		n.Waiting = ""
	}
	if again {
		n.Again[key] = true
	}
	return n
}

// without is next with key's hold gone: the record a release writes.
func (r *record) without(key string) *record {
	n := r.next()
	delete(n.Holds, key)
	delete(n.Since, key)
	delete(n.Again, key)
	return n
}

// tokenRequired refuses a token-less Release or SetValue of a live
// broker-owned session (one with an owner): such a session may be a
// pooled one that held the key before, and a request without a token may
// be a late one from that earlier holder. The rule is the same for every
// broker-owned session, pooled or not, whatever it held before, so that a
// caller can know it in advance.
func (r *record) tokenRequired(token uint64) error {
	if token != 0 || r.Owner == "" || !r.live {
		return nil
	}
	return invalid("token", "is required: session %s was made by the broker for an Acquire stream, so a release or value change must name the grant's token (acquired.sequencer.token)", r.session)
}

// waitsFor says whether the record shows its session waiting for key in
// key's queue (a lock's ticket, a semaphore's or read-write lock's
// contender entry, or a multi-key request's keys) without a grant of it.
func (r *record) waitsFor(key string) bool {
	if !r.live || r.Waiting == "" || r.token(key) != 0 {
		return false
	}
	return r.Waiting == key || (len(r.Keys) > 1 && slices.Contains(r.Keys, key))
}

// guard is the op that conditions a transaction on the record being as
// read.
func (r *record) guard() Op {
	if r.index == 0 {
		return Op{Verb: OpCheckNotExists, Key: recordKey(r.session)}
	}
	return Op{Verb: OpCheckIndex, Key: recordKey(r.session), Index: r.index}
}

// writeOps conditions on r and writes n, acquired by the session. A live
// record is rewritten with one check-and-set: Consul's set keeps the
// entry's session, and the index check also proves the session alive (its
// end releases or deletes the entry, which moves the index). An absent or
// dead record is written with a guard and a lock, which checks the
// session. Either way the op count varies: recordWritten finds the
// record's write in a committed transaction.
func (r *record) writeOps(n *record) []Op {
	body := encodeRecord(n)
	if r.index != 0 && r.live {
		return []Op{{Verb: OpCAS, Key: recordKey(r.session), Value: body, Index: r.index}}
	}
	return []Op{r.guard(), {Verb: OpLock, Key: recordKey(r.session), Value: body, Session: r.session}}
}

// recordWritten is the index at which a committed transaction wrote
// session's record (ops and res as Store.Txn takes and returns them), or 0.
func recordWritten(ops []Op, res []*Entry, session string) uint64 {
	key := recordKey(session)
	for i, op := range ops {
		if op.Key == key && (op.Verb == OpCAS || op.Verb == OpLock) && i < len(res) && res[i] != nil {
			return res[i].ModifyIndex
		}
	}
	return 0
}

// deleteOps conditions on r and deletes it.
func (r *record) deleteOps() []Op {
	if r.index == 0 {
		return nil
	}
	return []Op{{Verb: OpDeleteCAS, Key: recordKey(r.session), Index: r.index}}
}

// readRecord reads session's record consistently.
func (b *Broker) readRecord(ctx context.Context, session string) (*record, error) {
	entries, _, err := b.store.List(ctx, recordKey(session), true)
	if err != nil {
		return nil, err
	}
	e, _ := findEntry(entries, recordKey(session))
	return decodeRecord(session, e), nil
}

func findEntry(entries []*Entry, key string) (*Entry, bool) {
	for _, e := range entries {
		if e.Key == key {
			return e, true
		}
	}
	return nil, false
}
