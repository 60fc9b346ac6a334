package observability_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/brokertest"
)

// dashboardExprs returns every query of the Grafana dashboard: the panels'
// targets and the template variables' queries.
func dashboardExprs(t *testing.T, root string) []string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(root, "deploy/grafana/lockbroker.json"))
	require.NoError(t, err)
	var d struct {
		Panels []struct {
			ID      int    `json:"id"`
			Type    string `json:"type"`
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	require.NoError(t, json.Unmarshal(raw, &d))
	var out []string
	ids := map[int]bool{}
	for _, p := range d.Panels {
		assert.False(t, ids[p.ID], "panel id %d twice", p.ID)
		ids[p.ID] = true
		if p.Type == "row" {
			continue
		}
		assert.NotEmpty(t, p.Targets, "panel %q queries nothing", p.Title)
		for _, tg := range p.Targets {
			out = append(out, tg.Expr)
		}
	}
	for _, v := range d.Templating.List {
		if v.Definition != "" {
			out = append(out, v.Definition)
		}
	}
	require.NotEmpty(t, out)
	return out
}

// ruleExprs returns the expressions of the Prometheus alert rules.
func ruleExprs(t *testing.T, root string) []string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(root, "deploy/prometheus/lockbroker-alerts.yaml"))
	require.NoError(t, err)
	var f struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &f))
	var out []string
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			require.NotEmpty(t, r.Expr, "alert %s", r.Alert)
			out = append(out, r.Expr)
		}
	}
	require.NotEmpty(t, out)
	return out
}

var (
	// metricRE finds the names of the broker's metrics in PromQL: its own,
	// the gRPC server's and the Go and process collectors'.
	metricRE = regexp.MustCompile(`\b(?:lockbroker|grpc_server|go|process)_[a-zA-Z0-9_:]+`)
	// matcherRE finds label matchers with a literal value or an
	// alternation of literals: label="v", label!~"a|b".
	matcherRE = regexp.MustCompile(`\b([a-z_]+)\s*(=~|!~|!=|=)\s*"([A-Za-z0-9_|]+)"`)
)

// exported lists what a scrape holds: every sample name (a histogram's
// _bucket, _sum and _count too) and, per label, the values seen.
func exported(fams map[string]*dto.MetricFamily) (names map[string]bool, values map[string]map[string]bool) {
	names, values = map[string]bool{}, map[string]map[string]bool{}
	for name, f := range fams {
		names[name] = true
		if f.GetType() == dto.MetricType_HISTOGRAM {
			names[name+"_bucket"], names[name+"_sum"], names[name+"_count"] = true, true, true
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if values[l.GetName()] == nil {
					values[l.GetName()] = map[string]bool{}
				}
				values[l.GetName()][l.GetValue()] = true
			}
		}
	}
	return names, values
}

// TestDeployQueriesUseExportedMetrics scrapes a broker process (with a
// tenants file, so that the tenant metrics exist) and checks every metric
// name the dashboard and the alert rules query, and every label value
// they match literally, against what it exports.
func TestDeployQueriesUseExportedMetrics(t *testing.T) {
	root := brokertest.RepoRoot(t)
	p, _, locks, ctx := startBroker(t)
	// One grant, so that the Consul calls of a grant have been made.
	s, err := locks.Acquire(ctx, &lockbrokerv1.AcquireRequest{Key: "obs/q"})
	require.NoError(t, err)
	_, err = s.Recv()
	require.NoError(t, err)
	names, values := exported(scrape(t, p))

	for file, exprs := range map[string][]string{
		"deploy/grafana/lockbroker.json":           dashboardExprs(t, root),
		"deploy/prometheus/lockbroker-alerts.yaml": ruleExprs(t, root),
	} {
		seen := 0
		for _, e := range exprs {
			for _, name := range metricRE.FindAllString(e, -1) {
				seen++
				assert.True(t, names[name], "%s queries %s, which the broker does not export: %s", file, name, e)
			}
			for _, m := range matcherRE.FindAllStringSubmatch(e, -1) {
				label, vals := m[1], strings.Split(m[3], "|")
				if label == "instance" || label == "job" {
					continue // Prometheus's target labels
				}
				for _, v := range vals {
					assert.True(t, values[label][v], "%s matches %s %s %q, a value the broker never exports: %s", file, label, m[2], v, e)
				}
			}
		}
		assert.Positive(t, seen, "%s names no broker metric", file)
	}
}

// TestExtractors shows the two regular expressions at work, so that a
// dashboard query they miss does not pass for a checked one.
func TestExtractors(t *testing.T) {
	e := `sum by (op) (rate(lockbroker_consul_requests_total{op="session_renew",result=~"unavailable|rejected"}[5m])) / histogram_quantile(0.99, lockbroker_acquire_wait_seconds_bucket) and go_goroutines`
	assert.Equal(t, []string{"lockbroker_consul_requests_total", "lockbroker_acquire_wait_seconds_bucket", "go_goroutines"}, metricRE.FindAllString(e, -1))
	var got []string
	for _, m := range matcherRE.FindAllStringSubmatch(e, -1) {
		got = append(got, m[1]+m[2]+m[3])
	}
	assert.Equal(t, []string{"op=session_renew", "result=~unavailable|rejected"}, got)
}
