package main

import (
	"errors"
	"flag"
	"net"
	"os"

	"google.golang.org/grpc"

	"github.com/lockbroker/lockbroker/client"
)

// securityFlags are the TLS and identity flags every command takes.
type securityFlags struct {
	caCert, cert, key, token, serverName string
	tls                                  bool
}

// The variables lockctl reads its TLS and identity settings from. They
// differ from the ones `lockctl lock` gives its command (LOCKBROKER_KEY, the
// lock's key, and LOCKBROKER_TOKEN, its fencing token: see lockHelp), so
// that a lockctl run under `lockctl lock` reads neither a key name as a
// key file nor a fencing token as a credential, and inherits its parent's
// settings instead.
const (
	envCACert = "LOCKBROKER_CACERT"
	envCert   = "LOCKBROKER_CERT"
	envKey    = "LOCKBROKER_CERT_KEY"
	envToken  = "LOCKBROKER_BEARER_TOKEN"
)

// register adds the flags to fs, with defaults from the environment. The
// token's default is not shown in --help.
func (s *securityFlags) register(fs *flag.FlagSet) {
	if s.caCert == "" {
		s.caCert = os.Getenv(envCACert)
	}
	if s.cert == "" {
		s.cert = os.Getenv(envCert)
	}
	if s.key == "" {
		s.key = os.Getenv(envKey)
	}
	if s.token == "" {
		s.token = os.Getenv(envToken)
	}
	fs.Func("cacert", "verify the broker's TLS certificate against this CA `FILE` (PEM); turns TLS on\n(default $LOCKBROKER_CACERT)", func(v string) error { s.caCert = v; return nil })
	fs.Func("cert", "present this client certificate `FILE` (PEM) to a broker with --tls-client-ca (mTLS);\nturns TLS on (default $LOCKBROKER_CERT)", func(v string) error { s.cert = v; return nil })
	fs.Func("key", "the private key `FILE` of --cert (PEM) (default $LOCKBROKER_CERT_KEY)", func(v string) error { s.key = v; return nil })
	fs.Func("token", "send `TOKEN` as authorization: Bearer (default $LOCKBROKER_BEARER_TOKEN, which keeps\nit off the command line); only over TLS, or to a broker on loopback", func(v string) error { s.token = v; return nil })
	fs.BoolVar(&s.tls, "tls", s.tls, "use TLS, verifying the broker against the system's CAs (implied by --cacert and --cert)")
	fs.StringVar(&s.serverName, "server-name", s.serverName, "check the broker's certificate for this `NAME` instead of the address's host")
}

// dialOptions are the gRPC options for addr.
func (s *securityFlags) dialOptions(addr string) ([]grpc.DialOption, error) {
	var opts []client.DialOption
	useTLS := s.tls || s.caCert != "" || s.cert != "" || s.key != ""
	if s.tls {
		opts = append(opts, client.WithTLS())
	}
	if s.caCert != "" {
		opts = append(opts, client.WithCACert(s.caCert))
	}
	if s.cert != "" || s.key != "" {
		if s.cert == "" || s.key == "" {
			return nil, usageErrorf("--cert and --key go together (or $%s and $%s; $LOCKBROKER_KEY is not read: "+
				"it is the key lockctl lock gives its command)", envCert, envKey)
		}
		opts = append(opts, client.WithClientCert(s.cert, s.key))
	}
	if s.serverName != "" {
		opts = append(opts, client.WithServerName(s.serverName))
	}
	if s.token != "" {
		opts = append(opts, client.WithToken(s.token))
		if !useTLS {
			if !loopback(addr) {
				return nil, errors.New("--token is sent only over TLS (--cacert or --tls) to a broker that is not on loopback")
			}
			opts = append(opts, client.WithTokenOverPlaintext())
		}
	}
	return client.DialOptions(opts...)
}

// loopback reports whether addr's host is a loopback address.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return host == "localhost" || (ip != nil && ip.IsLoopback())
}
