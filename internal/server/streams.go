package server

import (
	"context"
	"time"

	"google.golang.org/grpc"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
)

// streams is the server's one stream interceptor: for a stream it does
// what the unary chain does for a call (metrics, access log, recovery,
// access, validation, the cut-off gate, in that order) in one stack frame.
//
// A hold's goroutine stays parked under its stream's interceptors for as
// long as the hold lasts. gRPC's chain puts two frames per interceptor
// there, 1.3 KiB for five, and with them a parked hold used about 4.9
// KiB of stack. The runtime gives half of a parked goroutine's stack back
// at a GC only while it uses under a quarter of it, so each hold kept 16
// KiB for its life (175 MiB of stacks at 10,000 holds). Under one frame
// it uses 2.7 KiB, and keeps 8 (see broker.Acquire for the rest of the
// budget, and test/e2e TestParkedHoldStack).
type streams struct {
	metrics *grpcMetrics
	log     accessLog
	// recovered turns a handler's panic into the call's error.
	recovered func(p any) error
	access    *access
	val       *validation
	gate      cutOffGate
	holds     *holdMetrics
}

func (s *streams) intercept(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
	cs := &callStream{ServerStream: ss, ctx: ss.Context(), s: s, start: time.Now(),
		kind: methodType(info.IsClientStream, info.IsServerStream)}
	cs.counters = s.metrics.method(info.FullMethod, cs.kind)
	cs.counters.started.Inc()
	defer cs.finish(info.FullMethod, &err)
	if !exempt(info.FullMethod) {
		cs.call = newCall(cs.ctx, info.FullMethod)
		if info.FullMethod == methodAcquire {
			cs.call.track = newHoldTracker(s.holds)
		}
		if cs.ctx, err = s.access.admitCall(cs.ctx, cs.call); err != nil {
			return err
		}
	}
	return handler(srv, cs)
}

// callStream is the stream a handler gets: it counts the messages,
// validates each request (access has checked the caller at the stream's
// start, and reads a request only once it is valid: nothing logs a
// request over the API's limits), lets the first in only if access does
// and refuses it while the replica is cut off from Consul, and carries
// the caller's tenant in its context.
type callStream struct {
	grpc.ServerStream
	ctx      context.Context // with the tenant (see access.admitCall)
	s        *streams
	start    time.Time
	kind     string
	counters *methodCounters
	call     *call // nil for a method access exempts
	received bool
}

func (cs *callStream) Context() context.Context { return cs.ctx }

func (cs *callStream) RecvMsg(m any) error {
	if err := cs.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	cs.counters.received.Inc()
	if err := cs.s.val.check(m); err != nil {
		return err
	}
	c := cs.call
	if c == nil || cs.received {
		return nil
	}
	cs.received = true
	c.req, c.hasNamed = m, false
	if err := cs.s.access.admitRequest(cs.ctx, c); err != nil {
		return err
	}
	return cs.s.gate.admit()
}

func (cs *callStream) SendMsg(m any) error {
	if err := cs.ServerStream.SendMsg(m); err != nil {
		return err
	}
	cs.counters.sent.Inc()
	if c := cs.call; c != nil && c.track != nil {
		if r, ok := m.(*lockbrokerv1.AcquireResponse); ok {
			c.track.event(r)
		}
	}
	return nil
}

// finish ends the call, also when its handler panicked: the panic becomes
// INTERNAL (logged), access gives back what it took and audits the
// outcome, then the access log and the metrics have it.
func (cs *callStream) finish(method string, err *error) {
	if p := recover(); p != nil {
		*err = cs.s.recovered(p)
	}
	if c := cs.call; c != nil {
		cs.s.access.finish(c, *err)
		c.done()
	}
	cs.s.log.finish(cs.ServerStream.Context(), method, cs.kind, cs.start, *err)
	cs.counters.done(cs.s.metrics, *err)
}
