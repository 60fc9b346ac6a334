package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockbroker/lockbroker/client"
	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// semWaiter is one waiter of TestSemaphoreMovedWaitKeepsItsPlace: a raw
// stream, or a wait of the Go library (lease set once granted).
type semWaiter struct {
	name   string
	stream *stream
	lib    chan libResult
	lease  *client.Lease
	seq    *lockbrokerv1.Sequencer
}

type libResult struct {
	lease *client.Lease
	err   error
}

// granted waits for the waiter's grant.
func (w *semWaiter) granted(t *testing.T) *lockbrokerv1.Sequencer {
	t.Helper()
	if w.stream != nil {
		w.seq = w.stream.acquired(10 * time.Second).GetSequencer()
		return w.seq
	}
	select {
	case r := <-w.lib:
		require.NoError(t, r.err, "%s", w.name)
		w.lease, w.seq = r.lease, r.lease.Sequencer()
	case <-time.After(10 * time.Second):
		t.Fatalf("%s was not granted", w.name)
	}
	return w.seq
}

// notGranted fails if the waiter was granted already.
func (w *semWaiter) notGranted(t *testing.T, before string) {
	t.Helper()
	if w.stream != nil {
		rwNotGranted(t, w.stream, w.name+" (before "+before+")")
		return
	}
	select {
	case r := <-w.lib:
		w.lib <- r
		t.Fatalf("%s was granted before %s (err %v)", w.name, before, r.err)
	default:
	}
}

// release gives the waiter's slot back.
func (w *semWaiter) release(t *testing.T, c lockbrokerv1.LockServiceClient) {
	t.Helper()
	if w.lease != nil {
		require.NoError(t, w.lease.Release(lkCtx(t)))
		return
	}
	_, err := c.Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: w.seq.GetKey(), SessionId: w.seq.GetSessionId(), Token: w.seq.GetToken()})
	require.NoError(t, err)
}

// semRecord is the broker's record of session, as Consul has it (nil:
// none).
func semRecord(t *testing.T, cli *api.Client, session string) map[string]any {
	t.Helper()
	p, _, err := cli.KV().Get("lockbroker/sessions/"+session, nil)
	require.NoError(t, err)
	if p == nil {
		return nil
	}
	var rec map[string]any
	require.NoError(t, json.Unmarshal(p.Value, &rec))
	return rec
}

// A semaphore wait whose replica is SIGKILLed moves to another replica
// through the Go library and keeps its place, as a lock wait does
// (TestSharedQueueMovedWaitKeepsItsPlace): same session, same contender
// entry (CreateIndex). Limit 2, two holders on replica 3; waiters arrive
// in the order r0 (replica 2), m1 and m2 (the library, on replica 1),
// l3 (replica 3), l4 (replica 2). Replica 1 is killed; both library
// waits resume on replica 2. Releasing one slot at a time grants them in
// arrival order: r0, m1, m2, l3, l4.
func TestSemaphoreMovedWaitKeepsItsPlace(t *testing.T) {
	agent := consultest.Start(t)
	p1 := brokertest.StartProcess(t, agent)
	p2 := brokertest.StartProcess(t, agent)
	p3 := brokertest.StartProcess(t, agent)
	conn1, conn2, conn3 := lkDial(t, p1.Addr), lkDial(t, p2.Addr), lkDial(t, p3.Addr)
	c2, c3 := lockbrokerv1.NewLockServiceClient(conn2), lockbrokerv1.NewLockServiceClient(conn3)
	cli, err := api.NewClient(&api.Config{Address: agent.HTTPAddr()})
	require.NoError(t, err)
	const limit = 2
	prefix := "sem/moved-wait"

	var order []*semWaiter
	for i := range limit {
		s, seq := semHold(t, c3, prefix, limit, fmt.Sprintf("h%d", i))
		order = append(order, &semWaiter{name: fmt.Sprintf("holder %d", i), stream: s, seq: seq})
	}
	contenders := func() map[string]*api.KVPair {
		ps, _, err := cli.KV().List(prefix+"/", nil)
		require.NoError(t, err)
		out := map[string]*api.KVPair{}
		for _, p := range ps {
			if p.Key != prefix+"/.lock" {
				out[string(p.Value)] = p
			}
		}
		return out
	}

	r0, _ := semQueued(t, c2, semReq(prefix, limit, "r0"))
	order = append(order, &semWaiter{name: "r0", stream: r0})

	lib := client.New(conn1, client.WithReplicas(conn2, conn3))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	moved := map[string]*api.KVPair{} // value → contender entry before the move
	for _, name := range []string{"m1", "m2"} {
		w := &semWaiter{name: name, lib: make(chan libResult, 1)}
		go func() {
			l, err := lib.Lock(ctx, prefix, client.WithSemaphore(), client.WithLimit(limit), client.WithValue([]byte(name)))
			w.lib <- libResult{l, err}
		}()
		require.Eventually(t, func() bool { _, ok := contenders()[name]; return ok }, 10*time.Second, 10*time.Millisecond, "%s wrote no contender entry", name)
		moved[name] = contenders()[name]
		order = append(order, w)
	}
	for i, c := range []lockbrokerv1.LockServiceClient{c3, c2} {
		name := fmt.Sprintf("l%d", i+3)
		s := acquire(t, c, semReq(prefix, limit, name))
		awaitPosition(t, s, uint32(i+4))
		order = append(order, &semWaiter{name: name, stream: s})
	}

	// Each waiting library request has its record, naming the replica
	// that owns the wait: what lets another replica resume it.
	owners := map[string]any{}
	for name, e := range moved {
		rec := semRecord(t, cli, e.Session)
		require.NotNil(t, rec, "%s's session %s has no broker record", name, e.Session)
		assert.Equal(t, prefix, rec["waiting"], "%s's record", name)
		owners[name] = rec["owner"]
	}

	p1.Kill()
	for name, e := range moved {
		require.Eventually(t, func() bool {
			rec := semRecord(t, cli, e.Session)
			return rec != nil && rec["owner"] != owners[name]
		}, 15*time.Second, 20*time.Millisecond, "%s's wait did not move", name)
		now := contenders()[name]
		require.NotNil(t, now, "%s lost its contender entry", name)
		assert.Equal(t, e.Session, now.Session, "%s waits with another session", name)
		assert.Equal(t, e.CreateIndex, now.CreateIndex, "%s lost its place", name)
	}

	// ListHolds lists the waiters in arrival order with their replicas:
	// the moved waits now on r0's replica, l3 on another.
	admin := lockbrokerv1.NewAdminServiceClient(conn2)
	resp, err := admin.ListHolds(lkCtx(t), &lockbrokerv1.ListHoldsRequest{KeyPrefix: prefix})
	require.NoError(t, err)
	var listed []*lockbrokerv1.HoldInfo
	for _, h := range resp.GetHolds() {
		if h.GetWaiting() {
			listed = append(listed, h)
		}
	}
	require.Len(t, listed, len(order)-limit, "ListHolds lists every waiter")
	for i, h := range listed {
		w := order[limit+i]
		assert.EqualValues(t, i+1, h.GetPosition(), "%s's place", w.name)
		if e := moved[w.name]; e != nil {
			assert.Equal(t, e.Session, h.GetSessionId(), "%s listed in its place", w.name)
		}
		assert.NotEmpty(t, h.GetReplica(), "%s's replica", w.name)
	}
	assert.Equal(t, listed[0].GetReplica(), listed[1].GetReplica(), "m1 waits on r0's replica now")
	assert.Equal(t, listed[0].GetReplica(), listed[2].GetReplica(), "m2 waits on r0's replica now")
	assert.NotEqual(t, listed[0].GetReplica(), listed[3].GetReplica(), "l3 waits on another replica")

	// One slot at a time: each release admits the next waiter in arrival
	// order, and nobody behind it.
	var last uint64
	for i := limit; i < len(order); i++ {
		order[i-limit].release(t, c3)
		w := order[i]
		seq := w.granted(t)
		assert.Greater(t, seq.GetToken(), last, "%s's token", w.name)
		last = seq.GetToken()
		if w.lib != nil {
			assert.Equal(t, moved[w.name].Session, seq.GetSessionId(), "%s was granted on another session", w.name)
		}
		for _, later := range order[i+1:] {
			later.notGranted(t, w.name)
		}
	}
	for _, w := range order[len(order)-limit:] {
		w.release(t, c3)
	}
}
