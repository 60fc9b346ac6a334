package client

import (
	"context"
	"errors"
	"time"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
)

// Client-owned sessions: for programs that cannot keep a stream open (cron
// jobs, short-lived scripts). The client creates a session, takes keys
// with TryAcquire, renews the session within its TTL and releases; the
// holds outlive any stream and are not resumed or renewed by the broker.
// Consul ends the session (and its holds) when it is not renewed in time.

// CreateSession creates a session with opts (nil: the defaults, TTL 15s,
// lock-delay 15s, behavior RELEASE). The client must renew it within its
// TTL (RenewSession) and destroy it when done.
func (c *Client) CreateSession(ctx context.Context, opts *lockbrokerv1.SessionOptions) (*lockbrokerv1.Session, error) {
	var out *lockbrokerv1.Session
	err := c.each(func(i int) error {
		resp, err := c.sessions[i].CreateSession(ctx, &lockbrokerv1.CreateSessionRequest{Options: opts})
		out = resp.GetSession()
		return err
	})
	return out, err
}

// RenewSession renews a client-owned session and returns how long, from
// now, the session is guaranteed if it is not renewed again.
// ErrSessionNotFound when it has already ended.
func (c *Client) RenewSession(ctx context.Context, sessionID string) (time.Duration, error) {
	var out time.Duration
	err := c.each(func(i int) error {
		resp, err := c.sessions[i].RenewSession(ctx, &lockbrokerv1.RenewSessionRequest{SessionId: sessionID})
		out = resp.GetGuaranteedFor().AsDuration()
		return err
	})
	return out, err
}

// DestroySession ends a session; Consul releases (or, with behavior
// DELETE, deletes) every key it holds.
func (c *Client) DestroySession(ctx context.Context, sessionID string) error {
	return c.each(func(i int) error {
		_, err := c.sessions[i].DestroySession(ctx, &lockbrokerv1.DestroySessionRequest{SessionId: sessionID})
		return err
	})
}

// GetSession returns a session; ErrSessionNotFound when it does not exist.
func (c *Client) GetSession(ctx context.Context, sessionID string) (*lockbrokerv1.Session, error) {
	var out *lockbrokerv1.Session
	err := c.each(func(i int) error {
		resp, err := c.sessions[i].GetSession(ctx, &lockbrokerv1.GetSessionRequest{SessionId: sessionID})
		out = resp.GetSession()
		return err
	})
	return out, err
}

// ListSessions lists the sessions the caller may see, each with the keys
// it holds (its sequencers) and whether a broker owns it (a stream's
// session) or a client does.
func (c *Client) ListSessions(ctx context.Context) ([]*lockbrokerv1.SessionSummary, error) {
	var out []*lockbrokerv1.SessionSummary
	err := c.each(func(i int) error {
		resp, err := c.sessions[i].ListSessions(ctx, &lockbrokerv1.ListSessionsRequest{})
		out = resp.GetSessions()
		return err
	})
	return out, err
}

// errSessionOption: TryAcquire takes an existing session, so options for
// a new one have no meaning there.
var errSessionOption = errors.New("client: TryAcquire takes a client-owned session: session options (WithTTL, WithLockDelay, WithDeleteBehavior, WithSessionName) and WithWaitTimeout belong to CreateSession and Lock")

// errKeysOption: TryAcquire takes one key (TryAcquireRequest has no keys).
var errKeysOption = errors.New("client: TryAcquire takes one key: WithKeys (a multi-key lock) belongs to Lock and TryLock")

// TryAcquire takes key for the client-owned session sessionID now and
// returns the grant, or fails at once: a busy key is a *StatusError that
// matches ErrBusy and names the holders. No stream is kept: the hold lasts
// until Release or until the session ends. A session that already holds
// the key gets its current sequencer back. Of the options, WithValue,
// WithLimit, WithKind and WithSemaphore apply (WithKind with
// ACQUIRE_KIND_READ or ACQUIRE_KIND_WRITE takes a read or write hold of a
// read-write lock, where the broker serves it); session options,
// WithWaitTimeout and WithKeys are an error.
func (c *Client) TryAcquire(ctx context.Context, sessionID, key string, opts ...LockOption) (*lockbrokerv1.Sequencer, error) {
	req := &lockbrokerv1.AcquireRequest{Key: key}
	for _, o := range opts {
		o(req)
	}
	if req.GetSession() != nil || req.GetWaitTimeout() != nil {
		return nil, errSessionOption
	}
	if len(req.GetKeys()) > 0 {
		return nil, errKeysOption
	}
	var out *lockbrokerv1.Sequencer
	err := c.each(func(i int) error {
		resp, err := c.locks[i].TryAcquire(ctx, &lockbrokerv1.TryAcquireRequest{
			Key: key, Value: req.GetValue(), Limit: req.GetLimit(), SessionId: sessionID, Kind: req.GetKind(),
		})
		out = resp.GetSequencer()
		return err
	})
	if err != nil {
		return nil, askedFor(req, c.withHolders(ctx, key, err))
	}
	return out, nil
}

// Release ends the hold of key by sessionID, from any replica (for
// client-owned sessions; a Lease has its own Release). With a non-zero
// token it releases only that grant; a token is required for a session
// the broker made (ErrInvalidArgument without one). released is false
// when the session did not hold the key, or token's grant has ended (a
// retry after success).
func (c *Client) Release(ctx context.Context, key, sessionID string, token uint64) (released bool, err error) {
	err = c.each(func(i int) error {
		resp, err := c.locks[i].Release(ctx, &lockbrokerv1.ReleaseRequest{Key: key, SessionId: sessionID, Token: token})
		released = resp.GetReleased()
		return err
	})
	return released, err
}
