package bench

import (
	"bufio"
	"bytes"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Measurement helpers shared by the table (TestBenchTable), the scale run
// (TestScale) and the Go benchmarks. Nothing here asserts.

// latencies collects one duration per operation; safe for concurrent add.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.mu.Unlock()
}

// merge adds o's samples to l.
func (l *latencies) merge(o *latencies) {
	o.mu.Lock()
	d := slices.Clone(o.d)
	o.mu.Unlock()
	l.mu.Lock()
	l.d = append(l.d, d...)
	l.mu.Unlock()
}

func (l *latencies) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.d)
}

// quantile returns the q-quantile (nearest rank), 0 when empty.
func (l *latencies) quantile(q float64) time.Duration {
	l.mu.Lock()
	s := slices.Clone(l.d)
	l.mu.Unlock()
	if len(s) == 0 {
		return 0
	}
	slices.Sort(s)
	i := int(q*float64(len(s))+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func (l *latencies) p50() time.Duration { return l.quantile(0.50) }
func (l *latencies) p99() time.Duration { return l.quantile(0.99) }

// msOf is d in milliseconds.
func msOf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// errorLog counts errors and keeps the first few distinct messages.
type errorLog struct {
	mu    sync.Mutex
	n     int
	first []string
}

func (e *errorLog) add(err error) {
	if err == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.n++
	e.keep(err.Error())
}

// keep adds msg to the first few distinct messages; e.mu is held.
func (e *errorLog) keep(msg string) {
	if len(e.first) < 3 && !slices.Contains(e.first, msg) {
		e.first = append(e.first, msg)
	}
}

// merge adds o's errors to e.
func (e *errorLog) merge(o *errorLog) {
	o.mu.Lock()
	n, first := o.n, slices.Clone(o.first)
	o.mu.Unlock()
	e.mu.Lock()
	defer e.mu.Unlock()
	e.n += n
	for _, msg := range first {
		e.keep(msg)
	}
}

func (e *errorLog) count() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.n
}

func (e *errorLog) String() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.n == 0 {
		return "none"
	}
	return fmt.Sprintf("%d (first: %s)", e.n, strings.Join(e.first, " | "))
}

// processCPU is the user+system CPU time of this process so far: the
// in-process broker, the test's own clients and everything else in it.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// mallocs is the number of heap objects allocated so far.
func mallocs() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.Mallocs
}

// clockTick is the kernel's USER_HZ, the unit of /proc/<pid>/stat times.
const clockTick = 100

// agentPID finds the pid of the consul agent child of this process that
// serves HTTP on port, or 0.
func agentPID(port int) int {
	self := os.Getpid()
	want := fmt.Sprintf("http = %d ", port)
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		if ppid, _ := statOf(pid); ppid != self {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err == nil && bytes.Contains(cmd, []byte(want)) {
			return pid
		}
	}
	return 0
}

// statOf returns the parent pid and the user+system CPU time of pid.
func statOf(pid int) (ppid int, cpu time.Duration) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0
	}
	f := strings.Fields(string(b[i+1:]))
	// Fields after "(comm)": state(0) ppid(1) ... utime(11) stime(12).
	if len(f) < 13 {
		return 0, 0
	}
	ppid, _ = strconv.Atoi(f[1])
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return ppid, time.Duration(ut+st) * time.Second / clockTick
}

// rssKiB returns VmRSS and VmHWM (peak RSS) of process pid in KiB.
func rssKiB(pid int) (rss, hwm int64) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		k, v, ok := strings.Cut(s.Text(), ":")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "VmRSS":
			rss = n
		case "VmHWM":
			hwm = n
		}
	}
	return rss, hwm
}

// consulConns counts process pid's established TCP connections to
// 127.0.0.1:port (or [::1]:port), from /proc/net/tcp{,6} matched against the
// socket inodes of /proc/<pid>/fd: every connection the process holds to
// the agent's HTTP port.
func consulConns(pid, port int) int {
	inodes := map[string]bool{}
	dir := fmt.Sprintf("/proc/%d/fd/", pid)
	fds, _ := os.ReadDir(dir)
	for _, fd := range fds {
		l, err := os.Readlink(dir + fd.Name())
		if err == nil && strings.HasPrefix(l, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	wantPort := fmt.Sprintf("%04X", port)
	n := 0
	for _, file := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(file)
		if err != nil {
			continue
		}
		s := bufio.NewScanner(f)
		s.Scan() // header
		for s.Scan() {
			fl := strings.Fields(s.Text())
			if len(fl) < 10 || fl[3] != "01" { // 01: ESTABLISHED
				continue
			}
			_, rport, _ := strings.Cut(fl[2], ":")
			if rport == wantPort && inodes[fl[9]] {
				n++
			}
		}
		f.Close()
	}
	return n
}

// scrape reads the unlabelled samples of a broker's /metrics (Prometheus
// text format) at addr: go_goroutines, lockbroker_consul_blocking_queries
// and the like. A failed read gives an empty map (zeros).
func scrape(addr string) map[string]float64 {
	out := map[string]float64{}
	samples, _ := readMetrics(addr, 5*time.Second)
	for _, s := range samples {
		if s.labels == "" {
			out[s.name] = s.value
		}
	}
	return out
}

// metricSample is one sample line of a /metrics page: `name{labels} value`.
type metricSample struct {
	name, labels string
	value        float64
}

// readMetrics reads every sample of a broker's /metrics (Prometheus text
// format) at addr; comments and lines that are not samples are skipped.
func readMetrics(addr string, timeout time.Duration) ([]metricSample, error) {
	cl := http.Client{Timeout: timeout}
	resp, err := cl.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET http://%s/metrics: %s", addr, resp.Status)
	}
	var out []metricSample
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if s, ok := parseSample(sc.Text()); ok {
			out = append(out, s)
		}
	}
	return out, sc.Err()
}

// parseSample splits a sample line; comments and blank lines are not
// samples.
func parseSample(line string) (metricSample, bool) {
	if line == "" || line[0] == '#' {
		return metricSample{}, false
	}
	sp := strings.LastIndexByte(line, ' ')
	if sp < 0 {
		return metricSample{}, false
	}
	v, err := strconv.ParseFloat(line[sp+1:], 64)
	if err != nil {
		return metricSample{}, false
	}
	head := line[:sp]
	if i := strings.IndexByte(head, '{'); i >= 0 && strings.HasSuffix(head, "}") {
		return metricSample{name: head[:i], labels: head[i+1 : len(head)-1], value: v}, true
	}
	return metricSample{name: head, value: v}, true
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

// loadAvg is /proc/loadavg's first three fields.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// callCounter is an http.RoundTripper that counts the Consul calls of an
// anchor client (api.Lock, api.Semaphore, the raw floor) by kind, named
// like consulstore's OpCounts where they match.
type callCounter struct {
	next http.RoundTripper
	mu   sync.Mutex
	n    map[string]uint64
	all  atomic.Uint64
}

func newCallCounter(next http.RoundTripper) *callCounter {
	return &callCounter{next: next, n: map[string]uint64{}}
}

func (c *callCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	k := callKind(r)
	c.mu.Lock()
	c.n[k]++
	c.mu.Unlock()
	c.all.Add(1)
	return c.next.RoundTrip(r)
}

// counts returns a copy of the counts so far.
func (c *callCounter) counts() map[string]uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]uint64, len(c.n))
	for k, v := range c.n {
		out[k] = v
	}
	return out
}

// callKind names a Consul HTTP call.
func callKind(r *http.Request) string {
	p, q := r.URL.Path, r.URL.Query()
	switch {
	case strings.HasPrefix(p, "/v1/session/create"):
		return "session_create"
	case strings.HasPrefix(p, "/v1/session/destroy"):
		return "session_destroy"
	case strings.HasPrefix(p, "/v1/session/renew"):
		return "session_renew"
	case strings.HasPrefix(p, "/v1/session/info"):
		return "session_info"
	case strings.HasPrefix(p, "/v1/session/list"):
		return "session_list"
	case strings.HasPrefix(p, "/v1/txn"):
		return "kv_txn"
	case strings.HasPrefix(p, "/v1/kv/"):
		switch {
		case r.Method == http.MethodPut && q.Has("acquire"):
			return "kv_acquire"
		case r.Method == http.MethodPut && q.Has("release"):
			return "kv_release"
		case r.Method == http.MethodPut && q.Has("cas"):
			return "kv_cas"
		case r.Method == http.MethodPut:
			return "kv_put"
		case r.Method == http.MethodDelete:
			return "kv_delete"
		case q.Has("index") && q.Get("index") != "0":
			return "kv_watch"
		case q.Has("recurse"):
			return "kv_list"
		}
		return "kv_get"
	}
	return strings.TrimPrefix(p, "/v1/")
}

// diffCounts returns after - before per key, dropping zeros.
func diffCounts(before, after map[string]uint64) map[string]uint64 {
	out := map[string]uint64{}
	for k, v := range after {
		if d := v - before[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

func sumCounts(m map[string]uint64) uint64 {
	var n uint64
	for _, v := range m {
		n += v
	}
	return n
}

// perCycle renders counts divided by cycles, "kind 1.00, kind 2.00",
// sorted by kind.
func perCycle(m map[string]uint64, cycles int) string {
	if cycles == 0 || len(m) == 0 {
		return "-"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %.2f", k, float64(m[k])/float64(cycles)))
	}
	return strings.Join(parts, ", ")
}

// cpuModel is the first "model name" of /proc/cpuinfo.
func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	for l := range strings.SplitSeq(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

// textTable prints an aligned text table whose lines all start with "|".
type textTable struct {
	rows [][]string
}

func (t *textTable) add(cells ...string) { t.rows = append(t.rows, cells) }

func (t *textTable) String() string {
	var w []int
	for _, r := range t.rows {
		for i, c := range r {
			if i >= len(w) {
				w = append(w, 0)
			}
			w[i] = max(w[i], len([]rune(c)))
		}
	}
	var sb strings.Builder
	for ri, r := range t.rows {
		sb.WriteString("|")
		for i := range w {
			c := ""
			if i < len(r) {
				c = r[i]
			}
			pad := w[i] - len([]rune(c))
			if i == 0 {
				sb.WriteString(" " + c + strings.Repeat(" ", pad) + " |")
			} else {
				sb.WriteString(" " + strings.Repeat(" ", pad) + c + " |")
			}
		}
		sb.WriteString("\n")
		if ri == 0 {
			sb.WriteString("|")
			for i := range w {
				if i == 0 {
					sb.WriteString(" " + strings.Repeat("-", w[i]) + " |")
				} else {
					sb.WriteString(" " + strings.Repeat("-", w[i]-1) + ": |")
				}
			}
			sb.WriteString("\n")
		}
	}
	return sb.String()
}
