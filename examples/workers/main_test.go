package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/lockbroker/lockbroker/client"
	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// 200 tasks, 5 workers, each on its own connection; halfway through, one
// worker dies in the middle of a task (it stops running, then its
// connection closes abruptly, as when a process is killed). Every task is
// completed exactly once, no task is ever run by two workers at once, the
// grants of each task carry increasing tokens, and the dead worker's task
// is finished by another.
func TestWorkersShareTasksAndSurviveAKill(t *testing.T) {
	const (
		tasks    = 200
		workers  = 5
		victim   = 2
		taskTime = 20 * time.Millisecond
		prefix   = "example/tasks"
	)
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)

	list := make([]string, tasks)
	for i := range list {
		list[i] = fmt.Sprintf("task-%03d", i)
	}
	ledger := &memLedger{done: map[string]completion{}}
	beliefs := &beliefs{running: map[string]string{}, intervals: map[string][]interval{}}
	kill := make(chan struct{})
	var killedTask atomic.Value // string
	victimConn := r.Conn(t)
	victimCtx, cancelVictim := context.WithCancel(context.Background())
	defer cancelVictim()

	var logs bytes.Buffer
	logw := &lockedWriter{w: &logs}
	errs := make([]error, workers)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range workers {
		name := fmt.Sprintf("w%d", i)
		conn, ctx := r.Conn(t), context.Background()
		if i == victim {
			conn, ctx = victimConn, victimCtx
		}
		w := &Worker{
			Name:   name,
			Client: client.New(conn),
			Prefix: prefix,
			Tasks:  rotate(list, i*tasks/workers),
			Ledger: ledger,
			Retry:  50 * time.Millisecond,
			Log:    logw,
			Do: func(ctx context.Context, task string, lease *client.Lease) error {
				beliefs.begin(t, task, name, lease.Sequencer().GetToken())
				ended := false
				defer func() {
					if !ended {
						beliefs.end(task, name)
					}
				}()
				var killed <-chan struct{}
				if i == victim {
					killed = kill
				}
				timer := time.NewTimer(taskTime)
				defer timer.Stop()
				select {
				case <-timer.C:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				case <-killed:
					// The process dies: it stops running, then the
					// kernel closes its connection.
					beliefs.end(task, name)
					ended = true
					killedTask.Store(task)
					_ = victimConn.Close()
					return errors.New("killed")
				}
			},
		}
		wg.Go(func() { errs[i] = w.Run(ctx) })
	}

	require.Eventually(t, func() bool { return ledger.count() >= tasks/2 }, 30*time.Second, time.Millisecond, "half the tasks done")
	close(kill)
	require.Eventually(t, func() bool { return killedTask.Load() != nil }, 10*time.Second, time.Millisecond, "the victim was killed in a task")
	cancelVictim()

	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(45 * time.Second):
		t.Fatalf("the workers did not finish within 45s; %d of %d tasks done", ledger.count(), tasks)
	}
	took := time.Since(start)

	t.Logf("%d tasks by %d workers in %s; worker %d killed during %s", tasks, workers, took.Round(time.Millisecond), victim, killedTask.Load())
	// Whatever else happened, no task ran twice at once, and no stale
	// grant was recorded.
	beliefs.check(t)
	ledger.mu.Lock()
	assert.Zero(t, ledger.stale, "no completion under a stale token")
	ledger.mu.Unlock()
	for i, err := range errs {
		if i != victim && err != nil && strings.Contains(err.Error(), "429") {
			t.Fatalf("regression: w%d stopped because Consul refused the broker's connections (%v): every short hold leaves a blocking query behind in Consul for its wait time; see TestWorkersShortHoldsLeaveConsulConnectionsFree in test/e2e", i, err)
		}
	}

	for i, err := range errs {
		if i == victim {
			assert.Error(t, err, "the killed worker stops with an error")
			t.Logf("w%d (killed) returned: %v", i, err)
			continue
		}
		assert.NoError(t, err, "w%d", i)
	}
	ledger.mu.Lock()
	perWorker := map[string]int{}
	for _, task := range list {
		c, ok := ledger.done[task]
		if assert.True(t, ok, "%s is done", task) {
			assert.Equal(t, 1, c.times, "%s was completed once", task)
			perWorker[c.worker]++
		}
	}
	if c, ok := ledger.done[killedTask.Load().(string)]; assert.True(t, ok) {
		assert.NotEqual(t, fmt.Sprintf("w%d", victim), c.worker, "another worker finished the killed worker's task")
	}
	ledger.mu.Unlock()
	t.Logf("tasks completed per worker: %v", perWorker)

	// DELETE behaviour: finished task keys vanish. Asked through the
	// broker: after this many short holds Consul may refuse new
	// connections from this host (see TestWorkersShortHoldsLeaveConsulConnectionsFree).
	check := client.New(r.Conn(t))
	var remain []string
	for _, task := range list {
		st, err := check.GetLock(context.Background(), prefix+"/"+task)
		require.NoError(t, err)
		if st.GetKind() != lockbrokerv1.LockKind_LOCK_KIND_NONE {
			remain = append(remain, task)
		}
	}
	if len(remain) > 0 {
		t.Fatalf("regression: %d of %d finished task keys remain in Consul although their locks had DELETE behaviour (e.g. %s); see TestWorkersDeleteBehaviorKeysVanish in test/e2e", len(remain), tasks, remain[0])
	}
	if t.Failed() {
		t.Logf("worker log:\n%s", logs.String())
	}
}

// The command itself: three workers in one process finish every task,
// each recorded once in the ledger directory, and it says so.
func TestWorkersCommand(t *testing.T) {
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	dir := t.TempDir()
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := run(ctx, []string{"-broker", r.Addr, "-tasks", "30", "-workers", "3", "-ledger", dir, "-work", "10ms", "-name", "cmd"}, &out)
	require.NoError(t, err, out.String())
	assert.Contains(t, out.String(), "all 30 tasks done")
	for i := range 30 {
		task := fmt.Sprintf("task-%03d", i)
		assert.Equal(t, 1, strings.Count(out.String(), ": ran "+task+" "), "%s ran once:\n%s", task, out.String())
		b, err := os.ReadFile(filepath.Join(dir, task))
		if assert.NoError(t, err, task) {
			assert.Regexp(t, `^\d+ cmd/w\d\n$`, string(b))
		}
	}
	// A second run finds everything done and runs nothing.
	out.Reset()
	require.NoError(t, run(ctx, []string{"-broker", r.Addr, "-tasks", "30", "-workers", "2", "-ledger", dir, "-name", "again"}, &out))
	assert.NotContains(t, out.String(), ": ran ")
	assert.Contains(t, out.String(), "all 30 tasks done")
}

// completion is a ledger record.
type completion struct {
	worker string
	token  uint64
	times  int
}

// memLedger is a Ledger in memory that counts completions.
type memLedger struct {
	mu    sync.Mutex
	done  map[string]completion
	stale int
}

func (l *memLedger) Done(_ context.Context, task string) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.done[task]
	return ok, nil
}

func (l *memLedger) Complete(_ context.Context, task, worker string, token uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.done[task]
	if token < c.token {
		l.stale++
		return ErrStaleToken
	}
	l.done[task] = completion{worker: worker, token: token, times: c.times + 1}
	return nil
}

func (l *memLedger) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.done)
}

// interval is one worker's run of a task, while it believed it held the
// task's lock.
type interval struct {
	worker     string
	token      uint64
	start, end time.Time
}

// beliefs checks that no task is run by two workers at once.
type beliefs struct {
	mu        sync.Mutex
	running   map[string]string // task → worker running it
	intervals map[string][]interval
}

func (b *beliefs) begin(t *testing.T, task, worker string, token uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if other, ok := b.running[task]; ok {
		t.Errorf("%s is run by %s and %s at once", task, other, worker)
	}
	b.running[task] = worker
	b.intervals[task] = append(b.intervals[task], interval{worker: worker, token: token, start: time.Now()})
}

func (b *beliefs) end(task, worker string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.running[task] == worker {
		delete(b.running, task)
	}
	ivs := b.intervals[task]
	for i := len(ivs) - 1; i >= 0; i-- {
		if ivs[i].worker == worker && ivs[i].end.IsZero() {
			ivs[i].end = time.Now()
			return
		}
	}
}

// check verifies, per task, that the runs do not overlap and that each
// later run has a higher token.
func (b *beliefs) check(t *testing.T) {
	b.mu.Lock()
	defer b.mu.Unlock()
	assert.Empty(t, b.running, "nothing is still running")
	runs := 0
	for task, ivs := range b.intervals {
		sort.Slice(ivs, func(i, j int) bool { return ivs[i].start.Before(ivs[j].start) })
		runs += len(ivs)
		for i, iv := range ivs {
			assert.False(t, iv.end.IsZero(), "%s: %s's run ended", task, iv.worker)
			if i == 0 {
				continue
			}
			prev := ivs[i-1]
			assert.False(t, iv.start.Before(prev.end), "%s: %s began at %s before %s ended at %s", task, iv.worker, iv.start.Format(time.StampMicro), prev.worker, prev.end.Format(time.StampMicro))
			assert.Greater(t, iv.token, prev.token, "%s: a later grant has a higher token", task)
		}
	}
	t.Logf("%d runs of %d tasks checked", runs, len(b.intervals))
}
