package broker_test

import (
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
// for a lock, a semaphore and a read-write lock, and for a grant on a free
// lock; for a wait that was queued when its client left; for one whose
// transaction Consul committed but whose answer the broker never got,
// because the client left while it was in flight ("answer lost"); and for
// one whose transaction reached Consul only after the clean-up had read
// the record absent, and before it destroyed the session ("commits
// late"). CI's cancel storm (TestCancelStormLeavesNothing) left such
// records behind: a waiting semaphore's, then a cut-off grant's.
func TestCancelledWaitLeavesNoRecord(t *testing.T) {
	agent := consultest.Start(t)
	// mode, when set, catches the first transaction that writes a session
	// record and sends the record's key on caught. "lost": Consul commits
	// it, and its answer is kept until the broker stops waiting for it.
	// "late": it is kept from Consul until the broker's clean-up reads the
	// record, and committed then, before that read is answered (or, if no
	// read comes, once the test says so on commitNow).
	var mu sync.Mutex
	var mode string
	var commitLate func() // the late transaction, while it waits
	caught := make(chan string, 1)
	commitNow := make(chan struct{}, 1)
	cfg := agent.Intercept(t, func(w http.ResponseWriter, r *http.Request, next http.Handler) {
		mu.Lock()
		m, late := mode, commitLate
		mu.Unlock()
		if late != nil && r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/v1/kv/"+broker.BrokerPrefix+"sessions/") && r.URL.Query().Has("consistent") {
			answerAfter(w, r, next, late)
			return
		}
		if m == "" || r.URL.Path != "/v1/txn" {
			next.ServeHTTP(w, r)
			return
		}
		body, err := peekBody(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		rec := writtenRecord(body)
		mu.Lock()
		mine := rec != "" && mode != ""
		if mine {
			mode = ""
		}
		mu.Unlock()
		if !mine {
			next.ServeHTTP(w, r)
			return
		}
		commit := func() {
			if code, err := sendToAgent(agent, r, body); err != nil || code != http.StatusOK {
				t.Logf("the caught transaction was refused: %d %v", code, err)
			}
		}
		if m == "lost" {
			commit()
			caught <- rec
			<-r.Context().Done() // the answer is never sent
			return
		}
		done := make(chan struct{})
		var once sync.Once
		mu.Lock()
		commitLate = func() {
			once.Do(func() {
				commit()
				t.Logf("the caught transaction reached Consul after its request was given up")
				close(done)
			})
		}
		late = commitLate
		mu.Unlock()
		caught <- rec
		<-r.Context().Done()
		select {
		case <-done:
		case <-commitNow:
			late()
		}
		mu.Lock()
		commitLate = nil
		mu.Unlock()
	})
	b, _ := replica(t, cfg, "a")
	kv := agent.Client().KV()

	specs := map[string]func(key string) *broker.AcquireSpec{
		"lock":  lockForever,
		"grant": lockForever,
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
	for _, kind := range []string{"lock", "semaphore", "read-write", "grant"} {
		for _, how := range []string{"queued", "answer lost", "commits late"} {
			if kind == "grant" && how == "queued" {
				continue
			}
			t.Run(kind+"/"+how, func(t *testing.T) {
				key := "waitrecord/" + kind + "-" + strings.ReplaceAll(how, " ", "-")
				spec := specs[kind]
				holders := map[string]int{"lock": 1, "semaphore": 2, "read-write": 1}[kind]
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
					mode = map[string]string{"answer lost": "lost", "commits late": "late"}[how]
					mu.Unlock()
					w = startHold(t, b, spec(key), nil)
					select {
					case rec = <-caught:
					case <-time.After(5 * time.Second):
						t.Fatal("no transaction wrote a session record")
					}
					w.cancel()
				}
				require.True(t, w.ended(5*time.Second), "the request ends")
				commitNow <- struct{}{} // a late transaction no read let through goes now
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
					t.Errorf("%s (session %q) left 3 s after the request ended: %s", rec, p.Session, p.Value)
				} else {
					t.Logf("%s gone %s after the request ended", rec, time.Since(ended).Round(time.Millisecond))
				}
				assert.Equal(t, 0, sessionsOf(t, agent.Client(), rec), "the request's session is gone")
				select {
				case <-commitNow:
				default:
				}
			})
		}
	}
}

// writtenRecord is the key of the session record that a transaction body
// writes, or "".
func writtenRecord(body []byte) string {
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
		if op.KV != nil && strings.HasPrefix(op.KV.Key, broker.BrokerPrefix+"sessions/") && (op.KV.Verb == "cas" || op.KV.Verb == "lock") {
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
