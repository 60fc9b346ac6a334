package server

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync/atomic"

	"google.golang.org/grpc/credentials"
)

// TLSFiles name the broker's TLS material.
type TLSFiles struct {
	// Cert and Key are the server's certificate chain and key (PEM).
	Cert, Key string
	// ClientCA, when set, makes every connection present a client
	// certificate signed by one of these CAs (mTLS); the handshake fails
	// otherwise.
	ClientCA string
}

// TLS serves the current certificate and client CAs: Reload reads the
// files again, and new connections use what it read while connections
// already open (and their streams) carry on.
type TLS struct {
	files TLSFiles
	cur   atomic.Pointer[tls.Config]
}

// NewTLS reads files.
func NewTLS(files TLSFiles) (*TLS, error) {
	if files.Cert == "" || files.Key == "" {
		return nil, errors.New("TLS needs both a certificate and a key")
	}
	t := &TLS{files: files}
	if err := t.Reload(); err != nil {
		return nil, err
	}
	return t, nil
}

// Reload reads the files again; on error the configuration in force stays.
func (t *TLS) Reload() error {
	cert, err := tls.LoadX509KeyPair(t.files.Cert, t.files.Key)
	if err != nil {
		return fmt.Errorf("TLS certificate %s / key %s: %w", t.files.Cert, t.files.Key, err)
	}
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
		NextProtos:   []string{"h2"}, // gRPC insists on ALPN h2
	}
	if t.files.ClientCA != "" {
		pem, err := os.ReadFile(t.files.ClientCA)
		if err != nil {
			return fmt.Errorf("TLS client CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("TLS client CA %s: no PEM certificate in it", t.files.ClientCA)
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	t.cur.Store(cfg)
	return nil
}

// MutualTLS reports whether client certificates are required.
func (t *TLS) MutualTLS() bool { return t.files.ClientCA != "" }

// Credentials are the gRPC server credentials that use the configuration
// in force at each handshake.
func (t *TLS) Credentials() credentials.TransportCredentials {
	return credentials.NewTLS(&tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return t.cur.Load(), nil
		},
	})
}
