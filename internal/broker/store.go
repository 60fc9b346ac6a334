package broker

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Consul's flag values for the lock and semaphore recipes (api.Lock's
// LockFlagValue and api.Semaphore's SemaphoreFlagValue). Using them makes
// broker holds and Consul's own clients exclude each other.
const (
	LockFlagValue      uint64 = 0x2ddccbc058a50c18
	SemaphoreFlagValue uint64 = 0xe0f69a2baa414de0
)

// Entry is one Consul KV entry.
type Entry struct {
	Key         string
	Value       []byte
	Flags       uint64
	Session     string
	LockIndex   uint64
	CreateIndex uint64
	ModifyIndex uint64
}

// SessionSpec describes a session to create.
type SessionSpec struct {
	Name      string
	TTL       time.Duration
	LockDelay time.Duration
	// Delete selects Consul's "delete" behavior instead of "release".
	Delete bool
	Checks []string
}

// SessionInfo describes an existing session.
type SessionInfo struct {
	ID          string
	Name        string
	Node        string
	TTL         time.Duration
	LockDelay   time.Duration
	Delete      bool
	Checks      []string
	CreateIndex uint64
}

// OpVerb is a KV transaction verb (Consul's /v1/txn KV verbs).
type OpVerb string

// The transaction verbs the broker uses. A transaction made only of get
// and check verbs is read-only: Consul answers it without a Raft write and
// reports every failing check, not only the first.
const (
	OpLock           OpVerb = "lock"
	OpUnlock         OpVerb = "unlock"
	OpCAS            OpVerb = "cas"
	OpSet            OpVerb = "set"
	OpDelete         OpVerb = "delete"
	OpDeleteCAS      OpVerb = "delete-cas"
	OpGet            OpVerb = "get"
	OpCheckIndex     OpVerb = "check-index"
	OpCheckNotExists OpVerb = "check-not-exists"
	OpCheckSession   OpVerb = "check-session"
)

// MaxTxnOps is Consul's limit on the operations of one transaction.
const MaxTxnOps = 128

// Op is one operation of an atomic KV transaction.
type Op struct {
	Verb    OpVerb
	Key     string
	Value   []byte
	Flags   uint64
	Index   uint64
	Session string
}

// Store is what the broker needs from Consul. internal/consulstore
// implements it.
//
// Errors are typed so that the broker never reads a Consul message:
//   - *StoreError for a call that failed as a whole (Consul unreachable,
//     429, 5xx, timeout, ACL denial, a request Consul refused), with a Kind;
//   - *TxnError for a transaction Consul rolled back, with the kind of each
//     failing operation;
//   - ErrSessionNotFound (wrapped) from RenewSession and Session when the
//     session does not exist, as a consistent read tells (a renewal's "not
//     found" from a leader whose state is not current yet is
//     StoreUnavailable);
//   - the context's error when ctx ended first.
//
// Every method bounds its call with a timeout of its own when ctx has no
// earlier deadline. A read that Consul filtered by ACLs is a
// StorePermissionDenied error, never an empty result.
type Store interface {
	// CreateSession creates a session and returns its id.
	CreateSession(ctx context.Context, spec SessionSpec) (string, error)
	// RenewSession renews a session.
	RenewSession(ctx context.Context, id string) (*SessionInfo, error)
	// DestroySession destroys a session; destroying an unknown one succeeds.
	DestroySession(ctx context.Context, id string) error
	// Session reads a session with a consistent read.
	Session(ctx context.Context, id string) (*SessionInfo, error)
	// Sessions lists every session with a consistent read.
	Sessions(ctx context.Context) ([]*SessionInfo, error)
	// List returns the entries whose key starts with prefix, and Consul's
	// index of the listing. consistent selects Consul's consistent read
	// mode. It is never a blocking query (see Watch).
	List(ctx context.Context, prefix string, consistent bool) ([]*Entry, uint64, error)
	// Watch is a blocking list of prefix: it returns once Consul's index
	// for prefix passes waitIndex, or after the store's wait time with the
	// same index. It uses the store's connections for blocking queries,
	// which never delay the other methods.
	Watch(ctx context.Context, prefix string, waitIndex uint64) ([]*Entry, uint64, error)
	// Txn runs ops atomically (at most MaxTxnOps). On success it returns
	// one entry per op, in order: the entry a write or check op produced,
	// or nil (deletes, check-not-exists). A rolled-back transaction
	// returns a *TxnError.
	Txn(ctx context.Context, ops []Op) ([]*Entry, error)
	// Check runs ops that only check (OpCheckIndex, OpCheckNotExists,
	// OpCheckSession) as one transaction, as Txn does, but reads no entry
	// back: nil when every check passed, a *TxnError naming the failing
	// ops when one did not. The sweep checks thousands of keys a second
	// with it.
	Check(ctx context.Context, ops []Op) error
	// Reachable reports whether Consul's agent answers at all: a cluster
	// without a leader (an election) still answers; an agent cut off from
	// this replica, stopped, or unable to reach its servers does not.
	Reachable(ctx context.Context) error
}

// StoreErrorKind classifies a failed store call.
type StoreErrorKind int

// The kinds of store failure.
const (
	// StoreUnavailable: Consul could not be reached, had no leader,
	// answered 429 or 5xx, or did not answer in time. A retry may work.
	StoreUnavailable StoreErrorKind = iota + 1
	// StorePermissionDenied: Consul's ACLs refused the operation (a 403, a
	// transaction rolled back with "Permission denied", a filtered read).
	StorePermissionDenied
	// StoreRejected: Consul refused the request as malformed or too large
	// (4xx other than 403, 404 and 429). A broker bug or a limit of Consul.
	StoreRejected
)

// StoreError is a store call that failed as a whole.
type StoreError struct {
	Kind StoreErrorKind
	// Op names the Consul operation, e.g. "kv txn", "session renew".
	Op string
	// RetryAfter is how long Consul asked to wait (429), or 0.
	RetryAfter time.Duration
	// Err is the cause, for logs. It never contains a token.
	Err error
}

func (e *StoreError) Error() string { return fmt.Sprintf("consul %s: %v", e.Op, e.Err) }

func (e *StoreError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, ErrUnavailable) hold for StoreUnavailable.
func (e *StoreError) Is(target error) bool {
	return (target == ErrUnavailable && e.Kind == StoreUnavailable) ||
		(target == ErrPermission && e.Kind == StorePermissionDenied)
}

// TxnFailureKind classifies one failing operation of a rolled-back
// transaction.
type TxnFailureKind int

// The kinds of transaction failure.
const (
	// TxnCheckFailed: a check-index, check-not-exists, check-session, cas
	// or delete-cas found another state (an index moved, the key exists or
	// does not, another session holds it). Re-read and decide again.
	TxnCheckFailed TxnFailureKind = iota + 1
	// TxnLockHeld: a lock op found the key held by another session.
	TxnLockHeld
	// TxnSessionInvalid: a lock op named a session that does not exist.
	TxnSessionInvalid
	// TxnLockDelay: a lock op was refused because the key is in Consul's
	// lock-delay.
	TxnLockDelay
	// TxnNotHeld: an unlock op found the key not held by the session.
	TxnNotHeld
	// TxnOther: any other failure.
	TxnOther
)

// TxnFailure is one failing operation.
type TxnFailure struct {
	// Op is the operation's index in the transaction.
	Op   int
	Kind TxnFailureKind
}

// TxnError is a transaction Consul rolled back. A read-only transaction
// lists every failing operation; a write transaction at least the first.
type TxnError struct {
	Failures []TxnFailure
}

func (e *TxnError) Error() string {
	return fmt.Sprintf("consul transaction rolled back (%d failing operations)", len(e.Failures))
}

// Has reports whether any failure is of kind k.
func (e *TxnError) Has(k TxnFailureKind) bool {
	for _, f := range e.Failures {
		if f.Kind == k {
			return true
		}
	}
	return false
}

// Failed reports whether operation op failed.
func (e *TxnError) Failed(op int) bool {
	for _, f := range e.Failures {
		if f.Op == op {
			return true
		}
	}
	return false
}

// asTxnError returns err as a *TxnError, or nil.
func asTxnError(err error) *TxnError {
	var te *TxnError
	if errors.As(err, &te) {
		return te
	}
	return nil
}
