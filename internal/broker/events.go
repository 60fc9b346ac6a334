package broker

import "time"

// EventKind is the kind of an Acquire event.
type EventKind int

// The Acquire events.
const (
	EventQueued EventKind = iota + 1
	EventAcquired
	EventKeepalive
	EventLost
	EventReleased
)

// LostReason says why a hold was lost.
type LostReason int

// The reasons a hold is lost.
const (
	LostSessionInvalidated LostReason = iota + 1
	LostReleasedByOther
	LostDeletedByOther
	LostRenewalFailed
	LostLimitConflict
	LostBrokerShutdown
	LostResumedElsewhere
	LostReplicaCutOff
)

// lostReasonNames are the reasons as the API's LostReason values name
// them without LOST_REASON_, which is how every client library, lockctl
// and the broker's log spell them.
var lostReasonNames = [...]string{
	LostSessionInvalidated: "SESSION_INVALIDATED",
	LostReleasedByOther:    "RELEASED_BY_OTHER",
	LostDeletedByOther:     "DELETED_BY_OTHER",
	LostRenewalFailed:      "RENEWAL_FAILED",
	LostLimitConflict:      "LIMIT_CONFLICT",
	LostBrokerShutdown:     "BROKER_SHUTDOWN",
	LostResumedElsewhere:   "RESUMED_ELSEWHERE",
	LostReplicaCutOff:      "REPLICA_CUT_OFF",
}

// String is the reason's name, e.g. SESSION_INVALIDATED ("UNSPECIFIED"
// for a value that is none of the reasons).
func (r LostReason) String() string {
	if r > 0 && int(r) < len(lostReasonNames) {
		return lostReasonNames[r]
	}
	return "UNSPECIFIED"
}

// Event is one event of an Acquire.
type Event struct {
	Kind EventKind
	// Queued: the state in the way, the lock-delay left (0 when it is not
	// what blocks), the waiting session, and the heartbeat.
	State              *State
	LockDelayRemaining time.Duration
	Session            string
	// Queued: how often `queued` comes again while nothing changes, and
	// the request's place in the key's shared queue (1: next; 0: none).
	Heartbeat time.Duration
	Position  int
	// Acquired, Released: the grant. Acquired, Keepalive: how long it is
	// guaranteed from now (0: unknown, a client-owned session).
	Sequencer     Sequencer
	GuaranteedFor time.Duration
	Resumed       bool
	// Lost: why.
	Reason LostReason
	Detail string
	// A multi-key lock (AcquireSpec.Keys). Acquired, Released: every
	// key's grant, in the request's order (Sequencer is the first).
	// Lost: the key whose loss ended the hold.
	Sequencers []Sequencer
	LostKey    string
}

// AcquireSpec is an Acquire request after validation.
type AcquireSpec struct {
	Key   string
	Value []byte
	// Limit 0 or 1 is a lock; more is a semaphore (unless Semaphore).
	Limit uint32
	// Semaphore takes a semaphore slot even with Limit 1.
	Semaphore bool
	// Wait bounds the wait; WaitForever waits until ctx ends. Wait 0
	// without WaitForever tries once.
	Wait        time.Duration
	WaitForever bool
	// At most one of NewSession, SessionID, Resume is set; none means a new
	// session with the defaults.
	NewSession *SessionSpec
	SessionID  string
	Resume     *Sequencer
	// Fair admits semaphore waiters oldest first.
	Fair bool
	// Mode: a read or write hold of the read-write lock at Key (ModeNone:
	// a lock or semaphore, by Limit and Semaphore).
	Mode RWMode
	// Keys: more lock keys taken with Key, all or nothing (a multi-key
	// lock; at most 63, distinct, none equal to Key).
	Keys []string
}

// RWMode is what an AcquireSpec asks of a read-write lock.
type RWMode int

const (
	// ModeNone: not a read-write lock.
	ModeNone RWMode = iota
	// ModeRead: a shared hold.
	ModeRead
	// ModeWrite: an exclusive hold.
	ModeWrite
)
