package broker_test

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/consulstore"
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

// TestResumeReadsGoWithRenewal: a resume's client hears nothing until it
// is done, so its Consul calls should be few round trips deep. The
// session's renewal and the two consistent reads the resume checks
// against (the key's state, the session's record) go out at once, then the
// transaction: two round trips, not four. make chaos found a client that
// learned of its hold's loss 1.19 s after it (bound 1 s) while it resumed
// over a link to Consul with 200 ms of latency each way. CheckSequencer
// makes its two reads at once too.
//
// A proxy in front of replica b's agent holds each armed request until
// all of them are in flight; made one after another, they would never be.
func TestResumeReadsGoWithRenewal(t *testing.T) {
	agent := consultest.Start(t)
	var z rendezvous
	storeB, err := consulstore.Open(agent.Intercept(t, z.handle), consulstore.Options{})
	require.NoError(t, err)
	t.Cleanup(storeB.Close)
	storeA, err := consulstore.Open(agent.Config(), consulstore.Options{})
	require.NoError(t, err)
	t.Cleanup(storeA.Close)
	a := broker.New(storeA, zap.NewNop(), broker.WithReplicaID("a"))
	t.Cleanup(a.Close)
	b := broker.New(storeB, zap.NewNop(), broker.WithReplicaID("b"))
	t.Cleanup(b.Close)
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

	z.arm(2, consistentRead)
	ok, _, err := b.CheckSequencer(ctx, got.Sequencer)
	assert.Equal(t, 2, z.disarm(), "CheckSequencer's reads in flight at once")
	require.NoError(t, err)
	assert.True(t, ok, "the resumed grant is current")

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
