package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// semSnapshot is what must not change under a prefix: every entry's key,
// value, flags, session and indexes.
func semSnapshot(t *testing.T, c *api.Client, prefix string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, p := range semKV(t, c, prefix) {
		out[p.Key] = fmt.Sprintf("flags=%#x session=%q lock=%d create=%d modify=%d value=%q",
			p.Flags, p.Session, p.LockIndex, p.CreateIndex, p.ModifyIndex, p.Value)
	}
	return out
}

// TestSemaphoreAcquireRefused: requests that cannot be served as asked are
// refused with the right code, never INTERNAL (a panic in a handler), and
// leave the KV under the prefix exactly as it was.
func TestSemaphoreAcquireRefused(t *testing.T) {
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	c := r.Locks(t)
	consul := agent.Client()

	putLock := func(body string, flags uint64) func(t *testing.T, prefix string) {
		return func(t *testing.T, prefix string) {
			_, err := consul.KV().Put(&api.KVPair{Key: prefix + "/.lock", Value: []byte(body), Flags: flags}, nil)
			require.NoError(t, err)
		}
	}
	tests := []struct {
		name string
		// setup prepares prefix; needsFresh: it takes a broker slot on a
		// fresh prefix (see semSkipIfFreshPrefixBroken).
		setup      func(t *testing.T, prefix string)
		needsFresh bool
		limit      uint32
		code       codes.Code
		// msg holds regexps the status message must match.
		msg []string
	}{
		{
			name:  "limit conflict with an api.Semaphore holder",
			setup: func(t *testing.T, prefix string) { semConsulHold(t, consul, prefix, 3) },
			limit: 4, code: codes.FailedPrecondition, msg: []string{`\b3\b`, `\b4\b`},
		},
		{
			name:       "limit conflict with a broker holder",
			setup:      func(t *testing.T, prefix string) { semHold(t, c, prefix, 3, "H") },
			needsFresh: true,
			limit:      2, code: codes.FailedPrecondition, msg: []string{`\b3\b`, `\b2\b`},
		},
		{
			name:  "limit conflict with a stored limit and no holder",
			setup: putLock(`{"Limit":5,"Holders":{}}`, semFlags),
			limit: 3, code: codes.FailedPrecondition, msg: []string{`\b5\b`, `\b3\b`},
		},
		{
			name:  "foreign flags on .lock",
			setup: putLock(`{"Limit":3,"Holders":{}}`, 42),
			limit: 3, code: codes.FailedPrecondition,
		},
		{
			name:  "foreign flags and foreign data on .lock",
			setup: putLock("somebody else's data", 0),
			limit: 3, code: codes.FailedPrecondition,
		},
		{name: "malformed .lock: not JSON", setup: putLock("not json", semFlags), limit: 3, code: codes.FailedPrecondition},
		{name: "malformed .lock: truncated", setup: putLock(`{"Limit":3,"Hol`, semFlags), limit: 3, code: codes.FailedPrecondition},
		{name: "malformed .lock: JSON array", setup: putLock(`[1,2,3]`, semFlags), limit: 3, code: codes.FailedPrecondition},
		{name: "malformed .lock: limit is a string", setup: putLock(`{"Limit":"3","Holders":{}}`, semFlags), limit: 3, code: codes.FailedPrecondition},
		{name: "malformed .lock: holders is a list", setup: putLock(`{"Limit":3,"Holders":["a"]}`, semFlags), limit: 3, code: codes.FailedPrecondition},
		{name: "malformed .lock: limit 0", setup: putLock(`{"Limit":0,"Holders":{}}`, semFlags), limit: 3, code: codes.FailedPrecondition},
		{name: "malformed .lock: negative limit", setup: putLock(`{"Limit":-3,"Holders":{}}`, semFlags), limit: 3, code: codes.FailedPrecondition},
		{name: "malformed .lock: huge limit", setup: putLock(`{"Limit":1e12,"Holders":{}}`, semFlags), limit: 3, code: codes.FailedPrecondition},
		{name: "malformed .lock: JSON null", setup: putLock(`null`, semFlags), limit: 3, code: codes.FailedPrecondition},
		{name: "limit 5000", setup: func(*testing.T, string) {}, limit: 5000, code: codes.InvalidArgument, msg: []string{`limit`}},
		{name: "limit 1025", setup: func(*testing.T, string) {}, limit: 1025, code: codes.InvalidArgument, msg: []string{`limit`}},
		{
			name:  "limit 1 on a semaphore prefix",
			setup: func(t *testing.T, prefix string) { semConsulHold(t, consul, prefix, 3) },
			limit: 1, code: codes.FailedPrecondition,
		},
		{
			name:  "limit 0 on a semaphore prefix",
			setup: func(t *testing.T, prefix string) { semConsulHold(t, consul, prefix, 3) },
			limit: 0, code: codes.FailedPrecondition,
		},
		{
			name:       "limit 1 on a prefix the broker holds a semaphore of",
			setup:      func(t *testing.T, prefix string) { semHold(t, c, prefix, 3, "H") },
			needsFresh: true,
			limit:      1, code: codes.FailedPrecondition,
		},
		{
			name: "limit 3 on a held lock key",
			setup: func(t *testing.T, prefix string) {
				s := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: prefix, Session: fast()})
				s.acquired(10 * time.Second)
			},
			limit: 3, code: codes.FailedPrecondition,
		},
		{
			name: "limit 3 on a free lock key",
			setup: func(t *testing.T, prefix string) {
				_, err := consul.KV().Put(&api.KVPair{Key: prefix, Flags: api.LockFlagValue}, nil)
				require.NoError(t, err)
			},
			limit: 3, code: codes.FailedPrecondition,
		},
	}
	var freshBug string
	if semFreshPrefixBug(t, c) {
		freshBug = "regression: the broker cannot take the first slot of a semaphore on a fresh prefix; see TestSemaphoreAcquireOnFreshPrefix"
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.needsFresh && freshBug != "" {
				t.Fatal(freshBug)
			}
			prefix := "refused/" + t.Name()
			tt.setup(t, prefix)
			before := semSnapshot(t, consul, prefix)

			for _, wait := range []*lockbrokerv1.AcquireRequest{
				{WaitTimeout: dur(0)},           // try once
				{WaitTimeout: dur(time.Second)}, // bounded wait
				{},                              // wait until cancelled
			} {
				req := semReq(prefix, tt.limit, "refused")
				req.WaitTimeout = wait.WaitTimeout
				err := acquire(t, c, req).end(10 * time.Second)
				st := status.Convert(err)
				require.Equal(t, tt.code, st.Code(), "wait_timeout %v: %v", wait.GetWaitTimeout().AsDuration(), err)
				for _, re := range tt.msg {
					assert.Regexp(t, re, st.Message())
				}
			}

			assert.Equal(t, before, semSnapshot(t, consul, prefix), "the KV under %s changed", prefix)
			// GetLock reports the same prefix without failing.
			_, err := c.GetLock(context.Background(), &lockbrokerv1.GetLockRequest{Key: prefix})
			assert.NotEqual(t, codes.Internal, status.Code(err), "%v", err)
		})
	}
}

// TestSemaphoreLimitsZeroAndOneAreLocks: limit 0 and 1 take a lock (Consul
// api.Lock's flags on the key itself, no `.lock`), 2 and 1024 a semaphore.
func TestSemaphoreLimitsZeroAndOneAreLocks(t *testing.T) {
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	c := r.Locks(t)
	consul := agent.Client()
	freshBug := semFreshPrefixBug(t, c)

	tests := []struct {
		limit uint32
		kind  lockbrokerv1.LockKind
	}{
		{0, lockbrokerv1.LockKind_LOCK_KIND_LOCK},
		{1, lockbrokerv1.LockKind_LOCK_KIND_LOCK},
		{2, lockbrokerv1.LockKind_LOCK_KIND_SEMAPHORE},
		{1024, lockbrokerv1.LockKind_LOCK_KIND_SEMAPHORE},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("limit %d", tt.limit), func(t *testing.T) {
			if tt.kind == lockbrokerv1.LockKind_LOCK_KIND_SEMAPHORE && freshBug {
				t.Fatal("regression: the broker cannot take the first slot of a semaphore on a fresh prefix; see TestSemaphoreAcquireOnFreshPrefix")
			}
			key := "limits/" + t.Name()
			_, seq := semHold(t, c, key, tt.limit, "me")
			assert.Equal(t, tt.kind, seq.GetKind())
			kv, _, err := consul.KV().Get(key, nil)
			require.NoError(t, err)
			semLockKV, _, err := consul.KV().Get(key+"/.lock", nil)
			require.NoError(t, err)
			if tt.kind == lockbrokerv1.LockKind_LOCK_KIND_LOCK {
				require.NotNil(t, kv)
				assert.Equal(t, uint64(api.LockFlagValue), kv.Flags)
				assert.Equal(t, seq.GetSessionId(), kv.Session)
				assert.Nil(t, semLockKV, "a lock must not write a semaphore's .lock")
				return
			}
			assert.Nil(t, kv, "a semaphore must not write its prefix key")
			require.NotNil(t, semLockKV)
			body, _ := semLock(t, consul, key)
			assert.Equal(t, int(tt.limit), body.Limit)
			assert.True(t, body.Holders[seq.GetSessionId()])
		})
	}
}

// TestSemaphoreReleaseByNonHolder: Release with a session that holds no
// slot of the prefix is refused and changes nothing, even when the session
// waits for a slot there.
func TestSemaphoreReleaseByNonHolder(t *testing.T) {
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	c := r.Locks(t)
	sessions := r.Sessions(t)
	consul := agent.Client()

	newSession := func(t *testing.T) string {
		resp, err := sessions.CreateSession(context.Background(), &lockbrokerv1.CreateSessionRequest{Options: &lockbrokerv1.SessionOptions{Ttl: dur(30 * time.Second)}})
		require.NoError(t, err)
		sid := resp.GetSession().GetId()
		t.Cleanup(func() { _, _ = consul.Session().Destroy(sid, nil) })
		return sid
	}
	tests := []struct {
		name string
		// session returns the session to release with (and the token of
		// its grant, 0 if none), and a waiting stream that must be
		// unaffected (nil if none).
		session func(t *testing.T, prefix string) (string, uint64, *stream)
		code    codes.Code
	}{
		{
			name:    "a session that holds nothing",
			session: func(t *testing.T, _ string) (string, uint64, *stream) { return newSession(t), 0, nil },
			code:    codes.FailedPrecondition,
		},
		{
			name: "a session that holds a slot of another prefix",
			session: func(t *testing.T, prefix string) (string, uint64, *stream) {
				semConsulHold(t, consul, prefix+"-other", 2)
				_, seq := semHold(t, c, prefix+"-other", 2, "elsewhere")
				return seq.GetSessionId(), seq.GetToken(), nil
			},
			code: codes.FailedPrecondition,
		},
		{
			name: "a waiting contender",
			session: func(t *testing.T, prefix string) (string, uint64, *stream) {
				s, sid := semQueued(t, c, semReq(prefix, 2, "W"))
				return sid, 0, s
			},
			code: codes.FailedPrecondition,
		},
		{
			name: "an unknown session",
			session: func(*testing.T, string) (string, uint64, *stream) {
				return "8f2a40c4-52e6-4c4c-9a85-33d4bfa1a9a1", 0, nil
			},
			code: codes.NotFound,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prefix := "nonholder/" + t.Name()
			// Two api.Semaphore holders fill the semaphore (limit 2).
			_, releaseA := semConsulHold(t, consul, prefix, 2)
			semConsulHold(t, consul, prefix, 2)
			sid, token, waiter := tt.session(t, prefix)
			before := semSnapshot(t, consul, prefix)

			resp, err := c.Release(context.Background(), &lockbrokerv1.ReleaseRequest{Key: prefix, SessionId: sid, Token: token})
			assert.Equal(t, tt.code, status.Code(err), "Release returned %v, error %v", resp, err)
			assert.Equal(t, before, semSnapshot(t, consul, prefix), "the KV under %s changed", prefix)

			if waiter != nil { // it still waits, and gets the next free slot
				releaseA()
				seq := waiter.acquired(5 * time.Second).GetSequencer()
				assert.Equal(t, sid, seq.GetSessionId())
			}
		})
	}
}
