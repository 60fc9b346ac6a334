package broker_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// TestCancelledWaitLeavesNoRecord: a wait of a broker-owned session writes
// the session's record (naming the key waited for) with its ticket or
// contender entry. A client that gives up waiting ends the session, and
// the record with it, at once: not 15 s later, by the janitor. That holds
// for a lock, a semaphore and a read-write lock; for a wait that was
// queued when its client left, and for one whose entering transaction
// Consul committed but whose answer the broker never got, because the
// client left while it was in flight. CI's cancel storm
// (TestCancelStormLeavesNothing) left such semaphore records behind.
func TestCancelledWaitLeavesNoRecord(t *testing.T) {
	agent := consultest.Start(t)
	// cut, when armed, lets Consul commit the first transaction that writes
	// a waiting record and keeps its answer until the broker stops waiting
	// for it; committed then gets the record's key.
	var mu sync.Mutex
	var cut bool
	committed := make(chan string, 1)
	cfg := agent.Intercept(t, func(w http.ResponseWriter, r *http.Request, next http.Handler) {
		mu.Lock()
		armed := cut
		mu.Unlock()
		if !armed || r.URL.Path != "/v1/txn" {
			next.ServeHTTP(w, r)
			return
		}
		body, err := peekBody(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		rec := waitingRecord(body)
		mu.Lock()
		mine := rec != "" && cut
		if mine {
			cut = false
		}
		mu.Unlock()
		if !mine {
			next.ServeHTTP(w, r)
			return
		}
		if code, err := sendToAgent(agent, r, body); err != nil || code != http.StatusOK {
			t.Errorf("the wait's transaction was refused: %d %v", code, err)
			return
		}
		committed <- rec
		<-r.Context().Done() // the answer is never sent
	})
	b, _ := replica(t, cfg, "a")
	kv := agent.Client().KV()

	specs := map[string]func(key string) *broker.AcquireSpec{
		"lock": lockForever,
		"semaphore": func(key string) *broker.AcquireSpec {
			s := lockForever(key)
			s.Limit = 2
			return s
		},
		"read-write": func(key string) *broker.AcquireSpec {
			s := lockForever(key)
			s.Mode = broker.ModeWrite
			return s
		},
	}
	for _, kind := range []string{"lock", "semaphore", "read-write"} {
		for _, how := range []string{"queued", "answer lost"} {
			t.Run(kind+"/"+how, func(t *testing.T) {
				key := "waitrecord/" + kind + "-" + strings.ReplaceAll(how, " ", "-")
				spec := specs[kind]
				holders := 1
				if kind == "semaphore" {
					holders = 2
				}
				for range holders {
					startHold(t, b, spec(key), nil).next(broker.EventAcquired)
				}
				var rec string
				var w *testHold
				if how == "queued" {
					w = startHold(t, b, spec(key), nil)
					rec = broker.RecordKey(w.next(broker.EventQueued).Session)
					p, _, err := kv.Get(rec, &api.QueryOptions{RequireConsistent: true})
					require.NoError(t, err)
					require.NotNil(t, p, "the wait wrote its record")
					w.cancel()
				} else {
					mu.Lock()
					cut = true
					mu.Unlock()
					w = startHold(t, b, spec(key), nil)
					select {
					case rec = <-committed:
					case <-time.After(5 * time.Second):
						t.Fatal("no transaction wrote a waiting record")
					}
					w.cancel()
				}
				require.True(t, w.ended(5*time.Second), "the wait ends")
				ended := time.Now()
				var p *api.KVPair
				for time.Since(ended) < 3*time.Second {
					var err error
					p, _, err = kv.Get(rec, &api.QueryOptions{RequireConsistent: true})
					require.NoError(t, err)
					if p == nil {
						break
					}
					time.Sleep(50 * time.Millisecond)
				}
				if p != nil {
					t.Errorf("%s (session %q) left 3 s after its wait ended: %s", rec, p.Session, p.Value)
				} else {
					t.Logf("%s gone %s after the wait ended", rec, time.Since(ended).Round(time.Millisecond))
				}
				assert.Equal(t, 0, sessionsOf(t, agent.Client(), rec), "the waiter's session is gone")
			})
		}
	}
}

// waitingRecord is the key of the session record that a transaction body
// writes with a key waited for ("waiting"), or "".
func waitingRecord(body []byte) string {
	var ops []struct {
		KV *struct {
			Verb  string
			Key   string
			Value []byte
		}
	}
	if json.Unmarshal(body, &ops) != nil {
		return ""
	}
	for _, op := range ops {
		if op.KV != nil && strings.HasPrefix(op.KV.Key, broker.BrokerPrefix+"sessions/") && bytes.Contains(op.KV.Value, []byte(`"waiting"`)) {
			return op.KV.Key
		}
	}
	return ""
}

// sessionsOf counts the live sessions whose id ends the record key rec.
func sessionsOf(t *testing.T, c *api.Client, rec string) int {
	ss, _, err := c.Session().List(&api.QueryOptions{RequireConsistent: true})
	require.NoError(t, err)
	n := 0
	for _, s := range ss {
		if strings.HasSuffix(rec, "/"+s.ID) {
			n++
		}
	}
	return n
}
