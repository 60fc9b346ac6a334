package fuzz

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
)

// acqSeq makes each FuzzAcquireKinds input's keys unique.
var acqSeq atomic.Int64

// badKeys are lock keys the proto refuses (lock_key): empty, a leading
// `/`, empty, `.` or `..` segments, control characters, too long.
var badKeys = []string{"", "/lead", "a//b", "a/./b", "a/../b", "ctl\x01", strings.Repeat("k", 513), "k\u2028", "tail/"} // (invalid UTF-8 cannot be sent by a Go client: FuzzRequests sends raw bytes)

// acquireKinds are the kinds FuzzAcquireKinds picks from by the kind
// byte; the last is not a defined AcquireKind.
var acquireKinds = []lockbrokerv1.AcquireKind{
	lockbrokerv1.AcquireKind_ACQUIRE_KIND_UNSPECIFIED, lockbrokerv1.AcquireKind_ACQUIRE_KIND_LOCK,
	lockbrokerv1.AcquireKind_ACQUIRE_KIND_SEMAPHORE, lockbrokerv1.AcquireKind_ACQUIRE_KIND_READ,
	lockbrokerv1.AcquireKind_ACQUIRE_KIND_WRITE, lockbrokerv1.AcquireKind(7),
}

// acquireCase is one FuzzAcquireKinds input decoded: the request, and the
// fields a refusal may name (none: the request is valid).
type acquireCase struct {
	req    *lockbrokerv1.AcquireRequest
	fields []string
}

// decodeAcquire builds an Acquire request from the fuzzer's bytes. A key
// byte below 0xC0 is a good key of its own (under prefix), any other picks
// a bad key, so whether each rule of AcquireRequest's documentation is
// broken is known exactly, and the fields a refusal may name with it.
func decodeAcquire(prefix string, kind uint8, limit uint32, key uint8, keys []byte) acquireCase {
	pick := func(b byte) (string, bool) {
		if b < 0xC0 {
			return fmt.Sprintf("%s/k%d", prefix, b), true
		}
		return badKeys[int(b)%len(badKeys)], false
	}
	k := acquireKinds[int(kind)%len(acquireKinds)]
	lim := limit % 1100
	c := acquireCase{req: &lockbrokerv1.AcquireRequest{Kind: k, Limit: lim, WaitTimeout: durationpb.New(0)}}
	var ok bool
	c.req.Key, ok = pick(key)
	if !ok {
		c.fields = append(c.fields, "key")
	}
	seen := map[string]bool{c.req.Key: true}
	keysBad := false
	for _, b := range keys[:min(len(keys), 80)] {
		s, ok := pick(b)
		keysBad = keysBad || !ok || seen[s]
		seen[s] = true
		c.req.Keys = append(c.req.Keys, s)
	}
	if len(c.req.Keys) > 63 {
		keysBad = true
	}
	c.req.Value = []byte(fmt.Sprintf("fuzz %d keys=%d", kind, len(c.req.Keys)))
	if lim > 1024 {
		c.fields = append(c.fields, "limit")
	}
	lockKind := k == lockbrokerv1.AcquireKind_ACQUIRE_KIND_UNSPECIFIED || k == lockbrokerv1.AcquireKind_ACQUIRE_KIND_LOCK
	if len(c.req.Keys) > 0 && (!lockKind || lim > 1) {
		keysBad = true // keys are for plain locks only (kind LOCK or UNSPECIFIED, limit 0 or 1)
		c.fields = append(c.fields, "kind", "limit")
	}
	switch k {
	case lockbrokerv1.AcquireKind_ACQUIRE_KIND_UNSPECIFIED, lockbrokerv1.AcquireKind_ACQUIRE_KIND_SEMAPHORE:
	case lockbrokerv1.AcquireKind_ACQUIRE_KIND_LOCK, lockbrokerv1.AcquireKind_ACQUIRE_KIND_READ, lockbrokerv1.AcquireKind_ACQUIRE_KIND_WRITE:
		if lim > 1 {
			c.fields = append(c.fields, "limit", "kind")
		}
	default:
		c.fields = append(c.fields, "kind")
	}
	if keysBad {
		c.fields = append(c.fields, "keys")
	}
	return c
}

// FuzzAcquireKinds fuzzes the fields issue 43 added to AcquireRequest:
// `kind` READ and WRITE (read-write locks) and `keys` (multi-key locks),
// with `limit`, good and bad keys, duplicates, too many keys, and kinds
// they do not go with. Through the real gRPC server: never INTERNAL or
// UNKNOWN; a request that breaks a documented rule is INVALID_ARGUMENT
// naming a field it breaks (`keys` for its keys) and moves neither
// Consul's KV nor its session index; a valid one on fresh keys is
// granted at once, with one sequencer per key in the request's order for
// a multi-key lock and `read` set exactly for a read hold.
func FuzzAcquireKinds(f *testing.F) {
	for _, s := range acquireSeeds {
		f.Add(s.kind, s.limit, s.key, s.keys)
	}
	fx := newFixture(f)
	f.Fuzz(func(t *testing.T, kind uint8, limit uint32, key uint8, keys []byte) {
		prefix := fmt.Sprintf("fuzzacq/%d", acqSeq.Add(1))
		c := decodeAcquire(prefix, kind, limit, key, keys)
		defer func() { _, _ = fx.consul.KV().DeleteTree(prefix, nil) }()
		kv0, ss0 := fx.writeIndex(t)
		acq, err := fx.acquireOnce(c.req)
		st := status.Convert(err)
		desc := fmt.Sprintf("kind %s limit %d key %q keys %q", c.req.GetKind(), c.req.GetLimit(), c.req.GetKey(), c.req.GetKeys())
		switch {
		case st.Code() == codes.Internal || st.Code() == codes.Unknown:
			t.Fatalf("%s: %s: %s (no request may end in INTERNAL or UNKNOWN)", desc, st.Code(), st.Message())
		case len(c.fields) > 0:
			if st.Code() != codes.InvalidArgument {
				t.Fatalf("%s breaks a rule (refusal may name %v) but got %s: %s", desc, c.fields, st.Code(), st.Message())
			}
			field, _ := namedField(st)
			if !slices.ContainsFunc(c.fields, func(f string) bool {
				return field == f || strings.HasPrefix(field, f+"[") || strings.HasPrefix(field, f+".")
			}) {
				t.Fatalf("%s: INVALID_ARGUMENT names %q, not one of the fields it breaks %v: %s", desc, field, c.fields, st.Message())
			}
			if kv1, ss1 := fx.writeIndex(t); kv1 != kv0 || ss1 != ss0 {
				// Something else may have written (an earlier input's
				// cleanup): settle and try the same request again.
				fx.settle(t)
				kv0, ss0 = fx.writeIndex(t)
				_, err = fx.acquireOnce(c.req)
				kv1, ss1 = fx.writeIndex(t)
				if status.Code(err) == codes.InvalidArgument && (kv1 != kv0 || ss1 != ss0) {
					t.Fatalf("%s rejected (%s) but Consul was written: kv index %d→%d, session index %d→%d",
						desc, status.Convert(err).Message(), kv0, kv1, ss0, ss1)
				}
			}
		case err != nil:
			t.Fatalf("%s is valid on fresh keys, yet not granted at once: %s: %s", desc, st.Code(), st.Message())
		default:
			seq := acq.GetSequencer()
			read := c.req.GetKind() == lockbrokerv1.AcquireKind_ACQUIRE_KIND_READ
			if seq.GetKey() != c.req.GetKey() || seq.GetToken() == 0 || seq.GetRead() != read {
				t.Fatalf("%s: acquired sequencer %v (read %v wanted)", desc, seq, read)
			}
			if len(c.req.GetKeys()) == 0 {
				if len(acq.GetSequencers()) > 0 {
					t.Fatalf("%s: single key, yet sequencers %v", desc, acq.GetSequencers())
				}
				break
			}
			want := append([]string{c.req.GetKey()}, c.req.GetKeys()...)
			var got []string
			for _, s := range acq.GetSequencers() {
				got = append(got, s.GetKey())
				if s.GetSessionId() != seq.GetSessionId() || s.GetToken() == 0 {
					t.Fatalf("%s: sequencer %v is not of the grant's session %s", desc, s, seq.GetSessionId())
				}
			}
			if !slices.Equal(got, want) {
				t.Fatalf("%s: acquired sequencers for %q, want one per key in the request's order %q", desc, got, want)
			}
		}
		if err == nil {
			fx.settle(t) // the stream's end releases the keys and destroys the session
		}
	})
}

// acquireOnce sends req and waits for its first decisive event: the
// grant (returned), or the stream's error.
func (fx *fixture) acquireOnce(req *lockbrokerv1.AcquireRequest) (*lockbrokerv1.AcquireAcquired, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stream, err := fx.locks.Acquire(ctx, req)
	if err != nil {
		return nil, err
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			return nil, err
		}
		if a := resp.GetAcquired(); a != nil {
			return a, nil
		}
	}
}

type acquireSeed struct {
	kind  uint8
	limit uint32
	key   uint8
	keys  []byte
}

// acquireSeeds: read, write and multi-key requests, valid and not (kind
// bytes index acquireKinds: 0 unspecified, 1 lock, 2 semaphore, 3 read,
// 4 write, 5 undefined; key bytes ≥ 0xC0 are bad keys).
var acquireSeeds = []acquireSeed{
	{3, 0, 1, nil}, {4, 1, 1, nil}, {3, 2, 1, nil}, {4, 5000, 1, nil}, {3, 0, 0xC1, nil}, {5, 0, 1, nil},
	{0, 0, 1, []byte{2, 3}}, {1, 1, 1, []byte{2, 3, 4, 5}}, {0, 0, 1, []byte{1}}, {0, 0, 1, []byte{2, 2}},
	{0, 0, 1, []byte{2, 0xC3}}, {0, 3, 1, []byte{2}}, {2, 0, 1, []byte{2}}, {3, 0, 1, []byte{2}}, {4, 0, 1, []byte{2}},
	{0, 0, 1, []byte("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+-=")}, // 64 keys
	{0, 0, 1, []byte("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+")},   // 63 more: 64 in all
	{0, 0, 0xC0, []byte{0xC5, 0xC6}},
}
