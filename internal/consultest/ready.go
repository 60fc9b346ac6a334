package consultest

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/hashicorp/consul/api"
)

// readyKey is written and deleted to prove the KV store accepts writes.
const readyKey = "_consultest/ready"

// waitReady polls the agent at addr until it reports itself (the agent whose
// server RPC address is leader) as leader and a KV write and a session
// (with token, if not "") succeed, the agent exits (exited is closed), or ctx is done. Checking
// the leader's address guards against probing some other agent that took our
// HTTP port. With https the probe speaks HTTPS.
func waitReady(ctx context.Context, addr, leader, token string, https *HTTPS, exited <-chan struct{}) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { // abort an in-flight probe as soon as the agent dies
		select {
		case <-exited:
			cancel()
		case <-ctx.Done():
		}
	}()
	tr, scheme := newTransport(), "http"
	if https != nil {
		tr, scheme = https.transport(), "https"
	}
	defer tr.CloseIdleConnections()
	c, err := api.NewClient(&api.Config{Address: addr, Scheme: scheme, Transport: tr, Token: token})
	if err != nil {
		return err
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		err := probe(ctx, c, leader)
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("agent exited during startup (last probe: %v)", err)
		case <-ctx.Done():
			return fmt.Errorf("%w (last probe: %v)", ctx.Err(), err)
		case <-tick.C:
		}
	}
}

// probe checks once that want is the leader and that a KV write works.
func probe(ctx context.Context, c *api.Client, want string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	leader, err := c.Status().LeaderWithQueryOptions((&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return err
	}
	if leader == "" {
		return errors.New("no leader yet")
	}
	if leader != want {
		return fmt.Errorf("leader is %s, not this agent (%s)", leader, want)
	}
	w := (&api.WriteOptions{}).WithContext(ctx)
	if _, err := c.KV().Put(&api.KVPair{Key: readyKey, Value: []byte("ok")}, w); err != nil {
		return fmt.Errorf("kv put: %w", err)
	}
	if _, err := c.KV().Delete(readyKey, w); err != nil {
		return fmt.Errorf("kv delete: %w", err)
	}
	// A session needs the agent's node registered in the catalog, which
	// comes a moment after the leader ("Missing node registration").
	id, _, err := c.Session().Create(&api.SessionEntry{TTL: "10s"}, w)
	if err != nil {
		return fmt.Errorf("session create: %w", err)
	}
	if _, err := c.Session().Destroy(id, w); err != nil {
		return fmt.Errorf("session destroy: %w", err)
	}
	return nil
}

// newTransport returns an HTTP transport for talking to a local agent.
// Setting TLSClientConfig stops api.NewClient from applying CONSUL_CACERT
// and similar variables from the environment; the agent speaks plain HTTP.
func newTransport() *http.Transport {
	return &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        100,
		MaxIdleConnsPerHost: 32,
		IdleConnTimeout:     90 * time.Second,
		TLSClientConfig:     &tls.Config{MinVersion: tls.VersionTLS12},
	}
}
