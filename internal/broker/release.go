package broker

import (
	"context"
	"slices"
	"time"
)

// Release ends the hold of session on key, from any replica, and returns
// once Consul committed it. With token > 0 it releases only that grant. It
// returns false when the session does not hold the key any more and
// nobody else does, or when token names a grant that has ended (the
// session holds a later grant of the key, or the key changed since:
// idempotent, a retry after success is OK), ErrSessionNotFound for an
// unknown session, ErrInvalid without a token for a live broker-owned
// session that holds the key (see record.tokenRequired), and ErrNotHolder
// when the session does not hold the key (or not that grant) while someone
// does, or, without a token, when it waits for the key: a waiter has no
// grant, so it is not held whatever the token rule says.
func (b *Broker) Release(ctx context.Context, key, session string, token uint64) (bool, error) {
	ok, err := b.releaseAny(ctx, key, session, token)
	switch {
	case ok:
		b.noteReleased(key, session)
	case isNotFound(err) && b.releasedRecently(key, session):
		// A retry after success: the session is gone since (a
		// broker-owned session is destroyed when its hold ends).
		return false, nil
	}
	return ok, err
}

func (b *Broker) releaseAny(ctx context.Context, key, session string, token uint64) (bool, error) {
	if m := b.lookupMulti(key, session); m != nil && (TenantFrom(ctx) == "" || m.h.tenant == TenantFrom(ctx)) {
		if ok, err, done := m.release(ctx, key, token); done {
			return ok, err
		}
	}
	if h := b.lookup(key, session); h != nil && (TenantFrom(ctx) == "" || h.tenant == TenantFrom(ctx)) {
		if ok, err, done := h.release(ctx, token); done {
			return ok, err
		}
	}
	return b.releaseRemote(ctx, key, session, token)
}

// recentTTL is how long this replica remembers a release, so that a retry
// of the same Release is answered OK even after the session is gone;
// recentMax bounds how many it remembers (at 2,500 releases a second, the
// last 40 s of them).
const (
	recentTTL = time.Minute
	recentMax = 100_000
)

func (b *Broker) noteReleased(key, session string) {
	b.cacheMu.Lock()
	defer b.cacheMu.Unlock()
	b.recent.note(localKey(key, session), time.Now())
}

func (b *Broker) releasedRecently(key, session string) bool {
	b.cacheMu.Lock()
	defer b.cacheMu.Unlock()
	return b.recent.has(localKey(key, session), time.Now())
}

// recentReleases remembers releases for recentTTL, at most recentMax: a
// map to look them up and their keys in the order they came, so that
// forgetting the old ones costs a constant time per release. (Scanning
// the whole map on each release once it held 10,000 took a quarter of the
// broker's CPU with 64 clients cycling.)
type recentReleases struct {
	at    map[string]time.Time
	order []recentRelease // order[head:] oldest first; a key noted again is in it twice
	head  int
}

type recentRelease struct {
	key string
	at  time.Time
}

func newRecentReleases() recentReleases {
	return recentReleases{at: make(map[string]time.Time)}
}

func (r *recentReleases) note(key string, now time.Time) {
	r.forget(now)
	r.at[key] = now
	r.order = append(r.order, recentRelease{key, now})
}

func (r *recentReleases) has(key string, now time.Time) bool {
	t, ok := r.at[key]
	return ok && now.Sub(t) < recentTTL
}

// forget drops the releases older than recentTTL, and the oldest beyond
// recentMax, then gives back the slots it dropped once they are half of
// the queue.
func (r *recentReleases) forget(now time.Time) {
	for r.head < len(r.order) {
		e := r.order[r.head]
		if now.Sub(e.at) < recentTTL && len(r.order)-r.head < recentMax {
			break
		}
		if t, ok := r.at[e.key]; ok && t.Equal(e.at) { // not noted again since
			delete(r.at, e.key)
		}
		r.order[r.head] = recentRelease{}
		r.head++
	}
	if r.head >= 1024 && 2*r.head >= len(r.order) {
		n := copy(r.order, r.order[r.head:])
		clear(r.order[n:])
		r.order, r.head = r.order[:n], 0
	}
}

// release releases a hold of this replica through its lifecycle. done is
// false when the hold is not held any more (the remote path decides).
func (h *hold) release(ctx context.Context, token uint64) (bool, error, bool) {
	seq := h.grant()
	if token != 0 && token != seq.Token {
		return false, nil, false
	}
	if h.life.Phase() == PhaseWaiting {
		// It holds nothing yet, so no token can exist for it: the remote
		// path answers (not held), before any token rule.
		return false, nil, false
	}
	if err := h.record().tokenRequired(token); err != nil {
		return false, err, true
	}
	if !h.life.BeginRelease() {
		return false, nil, false
	}
	released := false
	defer func() { h.life.EndRelease(released) }()
	if !h.sem && !h.del && h.handOff(ctx) {
		released = true
		return true, nil, true
	}
	st, err := h.leaveState(ctx)
	if err != nil {
		return false, err, true
	}
	for attempt := range maxWriteAttempts {
		ops, next, err := h.releaseOps(st)
		if err != nil {
			return false, err, true
		}
		res, err := h.st.Txn(ctx, ops)
		if err == nil {
			h.noteRelease(ops, res)
			next.index, next.live = recordWritten(ops, res, h.session), true
			h.setRecord(next)
			released = true
			return true, nil, true
		}
		if asTxnError(err) == nil {
			return false, err, true
		}
		backoff(ctx, attempt)
		var rec *record
		if st, rec, err = h.b.readHold(ctx, h.spec.Key, h.session); err != nil {
			return false, err, true
		}
		h.setRecord(rec)
		if _, ok := st.holder(h.session); !ok {
			return false, nil, false
		}
	}
	return false, newError(ErrUnavailable, ReasonConsulUnavailable, "key %q changed under every release attempt; retry", h.spec.Key), true
}

// releaseOps release the hold on st (see leaveState), and drop it from the
// record: the first ops write next, the record as it will be.
func (h *hold) releaseOps(st *State) (ops []Op, next *record, err error) {
	rec := h.record()
	next = rec.without(h.spec.Key)
	ops = rec.writeOps(next)
	if h.sem {
		if st == nil {
			return nil, nil, newError(ErrUnavailable, ReasonConsulUnavailable, "state of %q not known yet; retry", h.spec.Key)
		}
		leave, _, err := h.leaveOps(st)
		return append(ops, leave...), next, err
	}
	h.mu.Lock()
	value := h.value
	h.mu.Unlock()
	if hd, ok := st.holderOrSelf(h.session, h.grant().LockIndex); ok && hd.Value != nil {
		value = hd.Value
	}
	return append(ops, unlockOps(h.spec.Key, h.session, value, h.del)...), next, nil
}

// releaseRemote releases a hold whose stream is not on this replica (or
// has none). The releasing transaction drops the key from the session's
// record, which tells the stream, wherever it is, that a Release ended it.
// It goes through the caller's tenant's store (its Consul token), not the
// broker's: the hold's own replica would have used that one too.
func (b *Broker) releaseRemote(ctx context.Context, key, session string, token uint64) (bool, error) {
	for attempt := range maxWriteAttempts {
		if attempt > 0 {
			backoff(ctx, attempt)
		}
		st, rec, err := b.readHold(ctx, key, session)
		if err != nil {
			return false, err
		}
		if err := allowed(ctx, rec, TenantFrom(ctx)); err != nil {
			return false, err
		}
		if _, holds := st.holder(session); !holds && token == 0 && rec.waitsFor(key) {
			return false, b.waiterNotHolder(ctx, st, session)
		}
		if err := rec.tokenRequired(token); err != nil {
			return false, err
		}
		if len(rec.Keys) > 1 && slices.Contains(rec.Keys, key) {
			return b.releaseMultiRemote(ctx, rec, key, session, token)
		}
		hd, holds := st.holder(session)
		if !holds {
			return false, b.notHolder(ctx, st, session, token)
		}
		if cur := rec.token(key); token != 0 && token != cur && !(cur == 0 && hd.Token == token) {
			if cur == 0 {
				cur = hd.Token
			}
			if token < cur {
				return false, nil // a later grant of the session: token's has ended
			}
			return false, newError(ErrNotHolder, ReasonNotHolder, "session %s holds %q with another grant than token %d", session, key, token).withState(st)
		}
		ops, err := b.remoteReleaseOps(ctx, st, rec, hd, session)
		if err != nil {
			return false, err
		}
		res, err := b.storeFor(TenantFrom(ctx)).Txn(ctx, ops)
		if err == nil {
			b.noteRelease(ops, res)
		}
		if te := asTxnError(err); te != nil {
			if te.Has(TxnSessionInvalid) {
				return false, sessionError(ErrSessionNotFound, session)
			}
			continue
		}
		if err != nil {
			return false, err
		}
		return true, nil
	}
	return false, newError(ErrUnavailable, ReasonConsulUnavailable, "key %q changed under every release attempt; retry", key)
}

// remoteReleaseOps release hd's hold on st and drop it from the record.
func (b *Broker) remoteReleaseOps(ctx context.Context, st *State, rec *record, hd Holder, session string) ([]Op, error) {
	// Conditioned on the record as read (readHold reads it at the same
	// time as the state, so it may be the older of the two).
	ops := []Op{rec.guard()}
	if rec.index != 0 && rec.live {
		ops = rec.writeOps(rec.without(st.Key))
	}
	if st.Kind == KindSemaphore || st.Kind == KindRWLock {
		leave, _, err := leaveOps(st, session)
		if err != nil {
			return nil, err
		}
		ops = append(ops, leave...)
	} else {
		del := rec.Delete
		if rec.index == 0 {
			info, err := b.store.Session(ctx, session)
			if err != nil {
				return nil, sessionError(err, session)
			}
			del = info.Delete
		}
		ops = append(ops, unlockOps(st.Key, session, hd.Value, del)...)
	}
	return ops, nil
}

// notHolder is Release's answer when session does not hold st's key:
// NOT_FOUND for an unknown session; OK (nothing to do) when nobody holds
// it, or when token names a grant that has ended (it is older than the
// key's newest write: a grant's token is the index of a write to the key,
// which only grows); else NOT_HOLDER with the holders.
func (b *Broker) notHolder(ctx context.Context, st *State, session string, token uint64) error {
	if _, err := b.store.Session(ctx, session); err != nil {
		return sessionError(err, session)
	}
	if token != 0 && token <= st.newest() {
		return nil
	}
	if st.Kind == KindNone && !b.releasedRecently(st.Key, session) {
		return newError(ErrNotHolder, ReasonNotHolder, "session %s does not hold %q: there is no lock or semaphore there", session, st.Key).withState(st)
	}
	if len(st.Holders) == 0 {
		return nil
	}
	b.fillTokens(ctx, st)
	return newError(ErrNotHolder, ReasonNotHolder, "session %s does not hold %q; %s", session, st.Key, describeHolders(st)).withState(st)
}

// waiterNotHolder is Release's (and SetValue's) answer, without a token,
// for a session that waits for st's key in its queue and holds nothing:
// NOT_HOLDER
// (FAILED_PRECONDITION), whoever holds the key, and nothing is written;
// the wait goes on (cancelling its Acquire stream ends it).
func (b *Broker) waiterNotHolder(ctx context.Context, st *State, session string) error {
	b.fillTokens(ctx, st)
	return newError(ErrNotHolder, ReasonNotHolder, "session %s does not hold %q: it waits for it and holds nothing (cancel its Acquire stream to stop waiting); %s", session, st.Key, describeHolders(st)).withState(st)
}
