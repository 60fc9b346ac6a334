package broker

import (
	"context"
	"fmt"
	"sort"
	"time"
)

// Read-write locks (docs/consul-layout.md). A read-write lock at K is a
// semaphore whose grant rule differs, and an RW hold runs the semaphore's
// path (hold.sem) with these functions in place of the semaphore's:
//
//   - K itself is the state, flags RWLockFlagValue, value
//     {"Holders":{"<session>":"r"|"w"},"Seq":n}. Every grant and every
//     contender's arrival writes K by check-and-set (Seq one more each
//     time, so that Consul never skips the write as a no-op), so a grant's
//     check-and-set proves that no contender arrived unseen, and K's
//     ModifyIndex after a grant is the grant's token: tokens strictly
//     increase, and a writer's is above every token granted before it.
//   - A release does not write K: it deletes its contender entry (see
//     rwLeaveOps), so it never races the arrivals and grants that move K.
//     K may then list a session whose entry is gone; it holds nothing
//     (deriveRW), and the next write of K, built on the derived holders,
//     drops it. A session that comes back (pooled) drops its own listing
//     in the very check-and-set that writes its new entry (enterRW).
//   - K/.lock is a marker with the same flags, so that api.Semaphore on
//     the prefix K refuses it (ErrSemaphoreConflict); api.Lock on K
//     refuses K's flags (ErrLockConflict).
//   - K/<session> is each reader's or writer's contender entry, acquired
//     by its session, flags RWReadFlagValue or RWWriteFlagValue, with the
//     holder's value. Its CreateIndex is its place in the queue. An entry
//     its session no longer holds is dead: skipped, and deleted by the
//     next write; except a dead holder's (K lists it), which stays, in its
//     session's lock-delay, until a grant deletes it under a lock of it
//     (rwDeadHolder): so a lost holder's lock-delay holds off every grant,
//     as a lock's does.
//
// The grant rule, on the live contenders ordered by CreateIndex: a writer
// is granted when nobody holds the lock and nobody is ahead of it; a
// reader when no writer holds it and everyone ahead of it is a reader
// (holding or not). So readers that arrive together share, a reader
// behind a waiting writer waits for that writer, and neither starves.

// The read-write lock's flag values (ASCII "lbrwloc", "lbrwrea",
// "lbrwwri"): distinct from api.Lock's, api.Semaphore's and the queue's.
const (
	RWLockFlagValue  uint64 = 0x006c6272776c6f63
	RWReadFlagValue  uint64 = 0x006c627277726561
	RWWriteFlagValue uint64 = 0x006c627277777269
)

// rwBody is the JSON value of a read-write lock's key: each holder's
// session and mode ("r" or "w"), and Seq, one more at every write. Consul
// skips a write that would leave an entry as it is, without moving its
// ModifyIndex: without Seq, an arrival that leaves the holders as they
// are (a waiter's; or a grant of a session K still lists from an earlier
// hold) would not move K, and a check-and-set on a state older than it
// would pass.
type rwBody struct {
	Holders map[string]string `json:"Holders"`
	Seq     uint64            `json:"Seq,omitempty"`
}

// nextSeq is the Seq of the next write of K on st.
func (st *State) nextSeq() uint64 {
	if st.rw == nil || st.lock == nil {
		return 1
	}
	return st.rw.Seq + 1
}

func rwContenderFlags(f uint64) bool { return f == RWReadFlagValue || f == RWWriteFlagValue }

// isRW: the hold is a read-write lock's (it runs the semaphore's path).
func (h *hold) isRW() bool { return h.spec.Mode != ModeNone }

func (h *hold) rwFlags() uint64 {
	if h.spec.Mode == ModeRead {
		return RWReadFlagValue
	}
	return RWWriteFlagValue
}

// isRWState: K carries the read-write flags, or K is gone and its marker
// is left (the state was deleted by someone: there is no holder).
func (st *State) isRWState() bool {
	return (st.lock != nil && st.lock.Flags == RWLockFlagValue) ||
		(st.lock == nil && st.semLock != nil && st.semLock.Flags == RWLockFlagValue)
}

// deriveRW fills a read-write lock's holders: the sessions K's body lists
// that still hold their contender entry.
func (st *State) deriveRW() {
	st.Kind = KindRWLock
	st.contenders = make(map[string]*Entry)
	for name, e := range st.children {
		if rwContenderFlags(e.Flags) && e.Session == name {
			st.contenders[name] = e
		}
	}
	body := rwBody{Holders: map[string]string{}}
	if st.lock != nil && len(st.lock.Value) > 0 {
		if err := decodeRWBody(st.lock.Value, &body); err != nil {
			st.rwErr = fmt.Errorf("%w: read-write lock %q has a malformed state: %v", ErrConflict, st.Key, err)
			return
		}
		if body.Holders == nil {
			body.Holders = map[string]string{}
		}
	}
	st.rw = &body
	for sid, m := range body.Holders {
		if c, ok := st.contenders[sid]; ok {
			st.Holders = append(st.Holders, Holder{Session: sid, Value: c.Value, LockIndex: c.LockIndex, CreateIndex: c.CreateIndex, Read: m == "r"})
		} else if c := st.children[sid]; c != nil && rwContenderFlags(c.Flags) && c.Session == "" {
			st.rwDead = append(st.rwDead, rwDeadHolder{Session: sid, Mode: m, Entry: c})
		}
	}
	sort.Slice(st.Holders, func(i, j int) bool { return st.Holders[i].CreateIndex < st.Holders[j].CreateIndex })
	sort.Slice(st.rwDead, func(i, j int) bool { return st.rwDead[i].Entry.CreateIndex < st.rwDead[j].Entry.CreateIndex })
	st.Waiting = len(st.contenders) - len(st.Holders)
}

// kindName names st's kind for a conflict message.
func kindName(st *State) string {
	switch st.Kind {
	case KindLock:
		return "a lock (kind LOCK)"
	case KindSemaphore:
		return fmt.Sprintf("a semaphore (kind SEMAPHORE, limit %d)", st.Limit)
	case KindRWLock:
		return "a read-write lock (kind RWLOCK)"
	case KindForeign:
		return fmt.Sprintf("a key with foreign flags %#x (kind FOREIGN)", st.lock.Flags)
	}
	return "nothing (kind NONE)"
}

// rwConflict says why st cannot be used as a read-write lock.
func rwConflict(st *State) error {
	switch {
	case st.Kind == KindLock, st.Kind == KindSemaphore:
		return newError(ErrConflict, ReasonLimitConflict, "key %q is %s, not a read-write lock; acquire it as such", st.Key, kindName(st)).withState(st)
	case st.Kind == KindForeign:
		return newError(ErrConflict, ReasonForeignFlags, "key %q holds flags %#x, not a read-write lock's (%#x)", st.Key, st.lock.Flags, RWLockFlagValue).withState(st)
	case st.Kind == KindRWLock && st.rwErr != nil:
		return newError(ErrConflict, ReasonForeignFlags, "%v", st.rwErr).withState(st)
	case st.Kind == KindRWLock && st.semLock != nil && st.semLock.Flags != RWLockFlagValue:
		return newError(ErrConflict, ReasonForeignFlags, "key %q has a %q entry with flags %#x, not a read-write lock's", st.Key, st.semLock.Key, st.semLock.Flags).withState(st)
	case st.Kind == KindNone && st.semLock != nil:
		return newError(ErrConflict, ReasonForeignFlags, "key %q has a %q entry with flags %#x, not a read-write lock's", st.Key, st.semLock.Key, st.semLock.Flags).withState(st)
	}
	return nil
}

// rwKindConflict is the refusal of a lock or semaphore request on a
// read-write lock's key (nil when st is not one).
func rwKindConflict(st *State, asked string) error {
	if st.Kind != KindRWLock {
		return nil
	}
	return newError(ErrConflict, ReasonLimitConflict, "key %q is %s; acquire it with kind READ or WRITE, not as %s", st.Key, kindName(st), asked).withState(st)
}

// rwAhead lists the live contenders ahead of session (lower CreateIndex,
// then session id), oldest first; all of them when session is none.
func rwAhead(st *State, session string, me *Entry) []*Entry {
	var out []*Entry
	for sid, c := range st.contenders {
		if sid == session {
			continue
		}
		if me == nil || c.CreateIndex < me.CreateIndex || (c.CreateIndex == me.CreateIndex && sid < session) {
			out = append(out, c)
		}
	}
	return out
}

// rwGrantable applies the grant rule to the contender me of session on st
// (me nil: a newcomer, behind every contender st lists).
func rwGrantable(st *State, session string, write bool, me *Entry) bool {
	if write {
		if len(st.Holders) > 0 {
			return false
		}
		return len(rwAhead(st, session, me)) == 0
	}
	if mutantRWReaderBesideWriter {
		return true
	}
	for _, hd := range st.Holders {
		if !hd.Read {
			return false
		}
	}
	for _, c := range rwAhead(st, session, me) {
		if c.Flags != RWReadFlagValue {
			return false
		}
	}
	return true
}

// rwDeadHolder is a dead holder of a read-write lock: a session K lists
// whose contender entry is still there but no longer held, which only
// the end of the session does (an operator's destroy, a TTL expiry, a
// failed health check; a release deletes the entry). Consul put that
// entry in the session's lock-delay. Until a grant deletes the entry
// with a lock of it (rwDeadLockOps), which Consul refuses within the
// lock-delay, K keeps listing it and no other write deletes the entry:
// so a read-write lock honours its holders' lock-delay as a lock does.
type rwDeadHolder struct {
	Session string
	Mode    string // "r" or "w", as K lists it
	Entry   *Entry
}

// rwDeadMax bounds the dead holders one grant deletes (three operations
// each); more than that are deleted by transactions of their own first.
const rwDeadMax = 32

// rwDeadListed says whether name is a dead holder in st.
func (st *State) rwDeadListed(name string) bool {
	for _, d := range st.rwDead {
		if d.Session == name {
			return true
		}
	}
	return false
}

// rwDeadLockOps delete dead holders' entries, each unchanged since st
// and locked by session first: Consul refuses the whole transaction
// (TxnLockDelay) while any of them is in its lock-delay.
func rwDeadLockOps(dead []rwDeadHolder, session string) []Op {
	var ops []Op
	for _, d := range dead {
		ops = append(ops,
			Op{Verb: OpCheckIndex, Key: d.Entry.Key, Index: d.Entry.ModifyIndex},
			Op{Verb: OpLock, Key: d.Entry.Key, Flags: d.Entry.Flags, Session: session},
			Op{Verb: OpDelete, Key: d.Entry.Key})
	}
	return ops
}

// rwBodyWith is st's body with only its live holders and the dead ones
// in keep, plus session in mode when mode is not empty, minus drop.
func rwBodyWith(st *State, session, mode, drop string, keep []rwDeadHolder) ([]byte, error) {
	b := rwBody{Holders: map[string]string{}, Seq: st.nextSeq()}
	for _, d := range keep {
		b.Holders[d.Session] = d.Mode
	}
	for _, hd := range st.Holders {
		if hd.Session == drop {
			continue
		}
		m := "w"
		if hd.Read {
			m = "r"
		}
		b.Holders[hd.Session] = m
	}
	if mode != "" {
		b.Holders[session] = mode
	}
	return encodeRWBody(b)
}

// rwStateOps write K's new body by check-and-set on st (creating K, and
// its marker, when st shows them absent).
func rwStateOps(st *State, body []byte) []Op {
	key := st.Key
	var ops []Op
	if st.lock == nil {
		ops = append(ops, Op{Verb: OpCAS, Key: key, Value: body, Flags: RWLockFlagValue, Index: 0})
	} else {
		ops = append(ops, Op{Verb: OpCAS, Key: key, Value: body, Flags: RWLockFlagValue, Index: st.lock.ModifyIndex})
	}
	switch {
	case st.lock != nil:
		// The marker was written with K (a state from this replica's own
		// release lists K alone: see noteRelease).
	case st.semLock == nil:
		ops = append(ops, Op{Verb: OpCAS, Key: key + semLockSuffix, Value: []byte(`{"ReadWrite":true}`), Flags: RWLockFlagValue, Index: 0})
	default:
		ops = append(ops, Op{Verb: OpCheckIndex, Key: key + semLockSuffix, Index: st.semLock.ModifyIndex})
	}
	return ops
}

// rwDeadOps delete contender entries (the read-write lock's, or an
// api.Semaphore's left by a refused attempt) whose session ended, except
// session's own and the dead holders' (see rwDeadHolder): a dead waiter's
// lock-delay protects nothing.
func rwDeadOps(st *State, session string) []Op {
	var ops []Op
	for name, c := range st.children {
		if len(ops) == maxDeadCleanup {
			break
		}
		if name != session && c.Session == "" && (rwContenderFlags(c.Flags) || c.Flags == SemaphoreFlagValue) && c.Key != st.Key+semLockSuffix && !st.rwDeadListed(name) {
			ops = append(ops, Op{Verb: OpDeleteCAS, Key: c.Key, Index: c.ModifyIndex})
		}
	}
	return ops
}

func (h *hold) rwMode() string {
	if h.spec.Mode == ModeRead {
		return "r"
	}
	return "w"
}

// firstRW enters the hold's contender entry, on the shared watch's state
// when it has one (its check-and-set of K makes a stale one cost a failed
// transaction and a read, never a wrong grant). When the rule grants it
// at once, the same transaction is the grant (h.early): an uncontended
// read or write costs one transaction. A try-once request on a state that
// does not grant it writes nothing.
//
// This replica's arrivals on the key go one at a time (rwEnter), each on
// the state the one before it left when that is the newest known: a
// burst of readers arriving here together costs one transaction each,
// where each of them racing the others on K cost a failed transaction and
// a read per lost race.
func (h *hold) firstRW(ctx context.Context) (*State, error) {
	kw := h.sub.kw
	if err := kw.rwEnter(ctx); err != nil {
		return nil, err
	}
	defer kw.rwLeave()
	st, _ := h.sub.state()
	if k := h.b.hub.knownState(h.spec.Key); k != nil && (st == nil || st.lock == nil || k.lock.ModifyIndex >= st.lock.ModifyIndex) {
		// This replica's own release, of a hold that saw nobody else:
		// newer than a watch's listing at K's index or before (which may
		// still show the released entry).
		st = k
	}
	if l := kw.rwLastState(); l != nil && (st == nil || st.lock == nil || l.lock.ModifyIndex > st.lock.ModifyIndex) {
		// The last write of K made here, newer than what the watch or a
		// release knows.
		st = l
	}
	fresh := false
	if st == nil {
		st = &State{Key: h.spec.Key, Kind: KindNone} // not read yet: assume absent
	}
	write := h.spec.Mode == ModeWrite
	for attempt := 0; ; attempt++ {
		conflict := rwConflict(st)
		_, holds := st.holder(h.session)
		busy := !rwGrantable(st, h.session, write, nil)
		switch {
		case conflict != nil && fresh:
			return nil, conflict
		case conflict != nil, holds && !fresh, busy && h.tryOnce() && !fresh:
			// Only a fresh read decides these.
		case holds:
			return st, nil // already a holder (a client-owned session)
		case busy && h.tryOnce():
			h.b.fillTokens(ctx, st)
			return nil, holdersError(ErrBusy, ReasonLockHeld, st)
		default:
			next, err := h.enterRW(ctx, st)
			if err == nil {
				kw.noteRW(next)
				return next, nil
			}
			kw.forgetRW(st)
			if err == errLockDelay && fresh {
				// A try-once beside a dead holder in its lock-delay (the
				// end is unknown here: the session is gone).
				return nil, newError(ErrBusy, ReasonLockDelay, "key %q is in Consul's lock-delay of a holder whose session ended (its end is unknown to this broker)", h.spec.Key).withState(st)
			}
			if err != errRace && err != errLockDelay {
				return nil, err
			}
		}
		if attempt >= maxRaces {
			e := newError(ErrUnavailable, ReasonConsulUnavailable, "key %q changed under %d attempts in a row; retry later", h.spec.Key, maxRaces)
			e.RetryAfter = time.Second
			return nil, e
		}
		if attempt > 0 {
			backoff(ctx, attempt)
		}
		var err error
		if st, err = h.b.readState(ctx, h.spec.Key); err != nil {
			return nil, err
		}
		fresh = true
	}
}

// enterRW writes the hold's contender entry with a check-and-set of K,
// and, when the rule grants it on st, the grant too (h.early). An entry
// the session already has (a client-owned session coming back) is
// released and acquired again in the same transaction, which bumps its
// LockIndex. errRace: st is not the key's state any more.
func (h *hold) enterRW(ctx context.Context, st *State) (*State, error) {
	key := h.spec.Key
	ck := contenderKey(key, h.session)
	grant := rwGrantable(st, h.session, h.spec.Mode == ModeWrite, nil)
	// A grant beside dead holders deletes their entries under their
	// lock-delay (rwDeadLockOps). An arrival that waits is never refused
	// for it: it enters without the grant, keeping them listed, and its
	// next attempt (tryRW) asks for the grant. A try-once asks for both in
	// one transaction: refused, it wrote nothing and answers LOCK_DELAY.
	keep := st.rwDead
	var deadOps []Op
	if grant && len(st.rwDead) > 0 {
		if h.tryOnce() && len(st.rwDead) <= rwDeadMax {
			keep, deadOps = nil, rwDeadLockOps(st.rwDead, h.session)
		} else {
			grant = false
		}
	}
	mode := ""
	if grant {
		mode = h.rwMode()
	}
	// drop: a listing of this session K still has from an earlier hold
	// (a pooled session back on the key; its entry went with its release)
	// goes in this very check-and-set, before its new entry makes it look
	// like a holder. (Built on the derived holders, the body leaves it out
	// anyway; the drop says so.)
	body, err := rwBodyWith(st, h.session, mode, h.session, keep)
	if err != nil {
		return nil, err
	}
	ops := rwStateOps(st, body)
	casAt := 0
	if c := st.child(h.session); c != nil {
		if !rwContenderFlags(c.Flags) || (c.Session != "" && c.Session != h.session) {
			return nil, newError(ErrConflict, ReasonForeignFlags, "contender entry %q exists and is not this session's (flags %#x)", ck, c.Flags)
		}
		if c.Session == h.session {
			ops = append(ops, Op{Verb: OpUnlock, Key: ck, Flags: c.Flags, Session: h.session})
		}
	}
	entryAt := len(ops)
	ops = append(ops, Op{Verb: OpLock, Key: ck, Value: h.spec.Value, Flags: h.rwFlags(), Session: h.session})
	ops = append(ops, deadOps...)
	ops = append(ops, rwDeadOps(st, h.session)...)
	recAt := -1
	var next *record
	if grant {
		rec := h.record()
		next = rec.with(key, false)
		recAt = len(ops)
		ops = append(ops, rec.writeOps(next)...)
	} else if h.owned {
		// A waiter of a broker-owned session: its record goes with the
		// entry, naming the replica that owns the wait, as a lock
		// waiter's goes with its ticket (enqueue), so that the wait can
		// be resumed elsewhere in its place (resumeWait). No extra call:
		// it rides on the transaction that enters the contender.
		rec := h.record()
		next = rec.next()
		next.Waiting = key
		recAt = len(ops)
		ops = append(ops, rec.writeOps(next)...)
	}
	res, err := h.st.Txn(ctx, ops)
	if err != nil {
		h.unsure = h.unsure || (grant && ctx.Err() != nil)
		h.noteUnanswered(err, recAt)
		if te := asTxnError(err); te != nil {
			if te.Has(TxnSessionInvalid) {
				if h.owned {
					return nil, newError(ErrAborted, ReasonSessionLost, "the request's session %s was invalidated", h.session)
				}
				return nil, sessionError(ErrSessionNotFound, h.session)
			}
			if te.Has(TxnLockDelay) {
				return nil, errLockDelay
			}
			if recAt >= 0 && te.Failed(recAt) {
				if err := h.reloadRecord(ctx); err != nil {
					return nil, err
				}
			}
			return nil, errRace
		}
		return nil, err
	}
	k, e := res[casAt], res[entryAt]
	if k == nil || e == nil {
		return nil, fmt.Errorf("consul returned no entry for %q", key)
	}
	out := afterTxn(st, ops, res)
	if next != nil && !grant {
		next.index, next.live = recordWritten(ops, res, h.session), true
		h.setRecord(next)
	}
	if grant {
		next.index, next.live = k.ModifyIndex, true
		h.setRecord(next)
		h.b.hub.known.forget(key)
		h.mu.Lock()
		h.early = &Sequencer{Key: key, Session: h.session, LockIndex: e.LockIndex, Token: rwToken(k), Kind: KindRWLock, Read: h.spec.Mode == ModeRead}
		h.rwBase = out
		h.mu.Unlock()
	}
	return out, nil
}

// rwToken is the token of a grant that wrote K as k: K's ModifyIndex
// (its CreateIndex, never above an earlier grant's, in the rw-stale-token
// mutant).
func rwToken(k *Entry) uint64 {
	if mutantRWStaleToken {
		return k.CreateIndex
	}
	return k.ModifyIndex
}

// takeEarly returns (once) the grant enterRW made.
func (h *hold) takeEarly() *Sequencer {
	h.mu.Lock()
	defer h.mu.Unlock()
	seq := h.early
	h.early = nil
	return seq
}

// tryRW makes one attempt to grant the hold on st (which must show its
// contender entry), as trySemaphore does for a semaphore: the grant is a
// check-and-set of K with the session's record, in one transaction; its
// Raft index is the token.
func (h *hold) tryRW(ctx context.Context, st *State, fresh bool) (*Sequencer, error) {
	key := h.spec.Key
	if seq := h.takeEarly(); seq != nil {
		return seq, nil
	}
	if err := rwConflict(st); err != nil {
		return nil, err
	}
	me, ok := st.contenders[h.session]
	if !ok {
		return nil, errNoContender
	}
	if hd, ok := st.holder(h.session); ok {
		if !fresh {
			return nil, errRace
		}
		if hd.Read != (h.spec.Mode == ModeRead) {
			return nil, newError(ErrConflict, ReasonLimitConflict, "session %s holds %q in the other mode (read: %v); release it first", h.session, key, hd.Read).withState(st)
		}
		if err := h.ownGrant(ctx); err != nil {
			return nil, err
		}
		return &Sequencer{Key: key, Session: h.session, LockIndex: me.LockIndex, Token: h.currentToken(st, hd), Kind: KindRWLock, Read: hd.Read}, nil
	}
	if me.Flags != h.rwFlags() {
		return nil, newError(ErrConflict, ReasonLimitConflict, "session %s waits on %q in the other mode", h.session, key).withState(st)
	}
	if !rwGrantable(st, h.session, h.spec.Mode == ModeWrite, me) {
		return nil, nil
	}
	// Dead holders (rwDeadHolder) go with the grant, each entry deleted
	// under a lock of it: within its lock-delay Consul refuses the whole
	// grant (errLockDelay: the waiter waits it out). More than one
	// transaction takes are deleted first, without the grant.
	dead, keep := st.rwDead, []rwDeadHolder(nil)
	if len(dead) > rwDeadMax {
		dead, keep = dead[:rwDeadMax], dead[rwDeadMax:]
		return nil, h.rwDropDead(ctx, st, dead, keep)
	}
	body, err := rwBodyWith(st, h.session, h.rwMode(), "", keep)
	if err != nil {
		return nil, err
	}
	ops := []Op{{Verb: OpCheckSession, Key: me.Key, Session: h.session}}
	casAt := len(ops)
	ops = append(ops, rwStateOps(st, body)...)
	ops = append(ops, rwDeadLockOps(dead, h.session)...)
	ops = append(ops, rwDeadOps(st, h.session)...)
	rec := h.record()
	next := rec.with(key, false)
	recAt := len(ops)
	ops = append(ops, rec.writeOps(next)...)
	res, err := h.st.Txn(ctx, ops)
	if err != nil {
		h.unsure = h.unsure || ctx.Err() != nil
		return nil, h.txnFailure(ctx, err, recAt)
	}
	if res[casAt] == nil || res[0] == nil {
		return nil, fmt.Errorf("consul returned no entry for %q", key)
	}
	next.index, next.live = res[casAt].ModifyIndex, true
	h.setRecord(next)
	h.b.hub.known.forget(key)
	base := afterTxn(st, ops, res)
	h.sub.kw.noteRW(base)
	h.mu.Lock()
	h.rwBase = base
	h.mu.Unlock()
	// The entry's LockIndex as the transaction found it, as trySemaphore's.
	return &Sequencer{Key: key, Session: h.session, LockIndex: res[0].LockIndex, Token: rwToken(res[casAt]), Kind: KindRWLock, Read: h.spec.Mode == ModeRead}, nil
}

// rwDropDead deletes the entries of dead (dead holders of st) under
// their lock-delay, keeping keep listed, without a grant: errRace when it
// did (the waiter reads the key again), errLockDelay, or a final error.
func (h *hold) rwDropDead(ctx context.Context, st *State, dead, keep []rwDeadHolder) error {
	body, err := rwBodyWith(st, h.session, "", "", keep)
	if err != nil {
		return err
	}
	ops := rwStateOps(st, body)
	ops = append(ops, rwDeadLockOps(dead, h.session)...)
	res, err := h.st.Txn(ctx, ops)
	if err != nil {
		return h.txnFailure(ctx, err, -1)
	}
	h.sub.kw.noteRW(afterTxn(st, ops, res))
	return errRace
}

// rwTurn says whether an RW waiter may attempt on st (see turn).
func (h *hold) rwTurn(st *State) bool {
	h.mu.Lock()
	early := h.early != nil
	h.mu.Unlock()
	if early {
		return true
	}
	me, ok := st.contenders[h.session]
	if !ok {
		return true // the attempt tells (errNoContender)
	}
	return rwGrantable(st, h.session, me.Flags == RWWriteFlagValue, me)
}

// rwLoss says whether st shows the read-write hold seq lost.
func rwLoss(st *State, seq Sequencer) (lost bool, reason LostReason, detail string) {
	switch {
	case st.Kind == KindNone:
		return true, LostDeletedByOther, "the read-write lock's entries were deleted"
	case st.Kind != KindRWLock || st.rwErr != nil:
		return true, LostLimitConflict, "the key is no longer a read-write lock's"
	case st.lock == nil:
		return true, LostDeletedByOther, "the read-write lock's state key was deleted"
	}
	c, ok := st.contenders[seq.Session]
	if (!ok || c.LockIndex != seq.LockIndex) && st.rw != nil && st.rw.Holders[seq.Session] == "" {
		// Taken off the holders and its entry deleted, in one write: a
		// ForceRelease.
		return true, LostReleasedByOther, "this holder was removed from the read-write lock's holders"
	}
	if !ok || c.LockIndex != seq.LockIndex {
		return true, LostDeletedByOther, "the contender entry was deleted or released"
	}
	if _, ok := st.holder(seq.Session); !ok {
		return true, LostReleasedByOther, "this holder was removed from the read-write lock's holders"
	}
	return false, 0, ""
}

// rwLeaveOps removes session from the read-write lock in st: it deletes
// its contender entry (also an api.Semaphore-flagged one a refused
// semaphore request left), conditioned on that entry alone. It does not
// write K: a session K lists whose entry is gone holds nothing (deriveRW),
// and the next write of K (an arrival or a grant, both built on the
// derived holders) drops it. So a release never races the arrivals and
// grants that keep moving K on a busy key (with 16 readers cycling, a
// check-and-set of K failed 50 times in a row).
func rwLeaveOps(st *State, session string) ([]Op, bool, error) {
	var ops []Op
	_, held := st.holder(session)
	if st.rwDeadListed(session) {
		// Its session ended while it held: the entry stays, in its
		// lock-delay, until a grant deletes it (rwDeadHolder).
		return nil, false, nil
	}
	if c := st.child(session); c != nil && (rwContenderFlags(c.Flags) || c.Flags == SemaphoreFlagValue) && (c.Session == session || c.Session == "") {
		ops = append(ops, Op{Verb: OpDeleteCAS, Key: c.Key, Index: c.ModifyIndex})
	}
	if len(ops) > 0 {
		ops = append(ops, rwDeadOps(st, session)...)
	}
	return ops, held, nil
}

// rwForceOps end every hold of the read-write lock in st: K loses every
// holder (one check-and-set) and their contender entries are deleted. Dead
// holders stay listed, their entries in their lock-delay, as a lock's key
// stays in its lock-delay after a ForceRelease (rwDeadHolder).
func rwForceOps(st *State) ([]Op, error) {
	b := rwBody{Holders: map[string]string{}, Seq: st.nextSeq()}
	for _, d := range st.rwDead {
		b.Holders[d.Session] = d.Mode
	}
	body, err := encodeRWBody(b)
	if err != nil {
		return nil, err
	}
	if st.lock == nil {
		return nil, nil
	}
	ops := []Op{{Verb: OpCAS, Key: st.Key, Value: body, Flags: RWLockFlagValue, Index: st.lock.ModifyIndex}}
	for _, hd := range st.Holders {
		if c := st.child(hd.Session); c != nil {
			ops = append(ops, Op{Verb: OpDeleteCAS, Key: c.Key, Index: c.ModifyIndex})
		}
	}
	return ops, nil
}

// rwResumeConflict refuses a resume whose kind does not fit st: a
// read-write hold on another kind of key, a lock or semaphore on a
// read-write lock, or a read resumed as a write (and the reverse).
func rwResumeConflict(st *State, mode RWMode, seq Sequencer) error {
	switch {
	case mode == ModeNone && st.Kind == KindRWLock:
		return rwKindConflict(st, "a lock or semaphore")
	case mode == ModeNone:
		return nil
	case st.Kind == KindLock || st.Kind == KindSemaphore:
		return rwConflict(st)
	}
	if hd, ok := st.holder(seq.Session); ok && hd.Read != (mode == ModeRead) {
		return newError(ErrNotHolder, ReasonResumeRefused, "cannot resume: session %s holds %q as a %s, not a %s", seq.Session, st.Key, modeWord(hd.Read), modeWord(mode == ModeRead)).withState(st)
	}
	return nil
}

func modeWord(read bool) string {
	if read {
		return "reader"
	}
	return "writer"
}

// rwReads maps "key\x00session" to whether that session reads (true) or
// writes (false) the read-write lock at key, for the RW keys among sts.
func rwReads(st *State, out map[string]bool) {
	if st.Kind != KindRWLock {
		return
	}
	for sid, c := range st.contenders {
		out[st.Key+"\x00"+sid] = c.Flags == RWReadFlagValue
	}
}

// afterTxn is st as a committed transaction of ops (res, its answer)
// left it: entries written replaced, entries deleted gone.
func afterTxn(st *State, ops []Op, res []*Entry) *State {
	byKey := make(map[string]*Entry, len(st.entries)+len(ops))
	for _, e := range st.entries {
		byKey[e.Key] = e
	}
	index := st.Index
	for i, op := range ops {
		switch op.Verb {
		case OpDelete, OpDeleteCAS:
			delete(byKey, op.Key)
		case OpCAS, OpLock, OpUnlock, OpSet:
			if i < len(res) && res[i] != nil {
				e := *res[i]
				if e.Value == nil && op.Verb != OpUnlock {
					e.Value = op.Value // Consul answers a write without its value
				}
				byKey[op.Key] = &e
				index = max(index, e.ModifyIndex)
			}
		}
	}
	entries := make([]*Entry, 0, len(byKey))
	for _, e := range byKey {
		entries = append(entries, e)
	}
	return deriveState(st.Key, under(st.Key, entries), index)
}

// rwLeaveState is the state a read-write hold's release is built on: the
// state its grant left, when nothing newer is known (a check-and-set of K
// on it fails if anything changed, and the release reads the key then);
// a consistent read otherwise (a resumed hold).
func (h *hold) rwLeaveState(ctx context.Context) (*State, error) {
	h.mu.Lock()
	base := h.rwBase
	h.mu.Unlock()
	if base != nil {
		return base, nil
	}
	return h.b.readState(ctx, h.spec.Key)
}

// leaveOps is leaveOps for the hold. For a read-write lock whose st shows
// no other contender, K as st shows it is kept for noteRelease.
func (h *hold) leaveOps(st *State) ([]Op, bool, error) {
	ops, held, err := leaveOps(st, h.session)
	if !h.isRW() || err != nil {
		return ops, held, err
	}
	quiet := true
	for sid := range st.contenders {
		quiet = quiet && sid == h.session
	}
	var k *Entry
	// (Not beside a dead holder: K alone, as the next request here would
	// take it, would not show its entry, and that request would drop it.)
	if quiet && st.lock != nil && st.lock.Flags == RWLockFlagValue && len(ops) > 0 && len(st.rwDead) == 0 {
		k = st.lock
	}
	h.mu.Lock()
	h.rwQuietK = k
	h.mu.Unlock()
	return ops, held, nil
}

// noteRelease is Broker.noteRelease; for a read-write lock whose release
// was built on a state that showed no other contender, K as that state
// showed it is remembered (hub.known), so that the next request of this
// replica on the key is granted in one transaction even before a watch
// lists the key. It is a guess, as every known state is: every arrival
// writes K, so K still at that index when the next request's
// check-and-set runs means nobody arrived since that state showed nobody
// but the releaser (whose own listing in K, its entry gone, holds
// nothing: deriveRW). K moved meanwhile costs that request a failed
// check-and-set and a read, as having no guess does (it assumes the key
// absent); a newer listing of the shared watch wins over it (firstRW).
// (The release read K in its transaction to check it unchanged before:
// that read cost every release more than the guesses it saved.)
func (h *hold) noteRelease(ops []Op, res []*Entry) {
	h.b.noteRelease(ops, res)
	if !h.isRW() {
		return
	}
	key, ck := h.spec.Key, contenderKey(h.spec.Key, h.session)
	if h.sub != nil {
		h.sub.kw.rwReleased(h.session)
	}
	for _, op := range ops {
		if op.Verb == OpDeleteCAS && op.Key == ck {
			h.mu.Lock()
			k := h.rwQuietK
			h.mu.Unlock()
			if k != nil {
				h.b.hub.known.put(k)
			} else {
				h.b.hub.known.forget(key)
			}
			h.clearRWBase()
			return
		}
	}
	// (A finish after a Release writes only the record.)
}

func (h *hold) clearRWBase() {
	h.mu.Lock()
	h.rwBase, h.rwQuietK = nil, nil
	h.mu.Unlock()
}

// rwEnter waits for this replica's turn to enter a contender on kw's key
// (rwLeave ends it): the arrivals of one replica would only race each
// other's check-and-set of K.
func (kw *keyWatch) rwEnter(ctx context.Context) error {
	kw.mu.Lock()
	if kw.rwGate == nil {
		kw.rwGate = make(chan struct{}, 1)
	}
	gate := kw.rwGate
	kw.mu.Unlock()
	select {
	case gate <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (kw *keyWatch) rwLeave() {
	kw.mu.Lock()
	gate := kw.rwGate
	kw.mu.Unlock()
	<-gate
}

// noteRW remembers st, the state a write of K made here left, when it is
// the newest such.
func (kw *keyWatch) noteRW(st *State) {
	if st == nil || st.lock == nil {
		return
	}
	kw.mu.Lock()
	defer kw.mu.Unlock()
	if kw.rwLast == nil || st.lock.ModifyIndex > kw.rwLast.lock.ModifyIndex {
		kw.rwLast, kw.rwLastAt = st, time.Now()
	}
}

// rwLastFor bounds how long the state a write of K made here is trusted
// as a guess: a release elsewhere does not write K, so an older one may
// show holders long gone (a burst of arrivals is over well within it).
const rwLastFor = time.Second

// rwLastState is the state the newest write of K made here left (nil
// when none, or once it is known stale). Only a guess: every arrival
// built on it checks K.
func (kw *keyWatch) rwLastState() *State {
	kw.mu.Lock()
	defer kw.mu.Unlock()
	if kw.rwLast != nil && time.Since(kw.rwLastAt) > rwLastFor {
		kw.rwLast = nil
	}
	return kw.rwLast
}

// forgetRW forgets st if it is the remembered state (an attempt on it
// failed).
func (kw *keyWatch) forgetRW(st *State) {
	kw.mu.Lock()
	defer kw.mu.Unlock()
	if kw.rwLast == st {
		kw.rwLast = nil
	}
}

// rwReleased forgets the remembered state when it shows session's
// contender entry, which a release of this replica just deleted.
func (kw *keyWatch) rwReleased(session string) {
	kw.mu.Lock()
	defer kw.mu.Unlock()
	if kw.rwLast != nil && kw.rwLast.child(session) != nil {
		kw.rwLast = nil
	}
}
