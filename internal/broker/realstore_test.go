package broker_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/consulstore"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// startStore starts a real Consul agent for t and opens a Store on it,
// closed when the test ends.
func startStore(t *testing.T, opts consulstore.Options) (*consultest.Agent, *consulstore.Store) {
	t.Helper()
	agent := consultest.Start(t)
	store, err := consulstore.Open(agent.Config(), opts)
	require.NoError(t, err)
	t.Cleanup(store.Close)
	return agent, store
}

// replica opens a Store on cfg and a broker with replica id on it, both
// closed when the test ends (for tests that run two replicas on one agent,
// one of them through consultest's Intercept).
func replica(t *testing.T, cfg *api.Config, id string) (*broker.Broker, *consulstore.Store) {
	t.Helper()
	store, err := consulstore.Open(cfg, consulstore.Options{})
	require.NoError(t, err)
	t.Cleanup(store.Close)
	b := broker.New(store, zap.NewNop(), broker.WithReplicaID(id))
	t.Cleanup(b.Close)
	return b, store
}

// testHold is one Broker.Acquire run on a goroutine of its own until the
// test ends: the events its send got, in order, and done, closed once
// Acquire returned (err is then what it returned).
type testHold struct {
	t      *testing.T
	cancel context.CancelFunc
	events chan broker.Event
	done   chan struct{}
	err    error
}

// startHold runs b.Acquire(spec). If before is not nil, send calls it with
// each event before recording the event (a test can hold a send there).
func startHold(t *testing.T, b *broker.Broker, spec *broker.AcquireSpec, before func(broker.Event)) *testHold {
	ctx, cancel := context.WithCancel(context.Background())
	h := &testHold{t: t, cancel: cancel, events: make(chan broker.Event, 64), done: make(chan struct{})}
	go func() {
		defer close(h.done)
		h.err = b.Acquire(ctx, spec, func(e broker.Event) error {
			if before != nil {
				before(e)
			}
			h.events <- e
			return nil
		})
	}()
	t.Cleanup(func() {
		cancel()
		if !h.ended(10 * time.Second) {
			t.Errorf("the hold of %s did not end", spec.Key)
		}
	})
	return h
}

// ended reports whether the hold's Acquire returned within d.
func (h *testHold) ended(d time.Duration) bool {
	select {
	case <-h.done:
		return true
	case <-time.After(d):
		return false
	}
}

// next is the hold's next event of kind (others are skipped), within 5 s.
func (h *testHold) next(kind broker.EventKind) broker.Event {
	h.t.Helper()
	return h.nextWithin(kind, 5*time.Second)
}

// nextWithin is next with a bound of d.
func (h *testHold) nextWithin(kind broker.EventKind, d time.Duration) broker.Event {
	h.t.Helper()
	timeout := time.After(d)
	for {
		select {
		case e := <-h.events:
			if e.Kind == kind {
				return e
			}
		case <-timeout:
			h.t.Fatalf("no event %v", kind)
		}
	}
}

// sent says, without waiting, whether the hold has sent an event of kind
// (the events before it are skipped).
func (h *testHold) sent(kind broker.EventKind) (broker.Event, bool) {
	for {
		select {
		case e := <-h.events:
			if e.Kind == kind {
				return e, true
			}
		default:
			return broker.Event{}, false
		}
	}
}

// peekBody reads r's body, for a test's proxy (consultest's Intercept) to
// look at, and puts it back for the agent.
func peekBody(r *http.Request) ([]byte, error) {
	body, err := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	return body, err
}

// sendToAgent sends r, whose body is body, to the agent itself and
// returns Consul's status: a test's proxy that then answers r otherwise
// makes the broker lose Consul's answer. It is sent even when the broker
// gave r up already (as a request in flight reaches Consul).
func sendToAgent(agent *consultest.Agent, r *http.Request, body []byte) (int, error) {
	req, err := http.NewRequestWithContext(context.WithoutCancel(r.Context()), r.Method, "http://"+agent.HTTPAddr()+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header = r.Header.Clone()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}

// answerAfter has Consul (next) answer r now, and passes the answer on to
// the broker only after between returned: what the broker reads is from
// before whatever between does.
func answerAfter(w http.ResponseWriter, r *http.Request, next http.Handler, between func()) {
	rec := httptest.NewRecorder()
	next.ServeHTTP(rec, r)
	between()
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.Code)
	_, _ = w.Write(rec.Body.Bytes())
}
