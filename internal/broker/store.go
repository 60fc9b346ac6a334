package broker

import (
	"context"
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

// The transaction verbs the broker uses.
const (
	OpLock           OpVerb = "lock"
	OpUnlock         OpVerb = "unlock"
	OpCAS            OpVerb = "cas"
	OpSet            OpVerb = "set"
	OpDelete         OpVerb = "delete"
	OpDeleteCAS      OpVerb = "delete-cas"
	OpCheckIndex     OpVerb = "check-index"
	OpCheckNotExists OpVerb = "check-not-exists"
	OpCheckSession   OpVerb = "check-session"
)

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
// implements it. Every method fails with ErrUnavailable (wrapped) when
// Consul cannot be reached.
type Store interface {
	// CreateSession creates a session and returns its id.
	CreateSession(ctx context.Context, spec SessionSpec) (string, error)
	// RenewSession renews a session; ErrSessionNotFound when it is gone.
	RenewSession(ctx context.Context, id string) (*SessionInfo, error)
	// DestroySession destroys a session; destroying an unknown one succeeds.
	DestroySession(ctx context.Context, id string) error
	// Session reads a session with a consistent read; ErrSessionNotFound
	// when it is gone.
	Session(ctx context.Context, id string) (*SessionInfo, error)
	// List returns the entries whose key starts with prefix. With
	// waitIndex > 0 it is a blocking query that returns once the index
	// passes waitIndex (or after Consul's wait time). consistent selects
	// Consul's consistent read mode.
	List(ctx context.Context, prefix string, waitIndex uint64, consistent bool) ([]*Entry, uint64, error)
	// Txn runs ops atomically. When Consul rolls the transaction back it
	// returns a *TxnError. On success it returns the entries the write ops
	// produced, in order (nil for ops that return none).
	Txn(ctx context.Context, ops []Op) ([]*Entry, error)
}

// TxnError is a transaction Consul rolled back.
type TxnError struct {
	// Op is the index of the first failing operation.
	Op int
	// What is Consul's reason.
	What string
}

func (e *TxnError) Error() string { return "transaction rolled back: " + e.What }
