package broker

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
)

// Kind is what a key is in Consul.
type Kind int

// The kinds of key.
const (
	KindNone Kind = iota + 1
	KindLock
	KindSemaphore
	KindForeign
	// KindRWLock: a read-write lock (docs/consul-layout.md).
	KindRWLock
)

// Holder is one current holder of a key.
type Holder struct {
	Session     string
	SessionName string
	Value       []byte
	Token       uint64
	LockIndex   uint64
	CreateIndex uint64 // of the lock key or contender entry
	// Read: a read-write lock's reader (false: its writer).
	Read bool
}

// State is a key's kind and holders at one Consul index.
type State struct {
	Key     string
	Kind    Kind
	Limit   uint32
	Holders []Holder
	Index   uint64
	// Waiting is how many broker waiters the key's shared queue holds: the
	// live tickets of a lock (ticket.go), the live contenders of a
	// semaphore that hold no slot.
	Waiting int

	// guard and tickets are the lock's shared queue (ticket.go), tickets
	// oldest first.
	guard   *Entry
	tickets []*Entry
	// partial: the state was made from this replica's own write alone (see
	// known.go), not from a listing: it tells nothing of the queue.
	partial bool

	// lock is the lock entry (KindLock, KindForeign).
	lock *Entry
	// semLock is the semaphore's `.lock` entry and sem its decoded body.
	semLock *Entry
	sem     *semBody
	// semErr says why a `.lock` body could not be used.
	semErr error
	// rw is a read-write lock's decoded state and rwErr why it could not
	// be used (rwlock.go).
	rw    *rwBody
	rwErr error
	// rwDead are a read-write lock's dead holders: sessions K lists whose
	// entry their session's end left released (rwlock.go), oldest first.
	rwDead []rwDeadHolder
	// contenders are the live semaphore contender entries, by session;
	// children every direct child entry, by name.
	contenders map[string]*Entry
	children   map[string]*Entry
	entries    []*Entry
}

// entry returns the entry at key in the state's listing, or nil.
func (st *State) entry(key string) *Entry {
	e, _ := findEntry(st.entries, key)
	return e
}

// newest is the highest ModifyIndex of the state's entries (0 when there
// are none): every grant of the key so far has a token at most this.
func (st *State) newest() uint64 {
	var n uint64
	for _, e := range st.entries {
		n = max(n, e.ModifyIndex)
	}
	return n
}

// child returns the direct child entry <key>/<name>, or nil.
func (st *State) child(name string) *Entry { return st.children[name] }

// semBody is the JSON of a semaphore's `.lock` key, as api.Semaphore
// writes it.
type semBody struct {
	Limit   int             `json:"Limit"`
	Holders map[string]bool `json:"Holders"`
}

const semLockSuffix = "/.lock"

// deriveState builds the state of key from the entries of a listing of
// prefix key (entries outside key and key/ are ignored).
func deriveState(key string, entries []*Entry, index uint64) *State {
	st := &State{Key: key, Kind: KindNone, Index: index, entries: entries}
	children := make(map[string]*Entry)
	st.children = children
	for _, e := range entries {
		switch {
		case e.Key == key:
			st.lock = e
		case e.Key == key+semLockSuffix:
			st.semLock = e
		case strings.HasPrefix(e.Key, key+"/") && !strings.Contains(e.Key[len(key)+1:], "/"):
			children[e.Key[len(key)+1:]] = e
		}
	}
	// Live semaphore contenders: entries <key>/<session> held by that
	// session (present before the first holder creates `.lock`).
	st.contenders = make(map[string]*Entry)
	for name, e := range children {
		if e.Flags == SemaphoreFlagValue && e.Session == name {
			st.contenders[name] = e
		}
	}
	if st.isRWState() {
		st.deriveRW()
		return st
	}
	if st.semLock != nil && st.semLock.Flags == SemaphoreFlagValue {
		st.deriveSemaphore()
		return st
	}
	st.deriveQueue()
	if st.lock != nil {
		if st.lock.Flags != LockFlagValue {
			st.Kind = KindForeign
			return st
		}
		st.Kind = KindLock
		st.Limit = 1
		if st.lock.Session != "" {
			st.Holders = []Holder{{
				Session:     st.lock.Session,
				Value:       st.lock.Value,
				LockIndex:   st.lock.LockIndex,
				CreateIndex: st.lock.CreateIndex,
				Token:       st.lock.ModifyIndex,
			}}
		}
	}
	return st
}

// deriveSemaphore fills a semaphore's limit and holders from its `.lock`
// body: the sessions it lists that still hold their contender entry.
func (st *State) deriveSemaphore() {
	st.Kind = KindSemaphore
	var body semBody
	if err := json.Unmarshal(st.semLock.Value, &body); err != nil {
		st.semErr = fmt.Errorf("%w: semaphore %q has a malformed .lock body: %v", ErrConflict, st.Key, err)
		return
	}
	if body.Limit <= 0 || body.Limit > maxLimit {
		st.semErr = fmt.Errorf("%w: semaphore %q has a bad stored limit %d", ErrConflict, st.Key, body.Limit)
		return
	}
	if body.Holders == nil {
		body.Holders = map[string]bool{} // api.Semaphore writes into it
	}
	st.sem = &body
	st.Limit = uint32(body.Limit)
	for sid := range body.Holders {
		if c, ok := st.contenders[sid]; ok {
			st.Holders = append(st.Holders, Holder{Session: sid, Value: c.Value, LockIndex: c.LockIndex, CreateIndex: c.CreateIndex})
		}
	}
	sort.Slice(st.Holders, func(i, j int) bool { return st.Holders[i].CreateIndex < st.Holders[j].CreateIndex })
	st.Waiting = len(st.contenders) - len(st.Holders)
}

// holderOrSelf is holder, except that a nil state (not read) counts as
// held by session with lockIndex.
func (st *State) holderOrSelf(session string, lockIndex uint64) (Holder, bool) {
	if st == nil {
		return Holder{Session: session, LockIndex: lockIndex}, true
	}
	return st.holder(session)
}

// holds reports whether session is among the holders.
func (st *State) holder(session string) (Holder, bool) {
	for _, h := range st.Holders {
		if h.Session == session {
			return h, true
		}
	}
	return Holder{}, false
}

// sameHolders reports whether two states show the same kind, limit and
// holders (values included).
func sameHolders(a, b *State) bool {
	if a == nil || b == nil {
		return a == b
	}
	if a.Kind != b.Kind || a.Limit != b.Limit || len(a.Holders) != len(b.Holders) {
		return false
	}
	for i := range a.Holders {
		x, y := a.Holders[i], b.Holders[i]
		if x.Session != y.Session || x.LockIndex != y.LockIndex || x.Token != y.Token || string(x.Value) != string(y.Value) {
			return false
		}
	}
	return true
}

// subStates splits a listing under prefix into the state of every lock
// key and semaphore prefix it contains (prefix itself included).
func subStates(prefix string, entries []*Entry, index uint64) map[string]*State {
	keys := make(map[string]bool)
	for _, e := range entries {
		if e.Key != prefix && !strings.HasPrefix(e.Key, prefix+"/") {
			continue
		}
		switch {
		case e.Flags == LockFlagValue, e.Flags == RWLockFlagValue && !strings.HasSuffix(e.Key, semLockSuffix):
			keys[e.Key] = true
		case e.Flags == SemaphoreFlagValue && strings.HasSuffix(e.Key, semLockSuffix):
			keys[strings.TrimSuffix(e.Key, semLockSuffix)] = true
		}
	}
	out := make(map[string]*State, len(keys))
	for k := range keys {
		out[k] = deriveState(k, entries, index)
	}
	return out
}
