package client_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/lockbroker/lockbroker/client"
	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// newClient starts Consul and a broker replica and returns a client of it
// and the replica.
func newClient(t *testing.T) (*client.Client, *brokertest.Replica) {
	t.Helper()
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	return client.New(dial(t, r.Addr)), r
}

func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func sessions(hs []*lockbrokerv1.Holder) []string {
	var out []string
	for _, h := range hs {
		out = append(out, h.GetSessionId())
	}
	return out
}

// Busy and timed-out requests fail with sentinels that carry the status's
// details: the reason and the holders; the gRPC code stays visible.
func TestErrorsCarryStatusDetails(t *testing.T) {
	c, _ := newClient(t)
	const key = "client/errors"
	lease, err := c.Lock(ctx(t), key, client.WithValue([]byte("a")), client.WithLockDelay(0))
	require.NoError(t, err)
	holder := lease.Sequencer().GetSessionId()

	_, err = c.TryLock(ctx(t), key)
	require.ErrorIs(t, err, client.ErrBusy)
	var se *client.StatusError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, codes.Aborted, se.Code)
	assert.Equal(t, codes.Aborted, status.Code(err), "status.Code sees the broker's code")
	assert.Equal(t, "LOCK_HELD", se.Reason)
	assert.Equal(t, []string{holder}, sessions(se.Holders))
	assert.Equal(t, "a", string(se.Holders[0].GetValue()))

	start := time.Now()
	_, err = c.Lock(ctx(t), key, client.WithWaitTimeout(500*time.Millisecond))
	assert.GreaterOrEqual(t, time.Since(start), 450*time.Millisecond)
	require.ErrorIs(t, err, client.ErrWaitTimeout)
	assert.NotErrorIs(t, err, client.ErrBusy)
	require.ErrorAs(t, err, &se)
	assert.Equal(t, codes.DeadlineExceeded, status.Code(err))
	assert.Equal(t, "WAIT_TIMEOUT", se.Reason)
	assert.Equal(t, []string{holder}, sessions(se.Holders))

	_, err = c.Lock(ctx(t), "/bad")
	require.ErrorIs(t, err, client.ErrInvalidArgument)
	require.ErrorAs(t, err, &se)
	require.NotEmpty(t, se.FieldViolations)
	assert.Equal(t, "key", se.FieldViolations[0].GetField())

	_, err = c.Lock(ctx(t), key, client.WithLimit(3), client.WithWaitTimeout(0))
	assert.ErrorIs(t, err, client.ErrConflict, "a semaphore where a lock is: %v", err)

	require.NoError(t, lease.Release(ctx(t)))
	assert.Equal(t, client.ErrReleased, lease.Err(), "its own release is ErrReleased itself")
}

// Each way a lease ends has its cause, with the names every library uses.
func TestLossCauses(t *testing.T) {
	c, r := newClient(t)
	other := client.New(dial(t, r.Addr))

	t.Run("RELEASED by a Release from elsewhere", func(t *testing.T) {
		lease, err := c.Lock(ctx(t), "client/loss/released", client.WithLockDelay(0))
		require.NoError(t, err)
		seq := lease.Sequencer()
		ok, err := other.Release(ctx(t), seq.GetKey(), seq.GetSessionId(), seq.GetToken())
		require.NoError(t, err)
		assert.True(t, ok)
		waitLost(t, lease)
		var le *client.LostError
		require.ErrorAs(t, lease.Err(), &le)
		assert.Equal(t, client.CauseReleased, le.Cause)
		assert.ErrorIs(t, lease.Err(), client.ErrReleased, "a Release from elsewhere is a release too")
		assert.NoError(t, lease.Release(ctx(t)))
	})

	t.Run("SESSION_INVALIDATED when the session is destroyed", func(t *testing.T) {
		lease, err := c.Lock(ctx(t), "client/loss/destroyed", client.WithLockDelay(0))
		require.NoError(t, err)
		require.NoError(t, other.DestroySession(ctx(t), lease.Sequencer().GetSessionId()))
		waitLost(t, lease)
		var le *client.LostError
		require.ErrorAs(t, lease.Err(), &le)
		assert.Contains(t, []string{"SESSION_INVALIDATED", "RELEASED_BY_OTHER", "DELETED_BY_OTHER"}, le.Cause)
		assert.Equal(t, le.Cause, le.Reason.String()[len("LOST_REASON_"):])
		assert.NotErrorIs(t, lease.Err(), client.ErrReleased)
		assert.Equal(t, lease.Err(), lease.Release(ctx(t)), "releasing a lost lease returns its loss")
	})
}

func waitLost(t *testing.T, lease *client.Lease) {
	t.Helper()
	select {
	case <-lease.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("lease not ended within 5s")
	}
}

// Client-owned sessions: create, take a key without a stream, see it in
// ListSessions, busy for another session, release, destroy.
func TestTryAcquireWithClientOwnedSession(t *testing.T) {
	c, _ := newClient(t)
	const key = "client/cron/nightly"
	s1, err := c.CreateSession(ctx(t), &lockbrokerv1.SessionOptions{Ttl: durationpb.New(30 * time.Second), LockDelay: durationpb.New(0), Name: "cron-1"})
	require.NoError(t, err)
	s2, err := c.CreateSession(ctx(t), &lockbrokerv1.SessionOptions{LockDelay: durationpb.New(0)})
	require.NoError(t, err)

	seq, err := c.TryAcquire(ctx(t), s1.GetId(), key, client.WithValue([]byte("job-1")))
	require.NoError(t, err)
	assert.NotZero(t, seq.GetToken())
	assert.Equal(t, s1.GetId(), seq.GetSessionId())
	again, err := c.TryAcquire(ctx(t), s1.GetId(), key)
	require.NoError(t, err)
	assert.Equal(t, seq.GetToken(), again.GetToken(), "the holder gets its current grant back")

	_, err = c.TryAcquire(ctx(t), s2.GetId(), key)
	require.ErrorIs(t, err, client.ErrBusy)
	var se *client.StatusError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, "LOCK_HELD", se.Reason)
	assert.Equal(t, []string{s1.GetId()}, sessions(se.Holders))
	st, err := c.GetLock(ctx(t), key)
	require.NoError(t, err)
	require.Len(t, st.GetHolders(), 1)
	assert.Equal(t, "cron-1", st.GetHolders()[0].GetSessionName(), "holders show the session's name")

	_, err = c.TryAcquire(ctx(t), s2.GetId(), key, client.WithTTL(time.Minute))
	assert.Error(t, err, "session options do not apply")

	list, err := c.ListSessions(ctx(t))
	require.NoError(t, err)
	var found *lockbrokerv1.SessionSummary
	for _, s := range list {
		if s.GetSession().GetId() == s1.GetId() {
			found = s
		}
	}
	require.NotNil(t, found, "ListSessions has the session")
	assert.False(t, found.GetBrokerOwned())
	require.Len(t, found.GetHolds(), 1)
	assert.Equal(t, key, found.GetHolds()[0].GetKey())
	assert.Equal(t, seq.GetToken(), found.GetHolds()[0].GetToken())

	guaranteed, err := c.RenewSession(ctx(t), s1.GetId())
	require.NoError(t, err)
	assert.Greater(t, guaranteed, 10*time.Second)

	ok, err := c.Release(ctx(t), key, s1.GetId(), seq.GetToken())
	require.NoError(t, err)
	assert.True(t, ok)
	ok, err = c.Release(ctx(t), key, s1.GetId(), seq.GetToken())
	require.NoError(t, err)
	assert.False(t, ok, "a retry after success")

	next, err := c.TryAcquire(ctx(t), s2.GetId(), key)
	require.NoError(t, err)
	assert.Greater(t, next.GetToken(), seq.GetToken())
	require.NoError(t, c.DestroySession(ctx(t), s1.GetId()))
	require.NoError(t, c.DestroySession(ctx(t), s2.GetId()))
	_, err = c.GetSession(ctx(t), s1.GetId())
	assert.ErrorIs(t, err, client.ErrSessionNotFound)
}

// WithSemaphore takes a one-slot semaphore, which limit 1 alone cannot
// express (it means a lock).
func TestOneSlotSemaphore(t *testing.T) {
	c, _ := newClient(t)
	const prefix = "client/sem1"
	lease, err := c.Lock(ctx(t), prefix, client.WithSemaphore(), client.WithLockDelay(0))
	require.NoError(t, err)
	assert.Equal(t, lockbrokerv1.LockKind_LOCK_KIND_SEMAPHORE, lease.Sequencer().GetKind())
	st, err := c.GetLock(ctx(t), prefix)
	require.NoError(t, err)
	assert.Equal(t, lockbrokerv1.LockKind_LOCK_KIND_SEMAPHORE, st.GetKind())
	assert.EqualValues(t, 1, st.GetLimit())

	_, err = c.TryLock(ctx(t), prefix, client.WithSemaphore())
	assert.ErrorIs(t, err, client.ErrBusy, "the one slot is taken")
	require.NoError(t, lease.Release(ctx(t)))
	again, err := c.TryLock(ctx(t), prefix, client.WithKind(lockbrokerv1.AcquireKind_ACQUIRE_KIND_SEMAPHORE), client.WithLimit(1))
	require.NoError(t, err)
	require.NoError(t, again.Release(ctx(t)))
}

// A prefix watch sends the state of every key under it, then the
// snapshot-complete marker, then changes.
func TestWatchPrefixSnapshotComplete(t *testing.T) {
	c, _ := newClient(t)
	const prefix = "client/watch"
	a, err := c.Lock(ctx(t), prefix+"/a", client.WithLockDelay(0))
	require.NoError(t, err)
	b, err := c.Lock(ctx(t), prefix+"/b", client.WithLockDelay(0))
	require.NoError(t, err)

	wctx, cancel := context.WithCancel(ctx(t))
	w, err := c.Watch(wctx, prefix, client.WithPrefix())
	require.NoError(t, err)
	next := func() *lockbrokerv1.WatchResponse {
		t.Helper()
		select {
		case resp, ok := <-w.C:
			require.True(t, ok, "watch ended: %v", w.Err())
			return resp
		case <-time.After(10 * time.Second):
			t.Fatal("no watch response within 10s")
			return nil
		}
	}
	held := map[string]string{}
	for {
		resp := next()
		if resp.GetSnapshotComplete() {
			assert.Nil(t, resp.GetState(), "the marker carries no state")
			break
		}
		if len(resp.GetState().GetHolders()) > 0 {
			held[resp.GetState().GetKey()] = resp.GetState().GetHolders()[0].GetSessionId()
		}
	}
	assert.Equal(t, map[string]string{
		prefix + "/a": a.Sequencer().GetSessionId(),
		prefix + "/b": b.Sequencer().GetSessionId(),
	}, held, "the snapshot has every key before the marker")

	require.NoError(t, a.Release(ctx(t)))
	for {
		resp := next()
		require.False(t, resp.GetSnapshotComplete(), "one marker only")
		if resp.GetState().GetKey() == prefix+"/a" && len(resp.GetState().GetHolders()) == 0 {
			break
		}
	}
	require.NoError(t, b.Release(ctx(t)))
	cancel()
	<-w.Done()
	assert.True(t, errors.Is(w.Err(), context.Canceled), "%v", w.Err())
}

// LostError's text names the cause as every library spells it.
func TestLostErrorText(t *testing.T) {
	tests := []struct {
		err  *client.LostError
		want string
	}{
		{&client.LostError{Reason: lockbrokerv1.LostReason_LOST_REASON_SESSION_INVALIDATED, Cause: "SESSION_INVALIDATED", Detail: "d"},
			"lease lost: SESSION_INVALIDATED: d"},
		{&client.LostError{Reason: lockbrokerv1.LostReason_LOST_REASON_RENEWAL_FAILED, Cause: client.CauseKeepaliveTimeout, Detail: "d"},
			"lease lost: KEEPALIVE_TIMEOUT: d"},
		{&client.LostError{Reason: lockbrokerv1.LostReason_LOST_REASON_REPLICA_CUT_OFF, Detail: "d"}, "lease lost: REPLICA_CUT_OFF: d"},
		{&client.LostError{Cause: client.CauseReleased, Detail: "d"}, "lease lost: RELEASED: d"},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, tt.err.Error())
	}
	assert.ErrorIs(t, tests[3].err, client.ErrReleased)
	assert.NotErrorIs(t, tests[0].err, client.ErrReleased)
}

// pastDeadline is a context whose deadline has passed but whose timer has
// not fired yet: the moment a broker's DEADLINE_EXCEEDED can arrive in.
type pastDeadline struct{ context.Context }

func (pastDeadline) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }

// TestCallerEndedByDeadline: a stream's DEADLINE_EXCEEDED once the caller's
// deadline has passed is the caller's own ending, whether or not its
// context's timer has fired; before the deadline, or another code, it is
// the broker's answer.
func TestCallerEndedByDeadline(t *testing.T) {
	deadlineErr := status.Error(codes.DeadlineExceeded, "context deadline exceeded")
	past := pastDeadline{context.Background()}
	future, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	done, stop := context.WithCancel(context.Background())
	stop()
	tests := []struct {
		name string
		ctx  context.Context
		err  error
		want bool
	}{
		{"deadline passed, timer not fired", past, deadlineErr, true},
		{"deadline passed, another code", past, status.Error(codes.Unavailable, "gone"), false},
		{"deadline ahead", future, deadlineErr, false},
		{"no deadline", context.Background(), deadlineErr, false},
		{"context done", done, status.Error(codes.Unavailable, "gone"), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, client.CallerEnded(tt.ctx, tt.err))
		})
	}
}

// lostBeforeGrant is a LockService whose Acquire says `queued` and then
// `lost`, as a broker does for a grant that came after its session's safe
// deadline (a path only a stopped broker process reaches).
type lostBeforeGrant struct {
	lockbrokerv1.UnimplementedLockServiceServer
}

func (lostBeforeGrant) Acquire(req *lockbrokerv1.AcquireRequest, stream grpc.ServerStreamingServer[lockbrokerv1.AcquireResponse]) error {
	if err := stream.Send(&lockbrokerv1.AcquireResponse{Event: &lockbrokerv1.AcquireResponse_Queued{Queued: &lockbrokerv1.AcquireQueued{}}}); err != nil {
		return err
	}
	return stream.Send(&lockbrokerv1.AcquireResponse{Event: &lockbrokerv1.AcquireResponse_Lost{Lost: &lockbrokerv1.AcquireLost{
		Reason: lockbrokerv1.LostReason_LOST_REASON_RENEWAL_FAILED, Detail: "the grant came after the session's safe deadline"}}})
}

// A `lost` instead of `acquired` fails Lock with the broker's reason, not
// with the end of the stream.
func TestLockLostBeforeGrant(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	lockbrokerv1.RegisterLockServiceServer(srv, lostBeforeGrant{})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	c := client.New(dial(t, lis.Addr().String()))

	l, err := c.Lock(ctx(t), "k")
	require.Error(t, err)
	assert.Nil(t, l)
	var le *client.LostError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, lockbrokerv1.LostReason_LOST_REASON_RENEWAL_FAILED, le.Reason)
	assert.Equal(t, "RENEWAL_FAILED", le.Cause)
	assert.Equal(t, "lease lost: RENEWAL_FAILED: the stream ended with lost before the grant: the grant came after the session's safe deadline", err.Error())
}
