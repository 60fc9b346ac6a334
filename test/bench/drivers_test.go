package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/hashicorp/consul/api"
	"google.golang.org/grpc"

	"github.com/lockbroker/lockbroker/client"
	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
)

// The three ways to take a lock that the table compares, each as a user
// writes it: the broker through its raw generated stubs, Consul's own
// api.Lock / api.Semaphore, and the raw floor (KV acquire + release with a
// session kept across cycles: two Raft writes, nothing else).

// opTimeout bounds every single operation of the benchmarks.
const opTimeout = 30 * time.Second

// brokerDriver runs broker operations over one gRPC connection.
type brokerDriver struct {
	locks    lockbrokerv1.LockServiceClient
	sessions lockbrokerv1.SessionServiceClient
	lib      *client.Client // the Go client library on the same connection
}

// newDriver is the driver of conn.
func newDriver(conn grpc.ClientConnInterface) brokerDriver {
	return brokerDriver{locks: lockbrokerv1.NewLockServiceClient(conn), sessions: lockbrokerv1.NewSessionServiceClient(conn),
		lib: client.New(conn)}
}

// libCycle is one uncontended cycle as a user of the Go client library
// writes it: Lock, then Release (which returns once the stream has said
// `released`).
func (d brokerDriver) libCycle(key string) error {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	l, err := d.lib.Lock(ctx, key)
	if err != nil {
		return fmt.Errorf("client.Lock %s: %w", key, err)
	}
	if err := l.Release(ctx); err != nil {
		return fmt.Errorf("Lease.Release %s: %w", key, err)
	}
	return nil
}

// brokerHold is an open Acquire stream that got `acquired`.
type brokerHold struct {
	key    string
	stream lockbrokerv1.LockService_AcquireClient
	cancel context.CancelFunc
	seq    *lockbrokerv1.Sequencer
}

// open starts an Acquire stream with default session options (the broker
// creates, renews and destroys the session) for a lock (limit 0) or a
// semaphore slot (limit > 1).
func (d brokerDriver) open(key string, limit uint32) (*brokerHold, error) {
	return d.openReq(&lockbrokerv1.AcquireRequest{Key: key, Limit: limit})
}

// openReq starts an Acquire stream with req (a read or write hold, a
// multi-key lock).
func (d brokerDriver) openReq(req *lockbrokerv1.AcquireRequest) (*brokerHold, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	s, err := d.locks.Acquire(ctx, req)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("acquire %s: %w", req.GetKey(), err)
	}
	return &brokerHold{key: req.GetKey(), stream: s, cancel: cancel}, nil
}

// until reads events until one satisfies want, within opTimeout. An event
// in stop ends the wait with an error naming it.
func (h *brokerHold) until(want func(*lockbrokerv1.AcquireResponse) bool) (*lockbrokerv1.AcquireResponse, error) {
	deadline := time.Now().Add(opTimeout)
	for {
		resp, err := h.stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, fmt.Errorf("stream %s ended: %w", h.key, err)
		}
		if want(resp) {
			return resp, nil
		}
		if l := resp.GetLost(); l != nil {
			return resp, fmt.Errorf("stream %s: lost %s (%s)", h.key, l.GetReason(), l.GetDetail())
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("stream %s: no wanted event within %s", h.key, opTimeout)
		}
	}
}

func isAcquired(r *lockbrokerv1.AcquireResponse) bool { return r.GetAcquired() != nil }
func isQueued(r *lockbrokerv1.AcquireResponse) bool   { return r.GetQueued() != nil }
func isReleased(r *lockbrokerv1.AcquireResponse) bool { return r.GetReleased() != nil }
func isLost(r *lockbrokerv1.AcquireResponse) bool     { return r.GetLost() != nil }

// acquire opens a stream and waits for `acquired`.
func (d brokerDriver) acquire(key string, limit uint32) (*brokerHold, error) {
	return d.acquireReq(&lockbrokerv1.AcquireRequest{Key: key, Limit: limit})
}

// acquireReq opens a stream with req and waits for `acquired`.
func (d brokerDriver) acquireReq(req *lockbrokerv1.AcquireRequest) (*brokerHold, error) {
	h, err := d.openReq(req)
	if err != nil {
		return nil, err
	}
	resp, err := h.until(isAcquired)
	if err != nil {
		h.cancel()
		return nil, err
	}
	h.seq = resp.GetAcquired().GetSequencer()
	return h, nil
}

// release calls Release with the hold's session and token.
func (d brokerDriver) release(h *brokerHold) error {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	resp, err := d.locks.Release(ctx, &lockbrokerv1.ReleaseRequest{
		Key: h.key, SessionId: h.seq.GetSessionId(), Token: h.seq.GetToken()})
	if err != nil {
		return fmt.Errorf("release %s: %w", h.key, err)
	}
	if !resp.GetReleased() {
		return fmt.Errorf("release %s: released=false", h.key)
	}
	return nil
}

// releaseAndWait releases the hold, waits for its `released` and closes
// the stream.
func (d brokerDriver) releaseAndWait(h *brokerHold) error {
	defer h.cancel()
	if err := d.release(h); err != nil {
		return err
	}
	_, err := h.until(isReleased)
	return err
}

// cycle is one uncontended broker cycle: Acquire until `acquired`,
// Release with the token, wait for `released`.
func (d brokerDriver) cycle(key string, limit uint32) error {
	h, err := d.acquire(key, limit)
	if err != nil {
		return err
	}
	return d.releaseAndWait(h)
}

// anchorClient returns a Consul API client for addr whose calls go
// through counter: api.DefaultConfig's settings, with an idle pool large
// enough for 64 parallel clients (the default keeps GOMAXPROCS+1 idle
// connections, which at 64 clients churns through ephemeral ports).
func anchorClient(addr string, counter *callCounter) (*api.Client, error) {
	cfg := api.DefaultConfig()
	cfg.Address, cfg.Scheme, cfg.Token = addr, "http", ""
	cfg.HttpClient = &http.Client{Transport: counter}
	return api.NewClient(cfg)
}

// pooledTransport is the transport behind anchorClient.
func pooledTransport() *http.Transport {
	return &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		DialContext:         (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        256,
		MaxIdleConnsPerHost: 128,
		IdleConnTimeout:     90 * time.Second,
	}
}

// apiLockOpts are the options a user of api.Lock writes: a fresh session
// per Lock (api.Lock creates it, renews it and destroys it after Unlock),
// Consul's default lock-delay.
func apiLockOpts(key string) *api.LockOptions {
	return &api.LockOptions{Key: key, SessionTTL: "15s"}
}

// apiLockCycle is one api.Lock cycle: LockOpts, Lock, Unlock.
func apiLockCycle(c *api.Client, key string) error {
	l, err := c.LockOpts(apiLockOpts(key))
	if err != nil {
		return err
	}
	if _, err := l.Lock(nil); err != nil {
		return fmt.Errorf("api.Lock %s: %w", key, err)
	}
	return l.Unlock()
}

// floor holds one session across cycles and takes the lock with plain KV
// acquire and release: the two Raft writes any lock cycle needs.
type floor struct {
	kv      *api.KV
	session string
}

func newFloor(c *api.Client) (*floor, error) {
	id, _, err := c.Session().Create(&api.SessionEntry{TTL: "60s", Behavior: api.SessionBehaviorRelease}, nil)
	if err != nil {
		return nil, err
	}
	return &floor{kv: c.KV(), session: id}, nil
}

func (f *floor) close(c *api.Client) { _, _ = c.Session().Destroy(f.session, nil) }

func (f *floor) acquire(key string) error {
	ok, _, err := f.kv.Acquire(&api.KVPair{Key: key, Session: f.session, Flags: api.LockFlagValue}, nil)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("floor acquire %s: refused", key)
	}
	return nil
}

func (f *floor) release(key string) error {
	ok, _, err := f.kv.Release(&api.KVPair{Key: key, Session: f.session, Flags: api.LockFlagValue}, nil)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("floor release %s: refused", key)
	}
	return nil
}

func (f *floor) cycle(key string) error {
	if err := f.acquire(key); err != nil {
		return err
	}
	return f.release(key)
}

// apiSemaphoreCycle is one api.Semaphore cycle as a user writes it: a
// fresh semaphore (and session) each time, Acquire, Release.
func apiSemaphoreCycle(c *api.Client, prefix string, limit int) error {
	s, err := c.SemaphoreOpts(&api.SemaphoreOptions{Prefix: prefix, Limit: limit, SessionTTL: "15s"})
	if err != nil {
		return err
	}
	held, err := s.Acquire(nil)
	if err != nil {
		return fmt.Errorf("api.Semaphore %s: %w", prefix, err)
	}
	if held == nil {
		return fmt.Errorf("api.Semaphore %s: not acquired", prefix)
	}
	return s.Release()
}
