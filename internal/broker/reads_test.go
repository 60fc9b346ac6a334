package broker_test

import (
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// rendezvous holds the Consul requests it is armed for until want of them
// are held at once, or until its wait ran out, and notes the most it held
// at once: how many of a broker's calls were in flight together.
type rendezvous struct {
	mu    sync.Mutex
	match func(*http.Request) bool // nil: disarmed
	want  int
	held  int
	most  int
	all   chan struct{}
}

// arm makes the next want requests that match wait for each other.
func (z *rendezvous) arm(want int, match func(*http.Request) bool) {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.match, z.want, z.held, z.most, z.all = match, want, 0, 0, make(chan struct{})
}

// disarm lets requests through and returns the most held at once.
func (z *rendezvous) disarm() int {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.match = nil
	return z.most
}

func (z *rendezvous) handle(w http.ResponseWriter, r *http.Request, agent http.Handler) {
	z.mu.Lock()
	if z.match == nil || z.held == z.want || !z.match(r) {
		z.mu.Unlock()
		agent.ServeHTTP(w, r)
		return
	}
	z.held++
	z.most = max(z.most, z.held)
	all := z.all
	if z.held == z.want {
		close(all)
	}
	z.mu.Unlock()
	select {
	case <-all:
	case <-time.After(time.Second):
	}
	z.mu.Lock()
	if z.held < z.want {
		z.held-- // alone in flight: a later one starts a new count
	}
	z.mu.Unlock()
	agent.ServeHTTP(w, r)
}

func consistentRead(r *http.Request) bool {
	return r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/v1/kv/") && r.URL.Query().Has("consistent")
}

func renewal(r *http.Request) bool {
	return r.Method == http.MethodPut && strings.HasPrefix(r.URL.Path, "/v1/session/renew/")
}

func sessionInfo(r *http.Request) bool {
	return r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/v1/session/info/")
}

// TestReadsGoTogether: a resume's client hears nothing until it
// is done, so its Consul calls should be few round trips deep. The
// session's renewal and the two consistent reads the resume checks
// against (the key's state, the session's record) go out at once, then the
// transaction: two round trips, not four. make chaos found a client that
// learned of its hold's loss 1.19 s after it (bound 1 s) while it resumed
// over a link to Consul with 200 ms of latency each way. The calls
// without a stream on a client-owned session make their reads at once
// too: TryAcquire (the session's info and record), SetValue and Release
// (the key's state and the record). (CheckSequencer reads one after the
// other: see TestStaleRecordRefused.)
//
// A proxy in front of replica b's agent holds each armed request until
// all of them are in flight; made one after another, they would never be.
func TestReadsGoTogether(t *testing.T) {
	agent := consultest.Start(t)
	var z rendezvous
	a, storeA := replica(t, agent.Config(), "a")
	b, _ := replica(t, agent.Intercept(t, z.handle), "b")
	ctx := t.Context()

	const key = "resume/reads-with-renewal"
	first := startHold(t, a, lockForever(key), nil)
	seq := first.next(broker.EventAcquired).Sequencer

	z.arm(3, func(r *http.Request) bool { return renewal(r) || consistentRead(r) })
	began := time.Now()
	resumed := startHold(t, b, &broker.AcquireSpec{Key: key, WaitForever: true, Resume: &seq}, nil)
	got := resumed.next(broker.EventAcquired)
	took := time.Since(began)
	assert.Equal(t, 3, z.disarm(), "the renewal and both reads in flight at once (resume took %s)", took)
	require.True(t, got.Resumed)
	assert.Equal(t, seq.Token, got.Sequencer.Token)
	assert.Equal(t, broker.LostResumedElsewhere, first.next(broker.EventLost).Reason, "the old replica's hold yields")

	ok, _, err := b.CheckSequencer(ctx, got.Sequencer)
	require.NoError(t, err)
	assert.True(t, ok, "the resumed grant is current")

	// The calls without a stream, on a client-owned session.
	owned, err := b.CreateSession(ctx, &broker.SessionSpec{TTL: 10 * time.Second})
	require.NoError(t, err)
	const key2 = "resume/reads-without-stream"
	z.arm(2, func(r *http.Request) bool { return sessionInfo(r) || consistentRead(r) })
	grant, err := b.TryAcquire(ctx, broker.AcquireSpec{Key: key2, SessionID: owned.ID})
	assert.Equal(t, 2, z.disarm(), "TryAcquire's session info and record read in flight at once")
	require.NoError(t, err)
	z.arm(2, consistentRead)
	_, err = b.SetValue(ctx, key2, owned.ID, []byte("v"), grant.Token)
	assert.Equal(t, 2, z.disarm(), "SetValue's reads in flight at once")
	require.NoError(t, err)
	z.arm(2, consistentRead)
	released, err := b.Release(ctx, key2, owned.ID, grant.Token)
	assert.Equal(t, 2, z.disarm(), "Release's reads in flight at once")
	require.NoError(t, err)
	assert.True(t, released)

	// A resume refused by its renewal (the session is gone) leaves nothing
	// running: its reads are abandoned and waited for.
	resumed.cancel()
	require.True(t, resumed.ended(10*time.Second))
	require.NoError(t, storeA.DestroySession(ctx, seq.Session))
	gone := startHold(t, b, &broker.AcquireSpec{Key: key, WaitForever: true, Resume: &seq}, nil)
	require.True(t, gone.ended(10*time.Second), "a resume of a destroyed session ends")
	require.Error(t, gone.err)
	assert.ErrorIs(t, gone.err, broker.ErrSessionNotFound, "refused: %v", gone.err)
}

// TestStaleRecordRefused: reads made at once may answer in any order, so
// the session's record may be older than the key's state. A SetValue or
// Release with the token of a grant that ended must never touch the
// session's later grant of the key, when the same session holds the key
// again by the time the key is read: its transaction is conditioned on the
// record as read, which a later grant changed. SetValue is refused
// (NOT_HOLDER); Release answers as a retry after success (OK, nothing
// released). Here a proxy holds replica b's read of the key until replica a
// has released the grant and granted the key to the session again.
func TestStaleRecordRefused(t *testing.T) {
	agent := consultest.Start(t)
	const key = "reads/stale-record"
	var holding atomic.Bool
	arrived, resume := make(chan struct{}, 1), make(chan struct{})
	a, storeA := replica(t, agent.Config(), "a")
	b, _ := replica(t, agent.Intercept(t, func(w http.ResponseWriter, r *http.Request, next http.Handler) {
		if consistentRead(r) && r.URL.Path == "/v1/kv/"+key && holding.CompareAndSwap(true, false) {
			arrived <- struct{}{}
			<-resume
		}
		next.ServeHTTP(w, r)
	}), "b")
	ctx := t.Context()

	owned, err := a.CreateSession(ctx, &broker.SessionSpec{TTL: 10 * time.Second})
	require.NoError(t, err)
	first, err := a.TryAcquire(ctx, broker.AcquireSpec{Key: key, SessionID: owned.ID})
	require.NoError(t, err)

	errReleased := errors.New("released")
	for _, call := range []struct {
		name string
		run  func(token uint64) error
		want error
	}{
		{"SetValue", func(token uint64) error {
			_, err := b.SetValue(ctx, key, owned.ID, []byte("stale"), token)
			return err
		}, broker.ErrNotHolder},
		{"Release", func(token uint64) error {
			released, err := b.Release(ctx, key, owned.ID, token)
			if released {
				return errReleased
			}
			return err
		}, nil},
	} {
		holding.Store(true)
		done := make(chan error, 1)
		go func() { done <- call.run(first.Token) }()
		select {
		case <-arrived:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: no read of the key", call.name)
		}
		time.Sleep(100 * time.Millisecond) // the record's read answered meanwhile
		released, err := a.Release(ctx, key, owned.ID, first.Token)
		require.NoError(t, err)
		require.True(t, released)
		again, err := a.TryAcquire(ctx, broker.AcquireSpec{Key: key, SessionID: owned.ID})
		require.NoError(t, err)
		resume <- struct{}{}
		err = <-done
		if call.want == nil {
			assert.NoError(t, err, "%s with the ended grant's token", call.name)
		} else {
			assert.ErrorIs(t, err, call.want, "%s with the ended grant's token: %v", call.name, err)
		}
		entries, _, err := storeA.List(ctx, key, true)
		require.NoError(t, err)
		require.Len(t, entries, 1, "%s: the key", call.name)
		assert.Equal(t, owned.ID, entries[0].Session, "%s: the new grant still holds the key", call.name)
		assert.NotEqual(t, "stale", string(entries[0].Value), "%s: the new grant's value", call.name)
		first = again
	}
}
