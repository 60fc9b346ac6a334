package broker_test

import (
	"bytes"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// TestMovedWaitNotEndedByItsOldReplica: a client moves its wait from
// replica A to replica B (resuming it with its session: it keeps its
// place), and A then hears the client's first stream end and cleans up.
// A must leave the session alone: it is B's now. A checked that with one
// read of the session's record before destroying the session, which two
// things defeat:
//   - "read fails": Consul does not answer A's read (a leader election;
//     the likely cause of a semaphore hold's loss, DELETED_BY_OTHER, in
//     chaos seed 426468788), and A took no answer for "not moved";
//   - "move during clean-up": B's resume commits between A's read and A's
//     destroy.
//
// Either way B's wait is then killed, and its client told `lost` (or
// refused) although nothing it did was wrong. The record's deletion, by
// check-and-set on what A last wrote, before the destroy, is the fence:
// after a move it fails. Then, when the holder releases, B's wait is
// granted. For a lock and for a semaphore. (The old code failed three of
// the four: a lock's "move during clean-up" was already fenced, by
// leaveQueue's ticket deletion, conditioned on the record.)
func TestMovedWaitNotEndedByItsOldReplica(t *testing.T) {
	agent := consultest.Start(t)
	// A's requests about the record recKey: "fail" answers every read of
	// it 500; "hold" keeps A's first clean-up request that touches it
	// (a read, answered by Consul first; or a transaction, sent to Consul
	// after) until letGo is closed, and says so on caught.
	var mu sync.Mutex
	var mode, recKey string
	var caught, letGo chan struct{}
	cfg := agent.Intercept(t, func(w http.ResponseWriter, r *http.Request, next http.Handler) {
		mu.Lock()
		m, rk, c, l := mode, recKey, caught, letGo
		mu.Unlock()
		if m == "" || rk == "" {
			next.ServeHTTP(w, r)
			return
		}
		read := r.Method == http.MethodGet && r.URL.Path == "/v1/kv/"+rk && r.URL.Query().Has("consistent")
		var txn bool
		if r.URL.Path == "/v1/txn" {
			body, err := peekBody(r)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadGateway)
				return
			}
			txn = bytes.Contains(body, []byte(`"Key":"`+rk+`"`))
		}
		switch {
		case m == "fail" && read:
			http.Error(w, "rpc error making call: EOF", http.StatusInternalServerError)
			return
		case m == "hold" && (read || txn):
			mu.Lock()
			first := mode == "hold"
			mode = "held"
			mu.Unlock()
			if !first {
				break
			}
			close(c)
			if read { // Consul answers now; A hears it after the move
				answerAfter(w, r, next, func() { <-l })
				return
			}
			<-l // the transaction reaches Consul after the move
		}
		next.ServeHTTP(w, r)
	})
	a, _ := replica(t, cfg, "a")
	b, _ := replica(t, agent.Config(), "b")
	kv := agent.Client().KV()

	for _, kind := range []string{"lock", "semaphore"} {
		for _, how := range []string{"read fails", "move during clean-up"} {
			t.Run(kind+"/"+how, func(t *testing.T) {
				start := time.Now()
				key := "movedfence/" + kind + "-" + map[string]string{"read fails": "fail", "move during clean-up": "race"}[how]
				spec := func() *broker.AcquireSpec {
					s := lockForever(key)
					if kind == "semaphore" {
						s.Limit = 1
						s.Semaphore = true
					}
					return s
				}
				holder := startHold(t, b, spec(), nil)
				held := holder.next(broker.EventAcquired).Sequencer
				w := startHold(t, a, spec(), nil)
				sid := w.next(broker.EventQueued).Session
				resume := func() *testHold {
					s := spec()
					s.NewSession = nil
					s.Resume = &broker.Sequencer{Key: key, Session: sid}
					m := startHold(t, b, s, nil)
					m.next(broker.EventQueued)
					return m
				}
				mu.Lock()
				recKey, caught, letGo = broker.RecordKey(sid), make(chan struct{}), make(chan struct{})
				mu.Unlock()
				var moved *testHold
				var left time.Time
				if how == "read fails" {
					moved = resume()
					mu.Lock()
					mode = "fail"
					mu.Unlock()
					left = time.Now()
					w.cancel()
					require.True(t, w.ended(15*time.Second), "A's request ends")
				} else {
					mu.Lock()
					mode = "hold"
					mu.Unlock()
					left = time.Now()
					w.cancel()
					select {
					case <-caught:
					case <-time.After(5 * time.Second):
						t.Fatal("A's clean-up never touched the record")
					}
					moved = resume()
					close(letGo)
					require.True(t, w.ended(15*time.Second), "A's request ends")
				}
				mu.Lock()
				mode = ""
				mu.Unlock()
				t.Logf("A's request ended %s after its client left", time.Since(left).Round(time.Millisecond))

				p, _, err := kv.Get(broker.RecordKey(sid), &api.QueryOptions{RequireConsistent: true})
				require.NoError(t, err)
				if assert.NotNil(t, p, "the moved wait's record is there") {
					assert.Equal(t, sid, p.Session, "the moved wait's session lives")
					assert.Contains(t, string(p.Value), `"owner":"b/`)
				}
				_, err = b.Release(t.Context(), key, held.Session, held.Token)
				require.NoError(t, err)
				got := moved.nextWithin(broker.EventAcquired, 5*time.Second)
				assert.Equal(t, sid, got.Sequencer.Session, "the moved wait is granted, with its session")
				_, lost := moved.sent(broker.EventLost)
				assert.False(t, lost, "the moved wait is not lost")
				t.Logf("the moved wait was granted; the subtest took %s", time.Since(start).Round(time.Millisecond))
				// Released, not cancelled: a resumed hold cancelled within 2 s
				// of its grant is kept as after a lost connection.
				_, err = b.Release(t.Context(), key, got.Sequencer.Session, got.Sequencer.Token)
				require.NoError(t, err)
				assert.True(t, moved.ended(5*time.Second), "the moved hold ends once released")
			})
		}
	}
}
