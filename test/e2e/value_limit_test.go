package e2e

import (
	"bytes"
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

// maxValue is the API's bound on a value (the proto's bytes.max_len).
const maxValue = 256 << 10

// TestValueLimit checks both sides of the value bound against a Consul
// with default limits (txn_max_req_len 512 KiB): a value of exactly
// 256 KiB takes a lock, a semaphore slot and a TryAcquire grant, and
// SetValue writes one, each value as sent; one byte more, and the old
// bound of 512 KiB (which Consul refused as too large a transaction, from
// about 384 KiB, CONSUL_REJECTED), are INVALID_ARGUMENT naming `value`,
// with nothing written to Consul.
func TestValueLimit(t *testing.T) {
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	locks, sessions := r.Locks(t), r.Sessions(t)
	cc := agent.Client()
	value := func(n int, b byte) []byte { return bytes.Repeat([]byte{b}, n) }
	stored := func(key string) []byte {
		kv, _, err := cc.KV().Get(key, nil)
		require.NoError(t, err)
		require.NotNil(t, kv, "%s", key)
		return kv.Value
	}

	// The largest value, for each way of writing one.
	lock := acquire(t, locks, &lockbrokerv1.AcquireRequest{Key: "big/lock", Value: value(maxValue, 'a'), WaitTimeout: dur(0)})
	seq := lock.acquired(10 * time.Second).GetSequencer()
	assert.True(t, bytes.Equal(value(maxValue, 'a'), stored("big/lock")), "lock value as sent")

	sem := acquire(t, locks, &lockbrokerv1.AcquireRequest{Key: "big/sem", Value: value(maxValue, 'b'), Limit: 3, WaitTimeout: dur(0)})
	semSeq := sem.acquired(10 * time.Second).GetSequencer()
	assert.True(t, bytes.Equal(value(maxValue, 'b'), stored("big/sem/"+semSeq.GetSessionId())), "contender value as sent")

	_, err := locks.SetValue(lkCtx(t), &lockbrokerv1.SetValueRequest{Key: "big/lock", SessionId: seq.GetSessionId(), Token: seq.GetToken(), Value: value(maxValue, 'c')})
	require.NoError(t, err)
	assert.True(t, bytes.Equal(value(maxValue, 'c'), stored("big/lock")), "SetValue's value as sent")
	_, err = locks.SetValue(lkCtx(t), &lockbrokerv1.SetValueRequest{Key: "big/sem", SessionId: semSeq.GetSessionId(), Token: semSeq.GetToken(), Value: value(maxValue, 'd')})
	require.NoError(t, err)
	assert.True(t, bytes.Equal(value(maxValue, 'd'), stored("big/sem/"+semSeq.GetSessionId())), "SetValue's contender value as sent")

	cs, err := sessions.CreateSession(lkCtx(t), &lockbrokerv1.CreateSessionRequest{})
	require.NoError(t, err)
	sid := cs.GetSession().GetId()
	_, err = locks.TryAcquire(lkCtx(t), &lockbrokerv1.TryAcquireRequest{Key: "big/try", SessionId: sid, Value: value(maxValue, 'e')})
	require.NoError(t, err)
	assert.True(t, bytes.Equal(value(maxValue, 'e'), stored("big/try")), "TryAcquire's value as sent")

	// One byte more, and the old bound: refused before Consul.
	before := lkConsulState(t, cc)
	for _, n := range []int{maxValue + 1, 512 << 10} {
		_, err := locks.TryAcquire(lkCtx(t), &lockbrokerv1.TryAcquireRequest{Key: "big/try2", SessionId: sid, Value: value(n, 'x')})
		requireValueRefused(t, err, "TryAcquire", n)
		_, err = locks.SetValue(lkCtx(t), &lockbrokerv1.SetValueRequest{Key: "big/lock", SessionId: seq.GetSessionId(), Token: seq.GetToken(), Value: value(n, 'x')})
		requireValueRefused(t, err, "SetValue", n)
		_, err = locks.SetValue(lkCtx(t), &lockbrokerv1.SetValueRequest{Key: "big/sem", SessionId: semSeq.GetSessionId(), Token: semSeq.GetToken(), Value: value(n, 'x')})
		requireValueRefused(t, err, "SetValue of a slot", n)
		for _, limit := range []uint32{0, 3} {
			s := acquire(t, locks, &lockbrokerv1.AcquireRequest{Key: "big/other", Value: value(n, 'x'), Limit: limit, WaitTimeout: dur(0)})
			requireValueRefused(t, s.end(10*time.Second), "Acquire", n)
		}
	}
	assert.Equal(t, before, lkConsulState(t, cc), "a refused value wrote to Consul")
}

func requireValueRefused(t *testing.T, err error, call string, n int) {
	t.Helper()
	require.Error(t, err, "%s with a %d-byte value", call, n)
	assert.Equal(t, codes.InvalidArgument, status.Code(err), "%s with a %d-byte value: %v", call, n, err)
	assert.Contains(t, status.Convert(err).Message(), "value", "%s with a %d-byte value", call, n)
}
