package e2e

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// Issue 43 item 1: the read-write lock. Readers share, a writer excludes
// everyone, waiters are served in arrival order across replicas, and every
// grant's token is above every token granted on the key before it.

// rwReq is a read (read) or write request on key with a fast session.
func rwReq(key string, read bool, value string) *lockbrokerv1.AcquireRequest {
	kind := lockbrokerv1.AcquireKind_ACQUIRE_KIND_WRITE
	if read {
		kind = lockbrokerv1.AcquireKind_ACQUIRE_KIND_READ
	}
	return &lockbrokerv1.AcquireRequest{Key: key, Value: []byte(value), Kind: kind, Session: fast()}
}

// rwHold acquires key and returns the stream and its sequencer.
func rwHold(t *testing.T, c lockbrokerv1.LockServiceClient, key string, read bool, value string) (*stream, *lockbrokerv1.Sequencer) {
	t.Helper()
	s := acquire(t, c, rwReq(key, read, value))
	seq := s.acquired(10 * time.Second).GetSequencer()
	require.Equal(t, lockbrokerv1.LockKind_LOCK_KIND_RWLOCK, seq.GetKind())
	require.Equal(t, read, seq.GetRead())
	return s, seq
}

// rwQueued opens a request on key and waits until it is queued; it
// returns the stream and its session.
func rwQueued(t *testing.T, c lockbrokerv1.LockServiceClient, key string, read bool, value string) *stream {
	t.Helper()
	s := acquire(t, c, rwReq(key, read, value))
	ev := s.next(10*time.Second, func(r *lockbrokerv1.AcquireResponse) bool {
		return r.GetQueued() != nil || r.GetAcquired() != nil
	})
	require.NotNil(t, ev.GetQueued(), "%s request %q granted at once, want queued", map[bool]string{true: "read", false: "write"}[read], value)
	return s
}

// rwNotGranted fails if s has an `acquired` among the events it has now.
func rwNotGranted(t *testing.T, s *stream, what string) {
	t.Helper()
	for {
		select {
		case ev, ok := <-s.events:
			if !ok {
				return
			}
			require.Nil(t, ev.GetAcquired(), "%s granted out of turn", what)
		default:
			return
		}
	}
}

func rwRelease(t *testing.T, c lockbrokerv1.LockServiceClient, s *stream, seq *lockbrokerv1.Sequencer) {
	t.Helper()
	resp, err := c.Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: seq.GetKey(), SessionId: seq.GetSessionId(), Token: seq.GetToken()})
	require.NoError(t, err)
	require.True(t, resp.GetReleased())
	s.next(5*time.Second, lkIsReleased)
}

// rwTwoReplicas starts two broker replicas on one agent: one in this
// process (so that -race sees the broker) and one broker process. It
// returns a LockService client of each and an AdminService client of the
// first.
func rwTwoReplicas(t *testing.T) (*consultest.Agent, []lockbrokerv1.LockServiceClient, lockbrokerv1.AdminServiceClient) {
	t.Helper()
	agent := consultest.Start(t)
	local := brokertest.Start(t, agent)
	remote := lkDial(t, brokertest.StartProcess(t, agent).Addr)
	cs := []lockbrokerv1.LockServiceClient{local.Locks(t), lockbrokerv1.NewLockServiceClient(remote)}
	return agent, cs, lockbrokerv1.NewAdminServiceClient(local.Conn(t))
}

// Two readers on two replicas share the key; a writer waits for both,
// and a reader that arrives behind the writer waits for the writer. The
// writer's token is above both readers'. GetLock, Watch, ListHolds and
// CheckSequencer show it all.
func TestRWReadersShareWriterExcludes(t *testing.T) {
	_, cs, admin := rwTwoReplicas(t)
	key := "rw/share"

	watchCtx, stopWatch := context.WithTimeout(context.Background(), time.Minute)
	defer stopWatch()
	watch, err := cs[1].Watch(watchCtx, &lockbrokerv1.WatchRequest{Key: key})
	require.NoError(t, err)
	first, err := watch.Recv()
	require.NoError(t, err)
	require.Equal(t, lockbrokerv1.LockKind_LOCK_KIND_NONE, first.GetState().GetKind())

	r1, s1 := rwHold(t, cs[0], key, true, "r1")
	r2, s2 := rwHold(t, cs[1], key, true, "r2")
	assert.Greater(t, s2.GetToken(), s1.GetToken(), "tokens strictly increase")

	st := lkGetLock(t, cs[0], key)
	require.Equal(t, lockbrokerv1.LockKind_LOCK_KIND_RWLOCK, st.GetKind())
	require.Len(t, st.GetHolders(), 2)
	for _, h := range st.GetHolders() {
		assert.True(t, h.GetRead(), "holder %s reads", h.GetSessionId())
	}
	assert.Equal(t, s1.GetToken(), st.GetHolders()[0].GetToken(), "GetLock shows the exact token")

	// The watch reaches the two readers.
	for {
		w, err := watch.Recv()
		require.NoError(t, err)
		if len(w.GetState().GetHolders()) == 2 {
			assert.Equal(t, lockbrokerv1.LockKind_LOCK_KIND_RWLOCK, w.GetState().GetKind())
			assert.True(t, w.GetState().GetHolders()[0].GetRead() && w.GetState().GetHolders()[1].GetRead())
			break
		}
	}

	w := rwQueued(t, cs[0], key, false, "w")
	r3 := rwQueued(t, cs[1], key, true, "r3") // behind the writer: waits
	awaitPosition(t, r3, 2)

	hs, err := admin.ListHolds(lkCtx(t), &lockbrokerv1.ListHoldsRequest{KeyPrefix: key})
	require.NoError(t, err)
	var held, waiting []*lockbrokerv1.HoldInfo
	for _, h := range hs.GetHolds() {
		if h.GetKey() != key {
			continue
		}
		if h.GetWaiting() {
			waiting = append(waiting, h)
		} else {
			held = append(held, h)
		}
	}
	require.Len(t, held, 2)
	for _, h := range held {
		assert.True(t, h.GetRead())
	}
	require.Len(t, waiting, 2, "ListHolds lists both waiters")
	assert.False(t, waiting[0].GetRead(), "the writer is first")
	assert.EqualValues(t, 1, waiting[0].GetPosition())
	assert.True(t, waiting[1].GetRead(), "the reader is second")
	assert.EqualValues(t, 2, waiting[1].GetPosition())

	rwRelease(t, cs[1], r1, s1) // released through the other replica
	rwNotGranted(t, w, "the writer beside a reader")
	r2.cancel()
	aw := w.acquired(10 * time.Second).GetSequencer()
	assert.False(t, aw.GetRead())
	assert.Greater(t, aw.GetToken(), s2.GetToken(), "the writer's token is above every earlier grant")
	rwNotGranted(t, r3, "the reader beside the writer")

	st = lkGetLock(t, cs[1], key)
	h := lkHolder(t, st)
	assert.False(t, h.GetRead())
	assert.Equal(t, aw.GetSessionId(), h.GetSessionId())

	for _, c := range []struct {
		seq  *lockbrokerv1.Sequencer
		want bool
	}{{s1, false}, {s2, false}, {aw, true}} {
		resp, err := cs[1].CheckSequencer(lkCtx(t), &lockbrokerv1.CheckSequencerRequest{Sequencer: c.seq})
		require.NoError(t, err)
		assert.Equal(t, c.want, resp.GetCurrent(), "CheckSequencer of token %d", c.seq.GetToken())
	}

	rwRelease(t, cs[1], w, aw)
	a3 := r3.acquired(10 * time.Second).GetSequencer()
	assert.True(t, a3.GetRead())
	assert.Greater(t, a3.GetToken(), aw.GetToken())
}

// Readers and writers queue interleaved over two replicas behind a writer
// and are granted in arrival order, batch by batch: consecutive readers
// together, each writer alone. Repeated.
func TestRWArrivalOrderAcrossReplicas(t *testing.T) {
	_, cs, _ := rwTwoReplicas(t)
	reps := 4
	if lkRace {
		reps = 2
	}
	// The arrival order behind the first writer, and the batches it must
	// be granted in.
	pattern := "RRWRWRRRWW"
	for rep := range reps {
		key := fmt.Sprintf("rw/order/%d", rep)
		w0, s0 := rwHold(t, cs[rep%2], key, false, "w0")
		var waiters []*stream
		for i, k := range pattern {
			s := rwQueued(t, cs[i%2], key, k == 'R', fmt.Sprintf("%c%d", k, i))
			awaitPosition(t, s, uint32(i+1))
			waiters = append(waiters, s)
		}
		var batches [][]int
		for i := 0; i < len(pattern); {
			j := i + 1
			if pattern[i] == 'R' {
				for j < len(pattern) && pattern[j] == 'R' {
					j++
				}
			}
			var b []int
			for k := i; k < j; k++ {
				b = append(b, k)
			}
			batches = append(batches, b)
			i = j
		}
		floor := s0.GetToken()
		rwRelease(t, cs[(rep+1)%2], w0, s0)
		for _, b := range batches {
			seqs := map[int]*lockbrokerv1.Sequencer{}
			for _, i := range b {
				seq := waiters[i].acquired(10 * time.Second).GetSequencer()
				assert.Equal(t, pattern[i] == 'R', seq.GetRead(), "rep %d waiter %d's mode", rep, i)
				assert.Greater(t, seq.GetToken(), floor, "rep %d waiter %d's token is above every grant of an earlier batch", rep, i)
				seqs[i] = seq
			}
			last := b[len(b)-1]
			for k := last + 1; k < len(pattern); k++ {
				rwNotGranted(t, waiters[k], fmt.Sprintf("rep %d waiter %d (batch ending at %d)", rep, k, last))
			}
			st := lkGetLock(t, cs[rep%2], key)
			require.Len(t, st.GetHolders(), len(b), "rep %d: the batch %v holds, nobody else", rep, b)
			for _, i := range b {
				floor = max(floor, seqs[i].GetToken())
				rwRelease(t, cs[i%2], waiters[i], seqs[i])
			}
		}
	}
}

// A reader whose session is destroyed, and a writer whose contender entry
// is deleted, hear `lost` within 1 s; a ForceRelease ends every reader.
func TestRWLoss(t *testing.T) {
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	c := r.Locks(t)
	consul := agent.Client()
	admin := lockbrokerv1.NewAdminServiceClient(r.Conn(t))

	lostWithin := func(s *stream, d time.Duration) *lockbrokerv1.AcquireLost {
		t.Helper()
		start := time.Now()
		ev := s.next(5*time.Second, isLost)
		assert.Less(t, time.Since(start), d, "lost within the promise")
		return ev.GetLost()
	}

	key := "rw/loss"
	s1, seq1 := rwHold(t, c, key, true, "r1")
	s2, _ := rwHold(t, c, key, true, "r2")
	_, err := consul.Session().Destroy(seq1.GetSessionId(), nil)
	require.NoError(t, err)
	lost := lostWithin(s1, time.Second)
	assert.Equal(t, lockbrokerv1.LostReason_LOST_REASON_SESSION_INVALIDATED, lost.GetReason(), "%v", lost)
	// The other reader holds on.
	st := lkGetLock(t, c, key)
	require.Len(t, st.GetHolders(), 1)
	s2.cancel()

	key = "rw/loss-delete"
	w, wseq := rwHold(t, c, key, false, "w")
	_, err = consul.KV().Delete(key+"/"+wseq.GetSessionId(), nil)
	require.NoError(t, err)
	lost = lostWithin(w, time.Second)
	assert.Equal(t, lockbrokerv1.LostReason_LOST_REASON_DELETED_BY_OTHER, lost.GetReason(), "%v", lost)

	key = "rw/loss-force"
	a, _ := rwHold(t, c, key, true, "a")
	b, _ := rwHold(t, c, key, true, "b")
	resp, err := admin.ForceRelease(lkCtx(t), &lockbrokerv1.ForceReleaseRequest{Key: key})
	require.NoError(t, err)
	assert.EqualValues(t, 2, resp.GetReleased())
	for _, s := range []*stream{a, b} {
		lost := lostWithin(s, time.Second)
		assert.Equal(t, lockbrokerv1.LostReason_LOST_REASON_RELEASED_BY_OTHER, lost.GetReason(), "%v", lost)
	}
	// A writer gets the key next, above every earlier token.
	_, ws := rwHold(t, c, key, false, "w2")
	assert.Greater(t, ws.GetToken(), wseq.GetToken())
}

// A reader held through a replica that is killed resumes on another
// replica with its token; resuming it as a writer is refused.
func TestRWResumeAfterKill(t *testing.T) {
	agent := consultest.Start(t)
	p1 := brokertest.StartProcess(t, agent)
	p2 := brokertest.StartProcess(t, agent)
	c1 := lockbrokerv1.NewLockServiceClient(lkDial(t, p1.Addr))
	c2 := lockbrokerv1.NewLockServiceClient(lkDial(t, p2.Addr))
	key := "rw/resume"

	_, rseq := rwHold(t, c1, key, true, "r")
	_, other := rwHold(t, c2, key, true, "other")
	p1.Kill()

	// Kind WRITE on a read grant: refused.
	bad := acquire(t, c2, &lockbrokerv1.AcquireRequest{Key: key, Kind: lockbrokerv1.AcquireKind_ACQUIRE_KIND_WRITE, Session: &lockbrokerv1.AcquireRequest_Resume{Resume: rseq}})
	err := bad.end(10 * time.Second)
	require.Equal(t, codes.FailedPrecondition, status.Code(err), "%v", err)

	s := acquire(t, c2, &lockbrokerv1.AcquireRequest{Key: key, Kind: lockbrokerv1.AcquireKind_ACQUIRE_KIND_READ, Session: &lockbrokerv1.AcquireRequest_Resume{Resume: rseq}})
	a := s.acquired(10 * time.Second)
	assert.True(t, a.GetResumed())
	assert.Equal(t, rseq.GetToken(), a.GetSequencer().GetToken(), "the resumed hold keeps its token")
	assert.True(t, a.GetSequencer().GetRead())
	assert.Equal(t, lockbrokerv1.LockKind_LOCK_KIND_RWLOCK, a.GetSequencer().GetKind())
	s.next(10*time.Second, lkIsKeepalive)

	st := lkGetLock(t, c2, key)
	require.Len(t, st.GetHolders(), 2)
	// A writer waits for both readers, then gets a token above both.
	w := rwQueued(t, c2, key, false, "w")
	rwRelease(t, c2, s, a.GetSequencer())
	rwNotGranted(t, w, "the writer beside a reader")
	_, err = c2.Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: key, SessionId: other.GetSessionId(), Token: other.GetToken()})
	require.NoError(t, err)
	ws := w.acquired(10 * time.Second).GetSequencer()
	assert.Greater(t, ws.GetToken(), max(rseq.GetToken(), other.GetToken()))
}

// Consul's own recipes refuse a read-write lock's key with their own
// conflict errors, and change nothing; the broker refuses a lock or
// semaphore request on it, and a read or write request on a lock or a
// semaphore, with LIMIT_CONFLICT naming the kind found.
func TestRWKindConflicts(t *testing.T) {
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	c := r.Locks(t)
	consul := agent.Client()

	key := "rw/interop"
	rs, rseq := rwHold(t, c, key, true, "reader")
	before := lkConsulState(t, consul).KV

	t.Run("api.Lock", func(t *testing.T) {
		l, err := consul.LockOpts(&api.LockOptions{Key: key, LockTryOnce: true, LockWaitTime: time.Second})
		require.NoError(t, err)
		_, err = l.Lock(nil)
		require.ErrorIs(t, err, api.ErrLockConflict)
	})
	t.Run("api.Semaphore", func(t *testing.T) {
		s, err := consul.SemaphoreOpts(&api.SemaphoreOptions{Prefix: key, Limit: 2, SemaphoreTryOnce: true, SemaphoreWaitTime: time.Second})
		require.NoError(t, err)
		_, err = s.Acquire(nil)
		require.ErrorIs(t, err, api.ErrSemaphoreConflict)
	})
	t.Run("broker lock on a read-write lock", func(t *testing.T) {
		s := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: key, Session: fast()})
		err := s.end(10 * time.Second)
		requireReason(t, err, codes.FailedPrecondition, "LIMIT_CONFLICT")
		assert.Contains(t, status.Convert(err).Message(), "read-write lock (kind RWLOCK)")
	})
	t.Run("broker semaphore on a read-write lock", func(t *testing.T) {
		s := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: key, Limit: 3, Session: fast()})
		err := s.end(10 * time.Second)
		requireReason(t, err, codes.FailedPrecondition, "LIMIT_CONFLICT")
		assert.Contains(t, status.Convert(err).Message(), "read-write lock (kind RWLOCK)")
	})

	// Nothing the refused requests did is left, but for api.Semaphore's
	// released contender entry (its session is gone) and sessions.
	after := lkConsulState(t, consul).KV
	mine := func(kv api.KVPairs) map[string]uint64 {
		out := map[string]uint64{}
		for _, p := range kv {
			if strings.HasPrefix(p.Key, key) && (p.Session != "" || p.Flags != semFlags) {
				out[p.Key] = p.ModifyIndex
			}
		}
		return out
	}
	assert.Equal(t, mine(before), mine(after), "the read-write lock's entries are untouched")
	st := lkGetLock(t, c, key)
	require.Len(t, st.GetHolders(), 1)
	assert.Equal(t, rseq.GetSessionId(), st.GetHolders()[0].GetSessionId())
	assert.Equal(t, lockbrokerv1.LockKind_LOCK_KIND_RWLOCK, st.GetKind())
	select {
	case ev := <-rs.events:
		assert.Nil(t, ev.GetLost(), "the reader is not disturbed")
	default:
	}

	// A read or write request on a lock and on a semaphore.
	_ = acquire(t, c, &lockbrokerv1.AcquireRequest{Key: "rw/plain", Session: fast()}).acquired(10 * time.Second)
	semHold(t, c, "rw/sem", 2, "s")
	for _, tt := range []struct {
		key, kind string
		read      bool
	}{{"rw/plain", "kind LOCK", true}, {"rw/plain", "kind LOCK", false}, {"rw/sem", "kind SEMAPHORE", true}, {"rw/sem", "kind SEMAPHORE", false}} {
		s := acquire(t, c, rwReq(tt.key, tt.read, "x"))
		err := s.end(10 * time.Second)
		requireReason(t, err, codes.FailedPrecondition, "LIMIT_CONFLICT")
		assert.Contains(t, status.Convert(err).Message(), tt.kind, "the message names the kind found")
	}
	// A try-once read on api.Lock's key.
	l, err := consul.LockKey("rw/consul-lock")
	require.NoError(t, err)
	_, err = l.Lock(nil)
	require.NoError(t, err)
	defer func() { _ = l.Unlock() }()
	s := acquire(t, c, rwReq("rw/consul-lock", true, "x"))
	requireReason(t, s.end(10*time.Second), codes.FailedPrecondition, "LIMIT_CONFLICT")
}

// Bad read-write requests are INVALID_ARGUMENT naming the field, and
// write nothing to Consul.
func TestRWInvalidArguments(t *testing.T) {
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	c := r.Locks(t)
	consul := agent.Client()
	before := lkConsulState(t, consul)
	for _, kind := range []lockbrokerv1.AcquireKind{lockbrokerv1.AcquireKind_ACQUIRE_KIND_READ, lockbrokerv1.AcquireKind_ACQUIRE_KIND_WRITE} {
		s := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: "rw/bad", Kind: kind, Limit: 2, Session: fast()})
		err := s.end(10 * time.Second)
		require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
		assert.Contains(t, status.Convert(err).Message(), "limit")
		_, err = c.TryAcquire(lkCtx(t), &lockbrokerv1.TryAcquireRequest{Key: "rw/bad", Kind: kind, Limit: 5, SessionId: "00000000-0000-0000-0000-000000000000"})
		require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
		assert.Contains(t, status.Convert(err).Message(), "limit")
	}
	after := lkConsulState(t, consul)
	assert.Equal(t, before.KV, after.KV, "nothing written")
	assert.Equal(t, len(before.Sessions), len(after.Sessions), "no session made")
}

// TryAcquire with kind READ and WRITE on client-owned sessions: readers
// share, a writer is refused while they hold, then granted above them.
func TestRWTryAcquireClientSessions(t *testing.T) {
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	c := r.Locks(t)
	sessions := lockbrokerv1.NewSessionServiceClient(r.Conn(t))
	key := "rw/try"
	newSession := func() string {
		resp, err := sessions.CreateSession(lkCtx(t), &lockbrokerv1.CreateSessionRequest{Options: &lockbrokerv1.SessionOptions{Ttl: dur(30 * time.Second), LockDelay: dur(0)}})
		require.NoError(t, err)
		return resp.GetSession().GetId()
	}
	try := func(sid string, kind lockbrokerv1.AcquireKind) (*lockbrokerv1.Sequencer, error) {
		resp, err := c.TryAcquire(lkCtx(t), &lockbrokerv1.TryAcquireRequest{Key: key, Kind: kind, SessionId: sid})
		return resp.GetSequencer(), err
	}
	read, write := lockbrokerv1.AcquireKind_ACQUIRE_KIND_READ, lockbrokerv1.AcquireKind_ACQUIRE_KIND_WRITE
	a, b, w := newSession(), newSession(), newSession()
	sa, err := try(a, read)
	require.NoError(t, err)
	assert.True(t, sa.GetRead())
	sb, err := try(b, read)
	require.NoError(t, err)
	assert.Greater(t, sb.GetToken(), sa.GetToken())
	_, err = try(w, write)
	require.Equal(t, codes.Aborted, status.Code(err), "%v", err)
	// The refused try left no contender entry.
	kv, _, err := agent.Client().KV().Get(key+"/"+w, &api.QueryOptions{RequireConsistent: true})
	require.NoError(t, err)
	assert.Nil(t, kv, "a refused try writes no entry")
	// A reader changes its value; its grant stays the same.
	sv, err := c.SetValue(lkCtx(t), &lockbrokerv1.SetValueRequest{Key: key, SessionId: a, Value: []byte("a2"), Token: sa.GetToken()})
	require.NoError(t, err)
	assert.Equal(t, sa.GetToken(), sv.GetSequencer().GetToken())
	assert.True(t, sv.GetSequencer().GetRead())
	for _, h := range lkGetLock(t, c, key).GetHolders() {
		if h.GetSessionId() == a {
			assert.Equal(t, "a2", string(h.GetValue()))
			assert.Equal(t, sa.GetToken(), h.GetToken())
		}
	}
	// Asking again with the same session: the same grant.
	again, err := try(a, read)
	require.NoError(t, err)
	assert.Equal(t, sa.GetToken(), again.GetToken())

	for _, s := range []*lockbrokerv1.Sequencer{sa, sb} {
		resp, err := c.Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: key, SessionId: s.GetSessionId(), Token: s.GetToken()})
		require.NoError(t, err)
		assert.True(t, resp.GetReleased())
	}
	// A stale token releases nothing, and says so.
	resp, err := c.Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: key, SessionId: a, Token: sa.GetToken()})
	require.NoError(t, err)
	assert.False(t, resp.GetReleased())
	sw, err := try(w, write)
	require.NoError(t, err)
	assert.False(t, sw.GetRead())
	assert.Greater(t, sw.GetToken(), sb.GetToken())
	_, err = try(a, read)
	require.Equal(t, codes.Aborted, status.Code(err), "%v", err)
	var se interface{ GRPCStatus() *status.Status }
	require.True(t, errors.As(err, &se))
}

// A writer whose wait times out, and one whose client goes away, leave
// the queue: the reader behind them is granted beside the reader that
// holds, and no entry of theirs is left in Consul.
func TestRWWaitersThatLeave(t *testing.T) {
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	c := r.Locks(t)
	consul := agent.Client()
	key := "rw/leave"

	_, r1 := rwHold(t, c, key, true, "r1")
	req := rwReq(key, false, "w1")
	req.WaitTimeout = dur(300 * time.Millisecond)
	w1 := acquire(t, c, req)
	var w1session string
	ev := w1.next(5*time.Second, isQueued)
	w1session = ev.GetQueued().GetSessionId()
	require.NotEmpty(t, w1session)
	err := w1.end(10 * time.Second)
	require.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)

	w2 := rwQueued(t, c, key, false, "w2")
	r2 := rwQueued(t, c, key, true, "r2")
	awaitPosition(t, r2, 2)
	w2.cancel()
	a := r2.acquired(10 * time.Second).GetSequencer()
	assert.True(t, a.GetRead())
	assert.Greater(t, a.GetToken(), r1.GetToken())
	st := lkGetLock(t, c, key)
	require.Len(t, st.GetHolders(), 2, "the two readers share")

	require.Eventually(t, func() bool {
		kv, _, err := consul.KV().Get(key+"/"+w1session, &api.QueryOptions{RequireConsistent: true})
		return err == nil && kv == nil
	}, 10*time.Second, 50*time.Millisecond, "the timed-out writer's entry is gone")
}
