package broker

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// markerPrefix holds release markers: Release writes one in the same
// transaction that releases a key, so that the hold's stream, on whichever
// replica, reports `released` rather than `lost`. The stream (or Release,
// when no stream takes it within markerWait) deletes it.
const markerPrefix = "lockbroker/released/"

const markerWait = 500 * time.Millisecond

func markerKey(key, session string) string { return markerPrefix + session + "/" + key }

// readState is a consistent read of key's state, with the tokens this
// replica knows.
func (b *Broker) readState(ctx context.Context, key string) (*State, error) {
	entries, idx, err := b.store.List(ctx, key, true)
	if err != nil {
		return nil, err
	}
	st := deriveState(key, filterUnder(key, entries), idx)
	for i := range st.Holders {
		hd := &st.Holders[i]
		if t, ok := b.hub.term(key, hd.Session, hd.LockIndex); ok {
			hd.Token = t
		} else if st.Kind == KindSemaphore {
			hd.Token = 0 // unknown: Consul keeps no record of the admitting write
		}
	}
	return st, nil
}

// GetLock returns key's state, read consistently.
func (b *Broker) GetLock(ctx context.Context, key string) (*State, error) {
	return b.readState(ctx, key)
}

// checkResume verifies, with a consistent read, that seq is still the
// current grant of its key.
func (b *Broker) checkResume(ctx context.Context, seq Sequencer, limit uint32) (*Sequencer, error) {
	st, err := b.readState(ctx, seq.Key)
	if err != nil {
		return nil, err
	}
	if ok, why := current(st, seq); !ok {
		return nil, fmt.Errorf("%w: cannot resume: %s", ErrNotHolder, why)
	}
	if st.Kind == KindSemaphore && st.Limit != limit {
		return nil, fmt.Errorf("%w: semaphore %q has limit %d, requested limit %d", ErrConflict, seq.Key, st.Limit, limit)
	}
	if st.Kind == KindLock && limit > 1 {
		return nil, fmt.Errorf("%w: %q is a lock key; resume it with limit 0 or 1", ErrConflict, seq.Key)
	}
	out := seq
	out.Kind = st.Kind
	return &out, nil
}

// current says whether seq is the current grant in st, and if not, why.
func current(st *State, seq Sequencer) (bool, string) {
	hd, ok := st.holder(seq.Session)
	switch {
	case st.Kind != KindLock && st.Kind != KindSemaphore:
		return false, fmt.Sprintf("key %q holds no lock or semaphore", st.Key)
	case !ok:
		return false, fmt.Sprintf("session %s does not hold key %q", seq.Session, st.Key)
	case hd.LockIndex != seq.LockIndex:
		return false, fmt.Sprintf("session %s holds key %q with lock index %d, not %d", seq.Session, st.Key, hd.LockIndex, seq.LockIndex)
	case st.Kind == KindLock && (seq.Token < st.lock.CreateIndex || seq.Token > st.lock.ModifyIndex):
		return false, fmt.Sprintf("token %d is not the grant of key %q", seq.Token, st.Key)
	case st.Kind == KindSemaphore && (seq.Token < hd.CreateIndex || seq.Token > st.semLock.ModifyIndex):
		return false, fmt.Sprintf("token %d is not the grant of semaphore %q", seq.Token, st.Key)
	}
	return true, ""
}

// CheckSequencer reports whether seq is still the current grant of its key,
// and the key's state.
func (b *Broker) CheckSequencer(ctx context.Context, seq Sequencer) (bool, *State, error) {
	st, err := b.readState(ctx, seq.Key)
	if err != nil {
		return false, nil, err
	}
	ok, _ := current(st, seq)
	return ok, st, nil
}

// Release ends the hold of session on key, from any replica. It returns
// false when the session does not hold the key but did hold it once
// (idempotent), ErrSessionNotFound for an unknown session, and ErrNotHolder
// when the session holds nothing there.
func (b *Broker) Release(ctx context.Context, key, session string) (bool, error) {
	info, err := b.store.Session(ctx, session)
	if err != nil {
		return false, err
	}
	h := b.lookup(key, session)
	if h != nil {
		h.mu.Lock()
		h.releasing = true
		h.mu.Unlock()
	}
	released, err := b.release(ctx, key, session, info.Delete, h == nil)
	if h != nil {
		h.mu.Lock()
		if released {
			h.markReleased()
		}
		h.releasing = false
		h.mu.Unlock()
	}
	if err != nil || !released || h != nil {
		return released, err
	}
	// The hold may be on another replica: give its stream a moment to
	// take the marker, then remove it ourselves.
	b.awaitMarker(ctx, key, session)
	return true, nil
}

// release releases key for session; with marker it leaves a release
// marker for a hold that may be on another replica.
func (b *Broker) release(ctx context.Context, key, session string, del, marker bool) (bool, error) {
	for range 50 {
		st, err := b.readState(ctx, key)
		if err != nil {
			return false, err
		}
		var extra []Op
		if marker {
			extra = []Op{{Verb: OpSet, Key: markerKey(key, session), Value: []byte(key)}}
		}
		switch st.Kind {
		case KindSemaphore:
			if _, ok := st.holder(session); !ok {
				return false, fmt.Errorf("%w: session %s holds no slot of semaphore %q", ErrNotHolder, session, key)
			}
			return b.leaveSemaphore(ctx, key, session, extra)
		case KindLock:
			hd, ok := st.holder(session)
			if !ok && len(st.Holders) == 0 {
				return false, nil // already released: Release is idempotent
			}
			if !ok {
				return false, fmt.Errorf("%w: session %s does not hold %q (session %s does)", ErrNotHolder, session, key, st.Holders[0].Session)
			}
			ops := append(unlockOps(key, session, hd.Value, del), extra...)
			_, err := b.store.Txn(ctx, ops)
			var te *TxnError
			if errors.As(err, &te) {
				continue
			}
			return err == nil, err
		default:
			return false, fmt.Errorf("%w: session %s does not hold %q (no lock there)", ErrNotHolder, session, key)
		}
	}
	return false, fmt.Errorf("%w: too many races releasing %q", ErrUnavailable, key)
}

// takeMarker reports whether a Release left a marker for this hold, and
// deletes it.
func (b *Broker) takeMarker(ctx context.Context, key, session string) bool {
	mk := markerKey(key, session)
	entries, _, err := b.store.List(ctx, mk, true)
	if err != nil {
		return false
	}
	e, ok := findEntry(entries, mk)
	if !ok {
		return false
	}
	if _, err := b.store.Txn(ctx, []Op{{Verb: OpDeleteCAS, Key: mk, Index: e.ModifyIndex}}); err != nil {
		b.log.Debug("cannot delete release marker")
	}
	return true
}

// awaitMarker waits up to markerWait for a hold's stream to take the
// release marker, then deletes what is left.
func (b *Broker) awaitMarker(ctx context.Context, key, session string) {
	mk := markerKey(key, session)
	wctx, cancel := context.WithTimeout(ctx, markerWait)
	defer cancel()
	var idx uint64
	for {
		entries, next, err := b.store.Watch(wctx, mk, idx)
		if err != nil {
			break
		}
		if _, ok := findEntry(entries, mk); !ok {
			return
		}
		idx = max(next, 1)
	}
	dctx, dcancel := cleanupContext()
	defer dcancel()
	_, _ = b.store.Txn(dctx, []Op{{Verb: OpDelete, Key: mk}})
}

// SetValue changes the value of session's hold on key without giving it
// up; the sequencer stays the same.
func (b *Broker) SetValue(ctx context.Context, key, session string, value []byte) (*Sequencer, error) {
	st, err := b.readState(ctx, key)
	if err != nil {
		return nil, err
	}
	hd, ok := st.holder(session)
	if !ok {
		if _, err := b.store.Session(ctx, session); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("%w: session %s does not hold %q", ErrNotHolder, session, key)
	}
	target, flags := key, LockFlagValue
	if st.Kind == KindSemaphore {
		target, flags = contenderKey(key, session), SemaphoreFlagValue
	}
	_, err = b.store.Txn(ctx, []Op{
		{Verb: OpCheckSession, Key: target, Session: session},
		{Verb: OpLock, Key: target, Value: value, Flags: flags, Session: session},
	})
	var te *TxnError
	if errors.As(err, &te) {
		return nil, fmt.Errorf("%w: session %s no longer holds %q", ErrNotHolder, session, key)
	}
	if err != nil {
		return nil, err
	}
	seq := &Sequencer{Key: key, Session: session, LockIndex: hd.LockIndex, Token: hd.Token, Kind: st.Kind}
	if h := b.lookup(key, session); h != nil {
		seq.Token = h.seq.Token
	}
	return seq, nil
}
