package e2e

import (
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// A read-write or multi-key wait whose replica is killed (SIGKILL) moves
// to another replica by resume (a sequencer with no token), as a lock
// wait does (TestSharedQueueMovedWaitKeepsItsPlace): same session, same
// contender entry or tickets, so it keeps its place, ahead of a waiter
// that came after it.

// movedWaitReplicas starts the waiter's replica (a broker process, to be
// killed) and the replica the wait moves to (in this process, so that
// -race sees the resume), and a Consul client.
func movedWaitReplicas(t *testing.T) (*brokertest.Process, lockbrokerv1.LockServiceClient, lockbrokerv1.LockServiceClient, *api.Client) {
	t.Helper()
	agent := consultest.Start(t)
	pa := brokertest.StartProcess(t, agent)
	b := brokertest.Start(t, agent)
	cli, err := api.NewClient(&api.Config{Address: agent.HTTPAddr()})
	require.NoError(t, err)
	return pa, lockbrokerv1.NewLockServiceClient(lkDial(t, pa.Addr)), b.Locks(t), cli
}

// queuedSession waits until s is queued and returns its session.
func queuedSession(t *testing.T, s *stream, what string) string {
	t.Helper()
	ev := s.next(10*time.Second, func(r *lockbrokerv1.AcquireResponse) bool { return r.GetQueued() != nil || r.GetAcquired() != nil })
	require.NotNil(t, ev.GetQueued(), "%s was granted at once, want queued", what)
	require.NotEmpty(t, ev.GetQueued().GetSessionId())
	return ev.GetQueued().GetSessionId()
}

func TestRWMovedReadWaitKeepsItsPlace(t *testing.T)  { testRWMovedWait(t, true) }
func TestRWMovedWriteWaitKeepsItsPlace(t *testing.T) { testRWMovedWait(t, false) }

// A writer holds K (replica B); a reader (or writer) waits on replica A;
// then a writer waits on B. A is killed; the wait resumes on B with its
// session: refused in the other mode, accepted in its own, with the same
// contender entry (CreateIndex). The holder's release grants the moved
// wait, not the later writer, which gets K after the moved wait's release.
func testRWMovedWait(t *testing.T, read bool) {
	pa, ca, cb, cli := movedWaitReplicas(t)
	key := "rw/moved-wait"
	if !read {
		key += "-w"
	}
	hstream, hseq := rwHold(t, cb, key, false, "holder")

	w := acquire(t, ca, rwReq(key, read, "moved"))
	session := queuedSession(t, w, "the waiter")
	entry, _, err := cli.KV().Get(key+"/"+session, nil)
	require.NoError(t, err)
	require.NotNil(t, entry, "the waiter wrote no contender entry")
	later := rwQueued(t, cb, key, false, "later")

	pa.Kill()
	kind := lockbrokerv1.AcquireKind_ACQUIRE_KIND_WRITE
	other := lockbrokerv1.AcquireKind_ACQUIRE_KIND_READ
	if read {
		kind, other = other, kind
	}
	resume := &lockbrokerv1.AcquireRequest_Resume{Resume: &lockbrokerv1.Sequencer{Key: key, SessionId: session}}
	bad := acquire(t, cb, &lockbrokerv1.AcquireRequest{Key: key, Kind: other, Session: resume})
	require.Error(t, bad.end(10*time.Second), "a wait resumed in the other mode was accepted")

	moved := acquire(t, cb, &lockbrokerv1.AcquireRequest{Key: key, Kind: kind, Value: []byte("moved"), Session: resume})
	assert.Equal(t, session, queuedSession(t, moved, "the moved wait"))
	now, _, err := cli.KV().Get(key+"/"+session, nil)
	require.NoError(t, err)
	require.NotNil(t, now, "the moved wait lost its contender entry")
	assert.Equal(t, entry.CreateIndex, now.CreateIndex, "the moved wait lost its place")
	assert.Equal(t, session, now.Session)

	rwRelease(t, cb, hstream, hseq)
	a := moved.acquired(10 * time.Second).GetSequencer()
	assert.Equal(t, session, a.GetSessionId())
	assert.Equal(t, read, a.GetRead())
	assert.Greater(t, a.GetToken(), hseq.GetToken())
	rwNotGranted(t, later, "the writer that came after the moved wait")
	rwRelease(t, cb, moved, a)
	l := later.acquired(10 * time.Second).GetSequencer()
	assert.Greater(t, l.GetToken(), a.GetToken())
}

// A multi-key wait for X and Y (Y held on replica B) queues on replica A;
// a lock waiter on Y comes after it on B. A is killed; the wait resumes on
// B with its session and both keys (refused with other keys), keeping
// its tickets (CreateIndex). Y's release grants it both keys, ahead of
// the later waiter.
func TestMultiKeyMovedWaitKeepsItsPlace(t *testing.T) {
	pa, ca, cb, cli := movedWaitReplicas(t)
	keys := mkKeys("multi/moved-wait", 2)
	holder := acquire(t, cb, &lockbrokerv1.AcquireRequest{Key: keys[1], Session: fast()})
	hseq := holder.acquired(10 * time.Second).GetSequencer()

	w := acquire(t, ca, multiReq(keys, "moved"))
	session := queuedSession(t, w, "the multi-key waiter")
	var tickets []*api.KVPair
	for _, k := range keys {
		p, _, err := cli.KV().Get(k+"/.queue/"+session, nil)
		require.NoError(t, err)
		require.NotNil(t, p, "no ticket on %q", k)
		tickets = append(tickets, p)
	}
	later := acquire(t, cb, &lockbrokerv1.AcquireRequest{Key: keys[1], Value: []byte("later"), Session: fast()})
	queuedSession(t, later, "the later waiter")

	pa.Kill()
	resume := &lockbrokerv1.AcquireRequest_Resume{Resume: &lockbrokerv1.Sequencer{Key: keys[0], SessionId: session}}
	bad := acquire(t, cb, &lockbrokerv1.AcquireRequest{Key: keys[0], Session: resume})
	require.Error(t, bad.end(10*time.Second), "a multi-key wait resumed without its other key was accepted")

	moved := acquire(t, cb, &lockbrokerv1.AcquireRequest{Key: keys[0], Keys: keys[1:], Value: []byte("moved"), Session: resume})
	assert.Equal(t, session, queuedSession(t, moved, "the moved wait"))
	for i, k := range keys {
		p, _, err := cli.KV().Get(k+"/.queue/"+session, nil)
		require.NoError(t, err)
		require.NotNil(t, p, "the moved wait lost its ticket on %q", k)
		assert.Equal(t, tickets[i].CreateIndex, p.CreateIndex, "the moved wait lost its place on %q", k)
	}

	_, err := cb.Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: keys[1], SessionId: hseq.GetSessionId(), Token: hseq.GetToken()})
	require.NoError(t, err)
	a := moved.acquired(10 * time.Second)
	require.Len(t, a.GetSequencers(), 2)
	assert.Equal(t, session, a.GetSequencer().GetSessionId())
	assert.Greater(t, a.GetSequencers()[1].GetToken(), hseq.GetToken())
	rwNotGranted(t, later, "the lock waiter that came after the moved wait")
	_, err = cb.Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: keys[0], SessionId: session, Token: a.GetSequencer().GetToken()})
	require.NoError(t, err)
	l := later.acquired(10 * time.Second).GetSequencer()
	assert.Greater(t, l.GetToken(), a.GetSequencers()[1].GetToken())
}
