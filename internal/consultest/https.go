package consultest

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
)

// HTTPS is the TLS material of an agent that serves its API over HTTPS
// only (see ProcessConfig.HTTPS and WithHTTPSOnly).
type HTTPS struct {
	// CAFile verifies the agent's certificate (clients of the agent).
	CAFile string
	// CertFile and KeyFile are the agent's certificate and key; the
	// certificate must be valid for 127.0.0.1.
	CertFile, KeyFile string
	// ClientCertFile and ClientKeyFile, when set, make the agent require
	// client certificates signed by CAFile (verify_incoming); Config,
	// Client and the readiness probe present this one.
	ClientCertFile, ClientKeyFile string
}

// WithHTTPSOnly makes the agent serve its API over HTTPS only, on
// HTTPAddr (plain HTTP is off), with h's certificate; Config and Client
// speak HTTPS and trust h.CAFile. Clients are asked for certificates only
// when h.ClientCertFile is set.
func WithHTTPSOnly(h HTTPS) Option {
	return func(c *ProcessConfig) { c.HTTPS = &h }
}

// hcl moves the API to HTTPS on port.
func (h *HTTPS) hcl(port int) string {
	return fmt.Sprintf(`ports { http = -1  https = %d }
tls {
  defaults { ca_file = %q  cert_file = %q  key_file = %q  verify_incoming = false }
  https { verify_incoming = %t }
}`,
		port, h.CAFile, h.CertFile, h.KeyFile, h.ClientCertFile != "")
}

// transport is newTransport trusting h.CAFile (an unreadable CA file
// leaves the system roots, and the agent's certificate fails to verify).
func (h *HTTPS) transport() *http.Transport {
	tr := newTransport()
	if pem, err := os.ReadFile(h.CAFile); err == nil {
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(pem)
		tr.TLSClientConfig.RootCAs = pool
	}
	if h.ClientCertFile != "" {
		if pair, err := tls.LoadX509KeyPair(h.ClientCertFile, h.ClientKeyFile); err == nil {
			tr.TLSClientConfig.Certificates = []tls.Certificate{pair}
		}
	}
	return tr
}
