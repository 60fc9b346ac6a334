package broker

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// rwListing builds a read-write lock's entries at key "k": holders (by
// session, "r" or "w") in K, and contenders with their mode and
// CreateIndex; a contender whose session is "" is dead.
type rwContender struct {
	sid, mode string
	ci        uint64
	dead      bool
}

func rwListing(t *testing.T, holders map[string]string, cs ...rwContender) *State {
	t.Helper()
	body, err := json.Marshal(rwBody{Holders: holders})
	require.NoError(t, err)
	entries := []*Entry{
		{Key: "k", Value: body, Flags: RWLockFlagValue, CreateIndex: 1, ModifyIndex: 100},
		{Key: "k/.lock", Flags: RWLockFlagValue, CreateIndex: 1, ModifyIndex: 1},
	}
	for _, c := range cs {
		flags := RWReadFlagValue
		if c.mode == "w" {
			flags = RWWriteFlagValue
		}
		sess := c.sid
		if c.dead {
			sess = ""
		}
		entries = append(entries, &Entry{Key: "k/" + c.sid, Flags: flags, Session: sess, CreateIndex: c.ci, ModifyIndex: c.ci, LockIndex: 1})
	}
	return deriveState("k", entries, 100)
}

func TestRWGrantRule(t *testing.T) {
	tests := []struct {
		name    string
		holders map[string]string
		cs      []rwContender
		who     string // the contender asking ("" : a newcomer)
		write   bool
		want    bool
	}{
		{name: "free key, reader", write: false, want: true},
		{name: "free key, writer", write: true, want: true},
		{name: "readers hold, reader joins", holders: map[string]string{"a": "r"}, cs: []rwContender{{"a", "r", 10, false}}, want: true},
		{name: "readers hold, writer waits", holders: map[string]string{"a": "r"}, cs: []rwContender{{"a", "r", 10, false}}, write: true, want: false},
		{name: "writer holds, reader waits", holders: map[string]string{"a": "w"}, cs: []rwContender{{"a", "w", 10, false}}, want: false},
		{name: "reader behind a waiting writer waits", holders: map[string]string{"a": "r"},
			cs: []rwContender{{"a", "r", 10, false}, {"w", "w", 11, false}}, want: false},
		{name: "readers at the head after the writer left, second one", holders: map[string]string{},
			cs: []rwContender{{"r1", "r", 11, false}, {"r2", "r", 12, false}}, who: "r2", want: true},
		{name: "writer behind waiting readers waits", cs: []rwContender{{"r1", "r", 11, false}}, who: "", write: true, want: false},
		{name: "a dead writer ahead is skipped", holders: map[string]string{"a": "r"},
			cs: []rwContender{{"a", "r", 10, false}, {"w", "w", 11, true}}, want: true},
		{name: "a dead holder does not hold", holders: map[string]string{"a": "w"},
			cs: []rwContender{{"a", "w", 10, true}}, write: true, want: true},
		{name: "writer at the head with nobody holding", holders: map[string]string{"gone": "r"},
			cs: []rwContender{{"w", "w", 11, false}, {"r", "r", 12, false}}, who: "w", write: true, want: true},
		{name: "reader behind that writer", cs: []rwContender{{"w", "w", 11, false}, {"r", "r", 12, false}}, who: "r", want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := rwListing(t, tt.holders, tt.cs...)
			require.Equal(t, KindRWLock, st.Kind)
			var me *Entry
			if tt.who != "" {
				me = st.contenders[tt.who]
				require.NotNil(t, me)
			}
			assert.Equal(t, tt.want, rwGrantable(st, tt.who, tt.write, me))
		})
	}
}

func TestRWDeriveAndConflicts(t *testing.T) {
	st := rwListing(t, map[string]string{"a": "r", "b": "r", "gone": "w"},
		rwContender{"a", "r", 10, false}, rwContender{"b", "r", 12, false}, rwContender{"c", "w", 13, false}, rwContender{"gone", "w", 9, true},
		rwContender{"dw", "r", 14, true})
	require.Equal(t, KindRWLock, st.Kind)
	require.Len(t, st.Holders, 2, "a dead holder is not a holder")
	assert.Equal(t, "a", st.Holders[0].Session)
	assert.True(t, st.Holders[0].Read && st.Holders[1].Read)
	assert.Equal(t, 1, st.Waiting)

	// Kind conflicts both ways.
	require.ErrorIs(t, lockConflict(st), ErrConflict)
	require.ErrorIs(t, semaphoreConflict(st, 3), ErrConflict)
	lock := deriveState("k", []*Entry{{Key: "k", Flags: LockFlagValue, Session: "s", ModifyIndex: 5}}, 5)
	sem := deriveState("k", []*Entry{{Key: "k/.lock", Flags: SemaphoreFlagValue, Value: []byte(`{"Limit":2,"Holders":{}}`), ModifyIndex: 5}}, 5)
	for _, other := range []*State{lock, sem} {
		err := rwConflict(other)
		r, _ := ReasonOf(err)
		assert.Equal(t, ReasonLimitConflict, r, "%v", err)
	}
	assert.Contains(t, rwConflict(lock).Error(), "kind LOCK")
	assert.Contains(t, rwConflict(sem).Error(), "kind SEMAPHORE")
	assert.Contains(t, lockConflict(st).Error(), "kind RWLOCK")

	// "gone" is a dead holder (K lists it, its session ended holding its
	// entry): its entry stays until a grant deletes it under its
	// lock-delay. "dw" is a dead waiter: nothing to protect.
	require.Len(t, st.rwDead, 1)
	assert.Equal(t, "gone", st.rwDead[0].Session)
	assert.Equal(t, "w", st.rwDead[0].Mode)

	// Leaving deletes the holder's entry (and the dead waiter's, not the
	// dead holder's), conditioned on that entry alone: it does not write
	// K, which arrivals and grants keep moving on a busy key.
	ops, held, err := rwLeaveOps(st, "a")
	require.NoError(t, err)
	assert.True(t, held)
	require.Len(t, ops, 2)
	assert.Equal(t, Op{Verb: OpDeleteCAS, Key: "k/a", Index: 10}, ops[0])
	assert.Equal(t, Op{Verb: OpDeleteCAS, Key: "k/dw", Index: 14}, ops[1])
	// The dead holder's own cleanup (its broker hears its session ended)
	// leaves its entry too.
	ops, _, err = rwLeaveOps(st, "gone")
	require.NoError(t, err)
	assert.Empty(t, ops)
	// Every write of K keeps it listed unless it deletes its entry with
	// a lock of it.
	b, err := rwBodyWith(st, "n", "", "", st.rwDead)
	require.NoError(t, err)
	var kept rwBody
	require.NoError(t, json.Unmarshal(b, &kept))
	assert.Equal(t, map[string]string{"a": "r", "b": "r", "gone": "w"}, kept.Holders)
	force, err := rwForceOps(st)
	require.NoError(t, err)
	var forced rwBody
	require.NoError(t, json.Unmarshal(force[0].Value, &forced))
	assert.Equal(t, map[string]string{"gone": "w"}, forced.Holders, "ForceRelease keeps the dead holder in its lock-delay")
	lockOps := rwDeadLockOps(st.rwDead, "me")
	assert.Equal(t, []Op{
		{Verb: OpCheckIndex, Key: "k/gone", Index: 9},
		{Verb: OpLock, Key: "k/gone", Flags: RWWriteFlagValue, Session: "me"},
		{Verb: OpDelete, Key: "k/gone"},
	}, lockOps)
	for _, op := range ops {
		assert.NotEqual(t, "k", op.Key)
	}

	// K still lists a, whose entry is gone: a holds nothing. When a (a
	// pooled session) comes back, its entry alone does not make it a
	// holder in the state its arrival is built on, and the arrival's
	// body drops its listing, with Seq one more than K's.
	left := rwListing(t, map[string]string{"a": "r", "b": "r"}, rwContender{"a", "r", 12, false}, rwContender{"b", "r", 11, false})
	left.rw.Seq = 7
	gone := afterTxn(left, []Op{{Verb: OpDeleteCAS, Key: "k/a"}}, []*Entry{nil})
	_, holds := gone.holder("a")
	assert.False(t, holds)
	assert.Equal(t, []string{"b"}, holderSessions(gone))
	b, err = rwBodyWith(gone, "a", "", "a", gone.rwDead)
	require.NoError(t, err)
	var next rwBody
	require.NoError(t, json.Unmarshal(b, &next))
	assert.Equal(t, map[string]string{"b": "r"}, next.Holders)
	back := rwListing(t, map[string]string{"a": "r", "b": "r"}, rwContender{"a", "r", 20, false}, rwContender{"b", "r", 11, false})
	assert.Len(t, back.Holders, 2, "a listing K kept is a holder again once the session has an entry: the arrival must drop it")
	assert.EqualValues(t, 8, left.nextSeq())

	// A malformed state is refused, not used.
	bad := deriveState("k", []*Entry{{Key: "k", Flags: RWLockFlagValue, Value: []byte("nope"), ModifyIndex: 3}}, 3)
	assert.ErrorIs(t, rwConflict(bad), ErrConflict)
	lost, _, _ := rwLoss(bad, Sequencer{Key: "k", Session: "a", Kind: KindRWLock})
	assert.True(t, lost)
}

func holderSessions(st *State) []string {
	var out []string
	for _, hd := range st.Holders {
		out = append(out, hd.Session)
	}
	return out
}
