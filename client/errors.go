package client

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
)

// Sentinels for errors.Is. Every error the broker returns reaches the
// caller as a *StatusError (with the status's google.rpc details), which
// matches the sentinel of its kind; ErrReleased is the lease's own end.
var (
	// ErrBusy: a try (TryLock, a zero wait, TryAcquire) found the key held
	// (gRPC ABORTED; reason LOCK_HELD, or LOCK_DELAY while Consul's
	// lock-delay blocks the key). The *StatusError names the holders.
	ErrBusy = errors.New("lock is busy")
	// ErrWaitTimeout: a bounded wait (WithWaitTimeout) ran out (gRPC
	// DEADLINE_EXCEEDED, reason WAIT_TIMEOUT). The *StatusError names the
	// holders. The caller's own ctx ending is ctx.Err() instead.
	ErrWaitTimeout = errors.New("wait for the lock timed out")
	// ErrNotHolder: the session does not hold the key, or holds it with
	// another grant than the token given (gRPC FAILED_PRECONDITION, reason
	// NOT_HOLDER).
	ErrNotHolder = errors.New("not the holder")
	// ErrConflict: the key carries another client's flags, or a semaphore's
	// stored limit differs from the one asked for (gRPC
	// FAILED_PRECONDITION, reasons FOREIGN_FLAGS, LIMIT_CONFLICT,
	// MALFORMED_SEMAPHORE).
	ErrConflict = errors.New("key conflict")
	// ErrKindConflict: the key is another kind than the request asked for
	// (gRPC FAILED_PRECONDITION, reason LIMIT_CONFLICT, with the key's
	// LockState naming the kind found): a plain lock or semaphore asked
	// for on a read-write lock (RWLOCK), a read or write hold asked for on
	// a lock (LOCK) or semaphore (SEMAPHORE), a lock on a semaphore
	// prefix. StatusError.State.Kind is the kind found. A semaphore whose
	// stored limit differs from the one asked for is ErrConflict but not
	// ErrKindConflict. Every ErrKindConflict is an ErrConflict too.
	ErrKindConflict = errors.New("key is another kind of lock")
	// ErrSessionNotFound: the session is unknown or was invalidated (gRPC
	// NOT_FOUND).
	ErrSessionNotFound = errors.New("session not found")
	// ErrInvalidArgument: the broker refused a field (gRPC
	// INVALID_ARGUMENT); StatusError.FieldViolations says which and why.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrPermissionDenied: the caller may not use the key, or Consul's ACL
	// refused the broker (gRPC PERMISSION_DENIED).
	ErrPermissionDenied = errors.New("permission denied")
	// ErrUnavailable: neither the broker nor Consul could be reached, or the
	// broker is shutting down (gRPC UNAVAILABLE); StatusError.RetryAfter
	// says when to try again.
	ErrUnavailable = errors.New("unavailable")
	// ErrReleased: the lease was released by its own Release. A Release
	// from elsewhere (another process with the session id) ends the lease
	// with a *LostError of Cause RELEASED, which matches ErrReleased too.
	ErrReleased = errors.New("lease released")
)

// StatusError is an error status from the broker with its google.rpc
// details (AIP-193). It keeps the status: status.Code, status.FromError
// and status.Convert see the broker's code and message unchanged.
type StatusError struct {
	// Code is the gRPC code.
	Code codes.Code
	// Reason is ErrorInfo.reason, the stable name of the error (the
	// lockbroker.v1.ErrorReason value without ERROR_REASON_: LOCK_HELD,
	// WAIT_TIMEOUT, NOT_HOLDER, CONSUL_UNAVAILABLE, ...); empty when the
	// status carries no ErrorInfo (a transport failure).
	Reason string
	// Metadata is ErrorInfo.metadata (e.g. "key", "field").
	Metadata map[string]string
	// State is the key's state sent with the error (the lockbroker.v1
	// LockState detail) for busy and timed-out requests. When a broker
	// sends none for those, the client reads it with GetLock.
	State *lockbrokerv1.LockState
	// Holders are State's holders: who is in the way.
	Holders []*lockbrokerv1.Holder
	// RetryAfter is RetryInfo.retry_delay: when a retry may work (set for
	// UNAVAILABLE and Consul's lock-delay), 0 without it.
	RetryAfter time.Duration
	// FieldViolations are the BadRequest details of INVALID_ARGUMENT.
	FieldViolations []*errdetails.BadRequest_FieldViolation

	st *status.Status
	// asked is the kind the failed request asked for (UNSPECIFIED when
	// unknown: not an acquisition).
	asked lockbrokerv1.LockKind
}

// Error is the status's text ("rpc error: code = ... desc = ...").
func (e *StatusError) Error() string { return e.st.Err().Error() }

// GRPCStatus returns the broker's status, details included.
func (e *StatusError) GRPCStatus() *status.Status { return e.st }

// Is matches the sentinel of the error's kind (ErrBusy, ErrWaitTimeout,
// ...).
func (e *StatusError) Is(target error) bool {
	switch target {
	case ErrBusy:
		return e.Code == codes.Aborted
	case ErrWaitTimeout:
		return e.Code == codes.DeadlineExceeded && e.Reason == "WAIT_TIMEOUT"
	case ErrNotHolder:
		return e.Code == codes.FailedPrecondition && e.Reason == "NOT_HOLDER"
	case ErrConflict:
		return e.Code == codes.FailedPrecondition &&
			(e.Reason == "FOREIGN_FLAGS" || e.Reason == "LIMIT_CONFLICT" || e.Reason == "MALFORMED_SEMAPHORE")
	case ErrKindConflict:
		return e.Code == codes.FailedPrecondition && e.Reason == "LIMIT_CONFLICT" && e.kindDiffers()
	case ErrSessionNotFound:
		return e.Code == codes.NotFound
	case ErrInvalidArgument:
		return e.Code == codes.InvalidArgument
	case ErrPermissionDenied:
		return e.Code == codes.PermissionDenied
	case ErrUnavailable:
		return e.Code == codes.Unavailable
	}
	return false
}

// kindDiffers is whether the key's kind (State.Kind) is not the one
// asked for. Without either (an older broker sends no LockState; a call
// that is not an acquisition asks for no kind), every LIMIT_CONFLICT but a
// semaphore's limit mismatch is a kind conflict, and the message tells
// that one apart.
func (e *StatusError) kindDiffers() bool {
	found := e.State.GetKind()
	if found != lockbrokerv1.LockKind_LOCK_KIND_UNSPECIFIED && e.asked != lockbrokerv1.LockKind_LOCK_KIND_UNSPECIFIED {
		return found != e.asked
	}
	return !strings.Contains(e.st.Message(), "requested limit")
}

// kindAsked is the kind of key req asks for.
func kindAsked(req *lockbrokerv1.AcquireRequest) lockbrokerv1.LockKind {
	switch req.GetKind() {
	case lockbrokerv1.AcquireKind_ACQUIRE_KIND_READ, lockbrokerv1.AcquireKind_ACQUIRE_KIND_WRITE:
		return lockbrokerv1.LockKind_LOCK_KIND_RWLOCK
	case lockbrokerv1.AcquireKind_ACQUIRE_KIND_SEMAPHORE:
		return lockbrokerv1.LockKind_LOCK_KIND_SEMAPHORE
	case lockbrokerv1.AcquireKind_ACQUIRE_KIND_LOCK:
		return lockbrokerv1.LockKind_LOCK_KIND_LOCK
	}
	if req.GetLimit() > 1 {
		return lockbrokerv1.LockKind_LOCK_KIND_SEMAPHORE
	}
	return lockbrokerv1.LockKind_LOCK_KIND_LOCK
}

// askedFor notes on a *StatusError err the kind req asked for, which
// ErrKindConflict compares with the kind found; err is returned.
func askedFor(req *lockbrokerv1.AcquireRequest, err error) error {
	var se *StatusError
	if errors.As(err, &se) {
		se.asked = kindAsked(req)
	}
	return err
}

// asStatusError turns a gRPC error status into a *StatusError; any other
// error (nil, context errors, local errors) is returned as it is.
func asStatusError(err error) error {
	if err == nil {
		return nil
	}
	var se *StatusError
	if errors.As(err, &se) {
		return err
	}
	st, ok := status.FromError(err)
	if !ok || st.Code() == codes.OK {
		return err
	}
	se = &StatusError{Code: st.Code(), st: st}
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			se.Reason, se.Metadata = d.GetReason(), d.GetMetadata()
		case *errdetails.RetryInfo:
			se.RetryAfter = d.GetRetryDelay().AsDuration()
		case *errdetails.BadRequest:
			se.FieldViolations = append(se.FieldViolations, d.GetFieldViolations()...)
		case *lockbrokerv1.LockState:
			se.State = d
			se.Holders = d.GetHolders()
		}
	}
	return se
}

// holdersTimeout bounds the GetLock that fills in a busy error's holders
// when the broker sent none.
const holdersTimeout = 2 * time.Second

// withHolders makes sure a busy or timed-out error of key names the
// holders: from the broker's LockState detail, else from a GetLock read.
func (c *Client) withHolders(ctx context.Context, key string, err error) error {
	var se *StatusError
	if !errors.As(err, &se) || se.State != nil || !(errors.Is(se, ErrBusy) || errors.Is(se, ErrWaitTimeout)) {
		return err
	}
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), holdersTimeout)
	defer cancel()
	if st, gerr := c.GetLock(gctx, key); gerr == nil {
		se.State, se.Holders = st, st.GetHolders()
	}
	return err
}

// Loss causes: LostError.Cause. The broker's reasons are its LostReason
// names without the LOST_REASON_ prefix (SESSION_INVALIDATED,
// RELEASED_BY_OTHER, DELETED_BY_OTHER, RENEWAL_FAILED, LIMIT_CONFLICT,
// BROKER_SHUTDOWN, RESUMED_ELSEWHERE, REPLICA_CUT_OFF); the client decides
// three of its own. These are the
// names every lockbroker library uses (test/conformance/scenarios.md).
const (
	// CauseKeepaliveTimeout: no keepalive (and no resume on another
	// replica) before the guaranteed deadline, less a 250 ms margin.
	CauseKeepaliveTimeout = "KEEPALIVE_TIMEOUT"
	// CauseResumeRefused: a replica refused to resume the hold: the grant
	// is no longer current (the session lost the key, or is gone).
	CauseResumeRefused = "RESUME_REFUSED"
	// CauseReleased: a Release from elsewhere (another process with the
	// session id) ended the hold.
	CauseReleased = "RELEASED"
)

// LostError says why a lease was lost.
type LostError struct {
	// Reason is the broker's reason. For causes the client decides it is
	// the nearest broker reason: RENEWAL_FAILED for KEEPALIVE_TIMEOUT,
	// SESSION_INVALIDATED for RESUME_REFUSED, UNSPECIFIED for RELEASED.
	Reason lockbrokerv1.LostReason
	// Cause is the name shared by every lockbroker library: Reason's name
	// without LOST_REASON_ when the broker reported the loss, else one of
	// CauseKeepaliveTimeout, CauseResumeRefused, CauseReleased.
	Cause string
	// Detail is for humans.
	Detail string
	// Key is the key whose loss ended the hold (AcquireLost.key): for a
	// multi-key lock (WithKeys), the key lost first (the broker released
	// the others). Empty when the client decided the loss, and for losses
	// of the whole hold.
	Key string
}

// Error names the cause as every lockbroker library, lockctl and the
// broker's log spell it: "lease lost: SESSION_INVALIDATED: ...",
// "lease lost: KEEPALIVE_TIMEOUT: ...", "lease lost: RELEASED: ...".
func (e *LostError) Error() string {
	name := e.Cause
	if name == "" {
		name = strings.TrimPrefix(e.Reason.String(), "LOST_REASON_")
	}
	return fmt.Sprintf("lease lost: %s: %s", name, e.Detail)
}

// Is reports a Release from elsewhere as ErrReleased too.
func (e *LostError) Is(target error) bool { return target == ErrReleased && e.Cause == CauseReleased }

// lostByBroker is the loss the broker reported.
func lostByBroker(l *lockbrokerv1.AcquireLost) *LostError {
	return &LostError{Reason: l.GetReason(), Cause: strings.TrimPrefix(l.GetReason().String(), "LOST_REASON_"), Detail: l.GetDetail(), Key: l.GetKey()}
}
