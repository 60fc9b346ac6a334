package broker

import (
	"context"
	"fmt"
	"strconv"
)

// readState is a consistent read of key's state.
func (b *Broker) readState(ctx context.Context, key string) (*State, error) {
	entries, idx, err := b.store.List(ctx, key, true)
	if err != nil {
		return nil, err
	}
	return deriveState(key, under(key, entries), idx), nil
}

// readHold reads key's state and session's record, both consistently and
// at once: one round trip to Consul, not two.
func (b *Broker) readHold(ctx context.Context, key, session string) (*State, *record, error) {
	return b.startReadHold(ctx, key, session).wait()
}

// heldRead is a readHold in flight (see startReadHold).
type heldRead struct {
	cancel context.CancelFunc
	st     func() (*State, error)
	rec    func() (*record, error)
}

// startReadHold starts readHold's two reads; wait gives their answer.
func (b *Broker) startReadHold(ctx context.Context, key, session string) *heldRead {
	ctx, cancel := context.WithCancel(ctx)
	return &heldRead{cancel: cancel,
		st:  async(func() (*State, error) { return b.readState(ctx, key) }),
		rec: async(func() (*record, error) { return b.readRecord(ctx, session) })}
}

// abandon cancels the reads whose answer is not wanted, and waits for
// them to end, so that nothing outlives their caller.
func (r *heldRead) abandon() {
	r.cancel()
	_, _, _ = r.wait()
}

// readDone is a heldRead whose answer is already known.
func readDone(st *State, rec *record) *heldRead {
	return &heldRead{cancel: func() {},
		st:  func() (*State, error) { return st, nil },
		rec: func() (*record, error) { return rec, nil }}
}

// wait returns the reads' answer: the state's error first, as readState
// then readRecord would.
func (r *heldRead) wait() (*State, *record, error) {
	st, err := r.st()
	rec, recErr := r.rec()
	r.cancel()
	if err == nil {
		err = recErr
	}
	if err != nil {
		return nil, nil, err
	}
	return st, rec, nil
}

// async runs f on a goroutine of its own; the function it returns waits
// for f's result.
func async[T any](f func() (T, error)) func() (T, error) {
	var v T
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		v, err = f()
	}()
	return func() (T, error) {
		<-done
		return v, err
	}
}

// GetLock returns key's state, read consistently, with exact tokens and
// session names.
func (b *Broker) GetLock(ctx context.Context, key string) (*State, error) {
	st, err := b.readState(ctx, key)
	if err != nil {
		return nil, err
	}
	b.fillTokens(ctx, st)
	return st, nil
}

// current says whether seq is the current grant in st, and if not, why.
// A grant the broker made is current only with the token its session's
// record holds for the key: a later grant to the same session (after a
// delete and re-acquire, or a semaphore re-admission) has another token.
func current(st *State, rec *record, seq Sequencer) (bool, string) {
	hd, ok := st.holder(seq.Session)
	switch {
	case st.Kind != KindLock && st.Kind != KindSemaphore && st.Kind != KindRWLock:
		return false, fmt.Sprintf("key %q holds no lock, semaphore or read-write lock", st.Key)
	case !ok:
		return false, fmt.Sprintf("session %s does not hold key %q", seq.Session, st.Key)
	case hd.LockIndex != seq.LockIndex:
		return false, fmt.Sprintf("session %s holds key %q with lock index %d, not %d", seq.Session, st.Key, hd.LockIndex, seq.LockIndex)
	}
	if t := rec.token(st.Key); t > 0 {
		if t != seq.Token {
			return false, fmt.Sprintf("token %d is not the current grant of %q (token %d is)", seq.Token, st.Key, t)
		}
		return true, ""
	}
	// A grant the broker did not make (api.Lock, api.Semaphore): Consul's
	// indexes bound it.
	if st.Kind == KindLock && (seq.Token < st.lock.CreateIndex || seq.Token > st.lock.ModifyIndex) {
		return false, fmt.Sprintf("token %d is not the grant of key %q", seq.Token, st.Key)
	}
	if st.Kind == KindRWLock && (seq.Token < hd.CreateIndex || seq.Token > st.lock.ModifyIndex) {
		return false, fmt.Sprintf("token %d is not the grant of read-write lock %q", seq.Token, st.Key)
	}
	if st.Kind == KindSemaphore && (seq.Token < hd.CreateIndex || seq.Token > st.semLock.ModifyIndex) {
		return false, fmt.Sprintf("token %d is not the grant of semaphore %q", seq.Token, st.Key)
	}
	return true, ""
}

// CheckSequencer reports whether seq is still the current grant of its key,
// and the key's state.
func (b *Broker) CheckSequencer(ctx context.Context, seq Sequencer) (bool, *State, error) {
	// The state first, then the record, one after the other: no
	// transaction follows to fail on a record older than the state, so
	// the record must be the newer (a later grant to the same session then
	// shows as "not current", never an old grant as current).
	st, err := b.readState(ctx, seq.Key)
	if err != nil {
		return false, nil, err
	}
	rec, err := b.readRecord(ctx, seq.Session)
	if err != nil {
		return false, nil, err
	}
	ok, _ := current(st, rec, seq)
	b.fillTokens(ctx, st)
	return ok, st, nil
}

// grantID identifies one grant: Consul's entry identity (CreateIndex and
// LockIndex change with every new grant, also after a delete) and the
// session.
func grantID(key string, hd Holder) string {
	return key + "\x00" + hd.Session + "\x00" + strconv.FormatUint(hd.CreateIndex, 10) + "/" + strconv.FormatUint(hd.LockIndex, 10)
}

// fillTokens sets the exact token and session name of each holder in st:
// from the cache of grants this replica resolved, else from the holder's
// session record (the broker's grants) and its Consul session (the name).
// A holder the broker did not grant keeps Consul's best answer.
func (b *Broker) fillTokens(ctx context.Context, st *State) {
	for i := range st.Holders {
		hd := &st.Holders[i]
		id := grantID(st.Key, *hd)
		b.cacheMu.Lock()
		g, ok := b.grants[id]
		b.cacheMu.Unlock()
		if !ok {
			g = b.resolveGrant(ctx, st.Key, *hd)
		}
		if g.token > 0 {
			hd.Token = g.token
		}
		hd.SessionName = g.name
	}
}

// fillTokensCached is fillTokens without Consul calls: holders this
// replica has not resolved keep Consul's best answer. A waiter's queued
// reports use it, so a busy key's waiters do not read every new holder's
// record.
func (b *Broker) fillTokensCached(st *State) {
	b.cacheMu.Lock()
	defer b.cacheMu.Unlock()
	for i := range st.Holders {
		hd := &st.Holders[i]
		if g, ok := b.grants[grantID(st.Key, *hd)]; ok {
			if g.token > 0 {
				hd.Token = g.token
			}
			hd.SessionName = g.name
		}
	}
}

type grantInfo struct {
	token uint64
	name  string
}

func (b *Broker) resolveGrant(ctx context.Context, key string, hd Holder) grantInfo {
	var g grantInfo
	rec, err := b.readRecord(ctx, hd.Session)
	if err != nil {
		return g
	}
	g.token = rec.token(key)
	if info, err := b.store.Session(ctx, hd.Session); err == nil {
		g.name = info.Name
	}
	b.cacheMu.Lock()
	if len(b.grants) > 100_000 {
		clear(b.grants)
	}
	b.grants[grantID(key, hd)] = g
	b.cacheMu.Unlock()
	return g
}
