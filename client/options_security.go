package client

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
)

// The HTTP/2 keepalive of connections DialOptions builds: a ping after
// KeepaliveTime without hearing from the broker while a call is open, and
// the connection closed when the ping is not answered within
// KeepaliveTimeout, so every call on a broker that stopped (a paused
// process, a vanished host) fails UNAVAILABLE within about 15 s and, with
// WithReplicas, goes on at the next replica: a Lock waiting for its first
// answer, a Watch. (A held lease and a waiting Lock find out sooner: from
// the guaranteed deadline and the queued heartbeats.) The Python and Node
// libraries use the same values; the broker accepts pings 5 s apart or
// more.
const (
	KeepaliveTime    = 10 * time.Second
	KeepaliveTimeout = 5 * time.Second
)

// DialOption configures the connection DialOptions builds: TLS to the
// broker, a client certificate (mTLS) and a bearer token.
type DialOption func(*dialConfig)

type dialConfig struct {
	tls                bool
	caFile             string
	certFile, keyFile  string
	serverName         string
	token              string
	tokenOverPlaintext bool
	base               *tls.Config
}

// WithTLS verifies the broker's certificate against the system's roots
// (default: plaintext, unless another TLS option is given).
func WithTLS() DialOption { return func(c *dialConfig) { c.tls = true } }

// WithCACert verifies the broker's certificate against the CA
// certificates in file (PEM) instead of the system's roots, and turns TLS
// on. A file without a certificate is an error of DialOptions.
func WithCACert(file string) DialOption {
	return func(c *dialConfig) { c.tls, c.caFile = true, file }
}

// WithClientCert presents the certificate and key in certFile and keyFile
// (PEM) to a broker that requires client certificates (mTLS; the broker
// knows the caller as cn:<Common Name> or uri:<URI SAN>), and turns TLS on.
func WithClientCert(certFile, keyFile string) DialOption {
	return func(c *dialConfig) { c.tls, c.certFile, c.keyFile = true, certFile, keyFile }
}

// WithServerName checks the broker's certificate for name instead of the
// host of the address dialled.
func WithServerName(name string) DialOption { return func(c *dialConfig) { c.serverName = name } }

// WithTLSConfig starts from cfg (cloned) for what the other options leave
// alone, and turns TLS on.
func WithTLSConfig(cfg *tls.Config) DialOption {
	return func(c *dialConfig) { c.tls, c.base = true, cfg }
}

// WithToken sends `authorization: Bearer <token>` with every call (the
// broker knows the caller as token-sha256:<hex of SHA-256(token)>). The
// token is only sent over TLS: without a TLS option every call fails with
// UNAVAILABLE (gRPC refuses to send it in clear) unless
// WithTokenOverPlaintext is given too.
func WithToken(token string) DialOption { return func(c *dialConfig) { c.token = token } }

// WithTokenOverPlaintext lets WithToken's token travel over a plaintext
// connection, for a broker on loopback or behind a TLS-terminating proxy.
func WithTokenOverPlaintext() DialOption { return func(c *dialConfig) { c.tokenOverPlaintext = true } }

// DialOptions returns the grpc.DialOptions for opts, to pass to
// grpc.NewClient with the broker's address:
//
//	dopts, err := client.DialOptions(client.WithCACert("ca.pem"),
//		client.WithClientCert("me.pem", "me-key.pem"))
//	conn, err := grpc.NewClient("broker:8700", dopts...)
//	c := client.New(conn)
//
// Without options the connection is plaintext. Every connection gets the
// library's keepalive (KeepaliveTime, KeepaliveTimeout). Files are read
// now; an unreadable file or a bad key pair is an error.
func DialOptions(opts ...DialOption) ([]grpc.DialOption, error) {
	var c dialConfig
	for _, o := range opts {
		o(&c)
	}
	out := []grpc.DialOption{grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: KeepaliveTime, Timeout: KeepaliveTimeout})}
	if !c.tls {
		out = append(out, grpc.WithTransportCredentials(insecure.NewCredentials()))
	} else {
		cfg, err := c.tlsConfig()
		if err != nil {
			return nil, err
		}
		out = append(out, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	}
	if c.token != "" {
		out = append(out, grpc.WithPerRPCCredentials(bearer{token: c.token, secure: !c.tokenOverPlaintext}))
	}
	return out, nil
}

func (c *dialConfig) tlsConfig() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.base != nil {
		cfg = c.base.Clone()
	}
	if c.serverName != "" {
		cfg.ServerName = c.serverName
	}
	if c.caFile != "" {
		pem, err := os.ReadFile(c.caFile)
		if err != nil {
			return nil, fmt.Errorf("CA certificate: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("CA certificate %s: no PEM certificate in it", c.caFile)
		}
		cfg.RootCAs = pool
	}
	if c.certFile != "" || c.keyFile != "" {
		if c.certFile == "" || c.keyFile == "" {
			return nil, errors.New("a client certificate needs both the certificate and the key file")
		}
		pair, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
		if err != nil {
			return nil, fmt.Errorf("client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// bearer is the token as gRPC per-call credentials.
type bearer struct {
	token  string
	secure bool
}

// GetRequestMetadata implements credentials.PerRPCCredentials.
func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

// RequireTransportSecurity implements credentials.PerRPCCredentials.
func (b bearer) RequireTransportSecurity() bool { return b.secure }

// String never shows the token.
func (b bearer) String() string { return "bearer([redacted])" }
