package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/broker"
)

// A read-write lock's releases under contention: sixteen readers and a
// writer cycle on one key, on two replicas, with pooled sessions (default
// options). Every arrival and grant moves K; a release, which deletes only
// its contender entry, must never fail for it. A watcher lists the key in
// Consul all along and derives its holders as the broker does (the
// sessions K lists whose entry their session holds): a writer is never
// beside anyone, and every holder it sees is a session whose grant, of
// that very entry, came before the listing (a pooled session back on the
// key after its release is never a holder before its new grant, even
// though K may still list it from the earlier hold).

type rwGrant struct {
	session string
	token   uint64
	read    bool
}

// rwCycle acquires key on c (read or write, default session options),
// then ends the hold: with Release by token, or (cancel) by cancelling
// the stream. It returns the grant, and the Release's error if any.
func rwCycle(c lockbrokerv1.LockServiceClient, key string, read, cancelIt bool) (*rwGrant, error, error) {
	kind := lockbrokerv1.AcquireKind_ACQUIRE_KIND_WRITE
	if read {
		kind = lockbrokerv1.AcquireKind_ACQUIRE_KIND_READ
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := c.Acquire(ctx, &lockbrokerv1.AcquireRequest{Key: key, Kind: kind})
	if err != nil {
		return nil, nil, err
	}
	var seq *lockbrokerv1.Sequencer
	for seq == nil {
		r, err := st.Recv()
		if err != nil {
			return nil, nil, err
		}
		seq = r.GetAcquired().GetSequencer()
	}
	g := &rwGrant{session: seq.GetSessionId(), token: seq.GetToken(), read: seq.GetRead()}
	if cancelIt {
		cancel()
		return g, nil, nil
	}
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	resp, err := c.Release(rctx, &lockbrokerv1.ReleaseRequest{Key: key, SessionId: g.session, Token: g.token})
	rcancel()
	if err == nil && !resp.GetReleased() {
		err = errors.New("release answered released=false")
	}
	if err != nil {
		return g, err, nil
	}
	for {
		r, err := st.Recv()
		if err != nil {
			return g, nil, err
		}
		if r.GetReleased() != nil {
			return g, nil, nil
		}
	}
}

// rwListed is one listing of a read-write key: its index, and the holders
// derived from it (session → mode, and the CreateIndex of its entry).
type rwListed struct {
	index   uint64
	holders map[string]string
	created map[string]uint64
}

// rwDerive derives a read-write key's holders from a raw listing.
func rwDerive(t *testing.T, key string, kvs api.KVPairs, index uint64) rwListed {
	out := rwListed{index: index, holders: map[string]string{}, created: map[string]uint64{}}
	var body struct{ Holders map[string]string }
	live := map[string]*api.KVPair{}
	for _, p := range kvs {
		switch {
		case p.Key == key:
			if err := json.Unmarshal(p.Value, &body); err != nil {
				t.Errorf("K at %d: malformed body %q: %v", index, p.Value, err)
			}
		case strings.HasPrefix(p.Key, key+"/"):
			sid := strings.TrimPrefix(p.Key, key+"/")
			if (p.Flags == broker.RWReadFlagValue || p.Flags == broker.RWWriteFlagValue) && p.Session == sid {
				live[sid] = p
			}
		}
	}
	for sid, m := range body.Holders {
		if p, ok := live[sid]; ok {
			out.holders[sid], out.created[sid] = m, p.CreateIndex
		}
	}
	return out
}

func TestRWReleaseUnderContention(t *testing.T) {
	agent, cs, _ := rwTwoReplicas(t)
	key := "rw/contended"
	const readers = 16
	run := 5 * time.Second
	if testing.Short() {
		run = 2 * time.Second
	}

	// The watcher: blocking listings until the cycling ends.
	kv := agent.Client().KV()
	wctx, stopWatch := context.WithCancel(context.Background())
	var listings []rwListed
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		var idx uint64
		for wctx.Err() == nil {
			qctx, cancel := context.WithTimeout(wctx, 3*time.Second)
			kvs, meta, err := kv.List(key, (&api.QueryOptions{WaitIndex: idx, WaitTime: time.Second}).WithContext(qctx))
			cancel()
			if err != nil {
				continue
			}
			if meta.LastIndex < idx {
				idx = 0
				continue
			}
			idx = meta.LastIndex
			l := rwDerive(t, key, kvs, meta.LastIndex)
			listings = append(listings, l)
		}
	}()

	var mu sync.Mutex
	var grants [readers + 1][]*rwGrant
	var releaseErrs, otherErrs []error
	deadline := time.Now().Add(run)
	var wg sync.WaitGroup
	for i := range readers + 1 {
		read := i < readers
		c := cs[i%2]
		wg.Go(func() {
			for n := 0; time.Now().Before(deadline) && n < 2000; n++ {
				g, relErr, err := rwCycle(c, key, read, n%4 == 3)
				mu.Lock()
				if g != nil {
					grants[i] = append(grants[i], g)
				}
				if relErr != nil {
					releaseErrs = append(releaseErrs, relErr)
				}
				if err != nil {
					otherErrs = append(otherErrs, err)
				}
				mu.Unlock()
				if err != nil {
					return
				}
			}
		})
	}
	wg.Wait()

	// Every hold ended (Release or a cancelled stream): nobody holds the
	// key, and no live contender entry is left.
	var last rwListed
	require.Eventually(t, func() bool {
		kvs, meta, err := kv.List(key, nil)
		if err != nil {
			return false
		}
		last = rwDerive(t, key, kvs, meta.LastIndex)
		for _, p := range kvs {
			if p.Key != key && p.Session != "" {
				return false
			}
		}
		return len(last.holders) == 0
	}, 10*time.Second, 50*time.Millisecond, "holders left: %v", last.holders)
	stopWatch()
	<-watched

	require.Empty(t, releaseErrs, "Release failed under contention")
	require.Empty(t, otherErrs)

	// Tokens: strictly increasing per client, and no two grants alike.
	bySession := map[string][]*rwGrant{}
	seen := map[uint64]bool{}
	total, writes := 0, 0
	for i := range grants {
		var prev uint64
		for _, g := range grants[i] {
			assert.Greater(t, g.token, prev, "client %d: tokens must strictly increase", i)
			assert.False(t, seen[g.token], "token %d granted twice", g.token)
			assert.Equal(t, i < readers, g.read)
			seen[g.token], prev = true, g.token
			bySession[g.session] = append(bySession[g.session], g)
			total++
			if !g.read {
				writes++
			}
		}
	}
	reused := 0
	for _, gs := range bySession {
		reused += len(gs) - 1
	}
	t.Logf("%d grants (%d writes) in %v, %d on a session that held the key before; %d listings watched", total, writes, run, reused, len(listings))
	require.Greater(t, total, 2*(readers+1), "too few cycles to say anything")
	require.Positive(t, writes, "the writer was never granted")
	require.Positive(t, reused, "no pooled session came back to the key: the reuse check says nothing")

	// What the watcher saw.
	require.NotEmpty(t, listings)
	for _, l := range listings {
		writers := 0
		for _, m := range l.holders {
			if m == "w" {
				writers++
			}
		}
		if writers > 0 && len(l.holders) > 1 {
			t.Errorf("listing at %d: a writer beside others: %v", l.index, l.holders)
		}
		for sid, m := range l.holders {
			ok := false
			for _, g := range bySession[sid] {
				ok = ok || (g.token >= l.created[sid] && g.token <= l.index && g.read == (m == "r"))
			}
			if !ok {
				t.Errorf("listing at %d: session %s listed as holder (%s) of its entry created at %d, with no grant of it at or before the listing (grants: %v)", l.index, sid, m, l.created[sid], tokensOf(bySession[sid]))
			}
		}
	}
}

func tokensOf(gs []*rwGrant) []uint64 {
	out := make([]uint64, len(gs))
	for i, g := range gs {
		out[i] = g.token
	}
	return out
}
