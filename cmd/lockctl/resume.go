package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
)

// Resume. A hold whose broker goes away while the command runs (the broker
// died, was stopped, or drains for a restart) is re-attached on the
// brokers of --addr in turn, starting with the next one, with the same
// session and sequencer, as every client library does (DESIGN.md,
// "Resume" and "Rolling restart"). The command goes on running; the
// guarantee the broker gave still bounds it: if no broker has resumed the
// hold by the time the command must be stopped, it is stopped as for any
// loss. A broker that refuses the resume (the session or its grant is
// gone) ends the hold at once.
//
// With several addresses a stream silent for stallAfter of the time it
// was last guaranteed for is taken to be on a stalled broker, and the hold
// resumes elsewhere while it is still guaranteed. The silent stream stays
// open until the resume succeeds: closing it would release the hold if its
// broker woke before the resume moved it.

// stallShare is the share of the client libraries; minStallShare is the
// least lockctl waits: the broker renews every third of the TTL, so a
// healthy stream speaks about every 0.37 of the guarantee (0.9 of the TTL).
const (
	stallShare    = 0.6
	minStallShare = 0.45
)

// stallAfter is how long a stream guaranteed for d may stay silent before
// lockctl resumes the hold elsewhere: stallShare of d, as the libraries,
// or less, so that one resume attempt (resumeAttempt) fits before the
// command must be stopped (stopAfter); never
// less than minStallShare of d. With a 10 s TTL (9 s guaranteed) and the
// default --grace, that is 4.05 s, and the resume has 1.95 s before
// SIGTERM instead of 0.6 s at the libraries' share.
func stallAfter(d, grace time.Duration) time.Duration {
	share := func(f float64) time.Duration { return time.Duration(f * float64(d)) }
	return max(min(share(stallShare), stopAfter(d, grace)-resumeAttempt), share(minStallShare))
}

// resumeAttempt bounds one resume attempt on one broker (a stopped broker
// accepts the connection and never answers).
const resumeAttempt = 3 * time.Second

// resumePause is the pause after every broker of --addr failed once.
const resumePause = 200 * time.Millisecond

// holdStream is one Acquire stream of the hold: the first, or a resume.
type holdStream struct {
	addr   string
	cancel context.CancelFunc
	events <-chan recvResult
	done   <-chan struct{}
}

// openStream opens an Acquire stream for req on conn, under ctx.
func openStream(ctx context.Context, conn grpc.ClientConnInterface, addr string, req *lockbrokerv1.AcquireRequest) (*holdStream, error) {
	sctx, cancel := context.WithCancel(ctx)
	stream, err := lockbrokerv1.NewLockServiceClient(conn).Acquire(sctx, req)
	if err != nil {
		cancel()
		return nil, err
	}
	events, done := receive(sctx, stream)
	return &holdStream{addr: addr, cancel: cancel, events: events, done: done}, nil
}

// close ends the stream (the broker then releases the hold, unless it was
// resumed elsewhere) and waits for its reader.
func (s *holdStream) close() {
	s.cancel()
	<-s.done
}

// resumer re-attaches the hold on the brokers of --addr.
type resumer struct {
	c    *cli
	base context.Context              // the streams' context
	req  *lockbrokerv1.AcquireRequest // the first request
	seq  *lockbrokerv1.Sequencer      // the grant, once there is one
	seqs []*lockbrokerv1.Sequencer    // every key's grant (seq alone for one key)

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
}

func newResumer(ctx context.Context, c *cli, req *lockbrokerv1.AcquireRequest, first string, conn *grpc.ClientConn) *resumer {
	return &resumer{c: c, base: ctx, req: req, conns: map[string]*grpc.ClientConn{first: conn}}
}

// conn is the connection to addr, opened on first use and kept.
func (r *resumer) conn(addr string) (*grpc.ClientConn, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if cc := r.conns[addr]; cc != nil {
		return cc, nil
	}
	cc, err := r.c.connect(addr)
	if err != nil {
		return nil, err
	}
	r.conns[addr] = cc
	return cc, nil
}

// closeAll closes every connection.
func (r *resumer) closeAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, cc := range r.conns {
		cc.Close()
	}
}

// resumeResult is how a resume ended: the new stream and its `acquired`,
// or the error that ends the hold (a refusal, or ctx's).
type resumeResult struct {
	hs      *holdStream
	acq     *lockbrokerv1.AcquireAcquired
	err     error
	refused bool // err is a broker's refusal (RESUME_REFUSED)
}

// run tries the brokers in turn, starting after from, until one resumes
// the hold or refuses it, or ctx ends (the supervisor ends it when the
// command must be stopped or has exited). The new stream lives under
// r.base.
func (r *resumer) run(ctx context.Context, from string) resumeResult {
	addrs := r.c.brokerAddrs()
	start := slices.Index(addrs, from) + 1
	var tried []string
	for attempt := 0; ; attempt++ {
		addr := addrs[(start+attempt)%len(addrs)]
		hs, acq, err := r.try(ctx, addr)
		switch {
		case err == nil:
			return resumeResult{hs: hs, acq: acq}
		case ctx.Err() != nil:
			if len(tried) == 0 {
				return resumeResult{err: ctx.Err()}
			}
			return resumeResult{err: fmt.Errorf("no broker resumed the hold (%s)", strings.Join(tried, "; "))}
		case refused(err):
			return resumeResult{err: fmt.Errorf("%s refused to resume the hold: %s", addr, statusText(err)), refused: true}
		}
		if len(tried) < 2*len(addrs) {
			tried = append(tried, addr+": "+statusText(err))
		}
		if (attempt+1)%len(addrs) == 0 {
			select {
			case <-ctx.Done():
			case <-time.After(resumePause):
			}
		}
	}
}

// refused says whether a resume's error is a broker's "no": the session
// or the grant is gone, and no other broker would say otherwise.
func refused(err error) bool {
	switch status.Code(err) {
	case codes.FailedPrecondition, codes.NotFound, codes.InvalidArgument:
		return true
	}
	return false
}

// sameGrant is whether a resume's grant is the hold's: the same token on
// every key (a resume that repeats only the first key's grant counts).
func (r *resumer) sameGrant(a *lockbrokerv1.AcquireAcquired) bool {
	if a.GetSequencer().GetToken() != r.seq.GetToken() {
		return false
	}
	got := a.GetSequencers()
	if len(got) == 0 {
		return true
	}
	if len(got) != len(r.seqs) {
		return false
	}
	for i, s := range got {
		if s.GetKey() != r.seqs[i].GetKey() || s.GetToken() != r.seqs[i].GetToken() {
			return false
		}
	}
	return true
}

// try resumes the hold on addr: an Acquire with the grant as its resume,
// answered by `acquired` with the same token within resumeAttempt.
func (r *resumer) try(ctx context.Context, addr string) (*holdStream, *lockbrokerv1.AcquireAcquired, error) {
	cc, err := r.conn(addr)
	if err != nil {
		return nil, nil, err
	}
	req := proto.CloneOf(r.req)
	req.Session = &lockbrokerv1.AcquireRequest_Resume{Resume: r.seq}
	hs, err := openStream(r.base, cc, addr, req)
	if err != nil {
		return nil, nil, err
	}
	t := time.NewTimer(resumeAttempt)
	defer t.Stop()
	select {
	case ev := <-hs.events:
		if ev.err != nil {
			hs.close()
			return nil, nil, ev.err
		}
		a := ev.resp.GetAcquired()
		if a == nil || !r.sameGrant(a) {
			hs.close()
			return nil, nil, status.Error(codes.FailedPrecondition, "the resume did not return the same grant")
		}
		return hs, a, nil
	case <-t.C:
		hs.close()
		return nil, nil, status.Errorf(codes.DeadlineExceeded, "no answer within %v", resumeAttempt)
	case <-ctx.Done():
		hs.close()
		return nil, nil, ctx.Err()
	}
}
