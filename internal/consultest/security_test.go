package consultest

import (
	"net/http"
	"testing"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockbroker/lockbroker/internal/testpki"
)

// TestStartACL proves that StartACL's agent denies by default, that its
// management token may do everything, and that a CreateToken token may do
// what its rules say and nothing else.
func TestStartACL(t *testing.T) {
	t.Parallel()
	a := StartACL(t)
	put := func(cfg *api.Config, key string) error {
		c, err := api.NewClient(cfg)
		require.NoError(t, err)
		_, err = c.KV().Put(&api.KVPair{Key: key, Value: []byte("v")}, nil)
		return err
	}
	assert.ErrorContains(t, put(a.Config(), "x/1"), "403", "anonymous is denied")
	require.NoError(t, put(a.ManagementConfig(), "x/1"))

	cfg := a.Config()
	cfg.Token = a.CreateToken(t, "x-writer", `key_prefix "x/" { policy = "write" }`)
	require.NoError(t, put(cfg, "x/2"))
	assert.ErrorContains(t, put(cfg, "y/2"), "403")

	cfg.Token = a.CreateToken(t, "nothing", "")
	assert.ErrorContains(t, put(cfg, "x/3"), "403")
}

// TestHTTPSOnly proves that an agent started WithHTTPSOnly answers its
// Config over HTTPS and refuses plain HTTP on the same address.
func TestHTTPSOnly(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := testpki.NewCA(t, "consultest CA")
	certFile, keyFile := ca.Server(t, "server.dc1.consul", "server.dc1.consul").Write(t, dir, "server")
	a := Start(t, WithHTTPSOnly(HTTPS{CAFile: ca.WriteCA(t, dir, "ca.pem"), CertFile: certFile, KeyFile: keyFile}))
	assert.Equal(t, "https", a.Config().Scheme)
	_, err := a.Client().KV().Put(&api.KVPair{Key: "k", Value: []byte("v")}, nil)
	require.NoError(t, err)

	resp, err := http.Get("http://" + a.HTTPAddr() + "/v1/status/leader")
	if err == nil {
		defer resp.Body.Close()
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "plain HTTP is refused")
	}

	// With client certificates required, Config presents one; a client
	// without one is refused.
	clientCert, clientKey := ca.Client(t, "broker").Write(t, dir, "client")
	m := Start(t, WithHTTPSOnly(HTTPS{CAFile: dir + "/ca.pem", CertFile: certFile, KeyFile: keyFile,
		ClientCertFile: clientCert, ClientKeyFile: clientKey}))
	_, err = m.Client().KV().Put(&api.KVPair{Key: "k", Value: []byte("v")}, nil)
	require.NoError(t, err)
	noCert, err := api.NewClient(&api.Config{Address: m.HTTPAddr(), Scheme: "https", TLSConfig: api.TLSConfig{CAFile: dir + "/ca.pem"}})
	require.NoError(t, err)
	_, err = noCert.Status().Leader()
	assert.Error(t, err, "no client certificate")
}
