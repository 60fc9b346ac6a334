package bench

import (
	"flag"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/lockbroker/lockbroker/client"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// tableInProcess runs the table's broker in this process (as it ran up to
// this option) instead of as the broker binary.
var tableInProcess = flag.Bool("table.inprocess", false, "run the table's broker in this process (internal/brokertest) instead of as the broker binary in a process of its own")

// brokerProcess reads what the table needs from a broker running as the
// broker binary: its Consul calls by kind and its heap allocations (from
// its /metrics), and its CPU time (from /proc).
type brokerProcess struct {
	httpAddr string
	pid      int
	// scrapeAllocs is what one scrape of /metrics allocates in the
	// broker; a measured run's allocations are taken between two scrapes
	// and this is subtracted from them.
	scrapeAllocs uint64
}

// startProcess runs the broker binary on agent (with flags) and returns a
// driver on a connection to it (dial's, with opts) and the reader of its
// figures.
func startProcess(t testing.TB, agent *consultest.Agent, flags []string, opts ...client.DialOption) (brokerDriver, *brokerProcess) {
	t.Helper()
	p := brokertest.StartProcess(t, agent, brokertest.WithFlags(flags...))
	return newDriver(dial(t, p.Addr, opts...)), newBrokerProcess(t, p.HTTPAddr, p.Pid())
}

// dial connects to the broker at addr as the Go client library would with
// opts (plaintext unless they say TLS); the connection closes when t ends.
func dial(t testing.TB, addr string, opts ...client.DialOption) *grpc.ClientConn {
	t.Helper()
	dopts, err := client.DialOptions(opts...)
	if err != nil {
		t.Fatal(err)
	}
	c, err := grpc.NewClient(addr, dopts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func newBrokerProcess(t testing.TB, httpAddr string, pid int) *brokerProcess {
	t.Helper()
	p := &brokerProcess{httpAddr: httpAddr, pid: pid}
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
	samples, err := readMetrics(p.httpAddr, 10*time.Second)
	if err != nil {
		return nil, 0, err
	}
	ops = map[string]uint64{}
	for _, s := range samples {
		switch s.name {
		case "lockbroker_consul_requests_total":
			ops[labelValue(s.labels, "op")] += uint64(s.value)
		case "go_memstats_mallocs_total":
			mallocs = uint64(s.value)
		}
	}
	if len(ops) == 0 || mallocs == 0 {
		return nil, 0, fmt.Errorf("http://%s/metrics: no lockbroker_consul_requests_total or go_memstats_mallocs_total", p.httpAddr)
	}
	return ops, mallocs, nil
}
