package compose_test

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockbroker/lockbroker/internal/brokertest"
)

// drainExit is how long the broker may take to exit after --drain-timeout
// has passed (cmd/broker drain: a second for the broker, a second for the
// gRPC server, half a second for the HTTP server), rounded up.
const drainExit = 3 * time.Second

// TestComposeBrokerCommand runs the broker binary with the compose file's
// command and -h: every flag must be one the broker accepts, none
// deprecated, and Docker's stop_grace_period must outlast the drain, so
// that the broker ends its holds before Docker's SIGKILL does.
func TestComposeBrokerCommand(t *testing.T) {
	p, _ := loadProject(t)
	svc, err := p.GetService("broker")
	require.NoError(t, err)
	bin := brokertest.Build(t, "./cmd/broker", "broker")
	usage := brokerUsage(t, bin, svc.Command...)

	drain := 15 * time.Second // the broker's default
	for _, arg := range svc.Command {
		name, val, _ := strings.Cut(strings.TrimLeft(arg, "-"), "=")
		require.True(t, strings.HasPrefix(arg, "-"), "command argument %q is not a flag", arg)
		assert.NotContains(t, usage[name], "deprecated", "compose passes the deprecated flag --%s", name)
		if name == "drain-timeout" {
			drain, err = time.ParseDuration(val)
			require.NoError(t, err)
		}
	}
	require.NotNil(t, svc.StopGracePeriod, "stop_grace_period: Docker's default (10s) is shorter than the drain")
	grace := time.Duration(*svc.StopGracePeriod)
	assert.GreaterOrEqual(t, grace, drain+drainExit,
		"stop_grace_period %v must outlast --drain-timeout %v plus the %v the broker takes to exit after it", grace, drain, drainExit)
}

// brokerUsage runs `broker args... -h`, which fails on any flag the broker
// does not know before it reaches -h, and returns each flag's usage text.
func brokerUsage(t *testing.T, bin string, args ...string) map[string]string {
	t.Helper()
	cmd := exec.Command(bin, append(append([]string{}, args...), "-h")...)
	cmd.Env = []string{} // the host's LOCKBROKER_* must not change the result
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "broker %s -h:\n%s", strings.Join(args, " "), out)
	usage := map[string]string{}
	var last string
	flagRE := regexp.MustCompile(`^  -(\S+)`)
	s := bufio.NewScanner(strings.NewReader(string(out)))
	for s.Scan() {
		if m := flagRE.FindStringSubmatch(s.Text()); m != nil {
			last = m[1]
			continue
		}
		if last != "" {
			usage[last] += strings.TrimSpace(s.Text()) + " "
		}
	}
	require.Contains(t, usage, "drain-timeout", "broker -h printed no flags:\n%s", out)
	return usage
}

// TestComposeCommentQuotesSessionVariable checks that the usage comment's
// lockctl command leaves $LOCKBROKER_* to the command lockctl runs: in
// single quotes, not expanded by the host's shell before lockctl starts.
func TestComposeCommentQuotesSessionVariable(t *testing.T) {
	text, err := os.ReadFile(filepath.Join(brokertest.RepoRoot(t), "docker-compose.yml"))
	require.NoError(t, err)
	n := 0
	for _, line := range strings.Split(string(text), "\n") {
		if !strings.Contains(line, "lockctl lock") {
			continue
		}
		n++
		// Drop every single-quoted part: no $LOCKBROKER_ may be left outside.
		unquoted := regexp.MustCompile(`'[^']*'`).ReplaceAllString(line, "")
		assert.NotContains(t, unquoted, "$LOCKBROKER_", "the host shell expands it: %s", line)
	}
	assert.Positive(t, n, "the compose file's comment shows a lockctl lock command")
}

// TestDockerignore reads .dockerignore with Docker's own matcher and
// checks what goes into the build context: the Go module in, bulky and
// generated trees of other languages out, at any depth.
func TestDockerignore(t *testing.T) {
	root := brokertest.RepoRoot(t)
	f, err := os.Open(filepath.Join(root, ".dockerignore"))
	require.NoError(t, err)
	defer f.Close()
	patterns, err := ignorefile.ReadAll(f)
	require.NoError(t, err)
	pm, err := patternmatcher.New(patterns)
	require.NoError(t, err)
	tests := []struct {
		path     string
		excluded bool
	}{
		{".git/HEAD", true},
		{"bin/consul", true},
		{"node_modules/@bufbuild/buf/package.json", true},
		{"client/node/node_modules/@grpc/grpc-js/package.json", true},
		{"test/node/node_modules/x/index.js", true},
		{"client/java/build/lockbroker-client.jar", true},
		{"client/python/lockbroker/__pycache__/x.pyc", true},
		{"gen/python/lockbroker/v1/lock_pb2.py", true},
		{"go.mod", false},
		{"go.sum", false},
		{"cmd/broker/main.go", false},
		{"gen/lockbroker/v1/lock.pb.go", false},
		{"internal/broker/hold.go", false},
	}
	for _, tt := range tests {
		got, err := pm.MatchesOrParentMatches(tt.path)
		require.NoError(t, err)
		assert.Equal(t, tt.excluded, got, "%s excluded from the build context", tt.path)
	}
}
