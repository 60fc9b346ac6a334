package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// cutLink is a TCP proxy to addr whose connections the test can cut (both
// ends see their connection end, as with a reset or a dead middlebox).
type cutLink struct{ p *toxiproxy.Proxy }

func newCutLink(t *testing.T, addr string) *cutLink {
	t.Helper()
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, t.Name(), "127.0.0.1:0", addr)
	require.NoError(t, p.Start())
	t.Cleanup(p.Stop)
	return &cutLink{p: p}
}

func (l *cutLink) addr() string { return l.p.Listen }

func (l *cutLink) cut(t *testing.T) {
	t.Helper()
	l.p.Stop()
	require.NoError(t, l.p.Start())
}

// toxic adds a toxic of typ in both directions.
func (l *cutLink) toxic(t *testing.T, typ, attrs string) {
	t.Helper()
	for _, dir := range []string{"upstream", "downstream"} {
		_, err := l.p.Toxics.AddToxicJson(strings.NewReader(`{"name":"` + typ + `-` + dir + `","type":"` + typ + `","stream":"` + dir + `","attributes":` + attrs + `}`))
		require.NoError(t, err)
	}
}

func (l *cutLink) heal() { l.p.Toxics.ResetToxics(context.Background()) }

// lingerSetup holds key through a cuttable link and queues a waiter on a
// direct connection. It returns the holder's stream, its sequencer, the
// time its client's promise ends (receive time of `acquired` plus
// guaranteed_for) and the waiter.
func lingerSetup(t *testing.T, key string) (*brokertest.Replica, *cutLink, *stream, *lockbrokerv1.Sequencer, time.Time, *stream) {
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	link := newCutLink(t, r.Addr)
	holder := acquire(t, lockbrokerv1.NewLockServiceClient(lkDial(t, link.addr())), &lockbrokerv1.AcquireRequest{Key: key, Session: fast()})
	got := holder.acquired(5 * time.Second)
	promised := time.Now().Add(got.GetGuaranteedFor().AsDuration())
	require.Greater(t, got.GetGuaranteedFor().AsDuration(), 5*time.Second, "a fresh grant promises most of its TTL")
	waiter := acquire(t, r.Locks(t), &lockbrokerv1.AcquireRequest{Key: key, Session: fast()})
	waiter.next(5*time.Second, isQueued)
	return r, link, holder, got.GetSequencer(), promised, waiter
}

// Issue 11 (chaos finding): a client whose connection is reset still
// believes it holds the lock until the guaranteed_for it last received,
// and its library resumes the hold. The broker must not hand the lock to
// another client before that promise ends; after it, the lock moves.
func TestLostConnectionKeepsHoldUntilPromiseEnds(t *testing.T) {
	t.Parallel()
	_, link, holder, _, promised, waiter := lingerSetup(t, "linger/reset")
	link.cut(t)
	require.Error(t, holder.end(5*time.Second), "the holder's stream breaks with its connection")
	got := waiter.acquired(time.Until(promised) + 5*time.Second)
	at := time.Now()
	assert.False(t, at.Before(promised), "the waiter got the lock %s before the first holder's promise ended", promised.Sub(at))
	assert.Less(t, at.Sub(promised), 2*time.Second, "the lock moves soon after the promise ends")
	t.Logf("waiter acquired %s after the cut holder's promise ended (token %d)", at.Sub(promised), got.GetSequencer().GetToken())
}

// A hold resumed on the same replica after its connection was lost keeps
// the lock past the old copy's promise: the copy left behind is fenced by
// the record's owner and releases nothing when its linger ends.
func TestLostConnectionResumedOnSameReplica(t *testing.T) {
	t.Parallel()
	r, link, holder, seq, promised, waiter := lingerSetup(t, "linger/resume")
	link.cut(t)
	require.Error(t, holder.end(5*time.Second))
	resumed := acquire(t, r.Locks(t), &lockbrokerv1.AcquireRequest{Key: seq.GetKey(), Session: &lockbrokerv1.AcquireRequest_Resume{Resume: seq}})
	again := resumed.acquired(5 * time.Second)
	require.True(t, again.GetResumed())
	assert.Equal(t, seq.GetToken(), again.GetSequencer().GetToken(), "a resume keeps the token")
	// Past the old copy's linger: the lock is still the resumed hold's.
	time.Sleep(time.Until(promised) + 2*time.Second)
	select {
	case ev := <-waiter.events:
		require.Nil(t, ev.GetAcquired(), "the waiter got the lock while the resumed hold held it")
	default:
	}
	st := lkGetLock(t, r.Locks(t), seq.GetKey())
	assert.Equal(t, seq.GetSessionId(), lkHolder(t, st).GetSessionId(), "the resumed session still holds the key")
	_, err := r.Locks(t).Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: seq.GetKey(), SessionId: seq.GetSessionId(), Token: seq.GetToken()})
	require.NoError(t, err)
	resumed.next(5*time.Second, lkIsReleased)
	waiter.acquired(5 * time.Second)
}

// A client that cancels its stream (its connection up) gave the hold up:
// it is released at once.
func TestCancelledStreamReleasesAtOnce(t *testing.T) {
	t.Parallel()
	_, _, holder, _, _, waiter := lingerSetup(t, "linger/cancel")
	cancelled := time.Now()
	holder.cancel()
	err := holder.end(5 * time.Second)
	assert.Equal(t, codes.Canceled, status.Code(err))
	waiter.acquired(3 * time.Second)
	t.Logf("waiter acquired %s after the holder cancelled", time.Since(cancelled))
	assert.Less(t, time.Since(cancelled), 2*time.Second)
}

// A client that cancels its stream and closes its connection just after
// (a process that gives up and exits) gave the hold up: the cancel reached
// the broker while the connection was open, so it is released at once,
// not kept like a lost connection's. (A close that overtakes the cancel
// cannot be told from a lost connection.)
func TestCancelThenCloseReleasesAtOnce(t *testing.T) {
	t.Parallel()
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	conn := lkDial(t, r.Addr)
	holder := acquire(t, lockbrokerv1.NewLockServiceClient(conn), &lockbrokerv1.AcquireRequest{Key: "linger/cancel-close", Session: fast()})
	holder.acquired(5 * time.Second)
	waiter := acquire(t, r.Locks(t), &lockbrokerv1.AcquireRequest{Key: "linger/cancel-close", Session: fast()})
	waiter.next(5*time.Second, isQueued)
	cancelled := time.Now()
	holder.cancel()
	time.Sleep(20 * time.Millisecond) // the cancel leaves before the close
	require.NoError(t, conn.Close())
	waiter.acquired(3 * time.Second)
	t.Logf("waiter acquired %s after the holder cancelled and closed", time.Since(cancelled))
	assert.Less(t, time.Since(cancelled), 2*time.Second)
}
