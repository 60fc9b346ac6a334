package broker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/consulstore"
)

// TestRetriedRenewalFailuresAreLogged: while Consul cannot be reached,
// every hold's renewals fail and are retried until its safe deadline. The
// broker says so as they fail, at most one line a second for all of them,
// each line with how many failures it left out. Each hold is told to
// resume on another replica (REPLICA_CUT_OFF, with what is left of its
// guarantee) once the replica counts as cut off, 3 s after the agent
// stopped answering; its renewals go on meanwhile.
func TestRetriedRenewalFailuresAreLogged(t *testing.T) {
	agent, store := startStore(t, consulstore.Options{CallTimeout: time.Second})
	core, logs := observer.New(zapcore.WarnLevel)
	b := broker.New(store, zap.New(core))
	t.Cleanup(b.Close)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	const holds = 10
	acquired, lost, done := make(chan struct{}, holds), make(chan broker.Event, holds), make(chan error, holds)
	for i := range holds {
		go func() {
			spec := &broker.AcquireSpec{Key: fmt.Sprintf("renewals/%d", i), WaitForever: true, NewSession: &broker.SessionSpec{TTL: 10 * time.Second}}
			done <- b.Acquire(ctx, spec, func(e broker.Event) error {
				switch e.Kind {
				case broker.EventAcquired:
					acquired <- struct{}{}
				case broker.EventLost:
					lost <- e
				}
				return nil
			})
		}()
	}
	for range holds {
		select {
		case <-acquired:
		case <-time.After(10 * time.Second):
			t.Fatal("a hold was not acquired")
		}
	}
	agent.Stop()
	stopped := time.Now()
	for range holds {
		select {
		case e := <-lost:
			assert.Equal(t, broker.LostReplicaCutOff, e.Reason, e.Detail)
			assert.Positive(t, e.GuaranteedFor, "what is left of the guarantee")
		case <-time.After(15 * time.Second):
			t.Fatal("a hold was not lost after Consul stopped")
		}
		require.NoError(t, <-done)
	}

	lines := logs.FilterMessage("session renewal failed; retrying until the session's safe deadline").All()
	require.NotEmpty(t, lines, "no retried renewal failure was logged")
	failures := 0
	for i, l := range lines {
		fields := l.ContextMap()
		assert.NotEmpty(t, fields["session"])
		assert.NotEmpty(t, fields["error"])
		failures += 1 + int(fields["failures_not_logged"].(int64))
		if i > 0 {
			assert.GreaterOrEqual(t, l.Time.Sub(lines[i-1].Time), time.Second, "two lines within a second")
		}
	}
	// Each hold's first renewal (due TTL/3 after its grant) failed, and was
	// retried before its safe deadline (the TTL less 1 s).
	assert.GreaterOrEqual(t, failures, holds)
	t.Logf("%d lines for %d failed renewals of %d holds, over %s after Consul stopped", len(lines), failures, holds, time.Since(stopped).Round(time.Millisecond))
}
