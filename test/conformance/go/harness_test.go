package conformance

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/lockbroker/lockbroker/client"
	"github.com/lockbroker/lockbroker/internal/brokertest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestEveryScenarioCovered checks that every scenario id in scenarios.md
// (a "## S<N> ..." heading) has a TestS<N>... here.
func TestEveryScenarioCovered(t *testing.T) {
	md, err := os.ReadFile(filepath.Join(brokertest.RepoRoot(t), "test", "conformance", "scenarios.md"))
	require.NoError(t, err)
	var ids []string
	for _, m := range regexp.MustCompile(`(?m)^## (S\d+)\b`).FindAllStringSubmatch(string(md), -1) {
		ids = append(ids, m[1])
	}
	require.NotEmpty(t, ids, "no scenario ids in scenarios.md")

	fset := token.NewFileSet()
	files, err := filepath.Glob("*_test.go")
	require.NoError(t, err)
	have := map[string]bool{}
	testName := regexp.MustCompile(`^Test(S\d+)[A-Z_]`)
	for _, f := range files {
		file, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		require.NoError(t, err)
		for _, d := range file.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv == nil {
				if m := testName.FindStringSubmatch(fn.Name.Name); m != nil {
					have[m[1]] = true
				}
			}
		}
	}
	var missing []string
	for _, id := range ids {
		if !have[id] {
			missing = append(missing, id)
		}
	}
	require.Empty(t, missing, "scenarios without a Go test")
}

// figure logs a timing figure of the run (printed, not asserted beyond
// the promise).
func figure(t *testing.T, name string, v any) {
	t.Helper()
	if d, ok := v.(time.Duration); ok {
		v = fmt.Sprintf("%.3f s", d.Seconds())
	}
	t.Logf("FIGURE %s: %v", name, v)
}

// testKey is a key of its own for t.
func testKey(t *testing.T) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := strings.NewReplacer("/", "-", " ", "_").Replace(t.Name())
	return "conformance/go/" + name + "/" + hex.EncodeToString(b)
}

// dial connects to a broker; the connection closes when t ends.
func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// newClient is a client of the first address, with the others as
// replicas, on connections of its own.
func newClient(t *testing.T, addrs ...string) *client.Client {
	t.Helper()
	var more []grpc.ClientConnInterface
	for _, a := range addrs[1:] {
		more = append(more, dial(t, a))
	}
	return client.New(dial(t, addrs[0]), client.WithReplicas(more...))
}

// opCtx bounds one call.
func opCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// waitFor polls cond every 10ms until it holds or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("%s: not within %v", what, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// lostError is the lease's *client.LostError (the test fails without one).
func lostError(t *testing.T, l *client.Lease) *client.LostError {
	t.Helper()
	le, ok := errorsAsLost(l.Err())
	require.True(t, ok, "lease.Err() = %v, want a *client.LostError", l.Err())
	return le
}

func errorsAsLost(err error) (*client.LostError, bool) {
	var le *client.LostError
	return le, errors.As(err, &le)
}

// oneOf is whether v is among vs.
func oneOf(v string, vs ...string) bool { return slices.Contains(vs, v) }
