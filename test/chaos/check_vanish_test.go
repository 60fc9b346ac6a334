package chaos

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCheckVanished: a client frozen at 2s while holding "k" on broker-1;
// DESIGN.md promises the lock is released (someone gets it, or a
// consistent read sees it free) within 20s + lock-delay + 1s (23s here),
// unless a fault on broker-1, its Consul link or server, or a
// Consul election left the session to expire by its TTL (then 2×TTL +
// lock-delay + 5s = 27s after that fault ends).
func TestCheckVanished(t *testing.T) {
	b := VanishBounds{Vanish: s(23), Recovery: s(27), Handover: s(3)}
	fr := Freeze{Client: 1, Start: s(2), End: s(30), Silent: true, Replica: "broker-1", Server: "consul-1"}
	held := lockHold(1, 1, 10, 1, 40, "lost:LOCAL_DEADLINE")
	late := lockHold(2, 2, 20, 35, 36, EndReleased) // 33s after the freeze
	check := func(faults ...Fault) Result {
		r := newResult(CheckerLiveness)
		checkVanished(&Snapshot{Holds: []Hold{held, late}, Freezes: []Freeze{fr}, Faults: faults, End: s(100)}, b, &r)
		return r
	}

	r := check()
	assert.False(t, r.OK, "nothing excuses 33s")
	require.Len(t, r.Violations, 1)
	assert.Contains(t, r.Violations[0].Msg, "within 23s")

	// Faults elsewhere excuse nothing.
	for _, f := range []Fault{
		{Kind: FBrokerKill, Target: "broker-0", Start: s(8), End: s(9)},
		{Kind: FConsulBlackholeLong, Target: "broker-2↔consul", Start: s(5), End: s(20)},
		{Kind: FConsulFollowerKill, Target: "consul-0", Start: s(5), End: s(9)},
		{Kind: FConsulLatency, Target: "broker-1↔consul", Start: s(5), End: s(15)}, // slow, not failing
		{Kind: FClientPartition, Target: "client-3(lib)↔every broker", Start: s(5), End: s(15)},
		{Kind: FBrokerKill, Target: "broker-1", Start: s(26), End: s(27)},   // after the bound
		{Kind: FBrokerKill, Target: "broker-1", Start: s(22.5), End: s(23)}, // after the release was due (2s + 20s)
	} {
		assert.False(t, check(f).OK, "%s on %s", f.Kind, f.Target)
	}

	// The owning replica killed 6s into the freeze: its session is
	// orphaned and Consul expires it within 2×TTL, then the lock-delay.
	r = check(Fault{Kind: FBrokerKill, Target: "broker-1", Start: s(8), End: s(9)})
	assert.True(t, r.OK, "%+v", r)
	// A Consul election re-arms every session's timer, and a chain of them
	// pushes the bound again.
	assert.True(t, check(Fault{Kind: FConsulLeaderKill, Target: "consul-2", Start: s(1), End: s(9)}).OK,
		"an election under way when it froze")
	assert.True(t, check(Fault{Kind: FConsulFollowerKill, Target: "consul-1", Start: s(10), End: s(12)}).OK)
	assert.True(t, check(Fault{Kind: FConsulReset, Target: "broker-1↔consul", Start: s(10), End: s(11)}).OK)
	// A pause of the owner delays keepalive by the pause.
	assert.True(t, check(Fault{Kind: FBrokerPauseLong, Target: "broker-1", Start: s(10), End: s(22)}).OK)
	// So does the failover pause (the run at seed 412353885: the owner
	// stopped 11.6s into the freeze, before its linger ended, and released
	// the lock when it ran again).
	assert.True(t, check(Fault{Kind: FBrokerPauseFailover, Target: "broker-1", Start: s(13.6), End: s(24.9)}).OK)
	assert.False(t, check(Fault{Kind: FBrokerPauseFailover, Target: "broker-0", Start: s(13.6), End: s(24.9)}).OK,
		"another replica's pause excuses nothing")
	assert.False(t, check(Fault{Kind: FBrokerPause, Target: "broker-1", Start: s(3), End: s(5)}).OK,
		"a 2s pause does not excuse 15s more")

	// Pushed, but the lock still did not move in time.
	never := newResult(CheckerLiveness)
	checkVanished(&Snapshot{Holds: []Hold{held}, Freezes: []Freeze{fr}, End: s(100),
		Faults: []Fault{{Kind: FBrokerKill, Target: "broker-1", Start: s(8), End: s(9)}}}, b, &never)
	require.False(t, never.OK)
	assert.Contains(t, never.Violations[0].Msg, "by 36.000s (1 faults")

	// Unknown replica: any broker's fault may be the owner's.
	unknown := fr
	unknown.Replica, unknown.Server = "", ""
	r = newResult(CheckerLiveness)
	checkVanished(&Snapshot{Holds: []Hold{held, late}, Freezes: []Freeze{unknown}, End: s(100),
		Faults: []Fault{{Kind: FBrokerKill, Target: "broker-0", Start: s(8), End: s(9)}}}, b, &r)
	assert.True(t, r.OK)

	// The vanished client's own new grant after it woke shows the lock
	// was freed too.
	own := lockHold(3, 1, 30, 31, 32, EndReleased)
	r = newResult(CheckerLiveness)
	checkVanished(&Snapshot{Holds: []Hold{held, own}, Freezes: []Freeze{fr}, End: s(100),
		Faults: []Fault{{Kind: FBrokerKill, Target: "broker-1", Start: s(8), End: s(9)}}}, b, &r)
	assert.True(t, r.OK)

	// Released on time, but no waiter got it in time (a waiter's own
	// replica cut off from Consul, say): an observer's consistent read
	// that saw the key free, or held by another grant, shows the promise
	// kept (the run at seed 659867481: the key seen free 14.5s into the
	// freeze, granted 25.2s into it).
	read := func(call, ret float64, holder uint64) Check {
		return Check{Client: 9, Key: "k", GetLock: true, Holder: holder, Call: s(call), Return: s(ret)}
	}
	withChecks := func(checks ...Check) Result {
		r := newResult(CheckerLiveness)
		checkVanished(&Snapshot{Holds: []Hold{held, late}, Freezes: []Freeze{fr}, Checks: checks, End: s(100)}, b, &r)
		return r
	}
	assert.True(t, withChecks(read(16.5, 16.6, 0)).OK, "seen free 14.5s into the freeze")
	assert.True(t, withChecks(read(24.8, 24.9, 77)).OK, "seen held by another grant before the bound")
	for name, c := range map[string]Check{
		"still held by the vanished client": read(16.5, 16.6, 10),
		"begun before the freeze":           read(1.5, 2.5, 0),
		"answered after the bound (25s)":    read(24.9, 25.2, 0),
		"a CheckSequencer, not a GetLock":   {Client: 9, Key: "k", Token: 10, Call: s(16.5), Return: s(16.6)},
		"another key":                       {Client: 9, Key: "k2", GetLock: true, Call: s(16.5), Return: s(16.6)},
	} {
		r := withChecks(c)
		assert.False(t, r.OK, name)
		if assert.Len(t, r.Violations, 1, name) {
			assert.Contains(t, r.Violations[0].Msg, "nor did a consistent read see it released", name)
		}
	}
}
