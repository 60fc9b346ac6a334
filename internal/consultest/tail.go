package consultest

import (
	"strings"
	"sync"
)

// tailSize bounds how much recent agent output is kept for error messages.
const tailSize = 64 << 10

// tailBuffer is an io.Writer that keeps the last tailSize bytes written.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
}

// Write appends p, discarding the oldest bytes beyond tailSize.
func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - tailSize; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

// lastLines returns up to n of the most recent complete or partial lines.
func (t *tailBuffer) lastLines(n int) string {
	t.mu.Lock()
	s := strings.TrimRight(string(t.buf), "\n")
	t.mu.Unlock()
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// contains reports whether the kept output contains s.
func (t *tailBuffer) contains(s string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.Contains(string(t.buf), s)
}
