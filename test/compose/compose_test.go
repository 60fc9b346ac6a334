// Package compose_test checks docker-compose.yml and the Dockerfile without
// Docker: the compose file is loaded with the Compose Specification's own
// Go loader (the one `docker compose` uses), the Dockerfile with a small
// instruction parser.
package compose_test

import (
	"context"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// loadProject loads <repo>/docker-compose.yml as `docker compose` would,
// with an empty environment so that the host cannot change the result.
func loadProject(t *testing.T) (*types.Project, string) {
	t.Helper()
	root := brokertest.RepoRoot(t)
	p, err := loader.LoadWithContext(context.Background(), types.ConfigDetails{
		WorkingDir:  root,
		ConfigFiles: []types.ConfigFile{{Filename: filepath.Join(root, "docker-compose.yml")}},
		Environment: types.Mapping{},
	})
	require.NoError(t, err)
	return p, root
}

func TestComposeServices(t *testing.T) {
	p, root := loadProject(t)
	names := p.ServiceNames()
	sort.Strings(names)
	require.Equal(t, []string{"broker", "consul"}, names)

	consul, err := p.GetService("consul")
	require.NoError(t, err)
	assert.Equal(t, "hashicorp/consul:1.20.6", consul.Image)
	assert.Equal(t, types.ShellCommand{"agent", "-dev", "-client", "0.0.0.0"}, consul.Command)

	broker, err := p.GetService("broker")
	require.NoError(t, err)
	require.NotNil(t, broker.Build, "the broker is built from this repository")
	assert.Equal(t, root, broker.Build.Context)
	assert.Equal(t, "Dockerfile", broker.Build.Dockerfile)
	require.Contains(t, broker.Environment, "CONSUL_HTTP_ADDR")
	require.NotNil(t, broker.Environment["CONSUL_HTTP_ADDR"])
	assert.Equal(t, "consul:8500", *broker.Environment["CONSUL_HTTP_ADDR"])
	require.Contains(t, broker.DependsOn, "consul")
	assert.Equal(t, types.ServiceConditionHealthy, broker.DependsOn["consul"].Condition)
}

func TestComposePortsOnLoopbackOnly(t *testing.T) {
	p, _ := loadProject(t)
	want := map[string][]string{
		"consul": {"127.0.0.1:8500->8500/tcp"},
		"broker": {"127.0.0.1:8700->8700/tcp", "127.0.0.1:8701->8701/tcp"},
	}
	for name, ports := range want {
		s, err := p.GetService(name)
		require.NoError(t, err)
		var got []string
		for _, port := range s.Ports {
			assert.Equal(t, "127.0.0.1", port.HostIP, "%s publishes %s:%d beyond loopback", name, port.Published, port.Target)
			got = append(got, port.HostIP+":"+port.Published+"->"+strconv.FormatUint(uint64(port.Target), 10)+"/"+port.Protocol)
		}
		assert.ElementsMatch(t, ports, got, name)
	}
}

func TestComposeHealthChecks(t *testing.T) {
	p, _ := loadProject(t)
	for _, name := range []string{"consul", "broker"} {
		s, err := p.GetService(name)
		require.NoError(t, err)
		require.NotNil(t, s.HealthCheck, "%s needs a health check (depends_on waits for it)", name)
		assert.False(t, s.HealthCheck.Disable, name)
		require.NotEmpty(t, s.HealthCheck.Test, name)
		assert.Contains(t, []string{"CMD", "CMD-SHELL"}, s.HealthCheck.Test[0], name)
		assert.NotNil(t, s.HealthCheck.Interval, name)
		assert.NotNil(t, s.HealthCheck.Retries, name)
	}
	broker, _ := p.GetService("broker")
	test := broker.HealthCheck.Test
	assert.Equal(t, "CMD", test[0], "the image is distroless: there is no shell for CMD-SHELL")
	assert.Contains(t, strings.Join(test, " "), "http://127.0.0.1:8701/healthz")
	// The checking binary must exist in the image.
	df := parseDockerfile(t, filepath.Join(brokertest.RepoRoot(t), "Dockerfile"))
	final := df.stages[len(df.stages)-1]
	var copied []string
	for _, in := range final.instrs {
		if in.cmd == "COPY" {
			copied = append(copied, in.args)
		}
	}
	assert.Contains(t, strings.Join(copied, "\n"), filepath.Base(test[1]), "%s is not copied into the final stage", test[1])
	assert.Contains(t, strings.Join(copied, "\n"), filepath.Dir(test[1])+"/", "%s is not copied to %s", test[1], filepath.Dir(test[1]))
}
