package main

import (
	"bytes"
	"context"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// candidate is one run of the command, with its output.
type candidate struct {
	t      *testing.T
	id     string
	cancel context.CancelFunc
	done   chan error
	out    *lines
}

func start(t *testing.T, id string, args ...string) *candidate {
	ctx, cancel := context.WithCancel(context.Background())
	c := &candidate{t: t, id: id, cancel: cancel, done: make(chan error, 1), out: &lines{}}
	go func() { c.done <- run(ctx, append([]string{"-id", id}, args...), c.out) }()
	t.Cleanup(func() {
		cancel()
		<-c.done
		c.done <- nil
		t.Logf("output of %s:\n%s", id, c.out.String())
	})
	return c
}

// wait returns the submatches of the first line after the previous match
// that matches pattern (after "<id>: "). The campaign's lines and the
// observer's ("observed: ...") are two sequences, each in order, but
// interleaved as their goroutines run: each has its own position.
func (c *candidate) wait(pattern string) []string {
	c.t.Helper()
	re := regexp.MustCompile("^" + regexp.QuoteMeta(c.id) + ": " + pattern + "$")
	observed := strings.HasPrefix(pattern, "observed: ")
	var m []string
	require.Eventually(c.t, func() bool { m = c.out.next(re, observed); return m != nil }, 10*time.Second, 5*time.Millisecond,
		"%s never printed a line matching %q; output:\n%s", c.id, pattern, c.out.String())
	return m
}

// stop cancels the candidate (Ctrl-C) and waits for run to return.
func (c *candidate) stop() {
	c.t.Helper()
	c.cancel()
	select {
	case err := <-c.done:
		require.NoError(c.t, err)
		c.done <- err
	case <-time.After(10 * time.Second):
		c.t.Fatalf("%s did not stop within 10s", c.id)
	}
}

// Two candidates: the first leads, the second campaigns and observes it;
// the leader resigns (Ctrl-C) and the second takes over; then the second
// loses its session in Consul, says it stopped leading, campaigns again
// and leads again once the lock-delay has passed, with a higher token.
func TestLeaderHandover(t *testing.T) {
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	args := []string{"-broker", r.Addr, "-key", "example/leader", "-ttl", "10s", "-lock-delay", "1s"}

	a := start(t, "alpha", args...)
	a.wait(`campaigning for example/leader`)
	tokenA := token(t, a.wait(`leading \(token (\d+), session (\S+)\)`)[1])
	a.wait(`observed: leader is alpha \(token ` + strconv.FormatUint(tokenA, 10) + `\)`)

	b := start(t, "beta", args...)
	b.wait(`campaigning for example/leader`)
	b.wait(`observed: leader is alpha \(token ` + strconv.FormatUint(tokenA, 10) + `\)`)

	// alpha resigns: beta leads at once, and both see it.
	a.stop()
	a.wait(`stopped leading: resigned`)
	m := b.wait(`leading \(token (\d+), session (\S+)\)`)
	tokenB, sessionB := token(t, m[1]), m[2]
	assert.Greater(t, tokenB, tokenA)
	b.wait(`observed: leader is beta \(token ` + strconv.FormatUint(tokenB, 10) + `\)`)
	assert.NotContains(t, a.out.String(), "observed: leader is beta", "alpha stopped observing when it stopped")

	// beta's session is destroyed in Consul: it stops leading, the key is
	// free for the lock-delay, then beta leads again.
	_, err := agent.Client().Session().Destroy(sessionB, nil)
	require.NoError(t, err)
	b.wait(`stopped leading: lease lost: SESSION_INVALIDATED: .*`)
	b.wait(`observed: no leader`)
	b.wait(`campaigning for example/leader`)
	tokenB2 := token(t, b.wait(`leading \(token (\d+), session (\S+)\)`)[1])
	assert.Greater(t, tokenB2, tokenB)
	b.wait(`observed: leader is beta \(token ` + strconv.FormatUint(tokenB2, 10) + `\)`)

	b.stop()
	b.wait(`stopped leading: resigned`)
	out := b.out.String()
	assert.Equal(t, 2, strings.Count(out, "beta: leading"), "beta led twice:\n%s", out)
	assert.Equal(t, 1, strings.Count(a.out.String(), "alpha: leading"))
}

func token(t *testing.T, s string) uint64 {
	t.Helper()
	n, err := strconv.ParseUint(s, 10, 64)
	require.NoError(t, err)
	return n
}

// lines collects output lines, safe for concurrent use.
type lines struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	all    []string
	cursor [2]int // of the campaign's lines and the observer's
}

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	for {
		i := bytes.IndexByte(l.buf.Bytes(), '\n')
		if i < 0 {
			return len(p), nil
		}
		l.all = append(l.all, string(l.buf.Next(i + 1)[:i]))
	}
}

// next returns the submatches of the first line after the previous match
// in the same sequence (observer's or not) that matches re, and moves past
// it; nil if there is none yet.
func (l *lines) next(re *regexp.Regexp, observed bool) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	seq := 0
	if observed {
		seq = 1
	}
	for i := l.cursor[seq]; i < len(l.all); i++ {
		if m := re.FindStringSubmatch(l.all[i]); m != nil {
			l.cursor[seq] = i + 1
			return m
		}
	}
	return nil
}

func (l *lines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.all, "\n")
}
