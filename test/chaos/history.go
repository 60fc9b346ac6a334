package chaos

import (
	"sort"
	"sync"
	"time"
)

// ClientKind is what a client of the run does.
type ClientKind string

// The kinds of client.
const (
	KindLib      ClientKind = "lib"      // Go client (client/), resume on
	KindRaw      ClientKind = "raw"      // raw gRPC stub, no resume
	KindSem      ClientKind = "sem"      // semaphore slot via client/
	KindElect    ClientKind = "elect"    // leader-election candidate via client/
	KindObserver ClientKind = "observer" // watches an election key
	// The hot key (quiet periods only): clients of one replica passing it
	// among themselves, and waiters on the other replicas, which a queue
	// per replica would starve (see CheckStarvation).
	KindHot ClientKind = "hot" // Go client on broker 0 only; holds 20–40ms, asks again at once
	KindFar ClientKind = "far" // Go client on one other broker only; holds 20–40ms
	// Read-write locks and multi-key locks (issue 43), on raw stubs.
	KindReader   ClientKind = "reader"    // ACQUIRE_KIND_READ on a read-write key
	KindWriter   ClientKind = "writer"    // ACQUIRE_KIND_WRITE on a read-write key
	KindMulti    ClientKind = "multi"     // AcquireRequest.keys: several lock keys at once
	KindMultiObs ClientKind = "multi-obs" // lists the multi-key lock keys in Consul (blocking queries)
)

// Modes of a read-write hold (Hold.Mode).
const (
	ModeRead  = "read"
	ModeWrite = "write"
)

// End reasons of a hold, as the client saw them. A loss names the broker's
// LostReason (e.g. "lost:SESSION_INVALIDATED") or the client's own
// verdict ("lost:LOCAL_DEADLINE", "lost:STREAM_BROKEN").
const (
	EndReleased = "released" // the client gave it up (belief ended first)
	EndRunEnd   = "run-end"  // still held when the run stopped
)

// Hold is one believed hold: from the client's receipt of `acquired` to
// the moment it stopped believing (it decided to release, or learned the
// hold was lost). All times are offsets from the run's start on the one
// clock every process of the run shares.
type Hold struct {
	ID       int
	Client   int
	Kind     ClientKind
	Key      string
	Limit    int    // 1 for a lock
	Token    uint64 // the grant's fencing token
	Session  string
	Call     time.Duration // Acquire sent
	Acquired time.Duration // `acquired` received: belief starts
	End      time.Duration // belief ends (0 while it lasts)
	Reason   string        // EndReleased, EndRunEnd or "lost:..."
	// Deadline is the client's guaranteed deadline when the belief ended:
	// the last keepalive's receipt plus its guaranteed_for.
	Deadline time.Duration
	// Paused: the client was frozen during the hold; it is excluded from
	// the overlap and loss checks (fencing must stop it instead).
	Paused bool
	// Resumes counts the resume attempts the client made during the hold.
	Resumes int
	// Mode is ModeRead or ModeWrite for a hold of a read-write lock, ""
	// otherwise.
	Mode string `json:",omitempty"`
	// Group ties the holds of one multi-key grant together (one Hold per
	// key, each with its own token; Group is the first one's ID), and
	// Keys are every key the request asked for, in its order. 0 and nil
	// for a single-key hold.
	Group int      `json:",omitempty"`
	Keys  []string `json:",omitempty"`
}

// Ended reports whether the belief has ended.
func (h *Hold) Ended() bool { return h.End > 0 }

// Lost reports whether the hold ended in a loss (not a release or the end
// of the run).
func (h *Hold) Lost() bool { return h.Ended() && h.Reason != EndReleased && h.Reason != EndRunEnd }

// Write is one write of a holder to the fenced resource.
type Write struct {
	Client   int
	HoldID   int
	Key      string
	Token    uint64 // the hold's grant token (whatever the client sent)
	Value    int64
	Call     time.Duration
	Return   time.Duration
	Accepted bool
	// Seq orders accepted and refused writes as the resource applied them.
	Seq uint64
	// Stale: the first write after a freeze, sent without looking at the
	// lease (a paused process finishing what it had started).
	Stale bool
}

// Check is one read of who holds a key: a CheckSequencer of the caller's
// own grant, or a GetLock.
type Check struct {
	Client int
	Key    string
	// CheckSequencer: Token is the grant asked about and Current the
	// answer. GetLock: Token is 0 and Holder the holder's token (0: none).
	Token   uint64
	Current bool
	GetLock bool
	Holder  uint64
	Call    time.Duration
	Return  time.Duration
}

// Attempt is one Acquire by a client (for liveness).
type Attempt struct {
	Client int
	Key    string
	// Keys: a multi-key request's keys (Key is the first).
	Keys   []string `json:",omitempty"`
	Call   time.Duration
	Return time.Duration
	OK     bool
	Err    string
}

// Fault is one injected fault.
type Fault struct {
	Kind   string
	Target string
	Start  time.Duration
	End    time.Duration // healed (0 while active)
	Note   string
	// Session and Key name what an admin fault took away; Replica and
	// Server the broker whose stream held it and its Consul server, when
	// known.
	Session string
	Key     string
	Replica string `json:",omitempty"`
	Server  string `json:",omitempty"`
	// Clients a client-link fault hit; its Replica is the one broker they
	// were cut from ("" for every broker).
	Clients []int `json:",omitempty"`
}

// Quiet is a period with no fault active (everything up and healed).
type Quiet struct {
	Start, End time.Duration
}

// Freeze is a client frozen for a while (its goroutines stopped and its
// links blackholed).
type Freeze struct {
	Client     int
	Start, End time.Duration
	// Silent: its connections were left open but mute (a paused process
	// on a live host), so only gRPC keepalive can tell the broker.
	Silent bool
	// Replica names the broker whose stream held the client's lock when
	// it froze ("broker-1"), and Server that broker's Consul server
	// ("consul-1"); both "" when unknown (it held nothing, or an older
	// history), and then a fault on any of them may excuse a late handover.
	Replica, Server string `json:",omitempty"`
}

// Observation is one state an observer saw on a Watch.
type Observation struct {
	Client int
	Key    string
	At     time.Duration
	Holder uint64 // token, 0 when nobody holds it
	Raw    bool   // raw stub Watch rather than client.Watch
}

// KVView is one consistent read, by an observer straight from Consul, of
// the multi-key lock keys: the keys held at one Raft index, with the
// session and value holding each.
type KVView struct {
	Client int
	At     time.Duration
	Index  uint64
	Held   []KVHeld `json:",omitempty"`
}

// KVHeld is one key held in a KVView.
type KVHeld struct {
	Key, Session, Value string
}

// History is everything the run recorded. It is safe for concurrent use
// while recording; the checkers read a Snapshot.
type History struct {
	start time.Time

	mu           sync.Mutex
	holds        []*Hold
	writes       []Write
	checks       []Check
	attempts     []Attempt
	faults       []*Fault
	quiets       []Quiet
	freezes      []Freeze
	observations []Observation
	views        []KVView
	limits       map[string]int
}

// NewHistory starts a history whose clock starts now.
func NewHistory() *History {
	return &History{start: time.Now(), limits: map[string]int{}}
}

// Now is the current offset on the run's clock (never 0).
func (h *History) Now() time.Duration { return max(time.Since(h.start), 1) }

// SetLimit records the limit of key (1 for locks).
func (h *History) SetLimit(key string, limit int) {
	h.mu.Lock()
	h.limits[key] = limit
	h.mu.Unlock()
}

// StartHold records a new believed hold and returns it; update it only
// through EndHold, Pause and Resumed.
func (h *History) StartHold(hd Hold) *Hold {
	h.mu.Lock()
	defer h.mu.Unlock()
	hd.ID = len(h.holds) + 1
	p := &hd
	h.holds = append(h.holds, p)
	return p
}

// StartGroup records the holds of one multi-key grant, one per key, tied
// by Group (the first hold's ID); update them through EndHold and Pause.
func (h *History) StartGroup(hds []Hold) []*Hold {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]*Hold, 0, len(hds))
	group := len(h.holds) + 1
	for _, hd := range hds {
		hd.ID = len(h.holds) + 1
		hd.Group = group
		p := &hd
		h.holds = append(h.holds, p)
		out = append(out, p)
	}
	return out
}

// EndHold ends hd's belief at at with reason, the client's deadline and
// the number of resume attempts made during the hold. Only the first call
// counts.
func (h *History) EndHold(hd *Hold, at time.Duration, reason string, deadline time.Duration, resumes int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if hd.End == 0 {
		hd.End, hd.Reason, hd.Deadline, hd.Resumes = at, reason, deadline, resumes
	}
}

// Offset converts a wall time to the run's clock (0 for the zero time).
func (h *History) Offset(t time.Time) time.Duration {
	if t.IsZero() {
		return 0
	}
	return t.Sub(h.start)
}

// Current returns copies of the holds still believed, oldest first.
func (h *History) Current() []Hold {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []Hold
	for _, hd := range h.holds {
		if hd.End == 0 {
			out = append(out, *hd)
		}
	}
	return out
}

// Pause marks hd as belonging to a frozen client.
func (h *History) Pause(hd *Hold) {
	h.mu.Lock()
	hd.Paused = true
	h.mu.Unlock()
}

// AddWrite records a write.
func (h *History) AddWrite(w Write) {
	h.mu.Lock()
	h.writes = append(h.writes, w)
	h.mu.Unlock()
}

// AddCheck records a read of who holds a key.
func (h *History) AddCheck(c Check) {
	h.mu.Lock()
	h.checks = append(h.checks, c)
	h.mu.Unlock()
}

// AddAttempt records an Acquire attempt.
func (h *History) AddAttempt(a Attempt) {
	h.mu.Lock()
	h.attempts = append(h.attempts, a)
	h.mu.Unlock()
}

// StartFault records a fault injected now and returns it for EndFault.
func (h *History) StartFault(f Fault) *Fault {
	f.Start = h.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	p := &f
	h.faults = append(h.faults, p)
	return p
}

// EndFault records that f is healed.
func (h *History) EndFault(f *Fault) {
	at := h.Now()
	h.mu.Lock()
	if f.End == 0 {
		f.End = at
	}
	h.mu.Unlock()
}

// AddQuiet records a quiet period.
func (h *History) AddQuiet(q Quiet) {
	h.mu.Lock()
	h.quiets = append(h.quiets, q)
	h.mu.Unlock()
}

// AddFreeze records a client freeze.
func (h *History) AddFreeze(f Freeze) {
	h.mu.Lock()
	h.freezes = append(h.freezes, f)
	h.mu.Unlock()
}

// AddObservation records a watched state.
func (h *History) AddObservation(o Observation) {
	h.mu.Lock()
	h.observations = append(h.observations, o)
	h.mu.Unlock()
}

// AddKVView records an observer's consistent read of the multi-key keys.
func (h *History) AddKVView(v KVView) {
	h.mu.Lock()
	h.views = append(h.views, v)
	h.mu.Unlock()
}

// Snapshot is a copy of a History, for the checkers. Holds still believed
// are closed at End with EndRunEnd.
type Snapshot struct {
	Holds        []Hold
	Writes       []Write
	Checks       []Check
	Attempts     []Attempt
	Faults       []Fault
	Quiets       []Quiet
	Freezes      []Freeze
	Observations []Observation
	Views        []KVView
	Limits       map[string]int
	End          time.Duration
}

// Snapshot copies the history as of now.
func (h *History) Snapshot() *Snapshot {
	end := h.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	s := &Snapshot{End: end, Limits: map[string]int{}}
	for _, hd := range h.holds {
		c := *hd
		if c.End == 0 {
			c.End, c.Reason = end, EndRunEnd
		}
		s.Holds = append(s.Holds, c)
	}
	s.Writes = append(s.Writes, h.writes...)
	s.Checks = append(s.Checks, h.checks...)
	s.Attempts = append(s.Attempts, h.attempts...)
	for _, f := range h.faults {
		c := *f
		if c.End == 0 {
			c.End = end
		}
		s.Faults = append(s.Faults, c)
	}
	s.Quiets = append(s.Quiets, h.quiets...)
	s.Freezes = append(s.Freezes, h.freezes...)
	s.Observations = append(s.Observations, h.observations...)
	s.Views = append(s.Views, h.views...)
	for k, v := range h.limits {
		s.Limits[k] = v
	}
	sort.Slice(s.Writes, func(i, j int) bool { return s.Writes[i].Seq < s.Writes[j].Seq })
	return s
}

// limit is key's limit (1 unless recorded otherwise).
func (s *Snapshot) limit(key string) int {
	if l := s.Limits[key]; l > 0 {
		return l
	}
	return 1
}

// frozen reports whether client c was frozen at any time in [from, to].
func (s *Snapshot) frozen(c int, from, to time.Duration) bool {
	for _, f := range s.Freezes {
		if f.Client == c && f.Start <= to && f.End >= from {
			return true
		}
	}
	return false
}
