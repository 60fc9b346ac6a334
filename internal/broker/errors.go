package broker

import (
	"errors"
	"fmt"
	"strings"
)

// Domain errors. The gRPC layer maps each to one status code.
var (
	// ErrInvalid: a request field is bad (INVALID_ARGUMENT).
	ErrInvalid = errors.New("invalid argument")
	// ErrBusy: a try-once found the key held (ABORTED).
	ErrBusy = errors.New("busy")
	// ErrTimeout: a bounded wait ran out (DEADLINE_EXCEEDED).
	ErrTimeout = errors.New("wait timed out")
	// ErrConflict: the key holds foreign flags, another recipe, or a
	// different semaphore limit (FAILED_PRECONDITION).
	ErrConflict = errors.New("conflict")
	// ErrNotHolder: the session does not hold the key (FAILED_PRECONDITION).
	ErrNotHolder = errors.New("session is not the holder")
	// ErrSessionNotFound: the session does not exist (NOT_FOUND).
	ErrSessionNotFound = errors.New("session not found")
	// ErrUnavailable: Consul cannot be reached or has no leader
	// (UNAVAILABLE).
	ErrUnavailable = errors.New("consul unavailable")
	// ErrShutdown: the broker is stopping (UNAVAILABLE).
	ErrShutdown = errors.New("broker shutting down")
)

// holdersError wraps a sentinel with the key's holders, so that a busy or
// timed-out request says who is in the way.
func holdersError(sentinel error, st *State) error {
	if st == nil || len(st.Holders) == 0 {
		return fmt.Errorf("%w: key %q", sentinel, keyOf(st))
	}
	parts := make([]string, 0, len(st.Holders))
	for _, h := range st.Holders {
		parts = append(parts, fmt.Sprintf("session %s (value %q, token %d)", h.Session, truncate(h.Value, 64), h.Token))
	}
	return fmt.Errorf("%w: key %q held by %s", sentinel, st.Key, strings.Join(parts, ", "))
}

func keyOf(st *State) string {
	if st == nil {
		return ""
	}
	return st.Key
}

func truncate(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	return string(b[:n]) + "..."
}

// ErrAborted: the request cannot go on and should be retried from the
// start (ABORTED), e.g. its session was invalidated while it waited.
var ErrAborted = errors.New("aborted")
