package consulstore

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// writeTLSFiles writes a CA and a server certificate for 127.0.0.1 signed
// by it into dir, and returns their paths.
func writeTLSFiles(t *testing.T, dir string) (caFile, certFile, keyFile string) {
	t.Helper()
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(t, err)
		return k
	}
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600))
		return p
	}
	caKey, srvKey := newKey(), newKey()
	now := time.Now()
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "consulstore test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	srv := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "server.dc1.consul"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"server.dc1.consul", "localhost"},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srv, ca, &srvKey.PublicKey, caKey)
	require.NoError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(srvKey)
	require.NoError(t, err)
	return write("ca.pem", "CERTIFICATE", caDER), write("server.pem", "CERTIFICATE", srvDER), write("server-key.pem", "EC PRIVATE KEY", keyDER)
}

// startTLSAgent starts an agent that also serves its API over HTTPS, and
// returns it, the HTTPS address and the CA file.
func startTLSAgent(t *testing.T) (*consultest.Agent, string, string) {
	t.Helper()
	caFile, certFile, keyFile := writeTLSFiles(t, t.TempDir())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	agent := consultest.Start(t, consultest.WithHCL(fmt.Sprintf(
		`ports { https = %d }
		tls { defaults { ca_file = %q  cert_file = %q  key_file = %q  verify_incoming = false } }`,
		port, caFile, certFile, keyFile)))
	return agent, "127.0.0.1:" + strconv.Itoa(port), caFile
}

// useOverTLS proves both of s's clients work: a transaction (the general
// transport) and a watch (the blocking-query transport).
func useOverTLS(t *testing.T, s *Store) {
	t.Helper()
	set(t, s, "tls/k", "v")
	entries, _, err := s.Watch(t.Context(), "tls/", 0)
	require.NoError(t, err)
	assert.Len(t, entries, 1)
}

// TestTLSFromEnvironment proves that Open keeps TLS on both transports when
// it comes from the standard variables (CONSUL_HTTP_SSL, CONSUL_CACERT)
// read by api.DefaultConfig, as the broker binary configures it, against a
// real agent serving HTTPS; and that without the CA the agent's certificate
// is refused (StoreUnavailable).
func TestTLSFromEnvironment(t *testing.T) {
	agent, httpsAddr, caFile := startTLSAgent(t)
	_ = agent
	t.Setenv(api.HTTPAddrEnvName, httpsAddr)
	t.Setenv(api.HTTPSSLEnvName, "true")
	t.Setenv(api.HTTPCAFile, caFile)
	t.Setenv(api.HTTPTokenEnvName, "")

	cfg := api.DefaultConfig()
	s := openConfig(t, cfg, Options{})
	assert.Nil(t, cfg.Transport.TLSClientConfig, "the caller's transport is left as it was")
	for _, tr := range s.transports {
		require.NotNil(t, tr.TLSClientConfig)
		assert.NotNil(t, tr.TLSClientConfig.RootCAs, "CA applied to every transport")
	}
	useOverTLS(t, s)

	t.Setenv(api.HTTPCAFile, "")
	untrusted := openConfig(t, api.DefaultConfig(), Options{})
	_, _, err := untrusted.List(t.Context(), "tls/", false)
	requireStoreError(t, err, broker.StoreUnavailable, "kv list")
	t.Log(err)
}

// TestTLSFromConfig proves the same with the CA given in api.Config and an
// explicit https:// address, which api.NewClient turns into the scheme.
func TestTLSFromConfig(t *testing.T) {
	t.Parallel()
	_, httpsAddr, caFile := startTLSAgent(t)
	s := openConfig(t, &api.Config{Address: "https://" + httpsAddr, TLSConfig: api.TLSConfig{CAFile: caFile}}, Options{})
	useOverTLS(t, s)
}
