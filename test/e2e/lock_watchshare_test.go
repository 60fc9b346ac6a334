package e2e

import (
	"bufio"
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
	"github.com/lockbroker/lockbroker/internal/server"
)

// lkScrapeGauge reads one unlabelled gauge from a Prometheus text page.
func lkScrapeGauge(t *testing.T, url, name string) float64 {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 2 && fields[0] == name {
			v, err := strconv.ParseFloat(fields[1], 64)
			require.NoError(t, err)
			return v
		}
	}
	require.NoError(t, sc.Err())
	t.Fatalf("metric %s not found at %s", name, url)
	return 0
}

// lkWatch opens a Watch stream, waits for its first state, and returns
// what ends it.
func lkWatch(t *testing.T, c lockbrokerv1.LockServiceClient, key string) context.CancelFunc {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w, err := c.Watch(ctx, &lockbrokerv1.WatchRequest{Key: key})
	require.NoError(t, err)
	resp, err := w.Recv()
	require.NoError(t, err)
	require.Equal(t, key, resp.GetState().GetKey())
	return cancel
}

// TestLockOneBlockingQueryPerKey: every hold, waiter and watcher of a key
// on one replica shares a single Consul blocking query.
func TestLockOneBlockingQueryPerKey(t *testing.T) {
	const (
		waiters  = 39
		watchers = 10
		key      = "shared/one"
	)
	agent := consultest.Start(t)
	// An idle watch lingers until its blocking query returns (Consul keeps
	// serving an abandoned query and its connection until its wait time
	// runs out), so use a short wait time to see the queries go.
	const waitTime = 2 * time.Second
	r := brokertest.Start(t, agent, brokertest.WithWaitTime(waitTime))
	c := r.Locks(t)

	// The in-process replica does not serve its metrics; a second
	// server.Server on the same broker and store exports the same gauge.
	srv, err := server.New(r.Broker, r.Store, zap.NewNop())
	require.NoError(t, err)
	t.Cleanup(srv.GRPC.Stop)
	metrics := httptest.NewServer(srv.HTTPHandler())
	t.Cleanup(metrics.Close)
	const gauge = "lockbroker_consul_blocking_queries"
	// openQueries waits until the replica has n blocking queries open, as
	// counted and as its metric reports, and still has 150 ms later: a
	// watch between two queries (up to 50 ms on a key with no entries) has
	// one fewer open for a moment.
	openQueries := func(n int64, within time.Duration, msg string) {
		t.Helper()
		require.Eventually(t, func() bool {
			if r.Store.OpenBlockingQueries() != n || lkScrapeGauge(t, metrics.URL+"/metrics", gauge) != float64(n) {
				return false
			}
			time.Sleep(150 * time.Millisecond)
			return r.Store.OpenBlockingQueries() == n
		}, within, 10*time.Millisecond, "%s: %d open, metric %v", msg, r.Store.OpenBlockingQueries(), lkScrapeGauge(t, metrics.URL+"/metrics", gauge))
	}

	holder := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: key, Session: fast()})
	seq := holder.acquired(5 * time.Second).GetSequencer()
	var stops []context.CancelFunc
	for range waiters {
		s := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: key, Session: fast()})
		s.next(10*time.Second, isQueued)
		stops = append(stops, s.cancel)
	}
	for range watchers {
		stops = append(stops, lkWatch(t, c, key))
	}
	// 1 holder + 39 waiters + 10 watchers = 50 streams on one key.
	openQueries(1, 5*time.Second, "one key")

	// A second key adds one.
	other := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: "shared/two", Session: fast()})
	other.acquired(5 * time.Second)
	stops = append(stops, other.cancel, lkWatch(t, c, "shared/two"))
	openQueries(2, 5*time.Second, "two keys")

	// A hand-off on the shared key keeps it at one query per key.
	_, err = c.Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: key, SessionId: seq.GetSessionId(), Token: seq.GetToken()})
	require.NoError(t, err)
	holder.next(5*time.Second, lkIsReleased)
	require.Eventually(t, func() bool {
		st := lkGetLock(t, c, key)
		return len(st.GetHolders()) == 1 && st.GetHolders()[0].GetSessionId() != seq.GetSessionId()
	}, 5*time.Second, 10*time.Millisecond, "no waiter took the key")
	openQueries(2, 5*time.Second, "after a hand-off")

	// When every stream has gone, so have the queries, within one wait time.
	for _, stop := range stops {
		stop()
	}
	openQueries(0, waitTime+3*time.Second, "no stream left")
}
