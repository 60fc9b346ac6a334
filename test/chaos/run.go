package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// Profile sizes a run.
type Profile struct {
	Name string
	// Total is the length of the fault schedule (chaos and quiet periods).
	Total, ChaosLen, QuietLen time.Duration
	Brokers                   int
	// Clients by kind, and the keys they share.
	Lib, Raw, Sem, Elect, Observers int
	LockKeys, SemKeys, ElectKeys    int
	// Hot clients pass the hot key among themselves on broker 0, and Far
	// clients wait for it on the other brokers, in quiet periods only.
	Hot, Far int
	// Read-write locks (raw stubs, kind READ/WRITE) on RWKeys keys, and
	// multi-key locks (raw stubs, AcquireRequest.keys: overlapping key
	// sets of 2 or 3 of MultiKeys keys, in different orders) watched in
	// Consul by MultiObs observers.
	Readers, Writers, RWKeys   int
	Multi, MultiKeys, MultiObs int
	SemLimit                   int
	TTL, LockDelay             time.Duration
	// Weights override fault weights (0 removes a kind); Must are kinds
	// placed first in their lane.
	Weights map[string]float64
	Must    []string
	// Liveness is checked only with quiet periods long enough.
	CheckLiveness bool
	// LongHolds: outside quiet periods every hold lasts 15–25s (so that
	// holds resumed elsewhere are still live when a stale replica wakes).
	LongHolds bool
	// LinTimeout bounds porcupine.
	LinTimeout time.Duration
	// OwnCluster: the run starts a Consul cluster of its own, of Servers
	// servers (0: 3), even when a shared one is offered.
	OwnCluster bool
	Servers    int
}

// Recovery is the liveness bound's first part: 2×TTL (Consul expires an
// orphaned session after up to twice its TTL), the lock-delay that
// follows, and 5s for a Consul election and a broker restart.
func (p Profile) Recovery() time.Duration { return 2*p.TTL + p.LockDelay + 5*time.Second }

// Vanish is how soon a vanished client's lock must go to a waiter: DESIGN
// promises release within 20s (gRPC keepalive), then the lock-delay, and
// 1s to hand it over.
func (p Profile) Vanish() time.Duration { return 20*time.Second + p.LockDelay + time.Second }

// Profiles are the built-in profiles.
var Profiles = map[string]Profile{
	"short": {Name: "short", Total: 85 * time.Second, ChaosLen: 45 * time.Second, QuietLen: 40 * time.Second,
		Brokers: 3, Lib: 14, Raw: 3, Sem: 4, Elect: 3, Observers: 2, LockKeys: 5, SemKeys: 1, ElectKeys: 1, SemLimit: 3, Hot: 3, Far: 2,
		Readers: 3, Writers: 2, RWKeys: 1, Multi: 3, MultiKeys: 3, MultiObs: 1,
		TTL: 10 * time.Second, LockDelay: 2 * time.Second, CheckLiveness: true, LinTimeout: 30 * time.Second,
		Must:    []string{FClientFreezeReset, FBrokerTerm},
		Weights: map[string]float64{FConsulRestartAll: 0.3}},
	"full": {Name: "full", Total: 20 * time.Minute, ChaosLen: 150 * time.Second, QuietLen: 45 * time.Second,
		Brokers: 3, Lib: 40, Raw: 6, Sem: 8, Elect: 6, Observers: 4, LockKeys: 12, SemKeys: 2, ElectKeys: 2, SemLimit: 3, Hot: 3, Far: 2,
		Readers: 6, Writers: 4, RWKeys: 2, Multi: 6, MultiKeys: 4, MultiObs: 1,
		TTL: 10 * time.Second, LockDelay: 2 * time.Second, CheckLiveness: true, LinTimeout: 3 * time.Minute,
		Must: []string{FClientFreezeReset, FBrokerTerm, FClientFreeze}},
}

// MutantProfile is the short run a mutant gets: 32s of chaos and no quiet
// period, with the faults that exercise what the mutant breaks placed
// first (admin session destroys for no-loss-notice, a client freeze for
// no-fencing, rolling restarts and client link resets for
// no-resume-fence), then the usual mix. No-shared-queue gets 32s of quiet
// instead: what it breaks shows without faults, on the hot key.
func MutantProfile(mutant string) Profile {
	p := Profiles["short"]
	p.Name = "mutant-" + mutant
	p.Total, p.ChaosLen, p.QuietLen = 32*time.Second, 32*time.Second, 0
	p.CheckLiveness = false
	p.Lib, p.Raw, p.Sem, p.Elect, p.Observers = 12, 2, 3, 3, 1
	p.LockKeys = 3
	p.Hot, p.Far = 0, 0
	p.Readers, p.Writers, p.Multi, p.MultiObs = 0, 0, 0, 0
	p.Weights = map[string]float64{FConsulRestartAll: 0, FBrokerPauseLong: 0.5}
	switch mutant {
	case "no-loss-notice":
		p.Must = []string{FSessionDestroy, FSessionDestroy, FSessionDestroy, FSessionDestroy}
		p.Weights[FClientFreeze], p.Weights[FClientFreezeReset] = 0, 0
		p.Weights[FSessionDestroy] = 4
	case "no-fencing":
		p.Must = []string{FClientFreezeReset}
	case "no-resume-fence":
		// A stale replica waking past its safe deadline after its clients
		// resumed elsewhere, twice first, with holds long enough to be live
		// when it wakes.
		p.Must = []string{FBrokerPauseFailover, FBrokerPauseFailover, FClientReset}
		p.Weights[FBrokerPauseFailover] = 4
		p.Weights[FBrokerTerm] = 2
		p.Weights[FClientReset] = 3
		p.LongHolds = true
	case "no-shared-queue":
		// Broker 0 passes the hot key among its own clients: the waiters
		// on the other replicas wait past the starvation bound.
		// The other mutants' Consul faults on the shared cluster would
		// disturb its waits: one server of its own.
		p.ChaosLen, p.QuietLen = 0, 32*time.Second
		p.Must = nil
		p.Hot, p.Far = 3, 2
		p.OwnCluster, p.Servers = true, 1
	case "rw-reader-beside-writer", "rw-stale-token":
		// Readers and writers on one key, quiet (short holds, many
		// grants): what these break shows without faults. Two readers
		// leave the key free now and then, so writers get it (with more,
		// a mutant that lets readers in beside a writer starves the
		// writers instead, and no reader ever meets one).
		// As for no-shared-queue, a one-server cluster of its own: with
		// -mutants, the other mutants' Consul faults on the shared cluster
		// left the read-write clients 2 grants in 32s (acquires failing
		// UNAVAILABLE), too few for their checker to see anything.
		p.ChaosLen, p.QuietLen, p.Must = 0, 32*time.Second, nil
		p.Lib, p.Raw, p.Sem, p.Elect, p.Observers = 2, 0, 0, 0, 0
		p.Readers, p.Writers, p.RWKeys = 2, 3, 1
		p.OwnCluster, p.Servers = true, 1
	case "multi-partial":
		// Multi-key clients on overlapping keys, watched in Consul, quiet,
		// on a cluster of its own (as the read-write mutants).
		p.ChaosLen, p.QuietLen, p.Must = 0, 32*time.Second, nil
		p.Lib, p.Raw, p.Sem, p.Elect, p.Observers = 2, 0, 0, 0, 0
		p.Multi, p.MultiKeys, p.MultiObs = 5, 3, 1
		p.OwnCluster, p.Servers = true, 1
	}
	return p
}

// Config is one run.
type Config struct {
	Profile   Profile
	Seed      uint64
	Mutant    string // "" for the real thing
	BrokerBin string // built with BuildBroker
	OutDir    string // logs, report, visualization
	// Cluster, if set, is used (and left running); otherwise, or when
	// the profile asks for its own (OwnCluster), the run starts its own.
	Cluster  *consultest.Cluster
	Progress io.Writer
}

// run is the state of one run.
type run struct {
	cfg     Config
	p       Profile
	prefix  string
	hist    *History
	res     *Resource
	net     *Network
	cluster *consultest.Cluster
	brokers []*Broker
	links   []*Link // broker i's link to Consul
	clients []*Client
	// faultable are the clients a client fault may hit (not the hot key's).
	faultable []*Client
	env       *Env
	faults    faultStats
	quiet     atomic.Bool

	mu    sync.Mutex
	exits []string // unclean SIGTERM exits
	notes []string // faults that could not be injected as planned
}

// Run runs the suite once and returns its report. An error means the run
// itself could not be carried out (not a violation).
func Run(ctx context.Context, cfg Config) (*Report, error) {
	p := cfg.Profile
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	if err := os.MkdirAll(cfg.OutDir, 0o755); err != nil {
		return nil, err
	}
	tag := "normal"
	if cfg.Mutant != "" {
		tag = cfg.Mutant
	}
	r := &run{cfg: cfg, p: p, prefix: fmt.Sprintf("chaos/%d-%s", cfg.Seed, tag), hist: NewHistory(),
		res: NewResource(cfg.Mutant != "no-fencing"), net: NewNetwork()}
	defer r.net.Close()
	r.env = &Env{Hist: r.hist, Res: r.res, Quiet: &r.quiet, TTL: p.TTL, LockDelay: p.LockDelay, IgnoreTokens: cfg.Mutant == "no-fencing", LongHolds: p.LongHolds,
		Admin: r.admin}
	sched := Plan(cfg.Seed, p.Total, p.ChaosLen, p.QuietLen, p.TTL, p.LockDelay, p.Weights, p.Must)
	r.logf("run %s: seed %d (SEED=%d replays it), profile %s, %d faults planned: %s", tag, cfg.Seed, cfg.Seed, p.Name,
		sched.Count(), describeKinds(sched.ByKind()))

	r.cluster = cfg.Cluster
	if r.cluster == nil || p.OwnCluster {
		c, err := StartCluster(ctx, cfg.OutDir, p.Servers)
		if err != nil {
			return nil, err
		}
		defer c.Close()
		r.cluster = c.Cluster
	}
	before, err := r.sessions(ctx)
	if err != nil {
		return nil, err
	}
	if err := r.startBrokers(ctx); err != nil {
		return nil, err
	}
	defer func() {
		for _, b := range r.brokers {
			b.Kill()
		}
	}()
	if err := r.startClients(); err != nil {
		return nil, err
	}
	started := time.Now()

	cctx, stopClients := context.WithCancel(ctx)
	var cwg sync.WaitGroup
	for _, c := range r.clients {
		cwg.Go(func() { c.Run(cctx) })
	}
	pctx, stopProgress := context.WithCancel(ctx)
	var pwg sync.WaitGroup
	pwg.Go(func() { r.progress(pctx) })

	for _, seg := range sched.Segments {
		if ctx.Err() != nil {
			break
		}
		if seg.Chaos {
			r.executeSegment(ctx, seg)
			r.restore(ctx)
			continue
		}
		r.quiet.Store(true)
		q := Quiet{Start: r.hist.Now()}
		sleep(ctx, seg.Len)
		q.End = r.hist.Now()
		r.hist.AddQuiet(q)
		r.quiet.Store(false)
	}
	stopProgress()
	pwg.Wait()

	// Wind down: clients release, brokers get SIGTERM, then nothing of
	// the run may be left in Consul.
	r.logf("stopping clients")
	stopClients()
	waitGroup(&cwg, 30*time.Second)
	snap := r.hist.Snapshot()
	if b, err := json.Marshal(snap); err == nil {
		_ = os.WriteFile(filepath.Join(cfg.OutDir, "history.json"), b, 0o644)
	}
	for _, c := range r.clients {
		c.Close()
	}
	r.logf("stopping brokers (SIGTERM)")
	var bwg sync.WaitGroup
	for _, b := range r.brokers {
		bwg.Go(func() {
			if err := b.Term(); err != nil {
				r.exit(err.Error())
			}
		})
	}
	bwg.Wait()
	left := r.leftovers(ctx, before)
	duration := time.Since(started)
	return r.report(snap, sched, left, duration), nil
}

// Cluster is a Consul cluster with its log files.
type Cluster struct {
	*consultest.Cluster
	logs []*os.File
}

// StartCluster starts a Consul cluster of servers servers (0: 3), for
// one run or for several to share, with the servers' logs in dir.
func StartCluster(ctx context.Context, dir string, servers int) (*Cluster, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	c := &Cluster{}
	cc, err := consultest.StartCluster(ctx, consultest.ClusterConfig{Servers: servers, LogWriter: func(i int) io.Writer {
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("consul-%d.log", i)))
		if err != nil {
			return nil
		}
		c.logs = append(c.logs, f)
		return f
	}})
	if err != nil {
		c.closeLogs()
		return nil, fmt.Errorf("consul cluster: %w", err)
	}
	c.Cluster = cc
	return c, nil
}

// Close stops the servers and closes their logs.
func (c *Cluster) Close() error {
	err := c.Cluster.Close()
	c.closeLogs()
	return err
}

func (c *Cluster) closeLogs() {
	for _, f := range c.logs {
		f.Close()
	}
	c.logs = nil
}

func (r *run) logf(format string, args ...any) {
	tag := "real"
	if r.cfg.Mutant != "" {
		tag = r.cfg.Mutant
	}
	fmt.Fprintf(r.cfg.Progress, "[%s %6.1fs] %s\n", tag, r.hist.Now().Seconds(), fmt.Sprintf(format, args...))
}

func (r *run) exit(msg string) {
	r.mu.Lock()
	r.exits = append(r.exits, msg)
	r.mu.Unlock()
}

func (r *run) note(msg string) {
	r.mu.Lock()
	r.notes = append(r.notes, msg)
	r.mu.Unlock()
}

func (r *run) startBrokers(ctx context.Context) error {
	for i := range r.p.Brokers {
		link, err := r.net.Link(fmt.Sprintf("b%d-consul", i), r.cluster.HTTPAddr(i%r.cluster.Size()))
		if err != nil {
			return err
		}
		b, err := NewBroker(i, r.cfg.BrokerBin, link.Addr(), r.cfg.OutDir, 5*time.Second)
		if err != nil {
			return err
		}
		if err := b.Start(ctx); err != nil {
			return err
		}
		r.brokers = append(r.brokers, b)
		r.links = append(r.links, link)
	}
	return nil
}

func (r *run) startClients() error {
	id := 0
	var keys []string // a multi-key client's (set before add)
	add := func(kind ClientKind, key string, limit int, pin int) error {
		id++
		var links []*Link
		for j, b := range r.brokers {
			l, err := r.net.Link(fmt.Sprintf("c%d-b%d", id, j), b.Addr)
			if err != nil {
				return err
			}
			links = append(links, l)
		}
		c, err := NewClient(id, kind, key, limit, links, r.env, r.cfg.Seed)
		if err != nil {
			return err
		}
		c.Pin, c.Keys = pin, keys
		r.hist.SetLimit(key, limit)
		r.clients = append(r.clients, c)
		return nil
	}
	lockKey := func(i int) string { return fmt.Sprintf("%s/lock/%d", r.prefix, i%r.p.LockKeys) }
	for i := range r.p.Lib {
		if err := add(KindLib, lockKey(i), 1, -1); err != nil {
			return err
		}
	}
	for i := range r.p.Raw {
		if err := add(KindRaw, lockKey(i), 1, -1); err != nil {
			return err
		}
	}
	for i := range r.p.Sem {
		if err := add(KindSem, fmt.Sprintf("%s/sem/%d", r.prefix, i%max(r.p.SemKeys, 1)), r.p.SemLimit, -1); err != nil {
			return err
		}
	}
	for i := range r.p.Elect {
		if err := add(KindElect, fmt.Sprintf("%s/elect/%d", r.prefix, i%max(r.p.ElectKeys, 1)), 1, -1); err != nil {
			return err
		}
	}
	for i := range r.p.Observers {
		if err := add(KindObserver, fmt.Sprintf("%s/elect/%d", r.prefix, i%max(r.p.ElectKeys, 1)), 1, -1); err != nil {
			return err
		}
	}
	for i := range r.p.Readers + r.p.Writers {
		kind := KindReader
		if i >= r.p.Readers {
			kind = KindWriter
		}
		if err := add(kind, fmt.Sprintf("%s/rw/%d", r.prefix, i%max(r.p.RWKeys, 1)), 1, -1); err != nil {
			return err
		}
	}
	multiKey := func(i int) string { return fmt.Sprintf("%s/multi/%d", r.prefix, i%max(r.p.MultiKeys, 1)) }
	for i := range r.p.Multi {
		keys = multiKeys(i, max(r.p.MultiKeys, 2), multiKey)
		if err := add(KindMulti, keys[0], 1, -1); err != nil {
			return err
		}
		for _, k := range keys {
			r.hist.SetLimit(k, 1)
		}
	}
	keys = nil
	for range r.p.MultiObs {
		keys = nil
		for i := range r.p.MultiKeys {
			keys = append(keys, multiKey(i))
		}
		if err := add(KindMultiObs, keys[0], 1, -1); err != nil {
			return err
		}
	}
	keys = nil
	hot := r.prefix + "/hot"
	for range r.p.Hot {
		if err := add(KindHot, hot, 1, 0); err != nil {
			return err
		}
	}
	for i := range r.p.Far {
		if err := add(KindFar, hot, 1, 1+i%max(len(r.brokers)-1, 1)); err != nil {
			return err
		}
	}
	// The hot key's clients are idle outside quiet periods: no client
	// fault picks them.
	r.faultable = r.clients[:len(r.clients)-r.p.Hot-r.p.Far]
	return nil
}

// multiKeys are multi-key client i's keys among n: 2 or 3 keys starting
// at i, in rising order for even i and falling for odd i, so that the
// clients' sets overlap and are taken in different orders.
func multiKeys(i, n int, key func(int) string) []string {
	size := min(2+i%2, n)
	var out []string
	for j := range size {
		out = append(out, key(i+j))
	}
	if i%2 == 1 {
		slices.Reverse(out)
	}
	return out
}

// progress prints a line every 10s: faults, holds, losses, refusals and
// the violations the cheap checkers see so far.
func (r *run) progress(ctx context.Context) {
	t := time.NewTicker(10 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s := r.hist.Snapshot()
		lost := 0
		for _, h := range s.Holds {
			if h.Lost() {
				lost++
			}
		}
		_, nf := r.faults.snapshot()
		fe, ov := CheckFencing(s), CheckOverlap(s)
		lb, _ := CheckLoss(s, lossBounds)
		rw, mk, to := CheckRW(s), CheckMulti(s), CheckTokenOrder(s)
		r.logf("faults %d, holds %d, losses %d, fencing refusals %d; violations so far: fencing %d, overlap %d, loss-bound %d, rw-exclusion %d, multi-atomic %d, token-order %d",
			nf, len(s.Holds), lost, r.res.Refused(), fe.Count, ov.Count, lb.Count, rw.Count, mk.Count, to.Count)
	}
}

// waitGroup waits for wg at most d.
func waitGroup(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// admin returns a Consul client of a running server (the operator's view,
// not proxied).
func (r *run) admin() (*api.Client, error) {
	for i := range r.cluster.Size() {
		if r.cluster.Running(i) {
			return r.cluster.Client(i)
		}
	}
	return nil, errors.New("no Consul server is running")
}

// sessions lists every session in Consul.
func (r *run) sessions(ctx context.Context) (map[string]bool, error) {
	c, err := r.admin()
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	list, _, err := c.Session().List((&api.QueryOptions{RequireConsistent: true}).WithContext(cctx))
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, s := range list {
		out[s.ID] = true
	}
	return out, nil
}

// leftovers waits (up to 2×TTL + 5s: an orphaned session's longest life)
// for the run's sessions and keys to be gone, then reports what is left,
// the unclean exits and what the logs show.
func (r *run) leftovers(ctx context.Context, before map[string]bool) Leftovers {
	var l Leftovers
	deadline := time.Now().Add(2*r.p.TTL + 5*time.Second)
	if r.cfg.Mutant != "" {
		deadline = time.Now() // a mutant is not judged on leaks: look once
	}
	for {
		l.Sessions, l.Keys = nil, nil
		all, err := r.sessions(ctx)
		if err != nil {
			l.Sessions = []string{"(cannot list sessions: " + err.Error() + ")"}
		}
		for id := range all {
			// Mutant runs share the cluster side by side, so a new session
			// may be another run's; they are not judged on leaks anyway.
			if !before[id] && r.cfg.Mutant == "" {
				l.Sessions = append(l.Sessions, id)
			}
		}
		if c, err := r.admin(); err == nil {
			pairs, _, err := c.KV().List(r.prefix+"/", &api.QueryOptions{RequireConsistent: true})
			if err != nil {
				l.Keys = append(l.Keys, "(cannot list keys: "+err.Error()+")")
			}
			for _, p := range pairs {
				if resting(p) {
					continue
				}
				held := "free"
				if p.Session != "" {
					held = "held by session " + p.Session
				}
				l.Keys = append(l.Keys, fmt.Sprintf("%s (%s, flags %#x, %d bytes)", p.Key, held, p.Flags, len(p.Value)))
			}
		}
		// Free keys stay until someone deletes them; sessions (and the
		// keys they hold) may still be expiring.
		if !expiring(l) || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		sleep(ctx, time.Second)
	}
	sort.Strings(l.Sessions)
	sort.Strings(l.Keys)
	if n := len(l.Keys); n > 0 {
		r.logf("%d keys left under %s/ (first: %s)", n, r.prefix, l.Keys[0])
	}
	r.mu.Lock()
	l.BrokerExits = append(l.BrokerExits, r.exits...)
	r.mu.Unlock()
	for _, b := range r.brokers {
		l.LogFindings = append(l.LogFindings, scanLog(b.LogPath())...)
	}
	return l
}

// expiring reports whether l has something that may still go away by
// itself: a session, or a key held by one.
// resting reports whether a key left by the run is the resting state of
// Consul's recipes (or the broker's read-write lock) rather than a leak: a released lock key (api.Lock
// leaves it, with its last value, for observers and the next holder) and a
// semaphore's `.lock` (api.Semaphore keeps it between holders). Held keys,
// contender entries (they belong to a session, dead or alive) and anything
// else are leaks.
func resting(p *api.KVPair) bool {
	const lockFlags, semFlags = 0x2ddccbc058a50c18, 0xe0f69a2baa414de0
	if p.Session != "" {
		return false
	}
	// A read-write lock's state key and its `.lock` marker stay too (its
	// contender entries, other flags, are leaks).
	return p.Flags == lockFlags || (p.Flags == semFlags && strings.HasSuffix(p.Key, "/.lock")) || p.Flags == broker.RWLockFlagValue
}

func expiring(l Leftovers) bool {
	if len(l.Sessions) > 0 {
		return true
	}
	for _, k := range l.Keys {
		if strings.Contains(k, "held by session") {
			return true
		}
	}
	return false
}

// restore heals everything after a chaos segment: links, frozen clients,
// paused or stopped brokers, stopped Consul servers; then waits for a
// Consul leader.
func (r *run) restore(ctx context.Context) {
	r.net.HealAll()
	for _, c := range r.clients {
		select {
		case <-c.gate.freezing():
			c.gate.Thaw()
		default:
		}
	}
	for i := range r.cluster.Size() {
		if !r.cluster.Running(i) {
			if err := r.cluster.Restart(ctx, i); err != nil {
				r.note("restore: consul server " + fmt.Sprint(i) + ": " + err.Error())
			}
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	if _, err := r.cluster.WaitLeader(wctx); err != nil {
		r.note("restore: " + err.Error())
	}
	cancel()
	for _, b := range r.brokers {
		if b.Paused() {
			_ = b.Continue()
		}
		if !b.Running() {
			if err := b.Start(ctx); err != nil {
				r.note("restore: " + err.Error())
			}
		}
	}
}

// inject carries out one planned fault and heals it.
func (r *run) inject(ctx context.Context, p Planned) {
	pick := func(n int) int { return int(p.Pick % uint64(n)) }
	hold := func() { sleep(ctx, p.Dur) }
	switch p.Kind {
	case FBrokerKill, FBrokerPause, FBrokerPauseLong, FBrokerTerm:
		b := r.brokers[pick(len(r.brokers))]
		if !b.Running() {
			r.note(p.Kind + ": " + b.Name() + " not running")
			return
		}
		f := r.start(Fault{Kind: p.Kind, Target: b.Name(), Note: p.Dur.String()})
		switch p.Kind {
		case FBrokerKill:
			b.Kill()
			hold()
		case FBrokerTerm:
			if err := b.Term(); err != nil {
				r.exit(err.Error())
			}
			hold()
		default:
			if err := b.Pause(); err != nil {
				r.note(p.Kind + ": " + err.Error())
			}
			hold()
			_ = b.Continue()
		}
		if !b.Running() {
			if err := b.Start(ctx); err != nil {
				r.note(p.Kind + ": restart: " + err.Error())
			}
		}
		r.end(f)
	case FBrokerPauseFailover:
		r.pauseFailover(ctx, p)
	case FConsulLeaderKill, FConsulFollowerKill:
		leader, err := r.cluster.Leader(ctx)
		if err != nil {
			r.note(p.Kind + ": " + err.Error())
			return
		}
		i := leader
		if p.Kind == FConsulFollowerKill {
			i = (leader + 1 + pick(r.cluster.Size()-1)) % r.cluster.Size()
		}
		f := r.start(Fault{Kind: p.Kind, Target: fmt.Sprintf("consul-%d", i)})
		_ = r.cluster.Kill(i)
		hold()
		if err := r.cluster.Restart(ctx, i); err != nil {
			r.note(p.Kind + ": restart: " + err.Error())
		}
		r.end(f)
	case FConsulRestartAll:
		f := r.start(Fault{Kind: p.Kind, Target: "consul-*"})
		for i := range r.cluster.Size() {
			_ = r.cluster.Stop(i)
		}
		hold()
		for i := range r.cluster.Size() {
			if err := r.cluster.Restart(ctx, i); err != nil {
				r.note(p.Kind + ": restart: " + err.Error())
			}
		}
		wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		if _, err := r.cluster.WaitLeader(wctx); err != nil {
			r.note(p.Kind + ": " + err.Error())
		}
		cancel()
		r.end(f)
	case FConsulBlackhole, FConsulBlackholeLong, FConsulLatency, FConsulReset:
		i := pick(len(r.brokers))
		l := r.links[i]
		f := r.start(Fault{Kind: p.Kind, Target: r.brokers[i].Name() + "↔consul"})
		var tx *Toxics
		var err error
		switch p.Kind {
		case FConsulLatency:
			tx, err = l.Latency(200, 100)
		case FConsulReset:
			tx, err = l.Reset()
		default:
			tx, err = l.Blackhole()
		}
		if err != nil {
			r.note(p.Kind + ": " + err.Error())
		}
		hold()
		tx.Heal()
		r.end(f)
	case FClientPartition, FClientReset, FClientLatency:
		n := 1 + pick(3)
		var targets []string
		var ids []int
		var links []*Link
		all := p.Pick%2 == 0 && p.Kind == FClientPartition
		broker := pick(len(r.brokers))
		for k := range n {
			c := r.faultable[int((p.Pick>>8+uint64(k)*7919)%uint64(len(r.faultable)))]
			targets = append(targets, c.Name())
			ids = append(ids, c.ID)
			for j, l := range c.Links {
				if all || j == broker || p.Kind == FClientLatency {
					links = append(links, l)
				}
			}
		}
		where, replica := r.brokers[broker].Name(), r.brokers[broker].Name()
		if all || p.Kind == FClientLatency {
			where, replica = "every broker", ""
		}
		f := r.start(Fault{Kind: p.Kind, Target: strings.Join(targets, ",") + "↔" + where, Clients: ids, Replica: replica})
		var txs []*Toxics
		for _, l := range links {
			var tx *Toxics
			var err error
			switch p.Kind {
			case FClientPartition:
				tx, err = l.Blackhole()
			case FClientReset:
				tx, err = l.Reset()
			default:
				tx, err = l.Latency(200, 100)
			}
			if err != nil {
				r.note(p.Kind + ": " + err.Error())
			}
			txs = append(txs, tx)
		}
		hold()
		for _, tx := range txs {
			tx.Heal()
		}
		r.end(f)
	case FClientFreeze, FClientFreezeReset:
		// Freeze a client that holds a lock now (so that its stale write
		// tests the token; wait up to 5s for one), else any lock client.
		var cands, all []*Client
		for try := 0; len(cands) == 0 && try < 25 && ctx.Err() == nil; try++ {
			if try > 0 {
				sleep(ctx, 200*time.Millisecond)
			}
			holding := map[int]bool{}
			for _, h := range r.hist.Current() {
				if h.Limit == 1 && !h.Paused {
					holding[h.Client] = true
				}
			}
			all = all[:0]
			for _, c := range r.clients {
				if c.Kind == KindLib || c.Kind == KindRaw || c.Kind == KindElect {
					all = append(all, c)
					if holding[c.ID] {
						cands = append(cands, c)
					}
				}
			}
		}
		if len(cands) == 0 {
			r.note(p.Kind + ": no client held a lock; froze a waiting one")
			cands = all
		}
		c := cands[pick(len(cands))]
		f := r.start(Fault{Kind: p.Kind, Target: c.Name(), Note: p.Dur.String()})
		fr := Freeze{Client: c.ID, Start: f.Start, Silent: p.Kind == FClientFreeze}
		if i := c.Replica(); i >= 0 {
			fr.Replica, fr.Server = r.brokers[i].Name(), fmt.Sprintf("consul-%d", i%r.cluster.Size())
		}
		c.gate.Freeze()
		var txs []*Toxics
		for _, l := range c.Links {
			tx, err := l.Blackhole()
			if err != nil {
				r.note(p.Kind + ": " + err.Error())
			}
			txs = append(txs, tx)
			if p.Kind == FClientFreezeReset { // its connections die at once
				if err := l.Cut(); err != nil {
					r.note(p.Kind + ": " + err.Error())
				}
			}
		}
		hold()
		for _, tx := range txs {
			tx.Heal()
		}
		c.gate.Thaw()
		r.end(f)
		fr.End = r.hist.Now()
		r.hist.AddFreeze(fr)
	case FSessionDestroy:
		var cands []Hold
		for _, h := range r.hist.Current() {
			if h.Limit == 1 && !h.Paused {
				cands = append(cands, h)
			}
		}
		if len(cands) == 0 {
			r.note(p.Kind + ": nobody holds a lock")
			return
		}
		h := cands[pick(len(cands))]
		c, err := r.admin()
		if err != nil {
			r.note(p.Kind + ": " + err.Error())
			return
		}
		fault := Fault{Kind: p.Kind, Target: fmt.Sprintf("client-%d %s", h.Client, h.Key), Session: h.Session, Key: h.Key}
		fault.Replica, fault.Server = r.replicaOf(h.Client)
		f := r.start(fault)
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err = c.Session().Destroy(h.Session, (&api.WriteOptions{}).WithContext(dctx))
		cancel()
		if err != nil {
			r.note(p.Kind + ": " + err.Error())
		}
		r.end(f)
	}
}

// start records and announces a fault.
func (r *run) start(f Fault) *Fault {
	r.faults.add(f.Kind)
	p := r.hist.StartFault(f)
	r.logf("fault %s → %s %s", f.Kind, f.Target, f.Note)
	return p
}

func (r *run) end(f *Fault) { r.hist.EndFault(f) }
