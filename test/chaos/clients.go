package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/consul/api"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/lockbroker/lockbroker/client"
	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
)

// Env is what every client of a run shares.
type Env struct {
	Hist      *History
	Res       *Resource
	Quiet     *atomic.Bool // quiet period: short holds, so everyone gets a turn
	TTL       time.Duration
	LockDelay time.Duration
	// IgnoreTokens: clients send no token to the resource (no-fencing).
	IgnoreTokens bool
	// LongHolds: holds last 15–25s outside quiet periods.
	LongHolds bool
	// Admin is a Consul client of a running server (the operator's view,
	// not proxied), for observers that read Consul itself.
	Admin func() (*api.Client, error)
}

// Client is one client of the run: a goroutine (two for observers) with
// its own connections, through its own proxies, to every broker.
type Client struct {
	ID    int
	Kind  ClientKind
	Key   string
	Limit int
	Links []*Link // one per broker, in broker order
	// Pin is the one broker a hot-key client uses (-1: every broker).
	Pin int
	// Keys: a multi-key client's keys, Key first (KindMulti), or the
	// multi-key lock keys a KindMultiObs observer lists in Consul.
	Keys []string

	env     *Env
	conns   []*grpc.ClientConn
	rng     *rand.Rand
	gate    gate
	resumes atomic.Int64
	value   int64
	// cur is the lease the client believes it holds (nil between holds),
	// for the injector to see which replica holds it.
	cur atomic.Pointer[leaseRef]
}

// leaseRef boxes a lease for an atomic pointer.
type leaseRef struct{ l lease }

// Replica is the index of the broker whose stream holds the client's
// current hold, or -1 when it holds nothing (or cannot tell).
func (c *Client) Replica() int {
	if r := c.cur.Load(); r != nil {
		return r.l.replica()
	}
	return -1
}

// NewClient dials every link (lazily, as gRPC does).
func NewClient(id int, kind ClientKind, key string, limit int, links []*Link, env *Env, seed uint64) (*Client, error) {
	c := &Client{ID: id, Kind: kind, Key: key, Limit: limit, Links: links, Pin: -1, env: env,
		rng: rand.New(rand.NewPCG(seed, uint64(id))), gate: newGate()}
	for _, l := range links {
		conn, err := grpc.NewClient(l.Addr(),
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithConnectParams(grpc.ConnectParams{
				Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
				MinConnectTimeout: 2 * time.Second,
			}),
			grpc.WithStreamInterceptor(c.countResumes))
		if err != nil {
			c.Close()
			return nil, err
		}
		c.conns = append(c.conns, conn)
	}
	return c, nil
}

// Close closes the client's connections.
func (c *Client) Close() {
	for _, conn := range c.conns {
		_ = conn.Close()
	}
}

// Name names the client in faults and reports.
func (c *Client) Name() string { return fmt.Sprintf("client-%d(%s)", c.ID, c.Kind) }

// Run is the client's life until ctx ends.
func (c *Client) Run(ctx context.Context) {
	switch c.Kind {
	case KindRaw:
		c.loop(ctx, c.acquireRaw, true)
	case KindSem:
		c.loop(ctx, c.acquireLib, false)
	case KindReader, KindWriter, KindMulti:
		c.loop(ctx, c.acquireRaw, c.Kind != KindReader) // readers do not write
	case KindObserver:
		c.observe(ctx)
	case KindMultiObs:
		c.observeConsul(ctx)
	default:
		c.loop(ctx, c.acquireLib, true)
	}
}

// countResumes counts the Acquire streams the client opens to resume.
func (c *Client) countResumes(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	s, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil || method != lockbrokerv1.LockService_Acquire_FullMethodName {
		return s, err
	}
	return &resumeCounter{ClientStream: s, c: c}, nil
}

type resumeCounter struct {
	grpc.ClientStream
	c *Client
}

func (r *resumeCounter) SendMsg(m any) error {
	if req, ok := m.(*lockbrokerv1.AcquireRequest); ok && req.GetResume() != nil {
		r.c.resumes.Add(1)
	}
	return r.ClientStream.SendMsg(m)
}

// between returns a random duration in [lo, hi).
func (c *Client) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(c.rng.Int64N(int64(hi-lo)))
}

// holdTime is how long the next hold is kept.
func (c *Client) holdTime() time.Duration {
	if c.hotKey() {
		return c.between(20*time.Millisecond, 40*time.Millisecond)
	}
	if c.env.Quiet.Load() {
		return c.between(100*time.Millisecond, 400*time.Millisecond)
	}
	if c.env.LongHolds {
		return c.between(15*time.Second, 25*time.Second)
	}
	switch c.Kind {
	case KindElect:
		return c.between(time.Second, 4*time.Second)
	case KindSem:
		return c.between(500*time.Millisecond, 3*time.Second)
	default:
		return c.between(200*time.Millisecond, 2*time.Second)
	}
}

// lease is a believed hold, whichever way it was taken.
type lease interface {
	lost() <-chan struct{}
	reason() string // once lost() is closed
	deadline() time.Time
	release(ctx context.Context)
	replica() int // the broker index whose stream holds it now
}

// acquireFunc takes the client's key (or keys) once (bounded by ctx): the
// grant's sequencers, the first key's first (one per key of a multi-key
// grant, as `acquired` listed them).
type acquireFunc func(ctx context.Context) (lease, []*lockbrokerv1.Sequencer, error)

// mode is the read-write mode of the client's holds ("" for none).
func (c *Client) mode() string {
	switch c.Kind {
	case KindReader:
		return ModeRead
	case KindWriter:
		return ModeWrite
	}
	return ""
}

// loop acquires, holds, releases, again and again.
func (c *Client) loop(ctx context.Context, acquire acquireFunc, writes bool) {
	for ctx.Err() == nil {
		c.gate.wait(ctx)
		if c.hotKey() && !c.env.Quiet.Load() {
			sleep(ctx, 100*time.Millisecond) // the hot key is used in quiet periods only
			continue
		}
		call := c.env.Hist.Now()
		actx, cancel := context.WithTimeout(ctx, 30*time.Second)
		l, seqs, err := acquire(actx)
		cancel()
		ret := c.env.Hist.Now()
		a := Attempt{Client: c.ID, Key: c.Key, Keys: c.Keys, Call: call, Return: ret, OK: err == nil}
		if err != nil {
			a.Err = truncate(err.Error(), 200)
		}
		c.env.Hist.AddAttempt(a)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			sleep(ctx, c.between(100*time.Millisecond, time.Second))
			continue
		}
		var hs []*Hold
		if c.Kind == KindMulti { // one hold per key `acquired` listed
			var group []Hold
			for _, seq := range seqs {
				group = append(group, Hold{Client: c.ID, Kind: c.Kind, Key: seq.GetKey(), Limit: 1,
					Token: seq.GetToken(), Session: seq.GetSessionId(), Call: call, Acquired: ret, Keys: c.Keys})
			}
			hs = c.env.Hist.StartGroup(group)
		} else {
			hs = []*Hold{c.env.Hist.StartHold(Hold{Client: c.ID, Kind: c.Kind, Key: c.Key, Limit: c.Limit,
				Token: seqs[0].GetToken(), Session: seqs[0].GetSessionId(), Call: call, Acquired: ret, Mode: c.mode()})}
		}
		c.hold(ctx, l, seqs[0], hs, writes)
		if c.Kind != KindHot { // a hot client asks again at once
			sleep(ctx, c.between(0, 300*time.Millisecond))
		}
	}
}

// hotKey reports whether the client uses the hot key.
func (c *Client) hotKey() bool { return c.Kind == KindHot || c.Kind == KindFar }

// hold keeps a believed hold until it is lost, its time is up, or ctx
// ends, writing to the fenced resource and checking the sequencer. hs are
// the holds of the grant: one, or one per key of a multi-key grant (each
// written with its own token; the first one's sequencer is checked).
func (c *Client) hold(ctx context.Context, l lease, seq *lockbrokerv1.Sequencer, hs []*Hold, writes bool) {
	h := hs[0]
	resumes0 := c.resumes.Load()
	hist := c.env.Hist
	c.cur.Store(&leaseRef{l})
	defer c.cur.Store(nil)
	// The loss is timed when the lease reports it, not when this loop
	// gets to it: the loop may be inside a CheckSequencer call to a
	// stopped broker for up to its 2s timeout. Every action the loop takes
	// as holder checks the lease first (lostNow), so the belief ends there.
	var lostAt atomic.Int64
	stopTiming := make(chan struct{})
	defer close(stopTiming)
	go func() {
		select {
		case <-l.lost():
			lostAt.Store(int64(hist.Now()))
		case <-stopTiming:
		}
	}()
	paused := false // a frozen client's belief ends when it wakes (see frozen)
	end := func(reason string) {
		at := hist.Now()
		if t := time.Duration(lostAt.Load()); t > 0 && t < at && !paused {
			at = t
		}
		for _, h := range hs {
			hist.EndHold(h, at, reason, hist.Offset(l.deadline()), int(c.resumes.Load()-resumes0))
		}
	}
	lostNow := func() bool {
		select {
		case <-l.lost():
			end(l.reason())
			return true
		default:
			return false
		}
	}
	relT := time.NewTimer(c.holdTime())
	defer relT.Stop()
	writeT := time.NewTimer(c.between(20*time.Millisecond, 200*time.Millisecond))
	defer writeT.Stop()
	checkT := time.NewTimer(c.between(300*time.Millisecond, 1500*time.Millisecond))
	defer checkT.Stop()
	frozen := func() {
		paused = true
		for _, h := range hs {
			hist.Pause(h)
		}
		c.gate.waitThaw(ctx)
		// A paused process finishes the write it had started, without
		// looking at the lease: only the token can stop it now.
		if writes && ctx.Err() == nil {
			for _, h := range hs {
				c.write(h, true)
			}
		}
	}
	for {
		select { // a freeze comes first: a frozen client does nothing else
		case <-c.gate.freezing():
			frozen()
			continue
		default:
		}
		select {
		case <-ctx.Done():
			end(EndRunEnd)
			rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			l.release(rctx)
			cancel()
			return
		case <-l.lost():
			end(l.reason())
			return
		case <-c.gate.freezing():
			frozen()
		case <-writeT.C:
			if lostNow() {
				return
			}
			if writes {
				for _, h := range hs {
					c.write(h, false)
				}
			}
			writeT.Reset(c.between(100*time.Millisecond, 300*time.Millisecond))
		case <-checkT.C:
			if lostNow() {
				return
			}
			if writes {
				c.checkSequencer(ctx, seq, h)
			}
			checkT.Reset(c.between(500*time.Millisecond, 1500*time.Millisecond))
		case <-relT.C:
			if lostNow() {
				return
			}
			end(EndReleased) // the belief ends before the release starts
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			l.release(rctx)
			cancel()
			return
		}
	}
}

// write writes the next value to the fenced resource with h's token.
func (c *Client) write(h *Hold, stale bool) {
	c.value++
	tok := h.Token
	if c.env.IgnoreTokens {
		tok = 0
	}
	call := c.env.Hist.Now()
	ok, seq := c.env.Res.Write(h.Key, tok, c.value)
	c.env.Hist.AddWrite(Write{Client: c.ID, HoldID: h.ID, Key: h.Key, Token: h.Token, Value: c.value,
		Call: call, Return: c.env.Hist.Now(), Accepted: ok, Seq: seq, Stale: stale})
}

// checkSequencer asks a broker whether h's grant (seq, as `acquired`
// carried it) is still current.
func (c *Client) checkSequencer(ctx context.Context, seq *lockbrokerv1.Sequencer, h *Hold) {
	stub := lockbrokerv1.NewLockServiceClient(c.conns[c.rng.IntN(len(c.conns))])
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	call := c.env.Hist.Now()
	resp, err := stub.CheckSequencer(cctx, &lockbrokerv1.CheckSequencerRequest{Sequencer: seq})
	if err != nil {
		return
	}
	c.env.Hist.AddCheck(Check{Client: c.ID, Key: h.Key, Token: h.Token, Current: resp.GetCurrent(), Call: call, Return: c.env.Hist.Now()})
}

// libClient is the Go client over all replicas, starting at a random one
// (first: the client's replica 0 is broker first, its replica i broker
// first+i).
func (c *Client) libClient() (cl *client.Client, first int) {
	if c.Pin >= 0 {
		return client.New(c.conns[c.Pin]), c.Pin
	}
	first = c.rng.IntN(len(c.conns))
	var rest []grpc.ClientConnInterface
	for i := 1; i < len(c.conns); i++ {
		rest = append(rest, c.conns[(first+i)%len(c.conns)])
	}
	return client.New(c.conns[first], client.WithReplicas(rest...)), first
}

// acquireLib takes the key with the Go client (resume on).
func (c *Client) acquireLib(ctx context.Context) (lease, []*lockbrokerv1.Sequencer, error) {
	opts := []client.LockOption{client.WithTTL(c.env.TTL), client.WithLockDelay(c.env.LockDelay),
		client.WithValue([]byte(c.Name()))}
	if c.Limit > 1 {
		opts = append(opts, client.WithLimit(uint32(c.Limit)))
	}
	cl, first := c.libClient()
	l, err := cl.Lock(ctx, c.Key, opts...)
	if err != nil {
		return nil, nil, err
	}
	return &libLease{l: l, first: first, n: len(c.conns)}, []*lockbrokerv1.Sequencer{l.Sequencer()}, nil
}

// libLease adapts a client.Lease.
type libLease struct {
	l        *client.Lease
	first, n int // the client's replica i is broker (first+i)%n
	ours     atomic.Bool
}

func (l *libLease) replica() int { return (l.first + l.l.Replica()) % l.n }

func (l *libLease) lost() <-chan struct{} { return l.l.Lost() }
func (l *libLease) deadline() time.Time   { return l.l.Deadline() }
func (l *libLease) release(ctx context.Context) {
	l.ours.Store(true)
	_ = l.l.Release(ctx)
}

func (l *libLease) reason() string {
	err := l.l.Err()
	var le *client.LostError
	switch {
	case errors.Is(err, client.ErrReleased) && l.ours.Load():
		return EndReleased
	case errors.Is(err, client.ErrReleased):
		return "lost:RELEASED_UNASKED"
	case errors.As(err, &le):
		return "lost:" + strings.TrimPrefix(le.Reason.String(), "LOST_REASON_")
	case err == nil:
		return "lost:UNKNOWN"
	}
	return "lost:" + truncate(err.Error(), 60)
}

// rawMargin is how long before its deadline a raw client gives a hold up.
const rawMargin = 250 * time.Millisecond

// acquireRaw takes the key with a bare LockService stub on one replica:
// no resume; the client enforces the deadline itself. Readers and writers
// ask for kind READ or WRITE, a multi-key client for all its keys (its
// value names them, for the observers of Consul).
func (c *Client) acquireRaw(ctx context.Context) (lease, []*lockbrokerv1.Sequencer, error) {
	idx := c.rng.IntN(len(c.conns))
	stub := lockbrokerv1.NewLockServiceClient(c.conns[idx])
	sctx, cancel := context.WithCancel(context.Background())
	stop := context.AfterFunc(ctx, cancel)
	req := &lockbrokerv1.AcquireRequest{
		Key: c.Key, Value: []byte(c.Name()), Limit: uint32(c.Limit),
		Session: &lockbrokerv1.AcquireRequest_NewSession{NewSession: &lockbrokerv1.SessionOptions{
			Ttl: durationpb.New(c.env.TTL), LockDelay: durationpb.New(c.env.LockDelay)}},
	}
	switch c.Kind {
	case KindReader:
		req.Kind = lockbrokerv1.AcquireKind_ACQUIRE_KIND_READ
	case KindWriter:
		req.Kind = lockbrokerv1.AcquireKind_ACQUIRE_KIND_WRITE
	case KindMulti:
		req.Keys = c.Keys[1:]
		req.Value = []byte(multiValue(c.Name(), c.Keys))
	}
	stream, err := stub.Acquire(sctx, req)
	if err != nil {
		stop()
		cancel()
		return nil, nil, err
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			stop()
			cancel()
			return nil, nil, err
		}
		if a := resp.GetAcquired(); a != nil {
			if !stop() {
				cancel()
				return nil, nil, ctx.Err()
			}
			l := &rawLease{stub: stub, idx: idx, cancel: cancel, seq: a.GetSequencer(), lostCh: make(chan struct{}), done: make(chan struct{}),
				dl: time.Now().Add(a.GetGuaranteedFor().AsDuration())}
			go l.follow(stream)
			seqs := a.GetSequencers()
			if len(seqs) == 0 {
				seqs = []*lockbrokerv1.Sequencer{a.GetSequencer()}
			}
			return l, seqs, nil
		}
	}
}

// rawLease is a hold on a bare stream.
type rawLease struct {
	stub   lockbrokerv1.LockServiceClient
	idx    int // the broker it is on
	cancel context.CancelFunc
	seq    *lockbrokerv1.Sequencer
	lostCh chan struct{}
	done   chan struct{}

	mu   sync.Mutex
	dl   time.Time
	why  string
	ours bool
}

func (l *rawLease) lost() <-chan struct{} { return l.lostCh }
func (l *rawLease) replica() int          { return l.idx }

func (l *rawLease) reason() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.why
}

func (l *rawLease) deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.dl
}

// end closes the lease once with why.
func (l *rawLease) end(why string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.why != "" {
		return
	}
	if l.ours {
		why = EndReleased
	}
	l.why = why
	close(l.lostCh)
}

// follow reads the stream: keepalives move the deadline; lost, released
// or a broken stream end the hold, and so does the deadline passing.
func (l *rawLease) follow(stream lockbrokerv1.LockService_AcquireClient) {
	defer close(l.done)
	defer l.cancel()
	type recv struct {
		resp *lockbrokerv1.AcquireResponse
		err  error
	}
	events := make(chan recv, 1)
	go func() {
		for {
			resp, err := stream.Recv()
			events <- recv{resp, err}
			if err != nil {
				return
			}
		}
	}()
	for {
		timer := time.NewTimer(time.Until(l.deadline().Add(-rawMargin)))
		select {
		case <-timer.C:
			l.end("lost:LOCAL_DEADLINE")
			l.cancel()
			for ev := range events { // drain until the reader exits
				if ev.err != nil {
					return
				}
			}
			return
		case ev := <-events:
			timer.Stop()
			if ev.err != nil {
				l.end("lost:STREAM_BROKEN")
				return
			}
			switch e := ev.resp.GetEvent().(type) {
			case *lockbrokerv1.AcquireResponse_Keepalive:
				l.mu.Lock()
				l.dl = time.Now().Add(e.Keepalive.GetGuaranteedFor().AsDuration())
				l.mu.Unlock()
			case *lockbrokerv1.AcquireResponse_Lost:
				l.end("lost:" + strings.TrimPrefix(e.Lost.GetReason().String(), "LOST_REASON_"))
			case *lockbrokerv1.AcquireResponse_Released:
				l.end("lost:RELEASED_UNASKED")
			}
		}
	}
}

// release ends the hold: half the time with Release (key, session and
// token precondition), else by closing the stream.
func (l *rawLease) release(ctx context.Context) {
	l.mu.Lock()
	l.ours = true
	l.mu.Unlock()
	if time.Now().UnixNano()%2 == 0 {
		_, _ = l.stub.Release(ctx, &lockbrokerv1.ReleaseRequest{Key: l.seq.GetKey(), SessionId: l.seq.GetSessionId(), Token: l.seq.GetToken()})
	}
	l.cancel()
	select {
	case <-l.done:
	case <-ctx.Done():
	}
}

// observe follows the election key: client.Watch (or a raw Watch stream
// for odd ids) records every state seen, and GetLock polls feed the
// linearizability check.
func (c *Client) observe(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { c.pollGetLock(ctx) })
	raw := c.ID%2 == 1
	for ctx.Err() == nil {
		if raw {
			c.watchRaw(ctx)
		} else {
			c.watchLib(ctx)
		}
		sleep(ctx, 200*time.Millisecond)
	}
	wg.Wait()
}

func holderToken(st *lockbrokerv1.LockState) uint64 {
	if hs := st.GetHolders(); len(hs) > 0 {
		return hs[0].GetToken()
	}
	return 0
}

func (c *Client) watchLib(ctx context.Context) {
	cl, _ := c.libClient()
	w, err := cl.Watch(ctx, c.Key)
	if err != nil {
		return
	}
	for resp := range w.C {
		c.env.Hist.AddObservation(Observation{Client: c.ID, Key: c.Key, At: c.env.Hist.Now(), Holder: holderToken(resp.GetState())})
	}
}

func (c *Client) watchRaw(ctx context.Context) {
	stub := lockbrokerv1.NewLockServiceClient(c.conns[c.rng.IntN(len(c.conns))])
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := stub.Watch(wctx, &lockbrokerv1.WatchRequest{Key: c.Key})
	if err != nil {
		return
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			return
		}
		c.env.Hist.AddObservation(Observation{Client: c.ID, Key: c.Key, At: c.env.Hist.Now(), Holder: holderToken(resp.GetState()), Raw: true})
	}
}

// pollGetLock reads the key's holder (a consistent read) now and then.
func (c *Client) pollGetLock(ctx context.Context) {
	for ctx.Err() == nil {
		sleep(ctx, c.between(300*time.Millisecond, 700*time.Millisecond))
		stub := lockbrokerv1.NewLockServiceClient(c.conns[c.rng.IntN(len(c.conns))])
		gctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		call := c.env.Hist.Now()
		resp, err := stub.GetLock(gctx, &lockbrokerv1.GetLockRequest{Key: c.Key})
		cancel()
		if err != nil {
			continue
		}
		c.env.Hist.AddCheck(Check{Client: c.ID, Key: c.Key, GetLock: true, Holder: holderToken(resp.GetState()),
			Call: call, Return: c.env.Hist.Now()})
	}
}

// observeConsul lists the multi-key lock keys straight from Consul, by
// consistent blocking queries on their prefix (every change of the
// prefix's index wakes it), and records which session and value hold
// each key (CheckMulti).
func (c *Client) observeConsul(ctx context.Context) {
	if len(c.Keys) == 0 || c.env.Admin == nil {
		return
	}
	prefix := c.Keys[0][:strings.LastIndex(c.Keys[0], "/")+1]
	var index uint64
	var kv *api.Client // one client (one connection pool) until it fails
	for ctx.Err() == nil {
		if kv == nil {
			var err error
			if kv, err = c.env.Admin(); err != nil {
				sleep(ctx, 200*time.Millisecond)
				continue
			}
		}
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		pairs, meta, err := kv.KV().List(prefix, (&api.QueryOptions{RequireConsistent: true, WaitIndex: index, WaitTime: 5 * time.Second}).WithContext(qctx))
		cancel()
		if err != nil {
			kv, index = nil, 0 // its server may be down: ask for a running one
			sleep(ctx, 200*time.Millisecond)
			continue
		}
		if meta.LastIndex < index { // the index went back (a restored server): start over
			index = 0
			continue
		}
		if meta.LastIndex == index {
			continue // the wait timed out: nothing changed
		}
		index = meta.LastIndex
		v := KVView{Client: c.ID, At: c.env.Hist.Now(), Index: meta.LastIndex}
		for _, p := range pairs {
			if p.Session != "" && slices.Contains(c.Keys, p.Key) {
				v.Held = append(v.Held, KVHeld{Key: p.Key, Session: p.Session, Value: string(p.Value)})
			}
		}
		c.env.Hist.AddKVView(v)
	}
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// gate freezes a client's goroutine: Freeze closes the channel that
// freezing returns; the client then waits in waitThaw until Thaw.
type gate struct {
	mu   sync.Mutex
	ch   chan struct{} // closed while frozen
	thaw chan struct{} // closed by Thaw
}

func newGate() gate { return gate{ch: make(chan struct{}), thaw: make(chan struct{})} }

func (g *gate) freezing() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.ch
}

// Freeze stops the client at its next step.
func (g *gate) Freeze() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.thaw = make(chan struct{})
	close(g.ch)
}

// Thaw lets it go on.
func (g *gate) Thaw() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.ch = make(chan struct{})
	close(g.thaw)
}

func (g *gate) waitThaw(ctx context.Context) {
	g.mu.Lock()
	t := g.thaw
	g.mu.Unlock()
	select {
	case <-t:
	case <-ctx.Done():
	}
}

// wait blocks while the client is frozen.
func (g *gate) wait(ctx context.Context) {
	select {
	case <-g.freezing():
		g.waitThaw(ctx)
	default:
	}
}
