package broker

import (
	"cmp"
	"context"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The shared queue of a lock key. Waiters of every replica queue in
// Consul, next to the key, so that the order in which they get it does
// not depend on which replica each one reached:
//
//   - a waiter's ticket is K/.queue/<session>, acquired with its session
//     (so Consul clears it when the session ends: a dead ticket) and
//     flagged QueueFlagValue; its CreateIndex, a Raft index, is its place
//     in the queue. A request that waits again with the same session (a
//     wait moved to another replica, a client-owned session asking
//     again) finds its ticket where it was.
//   - the guard K/.queue exists while any ticket may be live. Every
//     ticket's creation writes it (check-and-set, its value the index it
//     replaces, so that every write moves its index), and a grant that finds
//     no live ticket but its own deletes it (check-and-set), so a
//     newcomer's grant, which checks that the guard does not exist,
//     fails while a ticket is live: a newcomer never takes a free key
//     ahead of queued waiters. An uncontended grant pays one check op.
//   - only the head may take a free key: the oldest live ticket. Tickets
//     ahead of a waiter only ever leave (a newer ticket has a higher
//     CreateIndex), so a waiter that once saw itself at the head stays
//     there, however stale its view.
//   - a ticket whose waiter is gone with its session still alive (its
//     replica was killed along with the client) is skipped once the key
//     has stood free for queueGrace with nobody taking it and with no
//     ticket ahead touched meanwhile. A waiter that waits for something
//     else while the key is free (a multi-key waiter, one of whose other
//     keys is held) touches its ticket every queueTouch to show it is
//     alive (multiHold.touch): a check-and-set that rewrites its value,
//     so that its ModifyIndex moves (its CreateIndex, its place, stays).
//
// Consul's own clients take no ticket; see handoffChain for how they get
// their turn.

// QueueFlagValue marks the shared queue's entries (the guard and the
// tickets): "lbqueue" in ASCII, after Consul's own flag values.
const QueueFlagValue uint64 = 0x006c627175657565

const queueSuffix = "/.queue"

// queueGrace is how long a key may stand free with a live ticket ahead of
// a waiter before the waiter takes it anyway: the head's replica takes a
// free key within milliseconds, so a head silent that long is gone.
var queueGrace = time.Second

// queueTouch is how often a waiter that waits on a free key touches its
// ticket (see above): half the grace, so that a waiter behind it sees a
// touch within every grace with time to spare for the watch's delay.
func queueTouch() time.Duration { return queueGrace / 2 }

// ticketValue is the value of a ticket written by replica: its id, and
// after a touch the ModifyIndex the touch replaced (Consul skips a write
// that changes nothing, and its ModifyIndex would not move).
func ticketValue(replica string, replaced uint64) []byte {
	if replaced == 0 {
		return []byte(replica)
	}
	return strconv.AppendUint([]byte(replica+"\n"), replaced, 10)
}

// ticketReplica is the replica named by a ticket's value (ticketValue).
func ticketReplica(value []byte) string {
	r, _, _ := strings.Cut(string(value), "\n")
	return r
}

// touchMark is the newest ModifyIndex among the tickets of ahead that st
// lists: it grows when one of them is touched (a waiter behind then
// restarts its grace, see waiter.turn), never when one leaves.
func touchMark(st *State, ahead []*Entry) uint64 {
	var n uint64
	for _, t := range ahead {
		if e := st.entry(t.Key); e != nil && e.CreateIndex == t.CreateIndex {
			n = max(n, e.ModifyIndex)
		}
	}
	return n
}

// ticketKey is the key of session's ticket in key's queue.
func ticketKey(key, session string) string { return key + queueSuffix + "/" + session }

// deriveQueue fills the state's queue from its listing.
// It runs on every listing of a lock key (and on every hand-off), so it
// builds no key names: an entry is matched by its suffix after the key.
func (st *State) deriveQueue() {
	for _, e := range st.entries {
		if e.Flags != QueueFlagValue {
			continue
		}
		switch rest, ok := strings.CutPrefix(e.Key, st.Key); {
		case !ok:
		case rest == queueSuffix:
			st.guard = e
		case strings.HasPrefix(rest, queueSuffix+"/") && !strings.Contains(rest[len(queueSuffix)+1:], "/"):
			st.tickets = append(st.tickets, e)
		}
	}
	slices.SortFunc(st.tickets, func(a, b *Entry) int { return cmp.Compare(a.CreateIndex, b.CreateIndex) })
	for _, t := range st.tickets {
		if ticketLive(st.Key, t) {
			st.Waiting++
		}
	}
}

// queueState is the part of key's state that its shared queue decides
// on (guard, tickets, Waiting, Index), from a listing of key: what
// claimNext needs on every hand-off, under the key's lock, without the
// holders, children and contenders that deriveState adds.
func queueState(key string, entries []*Entry, index uint64) *State {
	st := &State{Key: key, Kind: KindNone, Index: index, entries: entries}
	st.deriveQueue()
	return st
}

// ticketLive says whether t is held by the session it is named after
// (its key is ticketKey(key, t.Session), compared without building it).
func ticketLive(key string, t *Entry) bool {
	rest, ok := strings.CutPrefix(t.Key, key)
	if !ok || t.Session == "" {
		return false
	}
	rest, ok = strings.CutPrefix(rest, queueSuffix+"/")
	return ok && rest == t.Session
}

// othersQueued reports whether st shows a live ticket other than session's.
func (st *State) othersQueued(session string) bool {
	for _, t := range st.tickets {
		if t.Session != session && ticketLive(st.Key, t) {
			return true
		}
	}
	return false
}

// queueGrantOps are the ops a grant of key to session carries for the
// queue, as st shows it: for a newcomer (no ticket), that no guard exists,
// or the removal of a guard left with no live ticket; for a ticket holder,
// the removal of its ticket, and of the guard when no other ticket is
// live. Dead tickets go too (a few at a time).
func queueGrantOps(st *State, session string, ticketed bool) []Op {
	var ops []Op
	if ticketed {
		ops = append(ops, Op{Verb: OpDelete, Key: ticketKey(st.Key, session)})
	}
	switch {
	case st.guard == nil && !ticketed:
		ops = append(ops, Op{Verb: OpCheckNotExists, Key: st.Key + queueSuffix})
	case st.guard != nil && !st.othersQueued(session):
		ops = append(ops, Op{Verb: OpDeleteCAS, Key: st.guard.Key, Index: st.guard.ModifyIndex})
	}
	return append(ops, deadTicketOps(st, session)...)
}

// handOffQueueOps are the queue ops of a direct hand-off to session,
// whose ticket was made at ticket: the removal of its ticket, and of the
// guard when st (the releaser's listing, nil when it has none) shows no
// other live ticket and is no older than that ticket. A ticket newer than
// st moves the guard and fails the hand-off (the release then goes as
// usual); with an older listing the guard stays, and the next grant that
// finds no live ticket removes it.
func handOffQueueOps(key string, st *State, session string, ticket uint64) []Op {
	ops := []Op{{Verb: OpDelete, Key: ticketKey(key, session)}}
	if st != nil && !st.partial && st.guard != nil && st.Index >= ticket && !st.othersQueued(session) {
		ops = append(ops, Op{Verb: OpDeleteCAS, Key: st.guard.Key, Index: st.guard.ModifyIndex})
	}
	return ops
}

// deadTicketOps delete tickets whose session ended, except session's own
// (every dead ticket when session is "", for tidyQueue: a dead ticket has
// no session, so comparing it with "" would spare them all).
func deadTicketOps(st *State, session string) []Op {
	var ops []Op
	for _, t := range st.tickets {
		if len(ops) == maxDeadCleanup {
			break
		}
		if (session == "" || t.Session != session) && !ticketLive(st.Key, t) {
			ops = append(ops, Op{Verb: OpDeleteCAS, Key: t.Key, Index: t.ModifyIndex})
		}
	}
	return ops
}

// enqueue takes the hold's ticket in its key's queue (or finds the one
// its session has): one transaction that acquires the ticket with the
// session and writes the guard by check-and-set. It returns errRace when
// the guard moved under it.
func (h *hold) enqueue(ctx context.Context, st *State) error {
	key := h.spec.Key
	tk := ticketKey(key, h.session)
	var ops []Op
	if t := st.entry(tk); t != nil {
		if t.Flags != QueueFlagValue {
			return newError(ErrConflict, ReasonForeignFlags, "key %q holds flags %#x, not a queue ticket's (%#x)", tk, t.Flags, QueueFlagValue).withState(st)
		}
		ops = append(ops, Op{Verb: OpCheckIndex, Key: tk, Index: t.ModifyIndex})
	} else {
		ops = append(ops, Op{Verb: OpCheckNotExists, Key: tk})
	}
	// The guard's value is the index it replaces: Consul skips a write that
	// changes nothing (its ModifyIndex would stay, and prove nothing).
	guard := Op{Verb: OpCAS, Key: key + queueSuffix, Flags: QueueFlagValue, Value: []byte("0")}
	if st.guard != nil {
		guard.Index = st.guard.ModifyIndex
		guard.Value = strconv.AppendUint(nil, st.guard.ModifyIndex, 10)
	} else if e := st.child(strings.TrimPrefix(queueSuffix, "/")); e != nil {
		return newError(ErrConflict, ReasonForeignFlags, "key %q holds flags %#x, not a queue guard's (%#x)", e.Key, e.Flags, QueueFlagValue).withState(st)
	}
	ticketAt := len(ops)
	ops = append(ops,
		Op{Verb: OpLock, Key: tk, Value: []byte(h.b.id), Flags: QueueFlagValue, Session: h.session},
		guard)
	// A broker-owned session's record goes with it, naming the replica
	// that owns the wait and the tenant: what a resumed wait is checked
	// and fenced by (resumeWait).
	recAt := -1
	var next *record
	if h.owned {
		recAt = len(ops)
		rec := h.record()
		next = rec.next()
		next.Waiting = key
		ops = append(ops, rec.writeOps(next)...)
	}
	h.ticketTried, h.enqueued = true, true
	res, err := h.st.Txn(ctx, ops)
	if err != nil {
		h.noteUnanswered(err, recAt)
		return h.txnFailure(ctx, err, recAt)
	}
	if next != nil {
		next.index, next.live = recordWritten(ops, res, h.session), true
		h.setRecord(next)
	}
	// The guard's check-and-set proves that no ticket was made since st:
	// the tickets ahead of this one are among st's, and only ever leave.
	t := res[ticketAt]
	var ahead []*Entry
	for _, o := range st.tickets {
		if o.CreateIndex < t.CreateIndex && o.Session != h.session && ticketLive(key, o) {
			ahead = append(ahead, o)
		}
	}
	h.setTicket(t, ahead)
	return nil
}

// leaveQueue deletes the hold's ticket when it gives up waiting (a
// broker-owned session's too: its session may be kept, for a wait that
// moves, or pooled); the queue is tidied when the hold ends (tidyAfter).
// It reports whether the ticket is gone.
func (h *hold) leaveQueue() bool {
	if !h.ticketTried {
		return true
	}
	if h.movable && h.owned {
		return true // the wait may go on elsewhere, in its place (movedAway)
	}
	ctx, cancel := cleanupContext()
	defer cancel()
	ops := []Op{{Verb: OpDelete, Key: ticketKey(h.spec.Key, h.session)}}
	if rec := h.record(); h.owned && rec.index != 0 {
		// Conditioned on the session's record: a wait whose client moved
		// it elsewhere before this replica heard the client leave (the
		// replica was stopped) keeps its ticket there.
		ops = append([]Op{rec.guard()}, ops...)
	}
	_, err := h.st.Txn(ctx, ops)
	switch {
	case err == nil:
		h.setTicket(nil, nil)
		return true
	case asTxnError(err) != nil:
		return true // the record moved: the wait is not this replica's (abandon checks)
	}
	return false
}

// setTicket records the hold's ticket and the tickets ahead of it (nil:
// it has none any more), where a releaser of this replica can see them
// (claimNext). A ticket that leaves leaves every local waiter's ahead.
func (h *hold) setTicket(t *Entry, ahead []*Entry) {
	old := h.ticket
	h.ticket = t
	var idx uint64
	if t != nil {
		idx = t.CreateIndex
	} else {
		h.ticketTried = false
	}
	kw := h.sub.kw
	kw.mu.Lock()
	defer kw.mu.Unlock()
	h.sub.ticket, h.sub.ahead = idx, ahead
	if t == nil && old != nil {
		for o := range kw.subs {
			o.ahead = slices.DeleteFunc(o.ahead, func(e *Entry) bool { return e.Key == old.Key && e.CreateIndex == old.CreateIndex })
		}
	}
}

// pruneAhead drops from the subscriber's tickets ahead those st shows
// gone or dead (st is trusted only for tickets no newer than itself), and
// returns how many are left. kw.mu is held.
func (s *sub) pruneAhead(st *State) int {
	if st != nil && !st.partial {
		s.ahead = slices.DeleteFunc(s.ahead, func(t *Entry) bool {
			if st.Index < t.CreateIndex {
				return false
			}
			e := st.entry(t.Key)
			return e == nil || e.CreateIndex != t.CreateIndex || !ticketLive(st.Key, e)
		})
	}
	return len(s.ahead)
}

// aheadOf is how many live tickets are ahead of the hold's in its key's
// queue, as far as st and this replica know.
func (h *hold) aheadOf(st *State) int {
	kw := h.sub.kw
	kw.mu.Lock()
	defer kw.mu.Unlock()
	return h.sub.pruneAhead(st)
}

// aheadTouched is touchMark of the tickets ahead of the hold's in st.
func (h *hold) aheadTouched(st *State) uint64 {
	kw := h.sub.kw
	kw.mu.Lock()
	defer kw.mu.Unlock()
	return touchMark(st, h.sub.ahead)
}

// position is the hold's place in its key's shared queue (1: next), or 0
// without a ticket.
func (h *hold) position(st *State) int {
	if h.ticket == nil {
		return 0
	}
	return h.aheadOf(st) + 1
}

// resumingWait says whether the request resumes a wait (a sequencer with
// no token: the session's place in the key's queue) rather than a hold.
func (h *hold) resumingWait() bool {
	return h.spec.Resume != nil && h.spec.Resume.Token == 0
}

// resumeWait re-attaches a wait made on another replica (its replica
// died, drained or was cut off, and the client moved): it checks with
// consistent reads that the session is broker-owned, the tenant's, and
// still has its place in the key's queue (a live ticket, or a semaphore's
// live contender entry), then moves the record's owner to this replica by
// check-and-set, in one transaction with a check that the place did not
// move. The old replica's grants are conditioned on the record, so from
// then on only this replica can grant the session the key. The wait then
// goes on from that place.
func (h *hold) resumeWait(ctx context.Context) error {
	for range 5 {
		st, rec, err := h.readResumable(ctx)
		if err != nil {
			return err
		}
		place, _ := h.waitPlace(st, rec)
		if moved, err := h.takeOwner(ctx, rec, place); err != nil {
			return err
		} else if moved {
			continue // something moved: check again
		}
		h.resumedWait = true
		return nil
	}
	return newError(ErrUnavailable, ReasonConsulUnavailable, "key %q kept changing while resuming the wait; retry", h.spec.Key)
}

// waitPlace is the entry that holds the wait's place in st (its ticket, or
// a semaphore's or read-write lock's contender entry, in the request's
// mode), or why the wait cannot be resumed: the
// session has no live broker record, is client-owned, asks for the key as
// another kind, or has no place any more.
func (h *hold) waitPlace(st *State, rec *record) (*Entry, error) {
	seq := *h.spec.Resume
	if rec.index == 0 || !rec.live || rec.Owner == "" {
		return nil, newError(ErrNotHolder, ReasonResumeRefused, "cannot resume the wait: session %s has no live broker record (it ended, or it is client-owned)", seq.Session).withState(st)
	}
	if len(rec.Keys) > 1 {
		return nil, newError(ErrNotHolder, ReasonResumeRefused, "cannot resume the wait: session %s waits for the multi-key lock %q; resume it with every key (key and keys)", seq.Session, rec.Keys).withState(st)
	}
	if err := h.conflict(st); err != nil {
		return nil, err
	}
	place := st.entry(ticketKey(seq.Key, seq.Session))
	if h.sem {
		place = st.contenders[seq.Session]
	}
	if place == nil || place.Session != seq.Session {
		return nil, newError(ErrNotHolder, ReasonResumeRefused, "cannot resume the wait: session %s has no place in the queue of %q", seq.Session, seq.Key).withState(st)
	}
	if h.isRW() && place.Flags != h.rwFlags() {
		// A read-write lock's contender entry says in which mode it waits
		// (or holds): a reader's wait is not resumed as a writer's.
		return nil, newError(ErrNotHolder, ReasonResumeRefused, "cannot resume the wait: session %s waits on %q as a %s, not a %s", seq.Session, seq.Key, modeWord(place.Flags == RWReadFlagValue), modeWord(h.spec.Mode == ModeRead)).withState(st)
	}
	return place, nil
}

// tidyAfter tidies the key's queue in the background when the hold ends
// (close) and is the last of this replica's lock holds of the key, if
// one of them used the queue (lastOut): what the waiters leave behind
// goes, whatever this replica's view of the key shows (a view that lags,
// as a waiter's next behind a local holder does, may show tickets long
// gone, or miss a guard that a hand-off on a stale listing left). The
// tidy's consistent read comes after the hold's own ticket is gone (its
// grant, a hand-off or leaveQueue deleted it, or its session ended), so
// of the replicas whose last holds end at once, the one that reads last
// sees every other's ticket gone. An uncontended key, whose holds never
// queue and whose view shows no queue, costs nothing.
func (h *hold) tidyAfter() {
	if h.sem || h.sub == nil || !h.sub.lastOut(h.usedQueue()) {
		return
	}
	b, store, key := h.b, h.st, h.spec.Key
	b.holds.Add(1)
	go func() {
		defer b.holds.Done()
		b.tidyQueue(store, key)
	}()
}

// usedQueue says whether the hold used its key's shared queue: it tried
// to take a ticket (or resumed a wait with one), or its release handed
// the key over.
func (h *hold) usedQueue() bool {
	return h.enqueued || h.ticketTried || h.resumedWait || h.handedOff.Load()
}

// lastOut counts the subscriber's hold out of the key's lock holds on
// this replica (once; mine: it used the key's queue) and reports whether
// it should tidy the queue: no other lock hold of this replica is left on
// the key, and one of them used the queue, or the key's view shows what
// only a tidy removes (a guard with no live ticket, a dead ticket). A
// hold that leaves while others stay leaves the tidy to the last one.
func (s *sub) lastOut(mine bool) bool {
	kw := s.kw
	kw.mu.Lock()
	defer kw.mu.Unlock()
	if s.out {
		return false
	}
	s.out = true
	kw.queued = kw.queued || mine
	for o := range kw.subs {
		if o != s && o.queuer && !o.out {
			return false
		}
	}
	if !kw.queued && !(kw.ready && !kw.own && untidy(queueState(kw.key, kw.entries, kw.index))) {
		return false
	}
	kw.queued = false
	return true
}

// untidy says whether st shows what a tidy removes: a dead ticket, or a
// guard with no live ticket.
func untidy(st *State) bool {
	if st.guard != nil && st.Waiting == 0 {
		return true
	}
	return len(st.tickets) > st.Waiting
}

// tidyQueue removes what key's shared queue left behind: dead tickets,
// and the guard once no ticket is live. One consistent read, then
// check-and-set deletes (a ticket taken meanwhile moves the guard and
// fails them). Best effort, bounded: a read or write that fails (Consul
// away, a leader election) is tried again after 50, 100 ... 800 ms, and
// every attempt within cleanupContext.
func (b *Broker) tidyQueue(store Store, key string) {
	ctx, cancel := cleanupContext()
	defer cancel()
	for attempt := range tidyAttempts {
		if attempt > 0 && !sleep(ctx, tidyBackoff<<(attempt-1)) {
			return
		}
		st, err := b.readState(ctx, key)
		if err != nil {
			continue
		}
		ops := deadTicketOps(st, "")
		more := len(ops) == maxDeadCleanup
		if st.guard != nil && st.Waiting == 0 {
			ops = append(ops, Op{Verb: OpDeleteCAS, Key: st.guard.Key, Index: st.guard.ModifyIndex})
		}
		if len(ops) == 0 {
			return
		}
		if _, err := store.Txn(ctx, ops); err == nil && !more {
			return
		}
	}
}

// tidyAttempts and tidyBackoff bound tidyQueue's reads (see there).
const (
	tidyAttempts = 5
	tidyBackoff  = 50 * time.Millisecond
)
