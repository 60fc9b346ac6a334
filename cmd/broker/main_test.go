package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/consulstore"
)

// roleEnv makes the test binary act as a client process of a broker
// instead of running tests (see holdForever).
const roleEnv = "BROKER_TEST_ROLE"

func TestMain(m *testing.M) {
	if os.Getenv(roleEnv) == "holder" {
		os.Exit(holdForever(os.Getenv("BROKER_TEST_ADDR"), os.Getenv("BROKER_TEST_KEY")))
	}
	goleak.VerifyTestMain(m)
}

// holdForever is a client process: it acquires key through the broker at
// addr, prints "acquired SESSION" and keeps reading the stream until it
// ends. It sets no client keepalive, as a plain stub would not.
func holdForever(addr, key string) int {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintln(os.Stderr, "holder:", err)
		return 2
	}
	defer conn.Close()
	stream, err := lockbrokerv1.NewLockServiceClient(conn).Acquire(context.Background(), &lockbrokerv1.AcquireRequest{Key: key})
	if err != nil {
		fmt.Fprintln(os.Stderr, "holder:", err)
		return 2
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			fmt.Fprintln(os.Stderr, "holder: stream ended:", err)
			return 1
		}
		if a := resp.GetAcquired(); a != nil {
			fmt.Printf("acquired %s\n", a.GetSequencer().GetSessionId())
		}
	}
}

func TestParseFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		wantErr string // "" : valid
		check   func(t *testing.T, c config)
	}{
		{name: "defaults", check: func(t *testing.T, c config) {
			assert.Equal(t, 15*time.Second, c.drainTimeout)
			assert.Equal(t, 3*time.Second, c.keepaliveTime)
			assert.Equal(t, 2*time.Second, c.keepaliveTimeout)
			// A vanished client: noticed after 5 s, its hold kept until
			// the last promise (at most the bound) + 0.5 s = 20 s.
			assert.Equal(t, broker.DefaultPromiseBound, promiseBound(c.keepaliveTime, c.keepaliveTimeout))
			assert.Equal(t, consulstore.DefaultMaxBlocking, c.consul.MaxBlocking)
			assert.Equal(t, consulstore.DefaultMaxConns, c.consul.MaxConns)
		}},
		{name: "drain", args: []string{"--drain-timeout", "30s"}, check: func(t *testing.T, c config) {
			assert.Equal(t, 30*time.Second, c.drainTimeout)
		}},
		{name: "shutdown-timeout is an alias", args: []string{"--shutdown-timeout", "7s"}, check: func(t *testing.T, c config) {
			assert.Equal(t, 7*time.Second, c.drainTimeout)
		}},
		{name: "keepalive", args: []string{"--keepalive-time", "2s", "--keepalive-timeout", "1s"}, check: func(t *testing.T, c config) {
			assert.Equal(t, 2*time.Second, c.keepaliveTime)
			assert.Equal(t, time.Second, c.keepaliveTimeout)
			assert.Equal(t, 16500*time.Millisecond, promiseBound(c.keepaliveTime, c.keepaliveTimeout))
		}},
		{name: "consul caps", args: []string{"--consul-max-blocking", "16", "--consul-max-conns", "40"}, check: func(t *testing.T, c config) {
			assert.Equal(t, 16, c.consul.MaxBlocking)
			assert.Equal(t, 40, c.consul.MaxConns)
		}},
		{name: "zero consul cap", args: []string{"--consul-max-blocking", "0"}, wantErr: "must be positive"},
		{name: "zero drain", args: []string{"--drain-timeout", "0s"}, wantErr: "--drain-timeout must be positive"},
		{name: "keepalive too long", args: []string{"--keepalive-time", "30s"}, wantErr: "--keepalive-time must be between 1s and 10s"},
		{name: "keepalive too short", args: []string{"--keepalive-time", "100ms"}, wantErr: "--keepalive-time must be between 1s and 10s"},
		{name: "keepalive timeout too long", args: []string{"--keepalive-timeout", "6s"}, wantErr: "--keepalive-timeout must be between 1s and 5s"},
		{name: "stray argument", args: []string{"extra"}, wantErr: "unexpected arguments: extra"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parseFlags(tt.args, io.Discard)
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.wantErr)
				return
			}
			require.NoError(t, err)
			tt.check(t, c)
		})
	}
}

func TestHelpListsFlags(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, run([]string{"--help"}, &out, io.Discard))
	for _, f := range []string{"-drain-timeout", "-keepalive-time", "-keepalive-timeout", "-consul-max-blocking", "-consul-max-conns"} {
		assert.True(t, strings.Contains(out.String(), f), "--help must list %s:\n%s", f, out.String())
	}
}
