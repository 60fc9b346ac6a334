package chaos

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPlanReplaysFromSeed(t *testing.T) {
	p := Profiles["full"]
	a := Plan(42, p.Total, p.ChaosLen, p.QuietLen, p.TTL, p.LockDelay, p.Weights, p.Must)
	b := Plan(42, p.Total, p.ChaosLen, p.QuietLen, p.TTL, p.LockDelay, p.Weights, p.Must)
	assert.Equal(t, a, b, "the same seed gives the same schedule")
	c := Plan(43, p.Total, p.ChaosLen, p.QuietLen, p.TTL, p.LockDelay, p.Weights, p.Must)
	assert.NotEqual(t, a, c)

	assert.GreaterOrEqual(t, a.Count(), 200, "the full profile plans at least 200 faults")
	var total time.Duration
	for i, seg := range a.Segments {
		total += seg.Len
		for _, lane := range seg.Lanes {
			for _, f := range lane {
				assert.LessOrEqual(t, f.At+f.Dur, seg.Len, "segment %d: %s overruns its segment", i, f.Kind)
			}
		}
	}
	assert.Equal(t, p.Total, total)
	last := a.Segments[len(a.Segments)-1]
	assert.False(t, last.Chaos, "a run ends with a quiet period")
	assert.GreaterOrEqual(t, last.Len, p.QuietLen, "a full one")
	for _, k := range p.Must {
		assert.Positive(t, a.ByKind()[k], k)
	}
}

func TestPlanShortAndMutants(t *testing.T) {
	p := Profiles["short"]
	s := Plan(7, p.Total, p.ChaosLen, p.QuietLen, p.TTL, p.LockDelay, p.Weights, p.Must)
	require.Len(t, s.Segments, 2)
	assert.True(t, s.Segments[0].Chaos)
	assert.GreaterOrEqual(t, s.Segments[1].Len, p.Recovery()+10*time.Second, "the quiet period leaves a liveness window")
	for m := range Mutants {
		mp := MutantProfile(m)
		ms := Plan(7, mp.Total, mp.ChaosLen, mp.QuietLen, mp.TTL, mp.LockDelay, mp.Weights, mp.Must)
		require.Len(t, ms.Segments, 1, m)
		for _, k := range mp.Must {
			assert.Positive(t, ms.ByKind()[k], "%s: %s is planned", m, k)
		}
		switch m {
		case "rw-reader-beside-writer", "rw-stale-token":
			assert.Positive(t, mp.Readers*mp.Writers*mp.RWKeys, "%s: readers and writers share a key", m)
			assert.True(t, mp.OwnCluster, "%s: no other mutant's Consul faults", m)
		case "multi-partial":
			assert.Positive(t, mp.Multi*mp.MultiObs, "%s: multi-key clients and an observer of Consul", m)
			assert.GreaterOrEqual(t, mp.MultiKeys, 3, "%s: overlapping sets", m)
			assert.True(t, mp.OwnCluster, "%s: no other mutant's Consul faults", m)
		default:
			assert.Zero(t, mp.Readers+mp.Writers+mp.Multi+mp.MultiObs, "%s: runs as before issue 43", m)
		}
		if m == "no-shared-queue" {
			assert.False(t, ms.Segments[0].Chaos, "no-shared-queue: quiet, for the starvation checker")
			assert.Positive(t, mp.Hot*mp.Far, "no-shared-queue: the hot key is used")
		}
	}
}

// echoServer accepts connections and echoes what it reads.
func echoServer(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return l.Addr().String()
}

func roundTrip(c net.Conn) error {
	_ = c.SetDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := c.Write([]byte("x")); err != nil {
		return err
	}
	_, err := io.ReadFull(c, make([]byte, 1))
	return err
}

func TestLinkFaults(t *testing.T) {
	n := NewNetwork()
	t.Cleanup(n.Close)
	l, err := n.Link("test", echoServer(t))
	require.NoError(t, err)
	c, err := net.Dial("tcp", l.Addr())
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, roundTrip(c))

	bh, err := l.Blackhole()
	require.NoError(t, err)
	assert.True(t, l.Faulty())
	assert.Error(t, roundTrip(c), "a blackhole drops data")
	bh.Heal()
	assert.False(t, l.Faulty())

	c2, err := net.Dial("tcp", l.Addr())
	require.NoError(t, err)
	defer c2.Close()
	require.NoError(t, roundTrip(c2), "healed")
	require.NoError(t, l.Cut())
	assert.Error(t, roundTrip(c2), "a cut closes open connections")
	c3, err := net.Dial("tcp", l.Addr())
	require.NoError(t, err, "the link accepts again on the same address")
	defer c3.Close()
	require.NoError(t, roundTrip(c3))

	lat, err := l.Latency(100, 0)
	require.NoError(t, err)
	start := time.Now()
	_ = c3.SetDeadline(time.Now().Add(2 * time.Second))
	_, err = c3.Write([]byte("y"))
	require.NoError(t, err)
	_, err = io.ReadFull(c3, make([]byte, 1))
	require.NoError(t, err)
	assert.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond, "latency each way")
	lat.Heal()
	assert.False(t, l.Faulty())
}

// Faults overlap on a link (a frozen client's links blackholed while a
// replica's links are reset and healed): the end of one must not end the
// other. The chaos run at seed 915250863 had a frozen client's lease
// renewed for 20 s because a replica's pause-failover healed every toxic
// of the client's link to it, the freeze's blackhole included.
func TestLinkFaultsOverlap(t *testing.T) {
	n := NewNetwork()
	t.Cleanup(n.Close)
	l, err := n.Link("test", echoServer(t))
	require.NoError(t, err)

	freeze, err := l.Blackhole()
	require.NoError(t, err)
	part, err := l.Blackhole()
	require.NoError(t, err, "a second blackhole on the same link")
	reset, err := l.Reset()
	require.NoError(t, err)
	part.Heal()
	reset.Heal()
	c, err := net.Dial("tcp", l.Addr())
	require.NoError(t, err)
	defer c.Close()
	assert.True(t, l.Faulty())
	assert.Error(t, roundTrip(c), "the freeze's blackhole outlives the faults healed before it")

	freeze.Heal()
	assert.False(t, l.Faulty())
	c2, err := net.Dial("tcp", l.Addr())
	require.NoError(t, err)
	defer c2.Close()
	require.NoError(t, roundTrip(c2), "healed")
	var none *Toxics
	none.Heal() // a fault that failed to start heals nothing
}
