package consulstore

import (
	"net/http"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// TestOpenOptions checks the defaults and the refusal of bad options.
func TestOpenOptions(t *testing.T) {
	t.Parallel()
	cfg := unreachableConfig(t)
	s, err := Open(cfg, Options{})
	require.NoError(t, err)
	defer s.Close()
	assert.Equal(t, Options{WaitTime: 30 * time.Second, MaxBlocking: 32, MaxConns: 64, CallTimeout: 10 * time.Second, MaxTxnInFlight: 4}, s.Options())
	require.Len(t, s.transports, 3)
	assert.Equal(t, 64, s.transports[0].MaxConnsPerHost)
	assert.Equal(t, 32, s.transports[1].MaxConnsPerHost)
	assert.Equal(t, 1, s.transports[2].MaxConnsPerHost, "the reach probe's own connection")
	assert.LessOrEqual(t, s.Options().MaxBlocking+s.Options().MaxConns+1, 100, "two replicas fit under Consul's default 200")
	assert.Equal(t, 32, cap(s.slots))

	for _, bad := range []Options{
		{WaitTime: -1}, {WaitTime: 11 * time.Minute}, {MaxBlocking: -1}, {MaxConns: -1}, {CallTimeout: -1}, {MaxTxnInFlight: -1},
	} {
		_, err := Open(cfg, bad)
		assert.Error(t, err, "%+v", bad)
	}
	withClient := *cfg
	withClient.HttpClient = &http.Client{}
	_, err = Open(&withClient, Options{})
	assert.Error(t, err)
}

// TestDeprecatedConstructors proves that NewClient + New, which callers
// use until they move to Open, still give a working Store with typed
// errors and the blocking-query cap.
func TestDeprecatedConstructors(t *testing.T) {
	t.Parallel()
	agent := consultest.Start(t)
	cfg := agent.Config()
	cfg.Transport = nil
	client, err := NewClient(cfg)
	require.NoError(t, err)
	t.Cleanup(cfg.Transport.CloseIdleConnections)
	s := New(client, 0)
	assert.Equal(t, DefaultWaitTime, s.Options().WaitTime)
	assert.Equal(t, DefaultMaxBlocking, cap(s.slots))

	id := session(t, s, broker.SessionSpec{Name: "old"})
	_, err = s.Txn(t.Context(), []broker.Op{{Verb: broker.OpLock, Key: "old/k", Session: id}})
	require.NoError(t, err)
	_, err = s.Txn(t.Context(), []broker.Op{{Verb: broker.OpLock, Key: "old/k", Session: "3f1c7a52-0000-4000-8000-000000000000"}})
	requireTxnError(t, err, broker.TxnFailure{Op: 0, Kind: broker.TxnSessionInvalid})
	entries, _, err := s.Watch(t.Context(), "old/", 0)
	require.NoError(t, err)
	assert.Len(t, entries, 1)
	_, err = s.RenewSession(t.Context(), "")
	requireStoreError(t, err, broker.StoreRejected, "session renew") // status kept by the recorder
	require.NoError(t, s.Healthy(t.Context()))
	var _ *api.Client = s.Client()
}
