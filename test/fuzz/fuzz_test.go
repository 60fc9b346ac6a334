// Package fuzz holds lockbroker's Go native fuzz targets. Each runs the
// real gRPC server (interceptors included) of an in-process broker
// against a real Consul agent. `make fuzz` runs each for FUZZTIME; plain
// `go test` runs the committed seed corpora under testdata/fuzz.
package fuzz

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"buf.build/gen/go/bufbuild/protovalidate/protocolbuffers/go/buf/validate"
	"github.com/hashicorp/consul/api"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/broker"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// fixture is one Consul agent and one broker, shared by every input a
// fuzz worker process runs.
type fixture struct {
	consul   *api.Client
	locks    lockbrokerv1.LockServiceClient
	sessions lockbrokerv1.SessionServiceClient
}

// quietTB drops log lines: the broker's zaptest logger would otherwise
// call f.Logf from inside the fuzz target, which testing forbids. Panics
// and unknown errors still reach the client as INTERNAL, which fails the
// input.
type quietTB struct{ testing.TB }

func (quietTB) Logf(string, ...any) {}
func (quietTB) Log(...any)          {}

func newFixture(f *testing.F) *fixture {
	agent := consultest.Start(f)
	r := brokertest.Start(quietTB{f}, agent)
	conn := r.Conn(f)
	return &fixture{consul: agent.Client(), locks: lockbrokerv1.NewLockServiceClient(conn),
		sessions: lockbrokerv1.NewSessionServiceClient(conn)}
}

// writeIndex is where Consul's KV and session tables stand: a request
// that writes to Consul moves one of them.
func (fx *fixture) writeIndex(t *testing.T) (uint64, uint64) {
	t.Helper()
	q := &api.QueryOptions{RequireConsistent: true}
	_, kv, err := fx.consul.KV().Keys("", "", q)
	if err != nil {
		t.Fatalf("consul kv index: %v", err)
	}
	_, ss, err := fx.consul.Session().List(q)
	if err != nil {
		t.Fatalf("consul session index: %v", err)
	}
	return kv.LastIndex, ss.LastIndex
}

// settle waits until the indexes stop moving (an accepted request's
// cleanup, such as destroying its session, finishes after the call).
func (fx *fixture) settle(t *testing.T) {
	kv, ss := fx.writeIndex(t)
	for range 30 {
		time.Sleep(100 * time.Millisecond)
		kv2, ss2 := fx.writeIndex(t)
		if kv2 == kv && ss2 == ss {
			return
		}
		kv, ss = kv2, ss2
	}
}

// requestKinds are the request messages fuzzed, by the selector byte.
var requestKinds = []string{
	"Acquire", "Release", "Watch", "GetLock", "SetValue", "CheckSequencer", "TryAcquire",
	"CreateSession", "RenewSession", "DestroySession", "GetSession", "ListSessions",
}

// call decodes data into request kind k and sends it; it returns the
// status (nil for success) or false when data is not a valid encoding.
func (fx *fixture) call(k int, data []byte) (error, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	unmarshal := func(m proto.Message) bool { return proto.Unmarshal(data, m) == nil }
	switch requestKinds[k] {
	case "Acquire":
		var m lockbrokerv1.AcquireRequest
		if !unmarshal(&m) {
			return nil, false
		}
		return firstEvent(fx.locks.Acquire(ctx, &m)), true
	case "Watch":
		var m lockbrokerv1.WatchRequest
		if !unmarshal(&m) {
			return nil, false
		}
		return firstEvent(fx.locks.Watch(ctx, &m)), true
	case "Release":
		var m lockbrokerv1.ReleaseRequest
		if !unmarshal(&m) {
			return nil, false
		}
		_, err := fx.locks.Release(ctx, &m)
		return err, true
	case "GetLock":
		var m lockbrokerv1.GetLockRequest
		if !unmarshal(&m) {
			return nil, false
		}
		_, err := fx.locks.GetLock(ctx, &m)
		return err, true
	case "SetValue":
		var m lockbrokerv1.SetValueRequest
		if !unmarshal(&m) {
			return nil, false
		}
		_, err := fx.locks.SetValue(ctx, &m)
		return err, true
	case "CheckSequencer":
		var m lockbrokerv1.CheckSequencerRequest
		if !unmarshal(&m) {
			return nil, false
		}
		_, err := fx.locks.CheckSequencer(ctx, &m)
		return err, true
	case "TryAcquire":
		var m lockbrokerv1.TryAcquireRequest
		if !unmarshal(&m) {
			return nil, false
		}
		_, err := fx.locks.TryAcquire(ctx, &m)
		return err, true
	case "CreateSession":
		var m lockbrokerv1.CreateSessionRequest
		if !unmarshal(&m) {
			return nil, false
		}
		resp, err := fx.sessions.CreateSession(ctx, &m)
		if err == nil { // do not leave it behind
			_, _ = fx.sessions.DestroySession(ctx, &lockbrokerv1.DestroySessionRequest{SessionId: resp.GetSession().GetId()})
		}
		return err, true
	case "RenewSession":
		var m lockbrokerv1.RenewSessionRequest
		if !unmarshal(&m) {
			return nil, false
		}
		_, err := fx.sessions.RenewSession(ctx, &m)
		return err, true
	case "DestroySession":
		var m lockbrokerv1.DestroySessionRequest
		if !unmarshal(&m) {
			return nil, false
		}
		_, err := fx.sessions.DestroySession(ctx, &m)
		return err, true
	case "GetSession":
		var m lockbrokerv1.GetSessionRequest
		if !unmarshal(&m) {
			return nil, false
		}
		_, err := fx.sessions.GetSession(ctx, &m)
		return err, true
	default:
		var m lockbrokerv1.ListSessionsRequest
		if !unmarshal(&m) {
			return nil, false
		}
		_, err := fx.sessions.ListSessions(ctx, &m)
		return err, true
	}
}

// firstEvent reads a stream's first message (then the call's context ends
// it): the error, or nil once something arrived.
func firstEvent[T any](stream grpc.ServerStreamingClient[T], err error) error {
	if err != nil {
		return err
	}
	_, err = stream.Recv()
	return err
}

// namedField returns the field an INVALID_ARGUMENT names: from a
// google.rpc.BadRequest (what DESIGN.md asks for) or, failing that, from
// protovalidate's buf.validate.Violations.
func namedField(st *status.Status) (string, string) {
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.BadRequest:
			for _, v := range d.GetFieldViolations() {
				if v.GetField() != "" {
					return v.GetField(), "BadRequest"
				}
			}
		case *validate.Violations:
			for _, v := range d.GetViolations() {
				if len(v.GetField().GetElements()) > 0 {
					return v.GetField().GetElements()[0].GetFieldName(), "buf.validate.Violations"
				}
			}
		}
	}
	return "", ""
}

// FuzzRequests decodes arbitrary bytes into every request message and
// sends it through the real gRPC server and its interceptors: no panic,
// no INTERNAL or UNKNOWN, every INVALID_ARGUMENT names a field, and a
// rejected request writes nothing to Consul (its KV and session indexes
// do not move).
func FuzzRequests(f *testing.F) {
	for _, s := range requestSeeds() {
		f.Add(s.kind, s.data)
	}
	fx := newFixture(f)
	f.Fuzz(func(t *testing.T, kind uint8, data []byte) {
		k := int(kind) % len(requestKinds)
		kv0, ss0 := fx.writeIndex(t)
		err, ok := fx.call(k, data)
		if !ok {
			return // not a valid encoding of the message
		}
		st := status.Convert(err)
		switch st.Code() {
		case codes.Internal, codes.Unknown:
			t.Fatalf("%s: %s: %s (no request may end in INTERNAL or UNKNOWN)", requestKinds[k], st.Code(), st.Message())
		case codes.Unimplemented:
			return // an RPC the server does not implement yet
		case codes.InvalidArgument:
			field, from := namedField(st)
			if field == "" {
				t.Fatalf("%s: INVALID_ARGUMENT names no field: %q details %v", requestKinds[k], st.Message(), st.Details())
			}
			_ = from
			kv1, ss1 := fx.writeIndex(t)
			if kv1 == kv0 && ss1 == ss0 {
				return
			}
			// Something else may have written (an earlier request's
			// cleanup): settle and try the same input again.
			fx.settle(t)
			kv0, ss0 = fx.writeIndex(t)
			err, _ = fx.call(k, data)
			kv1, ss1 = fx.writeIndex(t)
			if status.Code(err) == codes.InvalidArgument && (kv1 != kv0 || ss1 != ss0) {
				t.Fatalf("%s rejected (%s) but Consul was written: kv index %d→%d, session index %d→%d",
					requestKinds[k], status.Convert(err).Message(), kv0, kv1, ss0, ss1)
			}
		default:
			if st.Code() == codes.OK {
				fx.settle(t)
			}
		}
	})
}

type requestSeed struct {
	kind uint8
	data []byte
}

// requestSeeds are valid and invalid requests of every kind.
func requestSeeds() []requestSeed {
	idx := func(name string) uint8 {
		for i, k := range requestKinds {
			if k == name {
				return uint8(i)
			}
		}
		panic(name)
	}
	enc := func(m proto.Message) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			panic(err)
		}
		return b
	}
	uuid := "6f0c2a1e-3b4d-4c5e-8f9a-0b1c2d3e4f50"
	var out []requestSeed
	add := func(kind string, m proto.Message) { out = append(out, requestSeed{idx(kind), enc(m)}) }
	for _, key := range []string{"fuzz/ok", "", "/lead", "a//b", "a/./b", "a/../b", "ctl\x01", strings.Repeat("k", 513), "k\u2028", "k\u200b", "é/ü"} {
		add("Acquire", &lockbrokerv1.AcquireRequest{Key: key, WaitTimeout: durationpb.New(0)})
		add("Watch", &lockbrokerv1.WatchRequest{Key: key})
		add("GetLock", &lockbrokerv1.GetLockRequest{Key: key})
		add("Release", &lockbrokerv1.ReleaseRequest{Key: key, SessionId: uuid})
	}
	add("Acquire", &lockbrokerv1.AcquireRequest{Key: "fuzz/ttl", WaitTimeout: durationpb.New(0),
		Session: &lockbrokerv1.AcquireRequest_NewSession{NewSession: &lockbrokerv1.SessionOptions{Ttl: durationpb.New(time.Second)}}})
	add("Acquire", &lockbrokerv1.AcquireRequest{Key: "fuzz/delay", WaitTimeout: durationpb.New(0),
		Session: &lockbrokerv1.AcquireRequest_NewSession{NewSession: &lockbrokerv1.SessionOptions{LockDelay: durationpb.New(time.Hour)}}})
	add("Acquire", &lockbrokerv1.AcquireRequest{Key: "fuzz/limit", Limit: 5000, WaitTimeout: durationpb.New(0)})
	add("Acquire", &lockbrokerv1.AcquireRequest{Key: "fuzz/value", Value: make([]byte, 600<<10), WaitTimeout: durationpb.New(0)})
	add("Acquire", &lockbrokerv1.AcquireRequest{Key: "fuzz/wait", WaitTimeout: durationpb.New(-time.Second)})
	add("Acquire", &lockbrokerv1.AcquireRequest{Key: "fuzz/sid", Session: &lockbrokerv1.AcquireRequest_SessionId{SessionId: "not-a-uuid"}})
	add("Acquire", &lockbrokerv1.AcquireRequest{Key: "fuzz/resume", Session: &lockbrokerv1.AcquireRequest_Resume{
		Resume: &lockbrokerv1.Sequencer{Key: "other", SessionId: uuid, Token: 7}}})
	add("Acquire", &lockbrokerv1.AcquireRequest{Key: "fuzz/kind", Kind: lockbrokerv1.AcquireKind(99)})
	// Multi-key locks (AcquireRequest.keys): a valid one, and each refusal.
	add("Acquire", &lockbrokerv1.AcquireRequest{Key: "fuzz/m1", Keys: []string{"fuzz/m2", "other/m3"}, WaitTimeout: durationpb.New(0)})
	add("Acquire", &lockbrokerv1.AcquireRequest{Key: "fuzz/m1", Keys: []string{"fuzz/m2", "fuzz/m2"}, WaitTimeout: durationpb.New(0)})
	add("Acquire", &lockbrokerv1.AcquireRequest{Key: "fuzz/m1", Keys: []string{"fuzz/m1"}, WaitTimeout: durationpb.New(0)})
	add("Acquire", &lockbrokerv1.AcquireRequest{Key: "fuzz/m1", Keys: []string{"a//b", ""}, WaitTimeout: durationpb.New(0)})
	add("Acquire", &lockbrokerv1.AcquireRequest{Key: "fuzz/m1", Keys: []string{"fuzz/m2"}, Limit: 3, WaitTimeout: durationpb.New(0)})
	add("Acquire", &lockbrokerv1.AcquireRequest{Key: "fuzz/m1", Keys: []string{"fuzz/m2"}, Kind: lockbrokerv1.AcquireKind_ACQUIRE_KIND_READ, WaitTimeout: durationpb.New(0)})
	add("Acquire", &lockbrokerv1.AcquireRequest{Key: "fuzz/m1", Keys: []string{"fuzz/m2"}, Value: make([]byte, 200<<10), WaitTimeout: durationpb.New(0)})
	add("Acquire", &lockbrokerv1.AcquireRequest{Key: "fuzz/m1", Keys: []string{"fuzz/m2"}, Session: &lockbrokerv1.AcquireRequest_Resume{
		Resume: &lockbrokerv1.Sequencer{Key: "fuzz/m1", SessionId: uuid, Token: 7}}})
	many := make([]string, 64)
	for i := range many {
		many[i] = fmt.Sprintf("fuzz/many/%d", i)
	}
	add("Acquire", &lockbrokerv1.AcquireRequest{Key: "fuzz/many", Keys: many, WaitTimeout: durationpb.New(0)})
	add("Acquire", &lockbrokerv1.AcquireRequest{Key: "fuzz/many", Keys: many[:63], WaitTimeout: durationpb.New(0)})
	add("SetValue", &lockbrokerv1.SetValueRequest{Key: "fuzz/ok", SessionId: uuid, Value: []byte("v")})
	add("CheckSequencer", &lockbrokerv1.CheckSequencerRequest{})
	add("CheckSequencer", &lockbrokerv1.CheckSequencerRequest{Sequencer: &lockbrokerv1.Sequencer{Key: "fuzz/ok", SessionId: uuid, Token: 1}})
	add("TryAcquire", &lockbrokerv1.TryAcquireRequest{Key: "fuzz/try"})
	add("CreateSession", &lockbrokerv1.CreateSessionRequest{Options: &lockbrokerv1.SessionOptions{Ttl: durationpb.New(30 * time.Second)}})
	add("CreateSession", &lockbrokerv1.CreateSessionRequest{Options: &lockbrokerv1.SessionOptions{Checks: []string{""}}})
	add("CreateSession", &lockbrokerv1.CreateSessionRequest{Options: &lockbrokerv1.SessionOptions{Behavior: 7}})
	add("RenewSession", &lockbrokerv1.RenewSessionRequest{SessionId: "x"})
	add("DestroySession", &lockbrokerv1.DestroySessionRequest{SessionId: uuid})
	add("GetSession", &lockbrokerv1.GetSessionRequest{})
	add("ListSessions", &lockbrokerv1.ListSessionsRequest{})
	out = append(out, requestSeed{0, []byte{0xff, 0xff, 0xff}}, requestSeed{3, []byte{0x0a, 0x02, '/', '/'}})
	return out
}

// semSeq makes each input's semaphore prefix unique.
var semSeq atomic.Int64

// semaphoreFlags is Consul's api.Semaphore flag value (SemaphoreFlagValue).
const semaphoreFlags = 0xe0f69a2baa414de0

// semLockBody is how Consul's api.Semaphore decodes `.lock`.
type semLockBody struct {
	Limit   int             `json:"Limit"`
	Holders map[string]bool `json:"Holders"`
}

// semaphoreSeeds are `.lock` contents: api.Semaphore's own, other limits,
// wrong types, corrupt JSON.
var semaphoreSeeds = []string{
	`{"Limit":3,"Holders":{}}`, `{"Limit":3,"Holders":null}`, `{"Limit":3}`,
	`{"Limit":2,"Holders":{}}`, `{"Limit":0}`, `{"Limit":-1}`, `{"Limit":100000}`,
	`{"Limit":3,"Holders":{"6f0c2a1e-3b4d-4c5e-8f9a-0b1c2d3e4f50":true}}`,
	`{"Limit":"3"}`, `{"Limit":3.5}`, `{"Limit":3,"Holders":[]}`, `{"Limit":3,"Holders":{"x":"yes"}}`,
	`{"limit":3,"holders":{}}`, `{"Limit":3,"Holders":{},"Extra":1}`, `{"Limit":3}{"Limit":3}`,
	``, `null`, `[]`, `{`, "\x00\xff", `{"Limit":1e400}`,
}

// FuzzSemaphoreLock writes arbitrary contents (foreign, corrupt, other
// limits) as a semaphore's `.lock` in Consul, then takes a slot with limit
// 3 through the gRPC API. The broker must answer with a status, never
// INTERNAL or UNKNOWN; it may grant the slot only when the contents are a
// well-formed limit-3 `.lock` (as api.Semaphore decodes it), must grant
// one when they are, and must not overwrite a `.lock` it refused.
func FuzzSemaphoreLock(f *testing.F) {
	for _, s := range semaphoreSeeds {
		f.Add([]byte(s), true)
	}
	f.Add([]byte(`{"Limit":3,"Holders":{}}`), false)
	fx := newFixture(f)
	f.Fuzz(func(t *testing.T, body []byte, semFlags bool) {
		prefix := fmt.Sprintf("fuzzsem/%d", semSeq.Add(1))
		defer func() { _, _ = fx.consul.KV().DeleteTree(prefix, nil) }()
		flags := uint64(semaphoreFlags)
		if !semFlags {
			flags = 42 // a foreign .lock
		}
		if _, err := fx.consul.KV().Put(&api.KVPair{Key: prefix + "/.lock", Value: body, Flags: flags}, nil); err != nil {
			t.Fatalf("put .lock: %v", err)
		}
		before, _, err := fx.consul.KV().Get(prefix+"/.lock", nil)
		if err != nil || before == nil {
			t.Fatalf("get .lock: %v", err)
		}
		var dec semLockBody
		wellFormed := semFlags && json.Unmarshal(body, &dec) == nil && dec.Limit == 3

		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		stream, err := fx.locks.Acquire(ctx, &lockbrokerv1.AcquireRequest{Key: prefix, Limit: 3, WaitTimeout: durationpb.New(0)})
		var acquired bool
		if err == nil {
			var resp *lockbrokerv1.AcquireResponse
			for {
				if resp, err = stream.Recv(); err != nil || resp.GetAcquired() != nil {
					break
				}
			}
			acquired = err == nil
		}
		st := status.Convert(err)
		switch {
		case st.Code() == codes.Internal || st.Code() == codes.Unknown:
			t.Fatalf(".lock %q: %s: %s", body, st.Code(), st.Message())
		case acquired && !wellFormed:
			t.Fatalf(".lock %q (semaphore flags %v) is not a well-formed limit-3 .lock, yet the broker granted a slot", body, semFlags)
		case !acquired && wellFormed:
			t.Fatalf("well-formed limit-3 .lock %q with no live holder refused: %s: %s", body, st.Code(), st.Message())
		case !acquired:
			after, _, err := fx.consul.KV().Get(prefix+"/.lock", nil)
			if err != nil {
				t.Fatalf("get .lock: %v", err)
			}
			if after == nil || after.ModifyIndex != before.ModifyIndex {
				t.Fatalf(".lock %q refused (%s) but overwritten or deleted by the broker", body, st.Code())
			}
		}
	})
}

// lifecycleModel is the hold lifecycle as internal/broker documents it:
// waiting → held → releasing → ended, releasing back to held when a
// release does not happen, the first decision final, and a loss seen
// during a release deferred until the release is known.
type lifecycleModel struct {
	phase   broker.Phase
	outcome broker.Outcome
	pending *broker.Outcome
}

func (m *lifecycleModel) grant() bool {
	if m.phase != broker.PhaseWaiting {
		return false
	}
	m.phase = broker.PhaseHeld
	return true
}

func (m *lifecycleModel) beginRelease() bool {
	if m.phase != broker.PhaseHeld {
		return false
	}
	m.phase = broker.PhaseReleasing
	return true
}

func (m *lifecycleModel) endRelease(released bool) {
	if m.phase != broker.PhaseReleasing {
		return
	}
	switch {
	case released:
		m.phase, m.outcome = broker.PhaseEnded, broker.Outcome{Kind: broker.OutcomeReleased}
	case m.pending != nil:
		m.phase, m.outcome = broker.PhaseEnded, *m.pending
	default:
		m.phase = broker.PhaseHeld
	}
	m.pending = nil
}

func (m *lifecycleModel) end(o broker.Outcome) bool {
	switch m.phase {
	case broker.PhaseEnded:
		return false
	case broker.PhaseReleasing:
		if m.pending == nil {
			m.pending = &o
		}
		return false
	}
	m.phase, m.outcome = broker.PhaseEnded, o
	return true
}

// outcomeOf draws an outcome from a byte.
func outcomeOf(b byte) broker.Outcome {
	kinds := []broker.OutcomeKind{broker.OutcomeReleased, broker.OutcomeLost, broker.OutcomeResumed,
		broker.OutcomeShutdown, broker.OutcomeCanceled, broker.OutcomeFailed}
	o := broker.Outcome{Kind: kinds[int(b)%len(kinds)]}
	if o.Kind == broker.OutcomeLost {
		o.Reason = broker.LostReason(1 + int(b/8)%7)
	}
	return o
}

// FuzzHoldStateMachine drives broker.Lifecycle (the pure type that decides
// every hold's outcome) with random event orders and compares it, step by
// step, with lifecycleModel: same answers, same phase, same outcome, Done
// closed exactly when the outcome is decided and the outcome final. The
// same events are then replayed from several goroutines at once: exactly
// one outcome, one of those offered.
func FuzzHoldStateMachine(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3})
	f.Add([]byte{0, 1, 4, 9, 3})
	f.Add([]byte{0, 1, 4, 9, 2})
	f.Add([]byte{4, 0, 0, 1, 5, 1, 2})
	f.Add([]byte{0, 1, 3, 1, 4, 17, 4, 2, 2})
	f.Fuzz(func(t *testing.T, events []byte) {
		l := broker.NewLifecycle()
		m := &lifecycleModel{phase: broker.PhaseWaiting}
		for i := 0; i < len(events); i++ {
			op := events[i] % 5
			switch op {
			case 0:
				if got, want := l.Grant(), m.grant(); got != want {
					t.Fatalf("step %d Grant = %v, model %v", i, got, want)
				}
			case 1:
				if got, want := l.BeginRelease(), m.beginRelease(); got != want {
					t.Fatalf("step %d BeginRelease = %v, model %v", i, got, want)
				}
			case 2, 3:
				l.EndRelease(op == 2)
				m.endRelease(op == 2)
			case 4:
				var b byte
				if i+1 < len(events) {
					i++
					b = events[i]
				}
				o := outcomeOf(b)
				if got, want := l.End(o), m.end(o); got != want {
					t.Fatalf("step %d End(%+v) = %v, model %v", i, o, got, want)
				}
			}
			if got := l.Phase(); got != m.phase {
				t.Fatalf("step %d: phase %v, model %v (events %v)", i, got, m.phase, events[:i+1])
			}
			out, ended := l.Outcome()
			if ended != (m.phase == broker.PhaseEnded) || (ended && out != m.outcome) {
				t.Fatalf("step %d: outcome %+v ended %v, model %+v phase %v", i, out, ended, m.outcome, m.phase)
			}
			select {
			case <-l.Done():
				if !ended {
					t.Fatalf("step %d: Done closed before the outcome", i)
				}
			default:
				if ended {
					t.Fatalf("step %d: outcome decided but Done open", i)
				}
			}
		}

		// The same events from four goroutines at once.
		c := broker.NewLifecycle()
		c.Grant()
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Go(func() {
				for i := g; i < len(events); i += 4 {
					switch events[i] % 5 {
					case 0:
						c.Grant()
					case 1:
						c.BeginRelease()
					case 2, 3:
						c.EndRelease(events[i]%5 == 2)
					case 4:
						c.End(outcomeOf(events[i] / 5))
					}
				}
			})
		}
		wg.Wait()
		c.End(broker.Outcome{Kind: broker.OutcomeCanceled}) // decides if nothing did (unless releasing)
		c.EndRelease(false)
		c.End(broker.Outcome{Kind: broker.OutcomeCanceled})
		out, ended := c.Outcome()
		if !ended {
			t.Fatalf("concurrent: no outcome after a final End (phase %v)", c.Phase())
		}
		ok := out.Kind == broker.OutcomeReleased || out == broker.Outcome{Kind: broker.OutcomeCanceled}
		for i := range events {
			if events[i]%5 == 4 && out == outcomeOf(events[i]/5) {
				ok = true
			}
		}
		if !ok {
			t.Fatalf("concurrent: outcome %+v was never offered", out)
		}
	})
}
