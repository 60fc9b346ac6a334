package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// Leader election: five candidates campaign for one key with their
// identity as value and a lock-delay of 1s; three observers (two replicas)
// record the leader sequence. Leaders are killed one by one, alternately
// by closing their stream (a resignation: the broker releases the key) and
// by destroying their session in Consul (a failure: Consul's lock-delay
// applies). Every observer sees the same terms in the same order, each
// once, a "no leader" state between leaders, and each new leader within
// lock-delay + 1s of the old one's end.
func TestLeaderElectionObserversSeeEveryTerm(t *testing.T) {
	agent := consultest.Start(t)
	replicas := []*brokertest.Replica{brokertest.Start(t, agent), brokertest.Start(t, agent)}
	const (
		key        = "service/leader"
		lockDelay  = time.Second
		candidates = 5
	)
	observers := []*wtObserver{
		wtObserve(t, "observer 1 (replica 0)", replicas[0].Locks(t), key, false),
		wtObserve(t, "observer 2 (replica 0)", replicas[0].Locks(t), key, false),
		wtObserve(t, "observer 3 (replica 1)", replicas[1].Locks(t), key, false),
	}
	for _, o := range observers {
		o.until(5*time.Second, "the state now", func(*lockbrokerv1.LockState) bool { return true })
	}

	cands := make(map[string]*stream, candidates)
	for i := range candidates {
		id := fmt.Sprintf("candidate-%d", i)
		cands[id] = acquire(t, replicas[i%2].Locks(t), &lockbrokerv1.AcquireRequest{
			Key:   key,
			Value: []byte(id),
			Session: &lockbrokerv1.AcquireRequest_NewSession{NewSession: &lockbrokerv1.SessionOptions{
				Ttl: dur(10 * time.Second), LockDelay: dur(lockDelay), Name: id,
			}},
		})
	}

	type term struct {
		leader string
		token  uint64
	}
	var terms []term
	var handed []bool // the term was cancelled (the next may follow with no free state between)
	var killedAt time.Time
	for round := range candidates {
		resp, at := observers[0].until(lockDelay+5*time.Second, "a leader", func(st *lockbrokerv1.LockState) bool { return len(st.GetHolders()) == 1 })
		h := resp.GetState().GetHolders()[0]
		id := string(h.GetValue())
		s, ok := cands[id]
		require.True(t, ok, "round %d: the leader %q is a live candidate", round, id)
		seq := s.acquired(5 * time.Second).GetSequencer()
		require.Equal(t, seq.GetToken(), h.GetToken(), "round %d: observers report the grant's token", round)
		require.Equal(t, seq.GetSessionId(), h.GetSessionId())
		if round > 0 {
			gap := at.Sub(killedAt)
			t.Logf("round %d: %s leads (token %d) %s after the previous leader's end", round, id, seq.GetToken(), gap.Round(time.Millisecond))
			assert.LessOrEqual(t, gap, lockDelay+time.Second, "round %d: a new leader within lock-delay + 1s", round)
		} else {
			t.Logf("round 0: %s leads (token %d)", id, seq.GetToken())
		}
		terms = append(terms, term{id, seq.GetToken()})
		delete(cands, id)
		for _, o := range observers[1:] { // every observer has seen this leader before it is killed
			o.until(5*time.Second, "the leader "+id, wtHeldBy(seq.GetSessionId()))
		}

		killedAt = time.Now()
		if round%2 == 0 {
			// The leader's stream closes: the broker releases the key, or
			// hands it straight to a candidate waiting on the same replica
			// (one transaction: Consul never shows the key free).
			s.cancel()
		} else {
			_, err := agent.Client().Session().Destroy(seq.GetSessionId(), nil)
			require.NoError(t, err)
			lost := s.next(2*time.Second, isLost).GetLost()
			assert.Equal(t, lockbrokerv1.LostReason_LOST_REASON_SESSION_INVALIDATED, lost.GetReason())
		}
		end, _ := observers[0].until(5*time.Second, "the end of the term", func(st *lockbrokerv1.LockState) bool {
			return len(st.GetHolders()) == 0 || st.GetHolders()[0].GetSessionId() != seq.GetSessionId()
		})
		if len(end.GetState().GetHolders()) > 0 {
			observers[0].unread() // handed over: that state is the next term
		}
		handed = append(handed, round%2 == 0)
	}

	// What every observer must have seen: the key's state before the
	// campaign (NONE), then each term and a "no leader" state after it,
	// except where a cancelled leader's replica handed the key straight
	// to the next term (then there was no such state to see).
	want := []string{"none"}
	handedTerm := map[string]bool{}
	for i, tm := range terms {
		want = append(want, fmt.Sprintf("%s/%d", tm.leader, tm.token))
		handedTerm[fmt.Sprintf("%s/%d", tm.leader, tm.token)] = handed[i]
		if !handed[i] || i == len(terms)-1 {
			want = append(want, "free")
		}
	}
	// A handed-over term may still show a free state (no candidate waited
	// on its replica): those are dropped before comparing, so the wait is
	// for the sequence without them (a count of raw states can be reached
	// before the last "free" arrives).
	terms2 := func(o *wtObserver) (got []*lockbrokerv1.WatchResponse, seen, kept []string) {
		got, _ = o.responses()
		for _, r := range got {
			st := r.GetState()
			switch {
			case st.GetKind() == lockbrokerv1.LockKind_LOCK_KIND_NONE:
				seen = append(seen, "none")
			case len(st.GetHolders()) == 0:
				seen = append(seen, "free")
			default:
				seen = append(seen, fmt.Sprintf("%s/%d", st.GetHolders()[0].GetValue(), st.GetHolders()[0].GetToken()))
			}
		}
		for i, x := range seen {
			if x == "free" && i > 0 && i+1 < len(seen) && handedTerm[seen[i-1]] {
				continue
			}
			kept = append(kept, x)
		}
		return got, seen, kept
	}
	for _, o := range observers {
		require.Eventually(t, func() bool { _, _, kept := terms2(o); return len(kept) >= len(want) }, 5*time.Second, 10*time.Millisecond,
			"%s saw fewer states than %v", o.name, want)
		got, seen, kept := terms2(o)
		for _, r := range got {
			assert.Zero(t, r.GetSkipped(), "%s: a prompt reader skips nothing: %s", o.name, wtDescribe(got))
		}
		assert.Equal(t, want, kept, "%s: every term once, in order, with no leader in between (%v)", o.name, seen)
	}
}
