package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// dial connects to the first broker, in the order given, that answers a
// gRPC health check with SERVING within --connect-timeout. A broker that
// answers but is not serving (shutting down, Consul unreachable) is used
// only if no later one is serving. When none answers, the error is
// UNAVAILABLE and names every address tried.
func (c *cli) dial(ctx context.Context) (*grpc.ClientConn, error) {
	conn, _, err := c.dialAddr(ctx)
	return conn, err
}

// dialAddr is dial that also returns the address it connected to.
func (c *cli) dialAddr(ctx context.Context) (*grpc.ClientConn, string, error) {
	var (
		fallback     *grpc.ClientConn
		fallbackAddr string
		failures     []string
	)
	addrs := c.brokerAddrs()
	for _, addr := range addrs {
		if err := checkAddr(addr); err != nil {
			return nil, "", err
		}
	}
	for _, addr := range addrs {
		conn, serving, err := c.probe(ctx, addr)
		var ce *configError
		switch {
		case errors.As(err, &ce), isUsage(err):
			if fallback != nil {
				fallback.Close()
			}
			return nil, "", err
		case err != nil:
			failures = append(failures, fmt.Sprintf("%s: %v", addr, err))
		case serving:
			if fallback != nil {
				fallback.Close()
			}
			return conn, addr, nil
		case fallback == nil:
			fallback, fallbackAddr = conn, addr
		default:
			conn.Close()
		}
	}
	if fallback != nil {
		return fallback, fallbackAddr, nil
	}
	return nil, "", status.Errorf(codes.Unavailable, "no broker reachable: %s", strings.Join(failures, "; "))
}

// connect opens a connection to addr without a health check (grpc.NewClient
// connects on first use). The client library's DialOptions give it HTTP/2
// keepalive (client.KeepaliveTime, client.KeepaliveTimeout), so a vanished
// broker breaks the stream.
// A mistake in the settings (a file that cannot be read, a certificate
// without its key, a token that would go in clear) is a *configError or a
// usage error, never UNAVAILABLE.
func (c *cli) connect(addr string) (*grpc.ClientConn, error) {
	dopts, err := c.sec.dialOptions(addr)
	if err != nil {
		if isUsage(err) {
			return nil, err
		}
		return nil, &configError{err}
	}
	conn, err := grpc.NewClient(addr, dopts...)
	if err != nil {
		return nil, &configError{fmt.Errorf("--addr %q: %w", addr, err)}
	}
	return conn, nil
}

// configError is a mistake in lockctl's settings (flags or variables),
// found before any broker is asked: "lockctl: configuration: ...", exit 1.
type configError struct{ err error }

func (e *configError) Error() string { return "configuration: " + e.err.Error() }
func (e *configError) Unwrap() error { return e.err }

// isUsage reports whether err is a command-line mistake (usageErrorf).
func isUsage(err error) bool {
	var ee *exitErr
	return errors.As(err, &ee) && strings.HasPrefix(ee.msg, "usage: ")
}

// checkAddr refuses a broker address that is not HOST:PORT with a port
// number, as a configuration error.
func checkAddr(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return &configError{fmt.Errorf("--addr %q: %w", addr, err)}
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return &configError{fmt.Errorf("--addr %q: the port must be a number from 1 to 65535", addr)}
	}
	return nil
}

// probe opens a connection to addr and asks the standard health service
// for the server's overall status. A server without the health service
// counts as serving. The connection is returned open unless err is set.
func (c *cli) probe(ctx context.Context, addr string) (conn *grpc.ClientConn, serving bool, err error) {
	if conn, err = c.connect(addr); err != nil {
		return nil, false, err
	}
	ctx, cancel := context.WithTimeout(ctx, c.connectTimeout)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	switch status.Code(err) {
	case codes.OK:
		return conn, resp.GetStatus() == healthpb.HealthCheckResponse_SERVING, nil
	case codes.Unimplemented:
		return conn, true, nil
	case codes.DeadlineExceeded:
		conn.Close()
		return nil, false, fmt.Errorf("no answer within %v", c.connectTimeout)
	case codes.Unavailable, codes.Canceled:
		conn.Close()
		msg := status.Convert(err).Message()
		if strings.Contains(msg, "authentication handshake failed") {
			msg += " (the TLS settings, --tls, --cacert, --cert, do not match the broker's)"
		}
		return nil, false, errors.New(msg)
	default:
		return conn, false, nil
	}
}
