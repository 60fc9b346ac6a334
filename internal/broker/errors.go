package broker

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Domain errors. The gRPC layer maps each to one status code; *Error adds
// the stable reason and the details a client can act on.
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
	// ErrPermission: Consul's ACLs refused an operation
	// (PERMISSION_DENIED).
	ErrPermission = errors.New("permission denied by consul")
	// ErrShutdown: the broker is stopping (UNAVAILABLE).
	ErrShutdown = errors.New("broker shutting down")
	// ErrAborted: the request cannot go on and should be retried from the
	// start (ABORTED), e.g. its session was invalidated while it waited.
	ErrAborted = errors.New("aborted")
)

// Reason is a stable, machine-readable error reason: the name of a
// lockbroker.v1.ErrorReason value without its prefix.
type Reason string

// The reasons (documented on lockbroker.v1.ErrorReason).
const (
	ReasonInvalidArgument        Reason = "INVALID_ARGUMENT"
	ReasonLockHeld               Reason = "LOCK_HELD"
	ReasonLockDelay              Reason = "LOCK_DELAY"
	ReasonWaitTimeout            Reason = "WAIT_TIMEOUT"
	ReasonForeignFlags           Reason = "FOREIGN_FLAGS"
	ReasonLimitConflict          Reason = "LIMIT_CONFLICT"
	ReasonMalformedSemaphore     Reason = "MALFORMED_SEMAPHORE"
	ReasonSessionNotFound        Reason = "SESSION_NOT_FOUND"
	ReasonNotHolder              Reason = "NOT_HOLDER"
	ReasonResumeRefused          Reason = "RESUME_REFUSED"
	ReasonSessionLost            Reason = "SESSION_LOST"
	ReasonConsulUnavailable      Reason = "CONSUL_UNAVAILABLE"
	ReasonConsulPermissionDenied Reason = "CONSUL_PERMISSION_DENIED"
	ReasonBrokerShuttingDown     Reason = "BROKER_SHUTTING_DOWN"
	ReasonPermissionDenied       Reason = "PERMISSION_DENIED"
	ReasonUnauthenticated        Reason = "UNAUTHENTICATED"
	ReasonQuotaExceeded          Reason = "QUOTA_EXCEEDED"
	ReasonInternal               Reason = "INTERNAL"
	ReasonConsulRejected         Reason = "CONSUL_REJECTED"
	ReasonReplicaCutOff          Reason = "REPLICA_CUT_OFF"
)

// Error is a domain error with what a client needs to act on it. It wraps
// one of the sentinels above (errors.Is works on it).
type Error struct {
	// Kind is the sentinel: ErrBusy, ErrConflict, ...
	Kind error
	// Reason is the stable reason.
	Reason Reason
	// Msg says what happened, for humans.
	Msg string
	// Field names the bad request field (ErrInvalid), e.g. "new_session.ttl".
	Field string
	// State is the key's state when it explains the error (busy, timed
	// out, not the holder).
	State *State
	// RetryAfter, when positive, is when a retry may work.
	RetryAfter time.Duration
}

func (e *Error) Error() string { return fmt.Sprintf("%v: %s", e.Kind, e.Msg) }

func (e *Error) Unwrap() error { return e.Kind }

// newError builds an *Error.
func newError(kind error, reason Reason, format string, args ...any) *Error {
	return &Error{Kind: kind, Reason: reason, Msg: fmt.Sprintf(format, args...)}
}

// invalid is an INVALID_ARGUMENT naming field.
func invalid(field, format string, args ...any) *Error {
	e := newError(ErrInvalid, ReasonInvalidArgument, format, args...)
	e.Field = field
	e.Msg = field + ": " + e.Msg
	return e
}

// withState attaches the key's state to e.
func (e *Error) withState(st *State) *Error { e.State = st; return e }

// holdersError is a busy or timed-out error that names the key's holders.
func holdersError(kind error, reason Reason, st *State) *Error {
	return newError(kind, reason, "%s", describeHolders(st)).withState(st)
}

func describeHolders(st *State) string {
	if st == nil {
		return "key state unknown"
	}
	if len(st.Holders) == 0 {
		return fmt.Sprintf("key %q has no holder", st.Key)
	}
	parts := make([]string, 0, len(st.Holders))
	for _, h := range st.Holders {
		parts = append(parts, fmt.Sprintf("session %s (value %q, token %d)", h.Session, truncate(h.Value, 64), h.Token))
	}
	return fmt.Sprintf("key %q held by %s", st.Key, strings.Join(parts, ", "))
}

func truncate(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	return string(b[:n]) + "..."
}

// ReasonOf returns the reason of err: the *Error's own, or the one that
// follows from a store error or sentinel. ok is false for an error the
// broker does not know (a bug: INTERNAL).
func ReasonOf(err error) (Reason, bool) {
	var e *Error
	if errors.As(err, &e) && e.Reason != "" {
		return e.Reason, true
	}
	var se *StoreError
	if errors.As(err, &se) {
		switch se.Kind {
		case StoreUnavailable:
			return ReasonConsulUnavailable, true
		case StorePermissionDenied:
			return ReasonConsulPermissionDenied, true
		}
		return ReasonInternal, false
	}
	switch {
	case errors.Is(err, ErrSessionNotFound):
		return ReasonSessionNotFound, true
	case errors.Is(err, ErrUnavailable):
		return ReasonConsulUnavailable, true
	case errors.Is(err, ErrShutdown):
		return ReasonBrokerShuttingDown, true
	case errors.Is(err, ErrPermission):
		return ReasonConsulPermissionDenied, true
	case errors.Is(err, ErrInvalid):
		return ReasonInvalidArgument, true
	}
	return ReasonInternal, false
}
