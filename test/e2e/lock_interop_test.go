package e2e

import (
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

// lkAPILock takes key with Consul's own api.Lock; tryOnce makes it give up
// after a short wait (it then returns nil).
func lkAPILock(t *testing.T, c *api.Client, key string, tryOnce bool) *api.Lock {
	t.Helper()
	l, err := c.LockOpts(&api.LockOptions{
		Key:          key,
		Value:        []byte("api"),
		SessionTTL:   "10s",
		LockTryOnce:  tryOnce,
		LockWaitTime: 300 * time.Millisecond,
	})
	require.NoError(t, err)
	stop := make(chan struct{})
	defer close(stop)
	held, err := l.Lock(stop)
	require.NoError(t, err)
	if held == nil {
		return nil
	}
	return l
}

// TestLockInteropWithConsulAPILock: a broker client and Consul's api.Lock
// on the same key exclude each other, both ways.
func TestLockInteropWithConsulAPILock(t *testing.T) {
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	c := r.Locks(t)
	cc := agent.Client()
	const key = "interop/lock"

	// api.Lock holds.
	al := lkAPILock(t, cc, key, false)
	require.NotNil(t, al)
	e, _, err := cc.KV().Get(key, nil)
	require.NoError(t, err)
	apiSession := e.Session

	try := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: key, WaitTimeout: dur(0), Session: fast()})
	err = try.end(5 * time.Second)
	assert.Equal(t, codes.Aborted, status.Code(err), "%v", err)
	assert.Contains(t, status.Convert(err).Message(), apiSession)

	waiter := acquire(t, c, &lockbrokerv1.AcquireRequest{Key: key, Value: []byte("broker"), Session: fast()})
	q := waiter.next(5*time.Second, isQueued).GetQueued()
	h := lkHolder(t, q.GetState())
	assert.Equal(t, apiSession, h.GetSessionId())
	assert.Equal(t, []byte("api"), h.GetValue())
	assert.Equal(t, lockbrokerv1.LockKind_LOCK_KIND_LOCK, q.GetState().GetKind())

	require.NoError(t, al.Unlock())
	seq := waiter.acquired(5 * time.Second).GetSequencer()
	e, _, err = cc.KV().Get(key, nil)
	require.NoError(t, err)
	assert.Equal(t, seq.GetSessionId(), e.Session)
	assert.Equal(t, uint64(api.LockFlagValue), e.Flags, "the broker writes api.Lock's flags")
	assert.Equal(t, []byte("broker"), e.Value)

	// The broker holds: api.Lock cannot take the key...
	assert.Nil(t, lkAPILock(t, cc, key, true), "api.Lock took a key the broker holds")

	// ...until the broker releases it.
	_, err = c.Release(lkCtx(t), &lockbrokerv1.ReleaseRequest{Key: key, SessionId: seq.GetSessionId(), Token: seq.GetToken()})
	require.NoError(t, err)
	waiter.next(5*time.Second, lkIsReleased)
	al = lkAPILock(t, cc, key, true)
	require.NotNil(t, al, "api.Lock could not take the key the broker released")
	st := lkGetLock(t, c, key)
	assert.NotEqual(t, seq.GetSessionId(), lkHolder(t, st).GetSessionId())
	assert.Greater(t, lkHolder(t, st).GetToken(), seq.GetToken())
	require.NoError(t, al.Unlock())
	require.NoError(t, al.Destroy())
}

// TestLockForeignKey: a key holding a plain KV value (flags that are not
// api.Lock's) cannot be locked, and is left untouched.
func TestLockForeignKey(t *testing.T) {
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	c := r.Locks(t)
	kv := agent.Client().KV()

	tests := []struct {
		name  string
		flags uint64
		wait  *lockbrokerv1.AcquireRequest
	}{
		{name: "flags 0, try once", flags: 0, wait: &lockbrokerv1.AcquireRequest{WaitTimeout: dur(0)}},
		{name: "flags 0, wait forever", flags: 0, wait: &lockbrokerv1.AcquireRequest{}},
		{name: "other flags, bounded wait", flags: 42, wait: &lockbrokerv1.AcquireRequest{WaitTimeout: dur(10 * time.Second)}},
		{name: "semaphore flags on the key itself", flags: uint64(api.SemaphoreFlagValue), wait: &lockbrokerv1.AcquireRequest{}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := "foreign/" + string(rune('a'+i))
			_, err := kv.Put(&api.KVPair{Key: key, Value: []byte("plain value"), Flags: tt.flags}, nil)
			require.NoError(t, err)
			before := lkConsulState(t, agent.Client())

			req := tt.wait
			req.Key, req.Session = key, fast()
			start := time.Now()
			err = acquire(t, c, req).end(5 * time.Second)
			assert.Equal(t, codes.FailedPrecondition, status.Code(err), "%v", err)
			assert.Less(t, time.Since(start), 2*time.Second, "a conflict is not waited on")

			after := lkConsulState(t, agent.Client())
			assert.Equal(t, before.KV, after.KV, "the foreign key was changed")
			e, _, err := kv.Get(key, nil)
			require.NoError(t, err)
			assert.Equal(t, []byte("plain value"), e.Value)
			assert.Equal(t, tt.flags, e.Flags)
			assert.Empty(t, e.Session)
			// The session the broker made for the request is gone.
			require.Eventually(t, func() bool {
				return len(lkConsulState(t, agent.Client()).Sessions) == len(before.Sessions)
			}, 5*time.Second, 20*time.Millisecond)
			assert.Equal(t, lockbrokerv1.LockKind_LOCK_KIND_FOREIGN, lkGetLock(t, c, key).GetKind())
		})
	}
}
