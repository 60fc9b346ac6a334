package client_test

import (
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/lockbroker/lockbroker/client"
	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
)

// The client side of read-write and multi-key locks against scripted
// LockServices: what the library sends and how it reads the answers
// (grants per key, the lost key, the kind conflict, the resume). The
// broker's side is tested against Consul in rwmulti_test.go.

// scripted is a LockService whose Acquire records the request and then
// runs script on the stream.
type scripted struct {
	lockbrokerv1.UnimplementedLockServiceServer
	mu     sync.Mutex
	reqs   []*lockbrokerv1.AcquireRequest
	script func(req *lockbrokerv1.AcquireRequest, stream grpc.ServerStreamingServer[lockbrokerv1.AcquireResponse]) error
}

func (s *scripted) Acquire(req *lockbrokerv1.AcquireRequest, stream grpc.ServerStreamingServer[lockbrokerv1.AcquireResponse]) error {
	s.mu.Lock()
	s.reqs = append(s.reqs, proto.CloneOf(req))
	s.mu.Unlock()
	return s.script(req, stream)
}

func (s *scripted) requests() []*lockbrokerv1.AcquireRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*lockbrokerv1.AcquireRequest{}, s.reqs...)
}

// serve runs ls on a loopback listener and returns its address.
func serve(t *testing.T, ls lockbrokerv1.LockServiceServer) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	lockbrokerv1.RegisterLockServiceServer(srv, ls)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

const sid = "8a4a3a4e-1111-4222-8333-444455556666"

// grants are the sequencers of req's keys, tokens 10, 11, ...
func grants(req *lockbrokerv1.AcquireRequest) []*lockbrokerv1.Sequencer {
	var out []*lockbrokerv1.Sequencer
	read := req.GetKind() == lockbrokerv1.AcquireKind_ACQUIRE_KIND_READ
	kind := lockbrokerv1.LockKind_LOCK_KIND_LOCK
	if read || req.GetKind() == lockbrokerv1.AcquireKind_ACQUIRE_KIND_WRITE {
		kind = lockbrokerv1.LockKind_LOCK_KIND_RWLOCK
	}
	for i, k := range append([]string{req.GetKey()}, req.GetKeys()...) {
		out = append(out, &lockbrokerv1.Sequencer{Key: k, SessionId: sid, Token: uint64(10 + i), LockIndex: 1, Kind: kind, Read: read})
	}
	return out
}

func acquired(req *lockbrokerv1.AcquireRequest, resumed bool) *lockbrokerv1.AcquireResponse {
	seqs := grants(req)
	a := &lockbrokerv1.AcquireAcquired{Sequencer: seqs[0], GuaranteedFor: durationpb.New(10 * time.Second), Resumed: resumed}
	if len(seqs) > 1 {
		a.Sequencers = seqs
	}
	return &lockbrokerv1.AcquireResponse{Event: &lockbrokerv1.AcquireResponse_Acquired{Acquired: a}}
}

// RLock and Lock of an RWMutex ask for READ and WRITE (over a WithKind
// given), TryRLock/TryLock with a zero wait; WithKeys sends the keys in
// order; the lease has one sequencer per key and reports the lost key.
func TestRWAndMultiKeyRequestsAndGrants(t *testing.T) {
	lose := make(chan string, 1)
	ls := &scripted{script: func(req *lockbrokerv1.AcquireRequest, stream grpc.ServerStreamingServer[lockbrokerv1.AcquireResponse]) error {
		if err := stream.Send(acquired(req, false)); err != nil {
			return err
		}
		if len(req.GetKeys()) == 0 {
			<-stream.Context().Done()
			return nil
		}
		select {
		case k := <-lose:
			return stream.Send(&lockbrokerv1.AcquireResponse{Event: &lockbrokerv1.AcquireResponse_Lost{Lost: &lockbrokerv1.AcquireLost{
				Reason: lockbrokerv1.LostReason_LOST_REASON_DELETED_BY_OTHER, Detail: "key deleted", Key: k}}})
		case <-stream.Context().Done():
			return nil
		}
	}}
	c := client.New(dial(t, serve(t, ls)))
	rw := c.RWLock("rw/k")
	assert.Equal(t, "rw/k", rw.Key())

	r, err := rw.RLock(ctx(t), client.WithKind(lockbrokerv1.AcquireKind_ACQUIRE_KIND_LOCK))
	require.NoError(t, err)
	assert.True(t, r.Sequencer().GetRead())
	assert.Equal(t, lockbrokerv1.LockKind_LOCK_KIND_RWLOCK, r.Sequencer().GetKind())
	w, err := rw.Lock(ctx(t))
	require.NoError(t, err)
	assert.False(t, w.Sequencer().GetRead())
	tr, err := rw.TryRLock(ctx(t), client.WithWaitTimeout(time.Minute))
	require.NoError(t, err)
	tw, err := rw.TryLock(ctx(t))
	require.NoError(t, err)

	m, err := c.Lock(ctx(t), "multi/a", client.WithKeys("multi/b"), client.WithKeys("multi/c"))
	require.NoError(t, err)
	reqs := ls.requests()
	require.Len(t, reqs, 5)
	wantKinds := []lockbrokerv1.AcquireKind{lockbrokerv1.AcquireKind_ACQUIRE_KIND_READ, lockbrokerv1.AcquireKind_ACQUIRE_KIND_WRITE,
		lockbrokerv1.AcquireKind_ACQUIRE_KIND_READ, lockbrokerv1.AcquireKind_ACQUIRE_KIND_WRITE, lockbrokerv1.AcquireKind_ACQUIRE_KIND_UNSPECIFIED}
	for i, want := range wantKinds {
		assert.Equal(t, want, reqs[i].GetKind(), "request %d", i)
	}
	assert.Nil(t, reqs[0].GetWaitTimeout(), "RLock waits without a bound")
	assert.Zero(t, reqs[2].GetWaitTimeout().AsDuration(), "TryRLock tries once, over WithWaitTimeout")
	assert.NotNil(t, reqs[2].GetWaitTimeout())
	assert.NotNil(t, reqs[3].GetWaitTimeout())
	assert.Equal(t, []string{"multi/b", "multi/c"}, reqs[4].GetKeys())

	assert.Equal(t, []string{"multi/a", "multi/b", "multi/c"}, m.Keys())
	var keys []string
	var tokens []uint64
	for _, s := range m.Sequencers() {
		keys, tokens = append(keys, s.GetKey()), append(tokens, s.GetToken())
	}
	assert.Equal(t, []string{"multi/a", "multi/b", "multi/c"}, keys)
	assert.Equal(t, []uint64{10, 11, 12}, tokens)
	assert.Equal(t, m.Sequencer().GetToken(), tokens[0])
	require.Len(t, r.Sequencers(), 1, "a single key has one sequencer")
	assert.Equal(t, "", m.LostKey(), "no lost key while held")

	lose <- "multi/b"
	select {
	case <-m.Lost():
	case <-time.After(10 * time.Second):
		t.Fatal("the multi-key lease was not reported lost")
	}
	assert.Equal(t, "multi/b", m.LostKey())
	var le *client.LostError
	require.ErrorAs(t, m.Err(), &le)
	assert.Equal(t, "multi/b", le.Key)
	assert.Equal(t, "DELETED_BY_OTHER", le.Cause)

	for _, l := range []*client.Lease{r, w, tr, tw} {
		assert.NoError(t, l.Release(ctx(t))) // the fake has no Release: the stream's end releases
	}
}

// kindConflict is a LockService whose Acquire fails as a broker does for
// a key of another kind (LIMIT_CONFLICT with the key's LockState).
type kindConflict struct {
	lockbrokerv1.UnimplementedLockServiceServer
	found lockbrokerv1.LockKind
	msg   string
}

func (k kindConflict) Acquire(req *lockbrokerv1.AcquireRequest, _ grpc.ServerStreamingServer[lockbrokerv1.AcquireResponse]) error {
	st, err := status.New(codes.FailedPrecondition, k.msg).WithDetails(
		&errdetails.ErrorInfo{Reason: "LIMIT_CONFLICT", Domain: "lockbroker.v1", Metadata: map[string]string{"key": req.GetKey()}},
		&lockbrokerv1.LockState{Key: req.GetKey(), Kind: k.found, Limit: 3})
	if err != nil {
		return err
	}
	return st.Err()
}

// A key of another kind is ErrKindConflict (and ErrConflict); a
// semaphore's limit mismatch is ErrConflict only.
func TestKindConflictIsRecognisable(t *testing.T) {
	tests := []struct {
		name  string
		found lockbrokerv1.LockKind
		msg   string
		take  func(c *client.Client) error
		kind  bool
	}{
		{"lock on a read-write lock", lockbrokerv1.LockKind_LOCK_KIND_RWLOCK, `"k" is a read-write lock (RWLOCK)`,
			func(c *client.Client) error { _, err := c.TryLock(ctx(t), "k"); return err }, true},
		{"read on a lock", lockbrokerv1.LockKind_LOCK_KIND_LOCK, `"k" is a lock key (LOCK)`,
			func(c *client.Client) error { _, err := c.RWLock("k").TryRLock(ctx(t)); return err }, true},
		{"write on a semaphore", lockbrokerv1.LockKind_LOCK_KIND_SEMAPHORE, `"k" is a semaphore prefix (SEMAPHORE)`,
			func(c *client.Client) error { _, err := c.RWLock("k").Lock(ctx(t)); return err }, true},
		{"semaphore with another limit", lockbrokerv1.LockKind_LOCK_KIND_SEMAPHORE, `semaphore "k" has limit 3, requested limit 2`,
			func(c *client.Client) error { _, err := c.Lock(ctx(t), "k", client.WithLimit(2)); return err }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := client.New(dial(t, serve(t, kindConflict{found: tt.found, msg: tt.msg})))
			err := tt.take(c)
			require.Error(t, err)
			assert.ErrorIs(t, err, client.ErrConflict)
			assert.Equal(t, tt.kind, errors.Is(err, client.ErrKindConflict), "errors.Is(%v, ErrKindConflict)", err)
			var se *client.StatusError
			require.ErrorAs(t, err, &se)
			assert.Equal(t, "LIMIT_CONFLICT", se.Reason)
			assert.Equal(t, tt.found, se.State.GetKind())
		})
	}
}

// A lease resumed on another replica asks for the same kind and keys, with
// its first key's sequencer, and keeps its grants.
func TestResumeCarriesModeAndKeys(t *testing.T) {
	hold := func(req *lockbrokerv1.AcquireRequest, stream grpc.ServerStreamingServer[lockbrokerv1.AcquireResponse]) error {
		if err := stream.Send(acquired(req, req.GetResume() != nil)); err != nil {
			return err
		}
		<-stream.Context().Done()
		return nil
	}
	die := func(req *lockbrokerv1.AcquireRequest, stream grpc.ServerStreamingServer[lockbrokerv1.AcquireResponse]) error {
		if err := stream.Send(acquired(req, false)); err != nil {
			return err
		}
		return status.Error(codes.Unavailable, "replica going away")
	}
	tests := []struct {
		name string
		take func(c *client.Client) (*client.Lease, error)
		kind lockbrokerv1.AcquireKind
		keys []string
	}{
		{"write hold", func(c *client.Client) (*client.Lease, error) { return c.RWLock("rw").Lock(ctx(t)) }, lockbrokerv1.AcquireKind_ACQUIRE_KIND_WRITE, nil},
		{"read hold", func(c *client.Client) (*client.Lease, error) { return c.RWLock("rw").RLock(ctx(t)) }, lockbrokerv1.AcquireKind_ACQUIRE_KIND_READ, nil},
		{"multi-key", func(c *client.Client) (*client.Lease, error) { return c.Lock(ctx(t), "a", client.WithKeys("b", "c")) },
			lockbrokerv1.AcquireKind_ACQUIRE_KIND_UNSPECIFIED, []string{"b", "c"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := &scripted{script: die}, &scripted{script: hold}
			c := client.New(dial(t, serve(t, a)), client.WithReplicas(dial(t, serve(t, b))))
			l, err := tt.take(c)
			require.NoError(t, err)
			before := l.Sequencers()
			require.True(t, waitUntil(10*time.Second, func() bool { return l.Replica() == 1 || l.Err() != nil }), "not resumed on B")
			require.NoError(t, l.Err())
			reqs := b.requests()
			require.Len(t, reqs, 1)
			assert.Equal(t, tt.kind, reqs[0].GetKind())
			assert.Equal(t, tt.keys, reqs[0].GetKeys())
			assert.True(t, proto.Equal(before[0], reqs[0].GetResume()), "resumed with %v, want %v", reqs[0].GetResume(), before[0])
			after := l.Sequencers()
			require.Len(t, after, len(before))
			for i := range before {
				assert.True(t, proto.Equal(before[i], after[i]))
			}
			assert.NoError(t, l.Release(ctx(t)))
		})
	}
}

// A replica that refuses the resume (FAILED_PRECONDITION: the session no
// longer holds the key) ends the lease at once with RESUME_REFUSED; it is
// not taken for a timeout and retried until the deadline.
func TestResumeRefusedEndsTheLease(t *testing.T) {
	die := &scripted{script: func(req *lockbrokerv1.AcquireRequest, stream grpc.ServerStreamingServer[lockbrokerv1.AcquireResponse]) error {
		if err := stream.Send(acquired(req, false)); err != nil {
			return err
		}
		return status.Error(codes.Unavailable, "replica going away")
	}}
	refuse := &scripted{script: func(req *lockbrokerv1.AcquireRequest, _ grpc.ServerStreamingServer[lockbrokerv1.AcquireResponse]) error {
		return status.Error(codes.FailedPrecondition, "cannot resume: the session does not hold the key")
	}}
	c := client.New(dial(t, serve(t, die)), client.WithReplicas(dial(t, serve(t, refuse))))
	start := time.Now()
	l, err := c.Lock(ctx(t), "k", client.WithKeys("k2"))
	require.NoError(t, err)
	select {
	case <-l.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("a refused resume did not end the lease within 5s (its deadline is 10s away)")
	}
	assert.Less(t, time.Since(start), 5*time.Second)
	le, ok := errors.AsType[*client.LostError](l.Err())
	require.True(t, ok, "%v", l.Err())
	assert.Equal(t, client.CauseResumeRefused, le.Cause)
	assert.Len(t, refuse.requests(), 1, "refused once, not retried")
}

// TryAcquire takes one key: WithKeys is refused before any call.
func TestTryAcquireRefusesWithKeys(t *testing.T) {
	ls := &scripted{}
	c := client.New(dial(t, serve(t, ls)))
	_, err := c.TryAcquire(ctx(t), sid, "a", client.WithKeys("b"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "WithKeys")
	assert.Empty(t, ls.requests())
}
