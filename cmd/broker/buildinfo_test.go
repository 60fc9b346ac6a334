package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// TestVersionAndFlagErrors runs the broker binary: --version prints one
// line and exits 0; a bad flag is said once, on one line, without the
// usage, and exits 1.
func TestVersionAndFlagErrors(t *testing.T) {
	bin := brokertest.BrokerBinary(t)
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, "--version")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), stderr.String())
	assert.Regexp(t, `^broker \S+ \(revision \S+, go[0-9.]+\)\n$`, stdout.String())
	assert.Empty(t, stderr.String())

	for _, args := range [][]string{{"--frob"}, {"--drain-timeout", "soon"}, {"--log-level", "loud"}} {
		stdout.Reset()
		stderr.Reset()
		cmd = exec.Command(bin, args...)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee, "%v must fail", args)
		assert.Equal(t, 1, ee.ExitCode())
		assert.Empty(t, stdout.String())
		assert.Regexp(t, `^broker: [^\n]*\n$`, stderr.String(), "%v: one line", args)
		assert.NotContains(t, stderr.String(), "usage", "%v: the usage is for --help", args)
	}
}

// isoTime is the logs' "ts": ISO 8601 in UTC with milliseconds.
var isoTime = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$`)

// TestBuildInfoLoggedAndExported starts a broker process: its first log
// line names its version, every line's time is ISO 8601, and /metrics
// has lockbroker_build_info with the same version.
func TestBuildInfoLoggedAndExported(t *testing.T) {
	agent := consultest.Start(t)
	p := brokertest.StartProcess(t, agent)
	out, err := exec.Command(brokertest.BrokerBinary(t), "--version").Output()
	require.NoError(t, err)
	version := strings.Fields(string(out))[1]

	f, err := os.Open(p.LogPath)
	require.NoError(t, err)
	defer f.Close()
	var lines []map[string]any
	s := bufio.NewScanner(f)
	for s.Scan() {
		var line map[string]any
		require.NoError(t, json.Unmarshal(s.Bytes(), &line), "a log line that is not JSON: %s", s.Text())
		lines = append(lines, line)
	}
	require.NotEmpty(t, lines)
	assert.Equal(t, "lockbroker starting", lines[0]["msg"])
	assert.Equal(t, version, lines[0]["version"])
	for _, l := range lines {
		ts, ok := l["ts"].(string)
		require.True(t, ok, "ts must be a string: %v", l)
		assert.Regexp(t, isoTime, ts)
		parsed, err := time.Parse(time.RFC3339Nano, ts)
		require.NoError(t, err)
		assert.WithinDuration(t, time.Now(), parsed, time.Minute)
	}

	metrics := get(t, "http://"+p.HTTPAddr+"/metrics")
	assert.Regexp(t, `(?m)^lockbroker_build_info\{goversion="go[0-9.]+",revision="[^"]*",version="`+regexp.QuoteMeta(version)+`"\} 1$`, metrics)
}
