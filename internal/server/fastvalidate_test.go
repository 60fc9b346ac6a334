package server

import (
	"go/ast"
	"go/parser"
	"go/token"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"buf.build/go/protovalidate"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
)

// hotRequests are the messages fastViolations checks, new for decoding.
var hotRequests = []func() proto.Message{
	func() proto.Message { return &lockbrokerv1.AcquireRequest{} },
	func() proto.Message { return &lockbrokerv1.TryAcquireRequest{} },
	func() proto.Message { return &lockbrokerv1.ReleaseRequest{} },
	func() proto.Message { return &lockbrokerv1.SetValueRequest{} },
}

func newReference(t testing.TB) *validation {
	t.Helper()
	pv, err := protovalidate.New()
	require.NoError(t, err)
	return &validation{validator: pv}
}

// sameVerdict fails unless fastViolations and protovalidate give msg the
// same answer: both nil, or the same status (code, message, ErrorInfo,
// every field violation with its field path, description and rule, in
// the same order).
func sameVerdict(t testing.TB, v *validation, msg proto.Message) {
	t.Helper()
	vs, ok := fastViolations(msg)
	require.True(t, ok, "%T is a hot request", msg)
	fast, ref := fastStatus(vs), v.reference(msg)
	if ref == nil || fast == nil {
		assert.Equal(t, ref == nil, fast == nil, "verdicts differ for %v: fast %v, protovalidate %v", msg, fast, ref)
		return
	}
	fp, rp := status.Convert(fast).Proto(), status.Convert(ref).Proto()
	if !proto.Equal(fp, rp) {
		t.Errorf("status differs for %v:\n fast:          %v\n protovalidate: %v", msg, fp, rp)
	}
}

// TestFastValidationMatchesProtovalidate runs both validators over every
// value of the committed fuzz corpora (test/fuzz/testdata/fuzz/**),
// decoded as each hot request, and over generated edge cases.
func TestFastValidationMatchesProtovalidate(t *testing.T) {
	v := newReference(t)
	inputs := corpusInputs(t)
	require.NotEmpty(t, inputs)
	decoded := 0
	for _, data := range inputs {
		for _, mk := range hotRequests {
			m := mk()
			if proto.Unmarshal(data, m) != nil {
				continue // the codec refuses it before validation
			}
			decoded++
			sameVerdict(t, v, m)
		}
	}
	t.Logf("%d corpus values, %d decoded requests", len(inputs), decoded)
	for _, m := range edgeRequests() {
		sameVerdict(t, v, m)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 3000 {
		sameVerdict(t, v, randomRequest(r))
	}
}

// FuzzFastValidation decodes arbitrary bytes as each hot request and
// compares the two validators.
func FuzzFastValidation(f *testing.F) {
	for _, data := range corpusInputs(f) {
		f.Add(data)
	}
	v := newReference(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, mk := range hotRequests {
			if m := mk(); proto.Unmarshal(data, m) == nil {
				sameVerdict(t, v, m)
			}
		}
	})
}

// corpusInputs are the []byte values of every file of the fuzz corpora.
func corpusInputs(t testing.TB) [][]byte {
	t.Helper()
	files, err := filepath.Glob("../../test/fuzz/testdata/fuzz/*/*")
	require.NoError(t, err)
	var out [][]byte
	for _, name := range files {
		b, err := os.ReadFile(name)
		require.NoError(t, err)
		lines := strings.Split(string(b), "\n")
		require.Equal(t, "go test fuzz v1", lines[0], name)
		for _, line := range lines[1:] {
			if data, ok := bytesLiteral(t, line); ok {
				out = append(out, data)
			}
		}
	}
	return out
}

// bytesLiteral reads a corpus line of the form []byte("...").
func bytesLiteral(t testing.TB, line string) ([]byte, bool) {
	if !strings.HasPrefix(line, "[]byte(") {
		return nil, false
	}
	e, err := parser.ParseExpr(line)
	require.NoError(t, err, line)
	lit, ok := e.(*ast.CallExpr).Args[0].(*ast.BasicLit)
	require.True(t, ok && lit.Kind == token.STRING, line)
	s, err := strconv.Unquote(lit.Value)
	require.NoError(t, err, line)
	return []byte(s), true
}

const uuid0 = "6f0c2a1e-3b4d-4c5e-8f9a-0b1c2d3e4f50"

var (
	edgeKeys = []string{"a", "fuzz/ok", "", "/", "//", "/lead", "a/", "a//b", ".", "..", "...", "./a", "a/.", "a/./b", "a/../b",
		"a/.../b", ".a/b.", "a/.b", "ctl\x01", "del\x7f", "tab\t", "\x00", "k\u2028", "é/ü", "zero\u200bwidth", "nb\u00a0sp", "pua\ue000", "unassigned\U000e0080", "bom\ufeff", "emoji😀/ok", "ctl\x01\u200b", strings.Repeat("k", 512),
		strings.Repeat("k", 513), strings.Repeat("é", 256), strings.Repeat("é", 257), "/" + strings.Repeat("k", 600) + "/./\x01"}
	edgeUUIDs = []string{"", uuid0, strings.ToUpper(uuid0), "not-a-uuid", uuid0 + "0", uuid0[:35], "6f0c2a1e_3b4d-4c5e-8f9a-0b1c2d3e4f50",
		"6f0c2a1e-3b4d-4c5e-8f9a-0b1c2d3e4f5g", "6f0c2a1e3b4d4c5e8f9a0b1c2d3e4f50", "6f0c2a1e-3b4d-4c5e-8f9a-0b1c2d3e4f5é"}
	edgeDurations = []*durationpb.Duration{nil, {}, {Seconds: -1}, {Nanos: -1}, {Seconds: 9}, {Seconds: 9, Nanos: 999999999}, {Seconds: 10},
		{Seconds: 60}, {Seconds: 60, Nanos: 1}, {Seconds: 86400}, {Seconds: 86400, Nanos: 1}, {Seconds: 86401},
		{Seconds: math.MaxInt64}, {Seconds: math.MinInt64}, {Seconds: 315576000001}, {Seconds: 1, Nanos: -1}, {Seconds: -1, Nanos: 1},
		{Nanos: 2e9}, {Seconds: 5, Nanos: math.MaxInt32}, {Seconds: 20, Nanos: math.MinInt32}, durationpb.New(time.Hour)}
	edgeValues = [][]byte{nil, {}, []byte("v"), make([]byte, 262144), make([]byte, 262145)}
	edgeLimits = []uint32{0, 1, 1024, 1025, math.MaxUint32}
	edgeChecks = [][]string{nil, {}, {""}, {"serfHealth"}, {strings.Repeat("é", 256)}, {strings.Repeat("é", 257)},
		{"a", "", strings.Repeat("x", 300)}, make([]string, 16), make([]string, 17), strings.Split(strings.Repeat("c,", 20), ",")}
	edgeNames = []string{"", "n", strings.Repeat("n", 128), strings.Repeat("n", 129), strings.Repeat("é", 64), strings.Repeat("é", 65)}
)

// edgeRequests covers each rule on its own, at and around its bounds.
func edgeRequests() []proto.Message {
	var out []proto.Message
	for _, k := range edgeKeys {
		out = append(out, &lockbrokerv1.AcquireRequest{Key: k}, &lockbrokerv1.ReleaseRequest{Key: k, SessionId: uuid0},
			&lockbrokerv1.TryAcquireRequest{Key: k, SessionId: uuid0}, &lockbrokerv1.SetValueRequest{Key: k, SessionId: uuid0},
			&lockbrokerv1.AcquireRequest{Key: "ok", Session: &lockbrokerv1.AcquireRequest_Resume{Resume: &lockbrokerv1.Sequencer{Key: k, SessionId: uuid0}}})
	}
	for _, id := range edgeUUIDs {
		out = append(out, &lockbrokerv1.ReleaseRequest{Key: "k", SessionId: id}, &lockbrokerv1.SetValueRequest{Key: "k", SessionId: id},
			&lockbrokerv1.TryAcquireRequest{Key: "k", SessionId: id}, &lockbrokerv1.AcquireRequest{Key: "k", Session: &lockbrokerv1.AcquireRequest_SessionId{SessionId: id}},
			&lockbrokerv1.AcquireRequest{Key: "k", Session: &lockbrokerv1.AcquireRequest_Resume{Resume: &lockbrokerv1.Sequencer{Key: "k", SessionId: id}}})
	}
	for _, d := range edgeDurations {
		out = append(out, &lockbrokerv1.AcquireRequest{Key: "k", WaitTimeout: d},
			&lockbrokerv1.AcquireRequest{Key: "k", Session: &lockbrokerv1.AcquireRequest_NewSession{NewSession: &lockbrokerv1.SessionOptions{Ttl: d}}},
			&lockbrokerv1.AcquireRequest{Key: "k", Session: &lockbrokerv1.AcquireRequest_NewSession{NewSession: &lockbrokerv1.SessionOptions{LockDelay: d}}})
	}
	for _, b := range edgeValues {
		out = append(out, &lockbrokerv1.AcquireRequest{Key: "k", Value: b}, &lockbrokerv1.TryAcquireRequest{Key: "k", SessionId: uuid0, Value: b},
			&lockbrokerv1.SetValueRequest{Key: "k", SessionId: uuid0, Value: b})
	}
	for _, l := range edgeLimits {
		out = append(out, &lockbrokerv1.AcquireRequest{Key: "k", Limit: l}, &lockbrokerv1.TryAcquireRequest{Key: "k", SessionId: uuid0, Limit: l})
	}
	for _, k := range []int32{-1, 0, 1, 2, 3, 99} {
		out = append(out, &lockbrokerv1.AcquireRequest{Key: "k", Kind: lockbrokerv1.AcquireKind(k)},
			&lockbrokerv1.TryAcquireRequest{Key: "k", SessionId: uuid0, Kind: lockbrokerv1.AcquireKind(k)},
			&lockbrokerv1.AcquireRequest{Key: "k", Session: &lockbrokerv1.AcquireRequest_NewSession{NewSession: &lockbrokerv1.SessionOptions{Behavior: lockbrokerv1.SessionBehavior(k)}}})
	}
	for _, c := range edgeChecks {
		out = append(out, &lockbrokerv1.AcquireRequest{Key: "k", Session: &lockbrokerv1.AcquireRequest_NewSession{NewSession: &lockbrokerv1.SessionOptions{Checks: c}}})
	}
	for _, n := range edgeNames {
		out = append(out, &lockbrokerv1.AcquireRequest{Key: "k", Session: &lockbrokerv1.AcquireRequest_NewSession{NewSession: &lockbrokerv1.SessionOptions{Name: n}}})
	}
	return out
}

// randomRequest mixes edge values, several broken rules at once.
func randomRequest(r *rand.Rand) proto.Message {
	pick := func(n int) int { return r.IntN(n) }
	key, id := edgeKeys[pick(len(edgeKeys))], edgeUUIDs[pick(len(edgeUUIDs))]
	val, limit := edgeValues[pick(len(edgeValues))], edgeLimits[pick(len(edgeLimits))]
	kind := lockbrokerv1.AcquireKind(pick(5) - 1)
	switch pick(4) {
	case 0:
		return &lockbrokerv1.ReleaseRequest{Key: key, SessionId: id, Token: r.Uint64()}
	case 1:
		return &lockbrokerv1.SetValueRequest{Key: key, SessionId: id, Value: val}
	case 2:
		return &lockbrokerv1.TryAcquireRequest{Key: key, SessionId: id, Value: val, Limit: limit, Kind: kind}
	}
	m := &lockbrokerv1.AcquireRequest{Key: key, Value: val, Limit: limit, Kind: kind, Fair: pick(2) == 0,
		WaitTimeout: edgeDurations[pick(len(edgeDurations))]}
	switch pick(4) {
	case 1:
		m.Session = &lockbrokerv1.AcquireRequest_SessionId{SessionId: id}
	case 2:
		m.Session = &lockbrokerv1.AcquireRequest_Resume{Resume: &lockbrokerv1.Sequencer{Key: edgeKeys[pick(len(edgeKeys))], SessionId: id}}
	case 3:
		m.Session = &lockbrokerv1.AcquireRequest_NewSession{NewSession: &lockbrokerv1.SessionOptions{
			Ttl: edgeDurations[pick(len(edgeDurations))], LockDelay: edgeDurations[pick(len(edgeDurations))],
			Behavior: lockbrokerv1.SessionBehavior(pick(5) - 1), Checks: edgeChecks[pick(len(edgeChecks))], Name: edgeNames[pick(len(edgeNames))]}}
	}
	return m
}

// TestFastValidationAllocatesNothingWhenValid: the critical path's valid
// requests cost no allocation to check.
func TestFastValidationAllocatesNothingWhenValid(t *testing.T) {
	v := newReference(t)
	v.codec = newRequestCodec()
	reqs := []proto.Message{
		&lockbrokerv1.AcquireRequest{Key: "a/b", Value: []byte("v"), WaitTimeout: durationpb.New(time.Second),
			Session: &lockbrokerv1.AcquireRequest_NewSession{NewSession: &lockbrokerv1.SessionOptions{Ttl: durationpb.New(15 * time.Second), Checks: []string{"c"}, Name: "n"}}},
		&lockbrokerv1.AcquireRequest{Key: "a/b", Session: &lockbrokerv1.AcquireRequest_Resume{Resume: &lockbrokerv1.Sequencer{Key: "a/b", SessionId: uuid0}}},
		&lockbrokerv1.ReleaseRequest{Key: "a/b", SessionId: uuid0, Token: 3},
		&lockbrokerv1.TryAcquireRequest{Key: "a/b", SessionId: uuid0},
		&lockbrokerv1.SetValueRequest{Key: "a/b", SessionId: uuid0},
	}
	for _, m := range reqs {
		assert.Zero(t, testing.AllocsPerRun(100, func() { require.NoError(t, v.check(m)) }), "%T", m)
	}
}

// BenchmarkValidation compares the two validators on a valid Acquire.
func BenchmarkValidation(b *testing.B) {
	v := newReference(b)
	m := &lockbrokerv1.AcquireRequest{Key: "bench/cycle/broker", WaitTimeout: durationpb.New(time.Minute)}
	b.Run("fast", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if vs, _ := fastViolations(m); fastStatus(vs) != nil {
				b.Fatal("invalid")
			}
		}
	})
	b.Run("protovalidate", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if v.reference(m) != nil {
				b.Fatal("invalid")
			}
		}
	})
}
