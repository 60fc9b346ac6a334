// Package grpcurl_test runs the grpcurl (and lockctl) command lines of the
// README against a real broker (and a real Consul agent, see
// internal/brokertest), so that what operators copy from the docs keeps
// working: server reflection, JSON field names, streaming output and error
// texts.
package grpcurl_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/lockbroker/lockbroker/internal/brokertest"
)

// Command lines in the README's style, for a broker on 127.0.0.1:8700
// (the tests put their broker's address in its place); readme_test.go
// runs the README's own blocks.
const (
	cmdList     = `grpcurl -plaintext 127.0.0.1:8700 list`
	cmdDescribe = `grpcurl -plaintext 127.0.0.1:8700 describe lockbroker.v1.LockService`
	cmdHealth   = `grpcurl -plaintext 127.0.0.1:8700 grpc.health.v1.Health/Check`
	cmdAcquire  = `grpcurl -plaintext -max-time 3 -d '{"key":"demo","waitTimeout":"0s"}' 127.0.0.1:8700 lockbroker.v1.LockService/Acquire`
	cmdGetLock  = `grpcurl -plaintext -d '{"key":"demo"}' 127.0.0.1:8700 lockbroker.v1.LockService/GetLock`
	cmdBadKey   = `grpcurl -plaintext -d '{"key":"a//b"}' 127.0.0.1:8700 lockbroker.v1.LockService/GetLock`
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestGrpcurl(t *testing.T) {
	b := brokertest.StartDev(t)
	bin := brokertest.BuildIn(t, filepath.Join(brokertest.RepoRoot(t), "tools", "go"),
		"github.com/fullstorydev/grpcurl/cmd/grpcurl", "grpcurl")
	sh := shell{path: filepath.Dir(bin), addr: b.Addr}

	tests := []struct {
		name, line string
		want       []string // substrings of the output
	}{
		{"List", cmdList, []string{"lockbroker.v1.LockService\n", "lockbroker.v1.SessionService\n"}},
		{"Describe", cmdDescribe, []string{
			"lockbroker.v1.LockService is a service:",
			"rpc Acquire ( .lockbroker.v1.AcquireRequest ) returns ( stream .lockbroker.v1.AcquireResponse );",
			"rpc GetLock ( .lockbroker.v1.GetLockRequest ) returns ( .lockbroker.v1.GetLockResponse );",
		}},
		{"Health", cmdHealth, []string{`"status": "SERVING"`}},
		{"BadKey", cmdBadKey, []string{"Code: InvalidArgument", "Message: validation error: key: must not contain an empty segment",
			`"@type": "type.googleapis.com/google.rpc.ErrorInfo"`, `"reason": "INVALID_ARGUMENT"`,
			`"@type": "type.googleapis.com/google.rpc.BadRequest"`, `"field": "key"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, _ := sh.run(t, tt.line)
			for _, w := range tt.want {
				assert.Contains(t, out, w)
			}
		})
	}

	t.Run("AcquireThenGetLock", func(t *testing.T) {
		acquire := sh.start(t, cmdAcquire)
		var session string
		sessionRE := regexp.MustCompile(`"sessionId": "([0-9a-f-]{36})"`)
		require.Eventually(t, func() bool {
			m := sessionRE.FindStringSubmatch(acquire.out.String())
			if m != nil && strings.Contains(acquire.out.String(), `"token"`) {
				session = m[1]
				return true
			}
			return false
		}, 10*time.Second, 20*time.Millisecond, "no acquired event with a token")

		out, err := sh.run(t, cmdGetLock) // while the try-once Acquire still holds it
		require.NoError(t, err, out)
		assert.Contains(t, out, `"kind": "LOCK_KIND_LOCK"`)
		assert.Contains(t, out, `"sessionId": "`+session+`"`)

		select { // -max-time 3 ends the stream, and with it the hold
		case <-acquire.done:
		case <-time.After(10 * time.Second):
			t.Fatal("grpcurl -max-time 3 still running after 10s")
		}
		out = acquire.out.String()
		assert.Contains(t, out, `"acquired"`)
		assert.Regexp(t, `"token": "[1-9][0-9]*"`, out)
	})
}

// shell runs README command lines with `sh -c`, grpcurl on PATH and the
// broker's address in place of 127.0.0.1:8700.
type shell struct {
	path, addr string
	dir        string // the working directory; "" for the test's
}

// command builds the process for line.
func (s shell) command(line string) *exec.Cmd {
	cmd := exec.Command("sh", "-c", strings.ReplaceAll(line, "127.0.0.1:8700", s.addr))
	cmd.Env = append(os.Environ(), "PATH="+s.path+string(os.PathListSeparator)+os.Getenv("PATH"))
	cmd.Dir = s.dir
	return cmd
}

// run runs line to completion (at most 30s) and returns its combined
// output and exit error.
func (s shell) run(t *testing.T, line string) (string, error) {
	t.Helper()
	p := s.start(t, line)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: still running after 30s", line)
	}
	t.Logf("$ %s\n%s", line, p.out.String())
	return p.out.String(), p.err
}

// proc is a running command line.
type proc struct {
	cmd  *exec.Cmd
	out  syncBuffer
	err  error
	done chan struct{} // closed once it has exited; err is set then
}

// start starts line; t.Cleanup kills it if it is still running.
func (s shell) start(t *testing.T, line string) *proc {
	t.Helper()
	cmd := s.command(line)
	p := &proc{cmd: cmd, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = &p.out, &p.out
	require.NoError(t, cmd.Start())
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
	})
	return p
}

// syncBuffer is a bytes.Buffer that can be read while a process writes it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
