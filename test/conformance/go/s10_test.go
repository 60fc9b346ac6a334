package conformance

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockbroker/lockbroker/client"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// s10Window bounds the cross-language read-write run: at least minimum,
// then until every language held both a read and a write hold, at most
// maximum.
var s10Window = struct{ minimum, maximum time.Duration }{15 * time.Second, 45 * time.Second}

// rwInterval is one holder's belief that it held the read-write lock.
type rwInterval struct {
	interval
	write bool
}

func (a rwInterval) overlaps(b rwInterval) bool { return a.from.Before(b.to) && b.from.Before(a.to) }

func (a rwInterval) String() string {
	m := "read"
	if a.write {
		m = "write"
	}
	return fmt.Sprintf("%s %s (token %d, %s..%s)", a.who, m, a.token, a.from.Format("15:04:05.000"), a.to.Format("15:04:05.000"))
}

// rwViolations checks S10's rules on the intervals: no writer overlaps
// any other holder; a writer's token is above every token of a hold that
// began before it (and so, by the first rule, ended before it); tokens
// are unique. overlappingReaders is how many pairs of readers overlap.
func rwViolations(ivs []rwInterval) (violations []string, overlappingReaders int) {
	tokens := map[uint64]rwInterval{}
	for _, iv := range ivs {
		if prev, dup := tokens[iv.token]; dup || iv.token == 0 {
			violations = append(violations, fmt.Sprintf("token %d of %v, also %v", iv.token, iv, prev))
		}
		tokens[iv.token] = iv
	}
	for i, a := range ivs {
		for j, b := range ivs {
			if j <= i {
				continue
			}
			if a.overlaps(b) {
				if a.write || b.write {
					violations = append(violations, fmt.Sprintf("a writer beside another holder: %v and %v", a, b))
				} else {
					overlappingReaders++
				}
			}
		}
		if !a.write {
			continue
		}
		for _, b := range ivs {
			if b.from.Before(a.from) && b.token >= a.token {
				violations = append(violations, fmt.Sprintf("writer %v has a token not above %v, which began before it", a, b))
			}
		}
	}
	return violations, overlappingReaders
}

// TestRWViolations checks the S10 checker on hand-made runs.
func TestRWViolations(t *testing.T) {
	at := func(ms int) time.Time { return time.Unix(1000, int64(ms)*int64(time.Millisecond)) }
	rd := func(who string, from, to int, tok uint64) rwInterval {
		return rwInterval{interval: interval{who: who, from: at(from), to: at(to), token: tok}}
	}
	wr := func(who string, from, to int, tok uint64) rwInterval {
		iv := rd(who, from, to, tok)
		iv.write = true
		return iv
	}
	tests := []struct {
		name    string
		ivs     []rwInterval
		bad     int
		readers int
	}{
		{"readers share, writer after", []rwInterval{rd("a", 0, 10, 1), rd("b", 5, 12, 2), wr("c", 12, 20, 3)}, 0, 1},
		{"writer beside a reader", []rwInterval{rd("a", 0, 10, 1), wr("b", 9, 20, 2)}, 1, 0},
		{"two writers overlap", []rwInterval{wr("a", 0, 10, 1), wr("b", 5, 20, 2)}, 1, 0},
		{"writer's token not above an earlier reader's", []rwInterval{rd("a", 0, 10, 5), wr("b", 10, 20, 4)}, 1, 0},
		{"duplicate token", []rwInterval{rd("a", 0, 10, 1), rd("b", 20, 30, 1)}, 1, 0},
		{"hand-off at the same instant", []rwInterval{wr("a", 0, 10, 1), rd("b", 10, 20, 2), wr("c", 20, 30, 3)}, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bad, readers := rwViolations(tt.ivs)
			assert.Len(t, bad, tt.bad, "%v", bad)
			assert.Equal(t, tt.readers, readers)
		})
	}
}

// rwCapable is l, or l with missing set when its CLI cannot hold a read
// hold (`hold --mode read`): a probe hold of probeKey on the broker at
// addr must print `acquired` and `released`.
func rwCapable(t *testing.T, l lang, addr, probeKey string) lang {
	t.Helper()
	if l.missing != "" {
		return l
	}
	args := append(append([]string{}, l.argv[1:]...), "--target", addr, "--key", probeKey, "--mode", "read", "--seconds", "0")
	cmd := exec.Command(l.argv[0], args...)
	cmd.Dir = brokertest.RepoRoot(t)
	cmd.Env = append(os.Environ(), l.env...)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	err := runBounded(cmd, 2*time.Minute)
	if err != nil || !strings.Contains(out.String(), `"acquired"`) || !strings.Contains(out.String(), `"released"`) {
		l.missing = fmt.Sprintf("its CLI cannot hold with --mode read (%v): %s", err, strings.TrimSpace(out.String()))
	}
	return l
}

// S10: readers and writers in Go (library and CLI), Python, Node and Java
// on one read-write key. A writer never holds beside anyone, readers do
// share, writers' tokens increase; then each language's CLI takes a
// multi-key hold (--also) and prints a token per key. A language whose
// CLI cannot run here (or cannot hold --mode read) is skipped with the
// reason (LOCKBROKER_S5_REQUIRE makes that a failure, as for S5).
func TestS10ReadWriteAcrossLanguages(t *testing.T) {
	agent := consultest.Start(t)
	b := brokertest.StartProcess(t, agent)
	c := newClient(t, b.Addr)
	key := testKey(t)

	var run []lang
	for _, l := range []lang{goCLI(t), pythonCLI(t), nodeCLI(t), javaCLI(t)} {
		l = rwCapable(t, l, b.Addr, key+"-probe-"+l.name)
		if l.missing != "" {
			if s5Required(l.name) || l.name == "go" {
				t.Fatalf("S10: the %s CLI is required but cannot run: %s", l.name, l.missing)
			}
			t.Logf("S10: skipping the %s readers and writers: %s", l.name, l.missing)
			continue
		}
		run = append(run, l)
	}
	figure(t, "S10 languages run", strings.Join(names(run), ","))

	var (
		mu        sync.Mutex
		intervals []rwInterval
		procs     []*cli
		procWrite = map[*cli]bool{}
		held      = map[string]bool{} // "lang read", "lang write"
		failures  []string
	)
	got := func(who string, write bool) {
		mu.Lock()
		defer mu.Unlock()
		held[fmt.Sprintf("%s %v", who, write)] = true
	}
	failf := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		failures = append(failures, fmt.Sprintf(format, args...))
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	holdFor := func(write bool) time.Duration {
		if write {
			return time.Duration(150+rand.IntN(300)) * time.Millisecond
		}
		return time.Duration(300+rand.IntN(700)) * time.Millisecond
	}
	pause := func() {
		select {
		case <-time.After(time.Duration(100+rand.IntN(300)) * time.Millisecond):
		case <-ctx.Done():
		}
	}

	var wg sync.WaitGroup
	// The Go library in the test process: two readers and a writer, whose
	// intervals are exact.
	for i, write := range []bool{false, false, true} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rw := newClient(t, b.Addr).RWLock(key)
			who := fmt.Sprintf("golib-%d", i)
			for ctx.Err() == nil {
				take := rw.RLock
				if write {
					take = rw.Lock
				}
				lease, err := take(ctx, client.WithValue([]byte(who)))
				if err != nil {
					if ctx.Err() == nil {
						failf("%s: %v", who, err)
					}
					return
				}
				from := time.Now()
				if lease.Sequencer().GetRead() == write {
					failf("%s: a grant with read=%v, asked write=%v", who, lease.Sequencer().GetRead(), write)
				}
				got("golib", write)
				select {
				case <-time.After(holdFor(write)):
				case <-lease.Lost():
				case <-ctx.Done():
				}
				to := time.Now()
				if err := lease.Err(); err != nil {
					failf("%s: lost: %v", who, err)
				}
				mu.Lock()
				intervals = append(intervals, rwInterval{interval{who: who, from: from, to: to, token: lease.Sequencer().GetToken()}, write})
				mu.Unlock()
				rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				if err := lease.Release(rctx); err != nil {
					failf("%s: release: %v", who, err)
				}
				cancel()
				pause()
			}
		}()
	}
	// Per language, a reader and a writer CLI loop, a process per hold.
	for _, l := range run {
		for _, write := range []bool{false, true} {
			mode := "read"
			if write {
				mode = "write"
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					p, err := startCLI(t, l, b.Addr, key, 0, 120, "--mode", mode)
					if err != nil {
						failf("%v", err)
						return
					}
					mu.Lock()
					procs, procWrite[p] = append(procs, p), write
					mu.Unlock()
					acq, err := p.waitOr("acquired", s10Window.maximum+30*time.Second, ctx.Done())
					if err != nil {
						if !errors.Is(err, errGaveUp) {
							failf("%v", err)
						}
						p.terminate()
						<-p.exited
						return
					}
					if m, _ := acq.fields["mode"].(string); m != mode {
						failf("%s CLI --mode %s printed mode %q", l.name, mode, m)
					}
					got(l.name, write)
					select {
					case <-time.After(holdFor(write)):
					case <-ctx.Done():
					}
					p.release()
					if _, err := p.wait("released", 15*time.Second); err != nil {
						failf("%v", err)
					}
					select {
					case <-p.exited:
					case <-time.After(10 * time.Second):
						failf("%s CLI did not exit after its release", l.name)
					}
				}
			}()
		}
	}
	started := time.Now()
	everyone := func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, n := range append([]string{"golib"}, names(run)...) {
			if !held[n+" false"] || !held[n+" true"] {
				return false
			}
		}
		return true
	}
	for {
		time.Sleep(100 * time.Millisecond)
		el := time.Since(started)
		if (el >= s10Window.minimum && everyone()) || el >= s10Window.maximum {
			break
		}
	}
	stop()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("contenders did not stop within 60s of the window's end")
	}
	window := time.Since(started)

	for _, p := range procs {
		if iv, ok := p.belief(); ok {
			intervals = append(intervals, rwInterval{iv, procWrite[p]})
		}
		for _, bad := range []string{"error", "lost"} {
			if e, ok := p.find(bad); ok {
				failures = append(failures, fmt.Sprintf("%s CLI: %v", p.lang.name, e.fields))
			}
		}
	}
	for _, f := range failures {
		t.Error(f)
	}
	bad, sharing := rwViolations(intervals)
	for _, v := range bad {
		t.Error(v)
	}
	assert.Positive(t, sharing, "no two readers' intervals overlapped: readers must share")
	writes, reads := map[string]int{}, map[string]int{}
	for _, iv := range intervals {
		who := strings.SplitN(iv.who, "-", 2)[0]
		if iv.write {
			writes[who]++
		} else {
			reads[who]++
		}
	}
	var counts []string
	for _, n := range append([]string{"golib"}, names(run)...) {
		assert.Positive(t, reads[n], "no %s reader held", n)
		assert.Positive(t, writes[n], "no %s writer held", n)
		counts = append(counts, fmt.Sprintf("%s %d read, %d write", n, reads[n], writes[n]))
	}
	figure(t, "S10 window", window)
	figure(t, "S10 holds per language", strings.Join(counts, "; "))
	figure(t, "S10 overlapping reader pairs", sharing)

	// Each language's multi-key hold: a token per key, in order.
	base := testKey(t)
	keys := []string{base + "/a", base + "/b", base + "/c"}
	for _, l := range run {
		p, err := startCLI(t, l, b.Addr, keys[0], 0, 60, "--also", keys[1], "--also", keys[2])
		require.NoError(t, err)
		acq, err := p.wait("acquired", 60*time.Second)
		if !assert.NoError(t, err, "%s multi-key hold", l.name) {
			continue
		}
		toks, _ := acq.fields["tokens"].([]any)
		assert.Len(t, toks, 3, "%s: a token per key: %v", l.name, acq.fields)
		if len(toks) > 0 {
			assert.Equal(t, toks[0], acq.fields["token"], "%s: token is the first key's", l.name)
		}
		st, err := c.GetLock(opCtx(t), keys[2])
		require.NoError(t, err)
		assert.Equal(t, []string{acq.fields["session_id"].(string)}, holderSessions(st.GetHolders()), "%s: the last key is held by the hold's session", l.name)
		p.release()
		_, err = p.wait("released", 15*time.Second)
		assert.NoError(t, err)
		<-p.exited
	}
}
