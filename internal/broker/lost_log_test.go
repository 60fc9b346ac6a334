package broker_test

import (
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/consulstore"
)

// TestLostHoldLogsReasonName: the log line of a lost hold names the
// reason as the API and every client library spell it
// (SESSION_INVALIDATED), not by its number.
func TestLostHoldLogsReasonName(t *testing.T) {
	agent, store := startStore(t, consulstore.Options{})
	core, logs := observer.New(zapcore.InfoLevel)
	b := broker.New(store, zap.New(core))
	t.Cleanup(b.Close)

	spec := &broker.AcquireSpec{Key: "lostlog/k", WaitForever: true, NewSession: &broker.SessionSpec{TTL: 10 * time.Second}}
	h := startHold(t, b, spec, nil)
	held := h.next(broker.EventAcquired)
	c, err := api.NewClient(agent.Config())
	require.NoError(t, err)
	_, err = c.Session().Destroy(held.Sequencer.Session, nil)
	require.NoError(t, err)
	lost := h.next(broker.EventLost)
	require.Equal(t, broker.LostSessionInvalidated, lost.Reason, lost.Detail)

	lines := logs.FilterMessage("hold lost").All()
	require.Len(t, lines, 1)
	assert.Equal(t, "SESSION_INVALIDATED", lines[0].ContextMap()["reason"])
}

// TestLostReasonString: every reason has a name, and a value that is none
// of them says so.
func TestLostReasonString(t *testing.T) {
	for r := broker.LostSessionInvalidated; r <= broker.LostReplicaCutOff; r++ {
		assert.NotEqual(t, "UNSPECIFIED", r.String(), int(r))
	}
	assert.Equal(t, "UNSPECIFIED", broker.LostReason(0).String())
	assert.Equal(t, "UNSPECIFIED", broker.LostReason(99).String())
}
