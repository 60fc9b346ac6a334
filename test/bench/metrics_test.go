package bench

import "testing"

// TestParseSample: the table's and the scale run's /metrics reader splits
// labelled and unlabelled samples and skips what is not a sample.
func TestParseSample(t *testing.T) {
	for _, c := range []struct {
		line   string
		want   metricSample
		sample bool
	}{
		{`go_goroutines 19`, metricSample{name: "go_goroutines", value: 19}, true},
		{`go_memstats_mallocs_total 1.234567e+06`, metricSample{name: "go_memstats_mallocs_total", value: 1234567}, true},
		{`lockbroker_consul_requests_total{op="kv_txn_write",result="ok"} 42`,
			metricSample{name: "lockbroker_consul_requests_total", labels: `op="kv_txn_write",result="ok"`, value: 42}, true},
		{`# HELP go_goroutines Number of goroutines that currently exist.`, metricSample{}, false},
		{``, metricSample{}, false},
		{`go_goroutines not-a-number`, metricSample{}, false},
	} {
		got, ok := parseSample(c.line)
		if ok != c.sample || got != c.want {
			t.Errorf("parseSample(%q) = %+v, %v; want %+v, %v", c.line, got, ok, c.want, c.sample)
		}
	}
	if v := labelValue(`op="kv_txn_write",result="ok"`, "op"); v != "kv_txn_write" {
		t.Errorf("labelValue op = %q, want kv_txn_write", v)
	}
	if v := labelValue(`op="kv_list"`, "result"); v != "" {
		t.Errorf("labelValue of a missing label = %q, want empty", v)
	}
}
