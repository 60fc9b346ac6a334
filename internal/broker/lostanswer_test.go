package broker_test

import (
	"bytes"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// TestHandOffAnswerLost: a hand-off whose transaction Consul committed
// but whose answer never reached the broker. make chaos (seed 487355972)
// found it: the Consul leader died while a hand-off was in flight, and the
// follower answered "rpc error making call: EOF" for a transaction the new
// leader had. The waiter then found the lock held by its own session and
// took the grant without the session's record, which the hand-off had
// written; so its later clean-up was not conditioned on the record. Its
// client resumed the hold on another replica (a SIGTERM) and closed the
// old stream, and the old replica unlocked the key and destroyed the
// session under the resumed hold: another client got the lock while the
// first still held it.
//
// Here a proxy in front of a real agent forwards the hand-off's
// transaction and answers 500 with Consul's own text. "answer lost": the
// releaser learns from a read that the hand-off committed, answers OK, and
// hands the grant over. "answer and read lost": the read fails too, and
// the waiter finds the key its own later. Either way the waiter gets its
// grant with the record's token, and a resume of it on a second replica
// survives the end of the old stream. "…, then a hand-off": the new
// holder knows its record, so its own hand-off is one transaction again.
func TestHandOffAnswerLost(t *testing.T) {
	agent := consultest.Start(t)
	var lose atomic.Bool
	var failReads atomic.Int32 // consistent reads of the key still to fail
	var committed atomic.Int32 // hand-offs Consul committed whose answer was lost
	var readKey atomic.Value   // the key whose reads fail
	readKey.Store("")
	// Release transactions of countKey: those that also lock it (a hand-off
	// in one transaction) and those that do not.
	var countKey atomic.Value
	countKey.Store("")
	var handOffTxns, plainReleases atomic.Int32
	cfg := agent.Intercept(t, func(w http.ResponseWriter, r *http.Request, next http.Handler) {
		if k := countKey.Load().(string); k != "" && r.URL.Path == "/v1/txn" {
			body, err := peekBody(r)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadGateway)
				return
			}
			if bytes.Contains(body, []byte(`"Key":"`+k+`"`)) && bytes.Contains(body, []byte(`"Verb":"unlock"`)) {
				if bytes.Contains(body, []byte(`"Verb":"lock"`)) {
					handOffTxns.Add(1)
				} else {
					plainReleases.Add(1)
				}
			}
		}
		if r.Method == http.MethodGet && r.URL.Path == "/v1/kv/"+readKey.Load().(string) && r.URL.Query().Has("consistent") && failReads.Add(-1) >= 0 {
			http.Error(w, "rpc error making call: EOF", http.StatusInternalServerError)
			return
		}
		if r.URL.Path == "/v1/txn" && lose.Load() {
			body, err := peekBody(r)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadGateway)
				return
			}
			handOff := bytes.Contains(body, []byte(`"Verb":"unlock"`)) && bytes.Contains(body, []byte(`"Verb":"lock"`))
			if handOff && lose.CompareAndSwap(true, false) {
				if code, err := sendToAgent(agent, r, body); err == nil && code == http.StatusOK {
					committed.Add(1)
				}
				http.Error(w, "rpc error making call: EOF", http.StatusInternalServerError)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
	a, _ := replica(t, cfg, "a")
	b, storeB := replica(t, agent.Config(), "b")
	ctx := t.Context()

	for _, tc := range []struct {
		name      string
		failReads int32
		handOn    bool // the new holder then hands the lock on, instead of resuming
	}{{"answer lost", 0, false}, {"answer and read lost", 1, false}, {"answer and read lost, then a hand-off", 1, true}} {
		t.Run(tc.name, func(t *testing.T) {
			key := "lostanswer/" + strings.ReplaceAll(tc.name, " ", "-")
			holder := startHold(t, a, lockForever(key), nil)
			first := holder.next(broker.EventAcquired).Sequencer
			w := startHold(t, a, lockForever(key), nil)
			w.next(broker.EventQueued)

			committed.Store(0)
			readKey.Store(key)
			failReads.Store(tc.failReads)
			lose.Store(true)
			released, err := a.Release(ctx, key, first.Session, first.Token)
			require.Equal(t, int32(1), committed.Load(), "the hand-off was committed, its answer lost")
			if tc.failReads == 0 {
				require.NoError(t, err, "the release happened")
				assert.True(t, released)
			} else {
				// Nothing tells this replica what happened until a read
				// answers; the release did happen, as a retry can tell.
				t.Logf("Release, neither answer nor read: released=%v err=%v", released, err)
			}

			got := w.nextWithin(broker.EventAcquired, 20*time.Second).Sequencer
			entries, _, err := storeB.List(ctx, key, true)
			require.NoError(t, err)
			entries = onlyKey(entries, key) // the shared queue's guard may stay
			require.Len(t, entries, 1)
			require.Equal(t, got.Session, entries[0].Session, "the waiter's session holds the key")
			assert.Equal(t, entries[0].ModifyIndex, got.Token, "the grant's token is the hand-off's index")

			if tc.handOn {
				// The new holder knows the record its grant wrote: its own
				// hand-off is one transaction, conditioned on it. The old
				// holder's stream ends first (it learns that its hold is
				// gone and cleans up): its writes are not counted.
				if !holder.ended(10 * time.Second) {
					t.Fatal("the old holder's stream did not end")
				}
				next := startHold(t, a, lockForever(key), nil)
				next.next(broker.EventQueued)
				// Counted by what the transactions do, not by how many
				// the replica sent: the holds that ended (the old holder,
				// the releaser) clean up in the background, and under
				// -race their writes landed in a count of all writes.
				countKey.Store(key)
				released, err := a.Release(ctx, key, got.Session, got.Token)
				require.NoError(t, err)
				require.True(t, released)
				seq := next.next(broker.EventAcquired).Sequencer
				countKey.Store("")
				assert.Greater(t, seq.Token, got.Token)
				assert.Equal(t, int32(1), handOffTxns.Load(), "the hand-off from the new holder is one transaction: release and grant")
				assert.Zero(t, plainReleases.Load(), "no release of the key without its grant")
				return
			}

			// The waiter's client resumes the hold on replica b (its
			// replica a is going away), then closes its stream on a.
			resumed := startHold(t, b, &broker.AcquireSpec{Key: key, WaitForever: true, Resume: &got}, nil)
			rs := resumed.next(broker.EventAcquired).Sequencer
			require.Equal(t, got.Token, rs.Token)
			w.cancel()
			if !w.ended(10 * time.Second) {
				t.Fatal("the old stream's hold did not end")
			}

			// a must leave the resumed hold alone: b owns the session's
			// record. A loss would show within the loss bound (1 s).
			time.Sleep(1500 * time.Millisecond)
			if e, ok := resumed.sent(broker.EventLost); ok {
				t.Errorf("the resumed hold was lost after the old replica's stream ended: %v %s", e.Reason, e.Detail)
			}
			entries, _, err = storeB.List(ctx, key, true)
			require.NoError(t, err)
			entries = onlyKey(entries, key)
			require.Len(t, entries, 1)
			assert.Equal(t, got.Session, entries[0].Session, "the key is still held by the resumed session")
			_, err = storeB.Session(ctx, got.Session)
			assert.NoError(t, err, "the session still exists")
		})
	}
}

// onlyKey keeps the entry at key of a listing of its prefix.
func onlyKey(entries []*broker.Entry, key string) []*broker.Entry {
	var out []*broker.Entry
	for _, e := range entries {
		if e.Key == key {
			out = append(out, e)
		}
	}
	return out
}
