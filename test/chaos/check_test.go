package chaos

import (
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// s is a shorthand for a run-clock offset in seconds.
func s(sec float64) time.Duration { return time.Duration(sec * float64(time.Second)) }

// lockHold is a hold of key "k" (a lock) by client c with token tok,
// believed from a to b.
func lockHold(id, c int, tok uint64, a, b float64, reason string) Hold {
	return Hold{ID: id, Client: c, Kind: KindLib, Key: "k", Limit: 1, Token: tok, Session: "s" + string(rune('a'+c)),
		Call: s(a) - s(0.01), Acquired: s(a), End: s(b), Reason: reason, Deadline: s(b) + s(1)}
}

func TestCheckFencing(t *testing.T) {
	tests := []struct {
		name   string
		writes []Write
		ok     bool
	}{
		{"increasing tokens", []Write{
			{Key: "k", Token: 10, Accepted: true, Seq: 1},
			{Key: "k", Token: 10, Accepted: true, Seq: 2},
			{Key: "k", Token: 20, Accepted: true, Seq: 3},
			{Key: "k", Token: 10, Accepted: false, Seq: 4, Stale: true},
		}, true},
		{"other keys are independent", []Write{
			{Key: "a", Token: 20, Accepted: true, Seq: 1},
			{Key: "b", Token: 10, Accepted: true, Seq: 2},
		}, true},
		{"stale token accepted (paused client, no fencing)", []Write{
			{Key: "k", Token: 10, Accepted: true, Seq: 1},
			{Key: "k", Token: 20, Accepted: true, Seq: 2},
			{Key: "k", Token: 10, Accepted: true, Seq: 3, Stale: true},
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := CheckFencing(&Snapshot{Writes: tt.writes})
			assert.Equal(t, tt.ok, r.OK, "%+v", r)
			if !tt.ok {
				require.NotEmpty(t, r.Violations)
				assert.Len(t, r.Violations[0].Excerpt, 2)
			}
		})
	}
}

func TestCheckOverlap(t *testing.T) {
	tests := []struct {
		name    string
		holds   []Hold
		freezes []Freeze
		limits  map[string]int
		ok      bool
	}{
		{"one after another", []Hold{
			lockHold(1, 1, 10, 1, 2, EndReleased),
			lockHold(2, 2, 20, 2, 3, EndReleased), // touching ends do not overlap
			lockHold(3, 1, 30, 3.5, 4, EndReleased),
		}, nil, nil, true},
		{"two believers at once", []Hold{
			lockHold(1, 1, 10, 1, 3, "lost:LOCAL_DEADLINE"),
			lockHold(2, 2, 20, 2, 4, EndReleased),
		}, nil, nil, false},
		{"a paused client is excluded", []Hold{
			{ID: 1, Client: 1, Key: "k", Token: 10, Acquired: s(1), End: s(30), Paused: true},
			lockHold(2, 2, 20, 2, 4, EndReleased),
		}, nil, nil, true},
		{"a client frozen during its hold is excluded", []Hold{
			lockHold(1, 1, 10, 1, 30, "lost:LOCAL_DEADLINE"),
			lockHold(2, 2, 20, 2, 4, EndReleased),
		}, []Freeze{{Client: 1, Start: s(1.5), End: s(25)}}, nil, true},
		{"taken by an operator while cut off from every broker: believed past the destroy", []Hold{
			lockHold(1, 1, 10, 1, 6, EndReleased),
			lockHold(2, 2, 21, 4.5, 7, EndReleased),
		}, nil, nil, true},
		{"taken by an operator while cut off from another broker only", []Hold{
			lockHold(1, 1, 10, 1, 6, EndReleased),
			lockHold(2, 2, 31, 4.5, 7, EndReleased),
		}, nil, nil, false},
		{"taken by an operator while its broker was cut off from Consul: believed past the destroy", []Hold{
			lockHold(1, 1, 10, 1, 6, EndReleased),
			lockHold(2, 2, 51, 4.5, 7, EndReleased),
		}, nil, nil, true},
		{"taken by an operator while its broker was paused: believed past the destroy", []Hold{
			lockHold(1, 1, 10, 1, 6, EndReleased),
			lockHold(2, 2, 71, 4.5, 7, EndReleased),
		}, nil, nil, true},
		{"taken by an operator while another broker was cut off from Consul", []Hold{
			lockHold(1, 1, 10, 1, 6, EndReleased),
			lockHold(2, 2, 61, 4.5, 7, EndReleased),
		}, nil, nil, false},
		{"cut off and taken by an operator, but overlapped before the destroy", []Hold{
			lockHold(1, 1, 10, 1, 6, EndReleased),
			lockHold(2, 2, 41, 2, 2.2, EndReleased),
		}, nil, nil, false},
		{"semaphore within its limit", []Hold{
			{ID: 1, Client: 1, Key: "sem", Acquired: s(1), End: s(5)},
			{ID: 2, Client: 2, Key: "sem", Acquired: s(1), End: s(5)},
			{ID: 3, Client: 3, Key: "sem", Acquired: s(1), End: s(5)},
			{ID: 4, Client: 4, Key: "sem", Acquired: s(5), End: s(6)},
		}, nil, map[string]int{"sem": 3}, true},
		{"semaphore over its limit", []Hold{
			{ID: 1, Client: 1, Key: "sem", Acquired: s(1), End: s(5)},
			{ID: 2, Client: 2, Key: "sem", Acquired: s(1), End: s(5)},
			{ID: 3, Client: 3, Key: "sem", Acquired: s(1), End: s(5)},
			{ID: 4, Client: 4, Key: "sem", Acquired: s(4), End: s(6)},
		}, nil, map[string]int{"sem": 3}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := CheckOverlap(&Snapshot{Holds: tt.holds, Freezes: tt.freezes, Limits: tt.limits, Faults: cutOffFaults(tt.holds[1].Token)})
			assert.Equal(t, tt.ok, r.OK, "%+v", r)
		})
	}
}

// cutOffFaults: client 1 (holding k on broker-0 with session "sb")
// partitioned from every broker (tok 21, 41) or from broker-1 only
// (31) from 2.4 s, or broker-0 cut off from Consul (51), or broker-1 cut
// off from Consul (61), or broker-0 paused (71); its session destroyed at
// 2.5 s; lock-delay lets the next holder in at 4.5 s. Any other token: no
// faults.
func cutOffFaults(tok uint64) []Fault {
	destroy := Fault{Kind: FSessionDestroy, Session: "sb", Key: "k", Start: s(2.5), End: s(2.5), Replica: "broker-0"}
	switch tok {
	case 21, 41:
		return []Fault{{Kind: FClientPartition, Target: "client-1↔every broker", Clients: []int{1}, Start: s(2.4), End: s(8)}, destroy}
	case 31:
		return []Fault{{Kind: FClientPartition, Target: "client-1↔broker-1", Clients: []int{1}, Replica: "broker-1", Start: s(2.4), End: s(8)}, destroy}
	case 51:
		return []Fault{{Kind: FConsulBlackhole, Target: "broker-0↔consul", Start: s(2.4), End: s(6)}, destroy}
	case 61:
		return []Fault{{Kind: FConsulBlackhole, Target: "broker-1↔consul", Start: s(2.4), End: s(6)}, destroy}
	case 71:
		return []Fault{{Kind: FBrokerPause, Target: "broker-0", Start: s(2.4), End: s(6)}, destroy}
	}
	return nil
}

func TestCheckLoss(t *testing.T) {
	bounds := LossBounds{Slack: 100 * time.Millisecond, Taken: time.Second}
	tests := []struct {
		name   string
		holds  []Hold
		faults []Fault
		ok     bool
	}{
		{"lost before the deadline and before the next grant", []Hold{
			lockHold(1, 1, 10, 1, 5, "lost:RENEWAL_FAILED"),
			lockHold(2, 2, 20, 6, 7, EndReleased),
		}, []Fault{{Kind: "consul-blackhole-long", Start: s(2), End: s(20)}}, true},
		{"learned after the deadline", []Hold{
			{ID: 1, Client: 1, Key: "k", Token: 10, Acquired: s(1), End: s(9), Reason: "lost:LOCAL_DEADLINE", Deadline: s(8)},
		}, nil, false},
		{"learned after another holder acquired (no loss notice)", []Hold{
			lockHold(1, 1, 10, 1, 12, "lost:LOCAL_DEADLINE"),
			lockHold(2, 2, 20, 4, 6, EndReleased),
		}, []Fault{{Kind: "session-destroy", Session: "sb", Key: "k", Start: s(2), End: s(2)}}, false},
		{"taken away with no admin fault (an old replica released it)", []Hold{
			lockHold(1, 1, 10, 1, 5, "lost:RELEASED_BY_OTHER"),
		}, []Fault{{Kind: "broker-term", Start: s(2), End: s(3)}}, false},
		{"admin destroy learned within 1s", []Hold{
			lockHold(1, 1, 10, 1, 2.5, "lost:SESSION_INVALIDATED"),
		}, []Fault{{Kind: "session-destroy", Session: "sb", Key: "k", Start: s(2), End: s(2)}}, true},
		{"admin destroy learned too late", []Hold{
			lockHold(1, 1, 10, 1, 4, "lost:SESSION_INVALIDATED"),
		}, []Fault{{Kind: "session-destroy", Session: "sb", Key: "k", Start: s(2), End: s(2)}}, false},
		{"admin destroy learned late while Consul elected a leader", []Hold{
			lockHold(1, 1, 10, 1, 4, "lost:SESSION_INVALIDATED"),
		}, []Fault{{Kind: "consul-leader-kill", Start: s(1.5), End: s(2.5)},
			{Kind: "session-destroy", Session: "sb", Key: "k", Start: s(2), End: s(2), Replica: "broker-0"}}, true},
		{"admin destroy learned late while the holder's broker was cut from Consul", []Hold{
			lockHold(1, 1, 10, 1, 4, "lost:SESSION_INVALIDATED"),
		}, []Fault{{Kind: "consul-blackhole-short", Target: "broker-0↔consul", Start: s(2.5), End: s(3.5)},
			{Kind: "session-destroy", Session: "sb", Key: "k", Start: s(2), End: s(2), Replica: "broker-0"}}, true},
		{"admin destroy learned late; only another broker was paused", []Hold{
			lockHold(1, 1, 10, 1, 4, "lost:SESSION_INVALIDATED"),
		}, []Fault{{Kind: "broker-pause", Target: "broker-1", Start: s(1.5), End: s(3.5)},
			{Kind: "session-destroy", Session: "sb", Key: "k", Start: s(2), End: s(2), Replica: "broker-0"}}, false},
		{"admin destroy learned late; a blinding fault only after the bound ran out", []Hold{
			lockHold(1, 1, 10, 1, 4, "lost:SESSION_INVALIDATED"),
		}, []Fault{{Kind: "consul-leader-kill", Start: s(3.2), End: s(4)},
			{Kind: "session-destroy", Session: "sb", Key: "k", Start: s(2), End: s(2), Replica: "broker-0"}}, false},
		{"admin destroy unheard: the client was cut off from its broker", []Hold{
			lockHold(1, 1, 10, 1, 6, "lost:LOCAL_DEADLINE"),
			lockHold(2, 2, 20, 4.5, 7, EndReleased),
		}, cutOffFaults(21), true},
		{"admin destroy unheard: cut off from its broker, but past its deadline", []Hold{
			{ID: 1, Client: 1, Kind: KindLib, Key: "k", Limit: 1, Token: 10, Session: "sb", Acquired: s(1), End: s(6), Reason: "lost:LOCAL_DEADLINE", Deadline: s(5)},
		}, cutOffFaults(21), false},
		{"admin destroy learned late; the client was cut off from another broker only", []Hold{
			lockHold(1, 1, 10, 1, 6, "lost:SESSION_INVALIDATED"),
		}, cutOffFaults(31), false},
		{"a paused client is not held to the bound", []Hold{
			{ID: 1, Client: 1, Key: "k", Token: 10, Acquired: s(1), End: s(30), Reason: "lost:LOCAL_DEADLINE", Deadline: s(8), Paused: true},
			lockHold(2, 2, 20, 20, 21, EndReleased),
		}, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, st := CheckLoss(&Snapshot{Holds: tt.holds, Faults: tt.faults}, bounds)
			assert.Equal(t, tt.ok, r.OK, "%+v", r)
			assert.Positive(t, st.Total())
		})
	}
	_, st := CheckLoss(&Snapshot{Holds: []Hold{lockHold(1, 1, 10, 1, 5, "lost:RENEWAL_FAILED")},
		Faults: []Fault{{Kind: "x", Start: s(4)}}}, bounds)
	assert.Equal(t, 1, st.N)
	assert.Equal(t, s(1), st.Max, "latency runs from the fault's start")
}

func TestCheckLiveness(t *testing.T) {
	clients := map[int]ClientKind{1: KindLib, 2: KindLib, 3: KindObserver}
	q := []Quiet{{Start: s(100), End: s(140)}, {Start: s(200), End: s(230)}} // the second is too short to judge
	recovery, vanish := s(25), s(23)
	good := []Hold{
		lockHold(1, 1, 10, 126, 127, EndReleased),
		lockHold(2, 2, 20, 90, 130, EndReleased), // held across the window's start
	}
	r := CheckLiveness(&Snapshot{Holds: good, Quiets: q}, recovery, vanish, clients)
	assert.True(t, r.OK, "%+v", r)

	starved := []Hold{lockHold(1, 1, 10, 126, 127, EndReleased), lockHold(2, 2, 20, 101, 102, EndReleased)}
	r = CheckLiveness(&Snapshot{Holds: starved, Quiets: q,
		Attempts: []Attempt{{Client: 2, Key: "k", Call: s(103), Return: s(139), Err: "context deadline exceeded"}}}, recovery, vanish, clients)
	assert.False(t, r.OK)
	require.Len(t, r.Violations, 1)
	assert.Contains(t, r.Violations[0].Msg, "client 2")
	assert.NotEmpty(t, r.Violations[0].Excerpt)

	frozen := &Snapshot{Holds: starved, Quiets: q, Freezes: []Freeze{{Client: 2, Start: s(110), End: s(120)}}}
	assert.True(t, CheckLiveness(frozen, recovery, vanish, clients).OK, "a frozen client is not expected to progress")

	// A client vanishes holding the lock: a waiter must get it in time.
	held := lockHold(1, 1, 10, 1, 40, "lost:LOCAL_DEADLINE")
	silent := []Freeze{{Client: 1, Start: s(2), End: s(30), Silent: true}}
	kept := &Snapshot{Holds: []Hold{held, lockHold(2, 2, 20, 31, 32, EndReleased)}, Freezes: silent}
	r = CheckLiveness(kept, recovery, vanish, clients)
	assert.False(t, r.OK, "the lock stayed with the vanished client")
	moved := &Snapshot{Holds: []Hold{held, lockHold(2, 2, 20, 18, 19, EndReleased)}, Freezes: silent}
	assert.True(t, CheckLiveness(moved, recovery, vanish, clients).OK)
}

func TestCheckLinearizable(t *testing.T) {
	tests := []struct {
		name   string
		snap   Snapshot
		expect porcupine.CheckResult
	}{
		{"grants, fenced writes and reads in order", Snapshot{
			Holds: []Hold{lockHold(1, 1, 10, 1, 3, EndReleased), lockHold(2, 2, 20, 4, 6, EndReleased)},
			Writes: []Write{
				{Client: 1, Key: "k", Token: 10, Accepted: true, Call: s(1.5), Return: s(1.6), Seq: 1},
				{Client: 2, Key: "k", Token: 20, Accepted: true, Call: s(4.5), Return: s(4.6), Seq: 2},
				{Client: 1, Key: "k", Token: 10, Accepted: false, Call: s(5), Return: s(5.1), Seq: 3},
			},
			Checks: []Check{
				{Client: 1, Key: "k", Token: 10, Current: true, Call: s(2), Return: s(2.1)},
				{Client: 3, Key: "k", GetLock: true, Holder: 20, Call: s(5), Return: s(5.2)},
				{Client: 1, Key: "k", Token: 10, Current: false, Call: s(5), Return: s(5.3)},
			},
		}, porcupine.Ok},
		{"a read reveals a grant before its Acquire returns", Snapshot{
			Holds:  []Hold{lockHold(1, 1, 10, 3, 4, EndReleased)},
			Checks: []Check{{Client: 3, Key: "k", GetLock: true, Holder: 10, Call: s(2), Return: s(2.1)}},
		}, porcupine.Ok},
		{"token goes back in real time", Snapshot{
			Holds: []Hold{lockHold(1, 1, 20, 1, 3, EndReleased), lockHold(2, 2, 10, 4, 6, EndReleased)},
		}, porcupine.Illegal},
		{"stale CheckSequencer: old grant current after a new grant", Snapshot{
			Holds:  []Hold{lockHold(1, 1, 10, 1, 3, "lost:LOCAL_DEADLINE"), lockHold(2, 2, 20, 4, 6, EndReleased)},
			Checks: []Check{{Client: 1, Key: "k", Token: 10, Current: true, Call: s(5), Return: s(5.1)}},
		}, porcupine.Illegal},
		{"stale GetLock: an older holder after a newer one was seen", Snapshot{
			Holds: []Hold{lockHold(1, 1, 10, 1, 3, EndReleased), lockHold(2, 2, 20, 4, 6, EndReleased)},
			Checks: []Check{
				{Client: 3, Key: "k", GetLock: true, Holder: 20, Call: s(4.5), Return: s(4.6)},
				{Client: 3, Key: "k", GetLock: true, Holder: 10, Call: s(5), Return: s(5.1)},
			},
		}, porcupine.Illegal},
		{"the resource accepts a lower token (no fencing)", Snapshot{
			Holds: []Hold{lockHold(1, 1, 10, 1, 3, EndReleased), lockHold(2, 2, 20, 4, 6, EndReleased)},
			Writes: []Write{
				{Client: 2, Key: "k", Token: 20, Accepted: true, Call: s(4.5), Return: s(4.6), Seq: 1},
				{Client: 1, Key: "k", Token: 10, Accepted: true, Call: s(5), Return: s(5.1), Seq: 2},
			},
		}, porcupine.Illegal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, verdict := CheckLinearizable(&tt.snap, 10*time.Second, "")
			assert.Equal(t, tt.expect, verdict, "%+v", r)
			assert.Equal(t, tt.expect != porcupine.Illegal, r.OK)
			if !r.OK {
				assert.NotEmpty(t, r.Violations[0].Excerpt, "the excerpt quotes the operations")
			}
		})
	}
}

func TestCheckLeaks(t *testing.T) {
	assert.True(t, CheckLeaks(Leftovers{}).OK)
	r := CheckLeaks(Leftovers{Sessions: []string{"abc"}, Keys: []string{"chaos/x/lock/1"},
		BrokerExits: []string{"broker-0: exit status 66"}, LogFindings: []string{"WARNING: DATA RACE"}})
	assert.False(t, r.OK)
	assert.Equal(t, 4, r.Count)
}

func TestResource(t *testing.T) {
	r := NewResource(true)
	ok, seq1 := r.Write("k", 10, 1)
	assert.True(t, ok)
	ok, _ = r.Write("k", 20, 2)
	assert.True(t, ok)
	ok, seq3 := r.Write("k", 10, 3)
	assert.False(t, ok, "a lower token is refused")
	assert.Greater(t, seq3, seq1)
	ok, _ = r.Write("other", 1, 1)
	assert.True(t, ok)
	assert.Equal(t, 1, r.Refused())

	open := NewResource(false)
	open.Write("k", 20, 1)
	ok, _ = open.Write("k", 10, 2)
	assert.True(t, ok, "without fencing everything is accepted")
}
