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

// TestResumedWaitGrantedOnLaggingView: a semaphore (or read-write lock)
// wait that moves to replica B enters its contender entry again there,
// which bumps the entry's LockIndex. When the slot came free between B's
// read of the key and that entry, B's first attempt works on the read
// (full) and the waiter sleeps; B's shared watch then brings the free
// slot, in a listing from before the entry was entered again, showing the
// entry's old LockIndex. The grant made on that listing passed all its
// checks (the session's entry, the `.lock` it changes) and gave the client
// the old LockIndex: the next listing showed the entry with another one,
// and the broker told the client its hold was lost (DELETED_BY_OTHER),
// 2 ms after granting it. That is the chaos loss of seeds 808228602 and
// 426468788. The grant must carry the entry's LockIndex as it is.
//
// The proxy in front of B holds B's transaction that enters the entry
// again until the holder has gone, and the watch's answers until B's
// waiter has reported itself queued. (A read-write lock's wait enters its
// entry with a check-and-set of the key, so a listing from before fails
// the grant's check-and-set; its case guards that.) The old code failed
// the semaphore's case every run.
func TestResumedWaitGrantedOnLaggingView(t *testing.T) {
	agent := consultest.Start(t)
	var mu sync.Mutex
	var enterKey string // hold B's transaction that locks this key
	var caught, letGo, watchGo chan struct{}
	cfg := agent.Intercept(t, func(w http.ResponseWriter, r *http.Request, next http.Handler) {
		mu.Lock()
		ek, c, l, wg := enterKey, caught, letGo, watchGo
		mu.Unlock()
		if r.Method == http.MethodGet && r.URL.Query().Has("index") && wg != nil {
			answerAfter(w, r, next, func() {
				mu.Lock()
				g := watchGo
				mu.Unlock()
				if g != nil {
					<-g
				}
			})
			return
		}
		if r.URL.Path == "/v1/txn" && ek != "" {
			body, err := peekBody(r)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadGateway)
				return
			}
			if bytes.Contains(body, []byte(`"Verb":"lock","Key":"`+ek+`"`)) {
				mu.Lock()
				first := enterKey != ""
				enterKey = ""
				mu.Unlock()
				if first {
					close(c)
					<-l
				}
			}
		}
		next.ServeHTTP(w, r)
	})
	a, _ := replica(t, agent.Config(), "a")
	b, _ := replica(t, cfg, "b")
	kv := agent.Client().KV()

	for _, kind := range []string{"semaphore", "write"} {
		t.Run(kind, func(t *testing.T) {
			key := "staleentry/" + kind
			spec := func() *broker.AcquireSpec {
				s := lockForever(key)
				if kind == "semaphore" {
					s.Limit = 1
					s.Semaphore = true
				} else {
					s.Mode = broker.ModeWrite
				}
				return s
			}
			holder := startHold(t, a, spec(), nil)
			holder.next(broker.EventAcquired)
			w := startHold(t, a, spec(), nil)
			sid := w.next(broker.EventQueued).Session
			// A waiter behind it on B keeps B's watch of the key going.
			behind := startHold(t, b, spec(), nil)
			behind.next(broker.EventQueued)

			ck := key + "/" + sid
			mu.Lock()
			enterKey, caught, letGo, watchGo = ck, make(chan struct{}), make(chan struct{}), make(chan struct{})
			mu.Unlock()
			s := spec()
			s.NewSession = nil
			s.Resume = &broker.Sequencer{Key: key, Session: sid}
			moved := startHold(t, b, s, nil)
			select {
			case <-caught:
			case <-time.After(5 * time.Second):
				t.Fatal("B never entered the moved wait's contender entry again")
			}
			w.cancel() // the client left A for B
			holder.cancel()
			require.True(t, holder.ended(10*time.Second), "the holder's request ends")
			mu.Lock()
			close(letGo)
			mu.Unlock()
			moved.next(broker.EventQueued)
			mu.Lock()
			close(watchGo)
			watchGo = nil
			mu.Unlock()

			freed := time.Now()
			got := moved.nextWithin(broker.EventAcquired, 10*time.Second).Sequencer
			t.Logf("granted %s after the listing went out", time.Since(freed).Round(time.Millisecond))
			p, _, err := kv.Get(ck, &api.QueryOptions{RequireConsistent: true})
			require.NoError(t, err)
			require.NotNil(t, p, "the contender entry is there")
			assert.Equal(t, p.LockIndex, got.LockIndex, "the grant's LockIndex is the entry's")
			time.Sleep(500 * time.Millisecond) // the listings after the grant
			if e, lost := moved.sent(broker.EventLost); lost {
				t.Errorf("the moved wait's grant was reported lost: %v %s", e.Reason, e.Detail)
			}
			select {
			case <-moved.done:
				t.Errorf("the moved wait's request ended: %v", moved.err)
			default:
			}
			// Released, not cancelled: a resumed hold cancelled lingers for
			// its client's next resume.
			_, err = b.Release(t.Context(), key, got.Session, got.Token)
			require.NoError(t, err)
		})
	}
}
