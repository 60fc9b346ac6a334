package e2e

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// Work keys: a try-once lock with DELETE behaviour on a broker-owned
// session. However the hold ends — Release, the stream closing, the
// session dying in Consul — the session's end deletes the key ("use it for
// work keys that should vanish once done", types.proto), and the fencing
// token of the next grant of the re-created key is still higher.
func TestWorkersDeleteBehaviorKeysVanish(t *testing.T) {
	tests := []struct {
		name string
		// invalidates: the hold ends with its session's invalidation, so
		// Consul's lock-delay applies before the next grant.
		invalidates bool
		end         func(t *testing.T, agent *consultest.Agent, c lockbrokerv1.LockServiceClient, s *stream, seq *lockbrokerv1.Sequencer)
	}{
		{
			name: "released",
			end: func(t *testing.T, _ *consultest.Agent, c lockbrokerv1.LockServiceClient, s *stream, seq *lockbrokerv1.Sequencer) {
				_, err := c.Release(wtCtx(t), &lockbrokerv1.ReleaseRequest{Key: seq.GetKey(), SessionId: seq.GetSessionId(), Token: seq.GetToken()})
				require.NoError(t, err)
				s.next(5*time.Second, func(r *lockbrokerv1.AcquireResponse) bool { return r.GetReleased() != nil })
			},
		},
		{
			name: "stream closed",
			end: func(t *testing.T, agent *consultest.Agent, _ lockbrokerv1.LockServiceClient, s *stream, seq *lockbrokerv1.Sequencer) {
				s.cancel()
				require.Eventually(t, func() bool {
					se, _, err := agent.Client().Session().Info(seq.GetSessionId(), nil)
					return err == nil && se == nil
				}, 5*time.Second, 10*time.Millisecond, "the broker destroys its session")
			},
		},
		{
			name:        "session destroyed in Consul",
			invalidates: true,
			end: func(t *testing.T, agent *consultest.Agent, _ lockbrokerv1.LockServiceClient, s *stream, seq *lockbrokerv1.Sequencer) {
				_, err := agent.Client().Session().Destroy(seq.GetSessionId(), nil)
				require.NoError(t, err)
				s.next(2*time.Second, isLost)
			},
		},
	}
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	c := r.Locks(t)
	work := func(key, who string) *lockbrokerv1.AcquireRequest {
		return &lockbrokerv1.AcquireRequest{Key: key, Value: []byte(who), WaitTimeout: dur(0), Session: &lockbrokerv1.AcquireRequest_NewSession{
			NewSession: &lockbrokerv1.SessionOptions{Ttl: dur(10 * time.Second), LockDelay: dur(0), Behavior: lockbrokerv1.SessionBehavior_SESSION_BEHAVIOR_DELETE},
		}}
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := "tasks/" + t.Name()
			s := acquire(t, c, work(key, "w1"))
			seq := s.acquired(5 * time.Second).GetSequencer()
			se, _, err := agent.Client().Session().Info(seq.GetSessionId(), nil)
			require.NoError(t, err)
			require.NotNil(t, se)

			busy := acquire(t, c, work(key, "w2"))
			err = busy.end(5 * time.Second)
			assert.Equal(t, codes.Aborted, status.Code(err), "a second worker's try finds the task taken: %v", err)

			tt.end(t, agent, c, s, seq)
			require.Eventually(t, func() bool {
				kv, _, err := agent.Client().KV().Get(key, nil)
				return err == nil && kv == nil
			}, 5*time.Second, 10*time.Millisecond, "the task key vanishes when its hold ends")

			if tt.invalidates && se.LockDelay > 0 {
				t.Fatalf("regression: the session was created with lock_delay 0 but Consul applies %s (see TestLockSessionOptionsReachConsul); the key cannot be taken again in time", se.LockDelay)
			}
			// The key is created again by the next grant; its token still grows.
			again := acquire(t, c, work(key, "w3"))
			seq2 := again.acquired(5 * time.Second).GetSequencer()
			assert.Greater(t, seq2.GetToken(), seq.GetToken(), "the token never goes back, across the key's deletion")
			resp, err := c.CheckSequencer(wtCtx(t), &lockbrokerv1.CheckSequencerRequest{Sequencer: seq})
			require.NoError(t, err)
			assert.False(t, resp.GetCurrent(), "the first grant is not current on the re-created key")
		})
	}
}
