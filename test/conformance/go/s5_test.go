package conformance

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockbroker/lockbroker/client"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

const s5Limit = 3

// observer watches a semaphore prefix and remembers the most holders any
// state showed.
type observer struct {
	max    atomic.Int64
	states atomic.Int64
	w      *client.Watcher
	cancel context.CancelFunc
}

func observe(t *testing.T, c *client.Client, key string) *observer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w, err := c.Watch(ctx, key)
	require.NoError(t, err)
	o := &observer{w: w, cancel: cancel}
	go func() {
		for resp := range w.C {
			o.states.Add(1)
			if n := int64(len(resp.GetState().GetHolders())); n > o.max.Load() {
				o.max.Store(n)
			}
		}
	}()
	t.Cleanup(o.stop)
	return o
}

func (o *observer) stop() {
	o.cancel()
	<-o.w.Done()
}

// usable returns l, or the fallback when l cannot run here (logged, or a
// failure when LOCKBROKER_S5_REQUIRE names it).
func usable(t *testing.T, l, fallback lang) lang {
	t.Helper()
	if l.missing == "" {
		return l
	}
	if s5Required(l.name) {
		t.Fatalf("S5: the %s CLI is required (LOCKBROKER_S5_REQUIRE) but cannot run: %s", l.name, l.missing)
	}
	t.Logf("S5: no %s holder: %s", l.name, l.missing)
	return fallback
}

// S5 (the scenario's steps): four CLI holders on one prefix, limit 3 — Go
// CLIs and, where they can run, a Python and a Node one. An observer never
// sees more than 3 holders; exactly 3 hold while the fourth waits; when
// one releases, the waiting one gets its slot.
func TestS5SemaphoreLimitAcrossProcesses(t *testing.T) {
	agent := consultest.Start(t)
	b := brokertest.StartProcess(t, agent)
	c := newClient(t, b.Addr)
	key := testKey(t)
	g := goCLI(t)
	langs := []lang{g, g, usable(t, pythonCLI(t), g), usable(t, nodeCLI(t), g)}

	obs := observe(t, c, key)
	var clis []*cli
	for _, l := range langs {
		p, err := startCLI(t, l, b.Addr, key, s5Limit, 60)
		require.NoError(t, err)
		clis = append(clis, p)
	}
	waitFor(t, 30*time.Second, "three holders", func() bool {
		n := 0
		for _, p := range clis {
			if p.has("acquired") {
				n++
			}
		}
		return n == s5Limit
	})
	time.Sleep(time.Second) // the fourth keeps waiting while the three hold
	var holding, waiting []*cli
	for _, p := range clis {
		if p.has("acquired") {
			holding = append(holding, p)
		} else {
			waiting = append(waiting, p)
		}
	}
	require.Len(t, holding, s5Limit)
	require.Len(t, waiting, 1)
	st, err := c.GetLock(opCtx(t), key)
	require.NoError(t, err)
	assert.Len(t, st.GetHolders(), s5Limit)
	assert.EqualValues(t, s5Limit, st.GetLimit())

	holding[0].release()
	_, err = holding[0].wait("released", 15*time.Second)
	require.NoError(t, err)
	start := time.Now()
	_, err = waiting[0].wait("acquired", 15*time.Second)
	require.NoError(t, err)
	figure(t, "S5 the waiting holder got the slot after the release by", time.Since(start))
	st, err = c.GetLock(opCtx(t), key)
	require.NoError(t, err)
	assert.Len(t, st.GetHolders(), s5Limit)

	var names []string
	for _, p := range clis {
		p.stop()
		if p.has("acquired") {
			names = append(names, p.lang.name)
		}
		for _, bad := range []string{"error", "lost"} {
			if e, ok := p.find(bad); ok {
				t.Errorf("%s CLI: %v", p.lang.name, e.fields)
			}
		}
	}
	obs.stop()
	assert.LessOrEqual(t, obs.max.Load(), int64(s5Limit), "an observer saw more holders than the limit")
	figure(t, "S5 languages holding", strings.Join(names, ","))
}

// s5Window bounds the cross-language contention: at least minimum, then
// until every language got a slot, at most maximum.
var s5Window = struct{ minimum, maximum time.Duration }{15 * time.Second, 40 * time.Second}

// S5 across languages: Go (in-process and CLI), Python, Node and Java
// holders contend for one semaphore prefix with limit 3, over and over:
// each takes a slot, holds it for a short random time, releases it and
// contends again (a CLI process per hold). The test records every
// holder's belief interval — for a CLI from its `acquired` JSON line to
// the moment the test asked it to release (never wider than its real
// belief, so an overlap seen here is a real one) — and asserts that no
// more than 3 overlap at any instant, that an observer watching the
// prefix never sees more than 3 holders, that every grant has a token of
// its own, and that every language got the lock. A language whose CLI
// cannot run here is skipped with the reason (LOCKBROKER_S5_REQUIRE=all
// makes that a failure).
func TestS5CrossLanguage(t *testing.T) {
	clis := []lang{goCLI(t), pythonCLI(t), nodeCLI(t), javaCLI(t)}
	var run []lang
	for _, l := range clis {
		if l.missing != "" {
			if s5Required(l.name) {
				t.Fatalf("S5: the %s CLI is required (LOCKBROKER_S5_REQUIRE) but cannot run: %s", l.name, l.missing)
			}
			t.Logf("S5: skipping the %s holder: %s", l.name, l.missing)
			continue
		}
		run = append(run, l)
	}
	if len(run) == 1 {
		t.Skip("S5 across languages: no other language's CLI can run here (see the log)")
	}
	agent := consultest.Start(t)
	b := brokertest.StartProcess(t, agent)
	c := newClient(t, b.Addr)
	key := testKey(t)
	obs := observe(t, c, key)

	var (
		mu        sync.Mutex
		intervals []interval
		procs     []*cli
		firstAt   = map[string]time.Duration{}
		failures  []string
	)
	started := time.Now()
	got := func(who string) {
		mu.Lock()
		defer mu.Unlock()
		if _, ok := firstAt[who]; !ok {
			firstAt[who] = time.Since(started)
		}
	}
	failf := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		failures = append(failures, fmt.Sprintf(format, args...))
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	holdFor := func() time.Duration { return time.Duration(300+rand.IntN(600)) * time.Millisecond }

	var wg sync.WaitGroup
	// Go holders in the test process: the belief interval is exact.
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			gc := newClient(t, b.Addr)
			who := fmt.Sprintf("golib-%d", i)
			for ctx.Err() == nil {
				lease, err := gc.Lock(ctx, key, client.WithLimit(s5Limit), client.WithValue([]byte(who)))
				if err != nil {
					if ctx.Err() == nil {
						failf("%s: lock: %v", who, err)
					}
					return
				}
				from := time.Now()
				got("go")
				select {
				case <-time.After(holdFor()):
				case <-lease.Lost():
				case <-ctx.Done():
				}
				to := time.Now()
				if err := lease.Err(); err != nil {
					failf("%s: lost its slot: %v", who, err)
				}
				mu.Lock()
				intervals = append(intervals, interval{who: who, from: from, to: to, token: lease.Sequencer().GetToken()})
				mu.Unlock()
				rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				if err := lease.Release(rctx); err != nil {
					failf("%s: release: %v", who, err)
				}
				cancel()
				select { // as long as a CLI takes to start again
				case <-time.After(time.Duration(200+rand.IntN(300)) * time.Millisecond):
				case <-ctx.Done():
				}
			}
		}()
	}
	// One CLI contender per language, a new process for every hold.
	for _, l := range run {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				p, err := startCLI(t, l, b.Addr, key, s5Limit, 120)
				if err != nil {
					failf("%v", err)
					return
				}
				mu.Lock()
				procs = append(procs, p)
				mu.Unlock()
				if _, err := p.waitOr("acquired", s5Window.maximum+30*time.Second, ctx.Done()); err != nil {
					if !errors.Is(err, errGaveUp) {
						failf("%v", err)
					}
					p.terminate()
					<-p.exited
					return
				}
				got(l.name)
				select {
				case <-time.After(holdFor()):
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
	// The window: at least the minimum, then until every language held.
	for {
		time.Sleep(100 * time.Millisecond)
		el := time.Since(started)
		mu.Lock()
		all := len(firstAt) == len(run) // "go" covers the library and the CLI
		mu.Unlock()
		if (el >= s5Window.minimum && all) || el >= s5Window.maximum {
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
	obs.stop()
	window := time.Since(started)

	// Every CLI hold as a belief interval.
	perLang := map[string]int{}
	for _, p := range procs {
		if iv, ok := p.belief(); ok {
			intervals = append(intervals, iv)
		}
		for _, bad := range []string{"error", "lost"} {
			if e, ok := p.find(bad); ok {
				failures = append(failures, fmt.Sprintf("%s CLI: %v", p.lang.name, e.fields))
			}
		}
		if acq, ok := p.find("acquired"); ok {
			if rel, ok := p.find("released"); ok && rel.token() != acq.token() {
				failures = append(failures, fmt.Sprintf("%s CLI released token %d, acquired %d", p.lang.name, rel.token(), acq.token()))
			}
		}
	}
	tokens := map[uint64]string{}
	for _, iv := range intervals {
		perLang[strings.SplitN(iv.who, "-", 2)[0]]++
		if prev, dup := tokens[iv.token]; dup || iv.token == 0 {
			failures = append(failures, fmt.Sprintf("token %d granted to %s and %s", iv.token, prev, iv.who))
		}
		tokens[iv.token] = iv.who
	}
	for _, f := range failures {
		t.Error(f)
	}
	most, at := maxOverlap(intervals)
	var atNames []string
	for _, iv := range at {
		atNames = append(atNames, fmt.Sprintf("%s(token %d, %s..%s)", iv.who, iv.token, iv.from.Format("15:04:05.000"), iv.to.Format("15:04:05.000")))
	}
	sort.Strings(atNames)
	assert.LessOrEqual(t, most, s5Limit, "more holders believed they held a slot at once than the limit: %v", atNames)
	assert.LessOrEqual(t, obs.max.Load(), int64(s5Limit), "an observer saw more holders than the limit")
	for _, l := range run {
		assert.Contains(t, firstAt, l.name, "the %s holders never got a slot", l.name)
	}

	var counts []string
	for _, l := range append([]string{"golib"}, names(run)...) {
		if l == "golib" {
			counts = append(counts, fmt.Sprintf("go library %d", perLang[l]))
			continue
		}
		counts = append(counts, fmt.Sprintf("%s CLI %d (language's first hold after %.1fs)", l, perLang[l], firstAt[l].Seconds()))
	}
	figure(t, "S5 across languages: contention window", window)
	figure(t, "S5 across languages: holds per language", strings.Join(counts, ", "))
	figure(t, "S5 across languages: most holders at once (beliefs; observer)", fmt.Sprintf("%d; %d over %d states", most, obs.max.Load(), obs.states.Load()))
}

func names(ls []lang) []string {
	var out []string
	for _, l := range ls {
		out = append(out, l.name)
	}
	return out
}
