package e2e

import (
	"context"
	"crypto/rand"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/brokertest"
	"github.com/lockbroker/lockbroker/internal/consultest"
)

// TestLockBadRequests sends requests the broker must refuse and checks the
// status, that the message names the field, and that nothing in Consul
// changed (KV store and sessions).
func TestLockBadRequests(t *testing.T) {
	agent := consultest.Start(t)
	r := brokertest.Start(t, agent)
	locks, sessions := r.Locks(t), r.Sessions(t)
	cc := agent.Client()

	// held is a key held by a client-owned session; other is a live session
	// that holds nothing.
	const held = "bad/held"
	newSession := func() string {
		resp, err := sessions.CreateSession(lkCtx(t), &lockbrokerv1.CreateSessionRequest{Options: &lockbrokerv1.SessionOptions{Ttl: dur(time.Hour)}})
		require.NoError(t, err)
		return resp.GetSession().GetId()
	}
	holderSession, otherSession := newSession(), newSession()
	h := acquire(t, locks, &lockbrokerv1.AcquireRequest{Key: held, Value: []byte("holder"), Session: &lockbrokerv1.AcquireRequest_SessionId{SessionId: holderSession}})
	h.acquired(5 * time.Second)
	h.cancel() // a client-owned hold outlives its stream
	assert.Equal(t, codes.Canceled, status.Code(h.end(5*time.Second)))
	unknownSession := lkUUID(t)

	newSess := func(o *lockbrokerv1.SessionOptions) *lockbrokerv1.AcquireRequest_NewSession {
		return &lockbrokerv1.AcquireRequest_NewSession{NewSession: o}
	}
	acquireCall := func(req *lockbrokerv1.AcquireRequest) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			s, err := locks.Acquire(ctx, req)
			if err != nil {
				return err
			}
			for {
				resp, err := s.Recv()
				if err != nil {
					return err
				}
				if resp.GetAcquired() != nil {
					return nil // granted: the case failed; cancelling ctx releases it
				}
			}
		}
	}
	key := func(k string) func(ctx context.Context) error {
		return acquireCall(&lockbrokerv1.AcquireRequest{Key: k, WaitTimeout: dur(0), Session: fast()})
	}
	opts := func(o *lockbrokerv1.SessionOptions) func(ctx context.Context) error {
		return acquireCall(&lockbrokerv1.AcquireRequest{Key: "bad/opts", WaitTimeout: dur(0), Session: newSess(o)})
	}

	tests := []struct {
		name  string
		call  func(ctx context.Context) error
		code  codes.Code
		field string // the message must name it (validation: "field:")
	}{
		{name: "empty key", call: key(""), code: codes.InvalidArgument, field: "key:"},
		{name: "leading slash", call: key("/a"), code: codes.InvalidArgument, field: "key:"},
		{name: "empty segment", call: key("a//b"), code: codes.InvalidArgument, field: "key:"},
		{name: "trailing slash", call: key("a/"), code: codes.InvalidArgument, field: "key:"},
		{name: "dot-dot segment", call: key("a/../b"), code: codes.InvalidArgument, field: "key:"},
		{name: "dot segment", call: key("a/./b"), code: codes.InvalidArgument, field: "key:"},
		{name: "600-byte key", call: key(strings.Repeat("k", 600)), code: codes.InvalidArgument, field: "key:"},
		{name: "control character", call: key("a\x01b"), code: codes.InvalidArgument, field: "key:"},
		{name: "newline", call: key("a\nb"), code: codes.InvalidArgument, field: "key:"},
		{name: "DEL character", call: key("a\x7fb"), code: codes.InvalidArgument, field: "key:"},
		{name: "ttl 1s", call: opts(&lockbrokerv1.SessionOptions{Ttl: dur(time.Second)}), code: codes.InvalidArgument, field: "new_session.ttl:"},
		{name: "ttl 48h", call: opts(&lockbrokerv1.SessionOptions{Ttl: dur(48 * time.Hour)}), code: codes.InvalidArgument, field: "new_session.ttl:"},
		{name: "lock-delay 90s", call: opts(&lockbrokerv1.SessionOptions{LockDelay: dur(90 * time.Second)}), code: codes.InvalidArgument, field: "new_session.lock_delay:"},
		{name: "negative lock-delay", call: opts(&lockbrokerv1.SessionOptions{LockDelay: dur(-time.Second)}), code: codes.InvalidArgument, field: "new_session.lock_delay:"},
		{name: "undefined behavior", call: opts(&lockbrokerv1.SessionOptions{Behavior: 7}), code: codes.InvalidArgument, field: "new_session.behavior:"},
		{
			name: "1 MiB value",
			call: acquireCall(&lockbrokerv1.AcquireRequest{Key: "bad/value", Value: make([]byte, 1<<20), WaitTimeout: dur(0), Session: fast()}),
			code: codes.InvalidArgument, field: "value:",
		},
		{
			name: "limit 5000",
			call: acquireCall(&lockbrokerv1.AcquireRequest{Key: "bad/limit", Limit: 5000, WaitTimeout: dur(0), Session: fast()}),
			code: codes.InvalidArgument, field: "limit:",
		},
		{
			name: "negative wait timeout",
			call: acquireCall(&lockbrokerv1.AcquireRequest{Key: "bad/wait", WaitTimeout: dur(-time.Second), Session: fast()}),
			code: codes.InvalidArgument, field: "wait_timeout:",
		},
		{
			name: "session_id not a UUID",
			call: acquireCall(&lockbrokerv1.AcquireRequest{Key: "bad/session", WaitTimeout: dur(0), Session: &lockbrokerv1.AcquireRequest_SessionId{SessionId: "nope"}}),
			code: codes.InvalidArgument, field: "session_id:",
		},
		{
			name: "acquire with an unknown session",
			call: acquireCall(&lockbrokerv1.AcquireRequest{Key: "bad/session", WaitTimeout: dur(0), Session: &lockbrokerv1.AcquireRequest_SessionId{SessionId: unknownSession}}),
			code: codes.NotFound, field: unknownSession,
		},
		{
			name: "resume of another key",
			call: acquireCall(&lockbrokerv1.AcquireRequest{Key: "bad/other", Session: &lockbrokerv1.AcquireRequest_Resume{Resume: &lockbrokerv1.Sequencer{
				Key: held, SessionId: holderSession, LockIndex: 1, Token: 1, Kind: lockbrokerv1.LockKind_LOCK_KIND_LOCK,
			}}}),
			code: codes.InvalidArgument, field: "resume",
		},
		{
			name: "release with an unknown session",
			call: func(ctx context.Context) error {
				_, err := locks.Release(ctx, &lockbrokerv1.ReleaseRequest{Key: held, SessionId: unknownSession})
				return err
			},
			code: codes.NotFound, field: unknownSession,
		},
		{
			name: "release by a session that does not hold the key",
			call: func(ctx context.Context) error {
				_, err := locks.Release(ctx, &lockbrokerv1.ReleaseRequest{Key: held, SessionId: otherSession})
				return err
			},
			code: codes.FailedPrecondition, field: otherSession,
		},
		{
			name: "release of a key nobody locked",
			call: func(ctx context.Context) error {
				_, err := locks.Release(ctx, &lockbrokerv1.ReleaseRequest{Key: "bad/free", SessionId: otherSession})
				return err
			},
			code: codes.FailedPrecondition, field: otherSession,
		},
		{
			name: "release with a bad key",
			call: func(ctx context.Context) error {
				_, err := locks.Release(ctx, &lockbrokerv1.ReleaseRequest{Key: "a//b", SessionId: holderSession})
				return err
			},
			code: codes.InvalidArgument, field: "key:",
		},
		{
			name: "release with session_id not a UUID",
			call: func(ctx context.Context) error {
				_, err := locks.Release(ctx, &lockbrokerv1.ReleaseRequest{Key: held, SessionId: "nope"})
				return err
			},
			code: codes.InvalidArgument, field: "session_id:",
		},
		{
			name: "set value by a non-holder",
			call: func(ctx context.Context) error {
				_, err := locks.SetValue(ctx, &lockbrokerv1.SetValueRequest{Key: held, SessionId: otherSession, Value: []byte("mine")})
				return err
			},
			code: codes.FailedPrecondition, field: otherSession,
		},
		{
			name: "set value with an unknown session",
			call: func(ctx context.Context) error {
				_, err := locks.SetValue(ctx, &lockbrokerv1.SetValueRequest{Key: held, SessionId: unknownSession, Value: []byte("mine")})
				return err
			},
			code: codes.NotFound, field: unknownSession,
		},
		{
			name: "set value of 1 MiB",
			call: func(ctx context.Context) error {
				_, err := locks.SetValue(ctx, &lockbrokerv1.SetValueRequest{Key: held, SessionId: holderSession, Value: make([]byte, 1<<20)})
				return err
			},
			code: codes.InvalidArgument, field: "value:",
		},
		{
			name: "create session with ttl 1s",
			call: func(ctx context.Context) error {
				_, err := sessions.CreateSession(ctx, &lockbrokerv1.CreateSessionRequest{Options: &lockbrokerv1.SessionOptions{Ttl: dur(time.Second)}})
				return err
			},
			code: codes.InvalidArgument, field: "options.ttl:",
		},
		{
			name: "create session with lock-delay 90s",
			call: func(ctx context.Context) error {
				_, err := sessions.CreateSession(ctx, &lockbrokerv1.CreateSessionRequest{Options: &lockbrokerv1.SessionOptions{LockDelay: dur(90 * time.Second)}})
				return err
			},
			code: codes.InvalidArgument, field: "options.lock_delay:",
		},
		{
			name: "watch a bad key",
			call: func(ctx context.Context) error {
				w, err := locks.Watch(ctx, &lockbrokerv1.WatchRequest{Key: "a/../b"})
				if err != nil {
					return err
				}
				_, err = w.Recv()
				return err
			},
			code: codes.InvalidArgument, field: "key:",
		},
		{
			name: "get a bad key",
			call: func(ctx context.Context) error {
				_, err := locks.GetLock(ctx, &lockbrokerv1.GetLockRequest{Key: "/a"})
				return err
			},
			code: codes.InvalidArgument, field: "key:",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := lkConsulState(t, cc)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := tt.call(ctx)
			cancel()
			require.Error(t, err, "the request was accepted")
			t.Logf("%s: %s", status.Code(err), status.Convert(err).Message())
			assert.Equal(t, tt.code, status.Code(err), "%v", err)
			assert.Contains(t, status.Convert(err).Message(), tt.field)
			after := lkConsulState(t, cc)
			assert.Equal(t, before.KV, after.KV, "Consul's KV store changed")
			assert.Equal(t, before.Sessions, after.Sessions, "Consul's sessions changed")
		})
	}

	// The holder's hold survived all of it.
	st := lkGetLock(t, locks, held)
	assert.Equal(t, holderSession, lkHolder(t, st).GetSessionId())
	assert.Equal(t, []byte("holder"), lkHolder(t, st).GetValue())
}

// lkUUID is a random UUID (version 4).
func lkUUID(t testing.TB) string {
	var b [16]byte
	_, err := rand.Read(b[:])
	require.NoError(t, err)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
