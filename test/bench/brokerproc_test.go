package bench

import (
	"bufio"
	"flag"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// tableInProcess runs the table's broker in this process (as it ran up to
// this option) instead of as the broker binary.
var tableInProcess = flag.Bool("table.inprocess", false, "run the table's broker in this process (internal/brokertest) instead of as the broker binary in a process of its own")

// brokerProcess reads what the table needs from a broker running as the
// broker binary: its Consul calls by kind and its heap allocations (from
// its /metrics), and its CPU time (from /proc).
type brokerProcess struct {
	metricsURL string
	pid        int
	client     *http.Client
	// scrapeAllocs is what one scrape of /metrics allocates in the
	// broker; a measured run's allocations are taken between two scrapes
	// and this is subtracted from them.
	scrapeAllocs uint64
}

func newBrokerProcess(t testing.TB, httpAddr string, pid int) *brokerProcess {
	t.Helper()
	p := &brokerProcess{metricsURL: "http://" + httpAddr + "/metrics", pid: pid, client: &http.Client{Timeout: 10 * time.Second}}
	// The smallest difference of a few back-to-back scrapes is one
	// scrape's own allocations (a GC or a background task adds to others).
	var prev uint64
	for i := range 6 {
		_, m, err := p.scrape()
		if err != nil {
			t.Fatalf("broker /metrics: %v", err)
		}
		if i > 0 && (p.scrapeAllocs == 0 || m-prev < p.scrapeAllocs) {
			p.scrapeAllocs = m - prev
		}
		prev = m
	}
	return p
}

// OpCounts is the broker's lockbroker_consul_requests_total summed over
// results, by op (as consulstore's OpCounts, which it exports); a failed
// scrape shows as a "scrape_error" kind in the row's calls.
func (p *brokerProcess) OpCounts() map[string]uint64 {
	ops, _, err := p.scrape()
	if err != nil {
		return map[string]uint64{"scrape_error": 1}
	}
	return ops
}

// mallocs is the broker's go_memstats_mallocs_total.
func (p *brokerProcess) mallocs() (uint64, error) {
	_, m, err := p.scrape()
	return m, err
}

// cpu is the broker process's user + system CPU time so far.
func (p *brokerProcess) cpu() time.Duration {
	_, c := statOf(p.pid)
	return c
}

func (p *brokerProcess) scrape() (ops map[string]uint64, mallocs uint64, err error) {
	resp, err := p.client.Get(p.metricsURL)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, 0, fmt.Errorf("GET %s: %s", p.metricsURL, resp.Status)
	}
	ops = map[string]uint64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		name, labels, value, ok := parseSample(line)
		if !ok {
			continue
		}
		switch name {
		case "lockbroker_consul_requests_total":
			ops[labelValue(labels, "op")] += uint64(value)
		case "go_memstats_mallocs_total":
			mallocs = uint64(value)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, 0, err
	}
	if len(ops) == 0 || mallocs == 0 {
		return nil, 0, fmt.Errorf("GET %s: no lockbroker_consul_requests_total or go_memstats_mallocs_total", p.metricsURL)
	}
	return ops, mallocs, nil
}

// parseSample splits a Prometheus text-format sample line
// (`name{labels} value`); comments and blank lines are not samples.
func parseSample(line string) (name, labels string, value float64, ok bool) {
	if line == "" || line[0] == '#' {
		return "", "", 0, false
	}
	sp := strings.LastIndexByte(line, ' ')
	if sp < 0 {
		return "", "", 0, false
	}
	v, err := strconv.ParseFloat(line[sp+1:], 64)
	if err != nil {
		return "", "", 0, false
	}
	head := line[:sp]
	if i := strings.IndexByte(head, '{'); i >= 0 && strings.HasSuffix(head, "}") {
		return head[:i], head[i+1 : len(head)-1], v, true
	}
	return head, "", v, true
}

// labelValue is the value of label key in a sample's label set (values
// here hold no commas or quotes).
func labelValue(labels, key string) string {
	for kv := range strings.SplitSeq(labels, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if ok && k == key {
			return strings.Trim(v, `"`)
		}
	}
	return ""
}
