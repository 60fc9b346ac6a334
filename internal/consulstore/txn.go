package consulstore

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/hashicorp/consul/api"

	"github.com/lockbroker/lockbroker/internal/broker"
)

// verbs lists the transaction verbs the Store accepts and what Consul does
// with each: whether it writes (a transaction without a write is served by
// Consul's read path, without Raft, and reports every failing check) and
// whether it produces a result entry (state/txn.go txnKVS: every verb that
// touches one existing entry does; check-not-exists, delete and delete-cas
// do not). Only get's entry carries the value.
var verbs = map[broker.OpVerb]struct{ write, result bool }{
	broker.OpLock:           {write: true, result: true},
	broker.OpUnlock:         {write: true, result: true},
	broker.OpCAS:            {write: true, result: true},
	broker.OpSet:            {write: true, result: true},
	broker.OpDelete:         {write: true, result: false},
	broker.OpDeleteCAS:      {write: true, result: false},
	broker.OpGet:            {write: false, result: true},
	broker.OpCheckIndex:     {write: false, result: true},
	broker.OpCheckSession:   {write: false, result: true},
	broker.OpCheckNotExists: {write: false, result: false},
}

// Txn implements broker.Store. It returns one slot per op, in order: the
// entry Consul returned for it (with Value only for get), or nil for
// check-not-exists, delete and delete-cas. A transaction of only get and
// check verbs is a read (no Raft write) in Consul's default mode, answered
// by the leader without a quorum round: the broker uses such reads only to
// notice changes, and decides on consistent reads. More than
// broker.MaxTxnOps ops, or an unknown verb, is StoreRejected without a call
// to Consul; no ops is an empty result without a call.
//
// A rolled-back transaction is a *broker.TxnError with each failing op's
// kind, unless one of its failures is an ACL denial: then the whole call is
// StorePermissionDenied. A successful transaction whose results Consul
// filtered by ACLs (a get of a key the token may not read) is also
// StorePermissionDenied, even though its writes, if any, were applied.
func (s *Store) Txn(ctx context.Context, ops []broker.Op) ([]*broker.Entry, error) {
	if len(ops) == 0 {
		return []*broker.Entry{}, nil
	}
	return s.runTxn(ctx, ops, true)
}

// Check implements broker.Store: a transaction of check verbs only, whose
// answer is decoded only when it was rolled back (the failing ops). So
// Txn's test for results filtered by ACLs is not made: it needs no
// results here, since Consul's pre-check refuses a check of a key the
// token may not read, and that comes back as a rolled-back transaction. An
// op that is not a check is StoreRejected without a call to Consul; no ops
// pass without a call.
func (s *Store) Check(ctx context.Context, ops []broker.Op) error {
	for i, op := range ops {
		switch op.Verb {
		case broker.OpCheckIndex, broker.OpCheckNotExists, broker.OpCheckSession:
		default:
			return &broker.StoreError{Kind: broker.StoreRejected, Op: opNames[opKVTxnRead].consul,
				Err: fmt.Errorf("operation %d: %q is not a check", i, op.Verb)}
		}
	}
	if len(ops) == 0 {
		return nil
	}
	_, err := s.runTxn(ctx, ops, false)
	return err
}

// runTxn is Txn and Check; results says whether the entries of a
// transaction that passed are wanted (always, for one that writes). A
// transaction that writes goes through the Store's batcher, if it has one.
func (s *Store) runTxn(ctx context.Context, ops []broker.Op, results bool) ([]*broker.Entry, error) {
	write, err := checkOps(ops)
	if err != nil {
		return nil, &broker.StoreError{Kind: broker.StoreRejected, Op: opNames[opKVTxnWrite].consul, Err: err}
	}
	if !write {
		return s.soloTxn(ctx, opKVTxnRead, ops, results)
	}
	if s.batch != nil {
		return s.batch.txn(ctx, ops)
	}
	return s.soloTxn(ctx, opKVTxnWrite, ops, results)
}

// soloTxn makes one call for checked ops of kind kind.
func (s *Store) soloTxn(ctx context.Context, kind opKind, ops []broker.Op, results bool) ([]*broker.Entry, error) {
	c := s.begin(ctx, kind, s.opts.CallTimeout)
	var err error
	var ok bool
	var a *txnAnswer
	if s.txn != nil {
		ok, a, err = s.txn.do(c.ctx, ops, results)
	} else {
		ok, a, err = s.apiTxn(c.ctx, ops)
	}
	var out []*broker.Entry
	switch {
	case err != nil:
	case !ok:
		err = c.rolledBack(ops, a.Errors)
	case results:
		out, err = c.results(ops, a)
	}
	if err = c.end(err); err != nil {
		return nil, err
	}
	return out, nil
}

// checkOps checks ops before any call, and reports whether any writes.
func checkOps(ops []broker.Op) (bool, error) {
	if len(ops) > broker.MaxTxnOps {
		return false, fmt.Errorf("%d operations, more than Consul's %d", len(ops), broker.MaxTxnOps)
	}
	write := false
	for i, op := range ops {
		v, known := verbs[op.Verb]
		if !known {
			return false, fmt.Errorf("operation %d: unsupported verb %q", i, op.Verb)
		}
		write = write || v.write
	}
	return write, nil
}

// apiTxn runs ops through api.Txn (a Store built by New, which has no
// txnEndpoint) and returns the answer as txnEndpoint.do does.
func (s *Store) apiTxn(ctx context.Context, ops []broker.Op) (bool, *txnAnswer, error) {
	ok, resp, _, err := s.c.Txn().Txn(txnOps(ops), (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return false, nil, err
	}
	a := &txnAnswer{}
	for _, e := range resp.Errors {
		a.Errors = append(a.Errors, txnErr{OpIndex: e.OpIndex, What: e.What})
	}
	for _, r := range resp.Results {
		var kv *txnKV
		if r != nil && r.KV != nil {
			p := r.KV
			kv = &txnKV{Key: p.Key, Value: p.Value, Flags: p.Flags, Session: p.Session,
				LockIndex: p.LockIndex, CreateIndex: p.CreateIndex, ModifyIndex: p.ModifyIndex}
		}
		a.Results = append(a.Results, struct{ KV *txnKV }{kv})
	}
	return ok, a, nil
}

// txnOps converts checked ops to Consul's.
func txnOps(ops []broker.Op) api.TxnOps {
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
	return txn
}

// results puts each of Consul's results back at the position of the op
// that produced it. Fewer results than ops that produce one means Consul
// filtered some by ACLs.
func (c *call) results(ops []broker.Op, a *txnAnswer) ([]*broker.Entry, error) {
	res := a.Results
	want := resultsWanted(ops)
	if len(res) != want {
		return nil, c.fail(broker.StorePermissionDenied,
			fmt.Errorf("%d of %d transaction results returned: results filtered by ACLs", len(res), want))
	}
	out := make([]*broker.Entry, len(ops))
	next := 0
	for i, op := range ops {
		if !verbs[op.Verb].result {
			continue
		}
		if kv := res[next].KV; kv != nil {
			out[i] = &broker.Entry{Key: kv.Key, Value: kv.Value, Flags: kv.Flags, Session: kv.Session,
				LockIndex: kv.LockIndex, CreateIndex: kv.CreateIndex, ModifyIndex: kv.ModifyIndex}
		}
		next++
	}
	return out, nil
}

// resultsWanted is how many results Consul returns for ops when its ACLs
// filter none: one per op whose verb produces one.
func resultsWanted(ops []broker.Op) int {
	n := 0
	for _, op := range ops {
		if verbs[op.Verb].result {
			n++
		}
	}
	return n
}

// permissionDenied starts the message of every ACL denial
// (acl.PermissionDeniedError).
const permissionDenied = "Permission denied"

// rolledBack builds the error of a transaction Consul rolled back (HTTP 409).
func (c *call) rolledBack(ops []broker.Op, errs []txnErr) error {
	if len(errs) == 0 {
		return c.fail(broker.StoreRejected, errors.New("transaction rolled back without errors"))
	}
	te := &broker.TxnError{Failures: make([]broker.TxnFailure, 0, len(errs))}
	for _, e := range errs {
		if strings.HasPrefix(e.What, permissionDenied) {
			return c.fail(broker.StorePermissionDenied, fmt.Errorf("operation %d: %s", e.OpIndex, e.What))
		}
		kind := broker.TxnOther
		if e.OpIndex >= 0 && e.OpIndex < len(ops) {
			kind = failureKind(ops[e.OpIndex], e.What)
		}
		te.Failures = append(te.Failures, broker.TxnFailure{Op: e.OpIndex, Kind: kind})
	}
	return te
}

// failureKind classifies Consul's message for a failing op. It compares the
// message with the exact text Consul builds for the op's verb and key
// (agent/consul/state/txn.go and kvs.go for the state checks,
// agent/consul/txn_endpoint.go for lock-delay), so a key that happens to
// contain "exists" or "lock is already held" cannot be misread.
func failureKind(op broker.Op, what string) broker.TxnFailureKind {
	k := op.Key
	switch op.Verb {
	case broker.OpLock:
		switch what {
		case fmt.Sprintf("failed to lock key %q, lock is already held", k):
			return broker.TxnLockHeld
		case fmt.Sprintf("failed to lock key %q due to lock delay", k):
			return broker.TxnLockDelay
		case "missing session", fmt.Sprintf("invalid session %#v", op.Session):
			return broker.TxnSessionInvalid
		}
	case broker.OpUnlock:
		switch what {
		case fmt.Sprintf("failed to unlock key %q, lock isn't held, or is held by another session", k):
			return broker.TxnNotHeld
		case "missing session":
			return broker.TxnSessionInvalid
		}
	case broker.OpCAS:
		if what == fmt.Sprintf("failed to set key %q, index is stale", k) {
			return broker.TxnCheckFailed
		}
	case broker.OpDeleteCAS:
		if what == fmt.Sprintf("failed to delete key %q, index is stale", k) {
			return broker.TxnCheckFailed
		}
	case broker.OpCheckIndex:
		if what == fmt.Sprintf("failed to check index, key %q doesn't exist", k) ||
			strings.HasPrefix(what, fmt.Sprintf("failed index check for key %q, current modify index ", k)) {
			return broker.TxnCheckFailed
		}
	case broker.OpCheckSession:
		if what == fmt.Sprintf("failed to check session, key %q doesn't exist", k) ||
			strings.HasPrefix(what, fmt.Sprintf("failed session check for key %q, current session ", k)) {
			return broker.TxnCheckFailed
		}
	case broker.OpCheckNotExists:
		if what == fmt.Sprintf("key %q exists", k) {
			return broker.TxnCheckFailed
		}
	case broker.OpGet:
		if what == fmt.Sprintf("key %q doesn't exist", k) {
			return broker.TxnCheckFailed
		}
	}
	return broker.TxnOther
}
