package chaos

import (
	"context"
	"fmt"
	"strings"
	"sync"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
)

// Network holds the run's toxiproxy proxies (in process): one on every
// broker→Consul link and on every client→broker link, so partitions,
// latency and resets are real TCP faults.
type Network struct {
	srv *toxiproxy.ApiServer

	mu    sync.Mutex
	links []*Link
}

// NewNetwork returns an empty network.
func NewNetwork() *Network {
	return &Network{srv: toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())}
}

// Link is one proxied TCP link.
type Link struct {
	Name string
	p    *toxiproxy.Proxy

	mu     sync.Mutex
	toxics []string
}

// Link starts a proxy on a free loopback port to upstream.
func (n *Network) Link(name, upstream string) (*Link, error) {
	p := toxiproxy.NewProxy(n.srv, name, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("proxy %s: %w", name, err)
	}
	l := &Link{Name: name, p: p}
	n.mu.Lock()
	n.links = append(n.links, l)
	n.mu.Unlock()
	return l, nil
}

// Addr is where clients of the link connect.
func (l *Link) Addr() string { return l.p.Listen }

func (l *Link) add(name, typ, stream, attrs string) error {
	body := fmt.Sprintf(`{"name":%q,"type":%q,"stream":%q,"toxicity":1,"attributes":%s}`, name, typ, stream, attrs)
	if _, err := l.p.Toxics.AddToxicJson(strings.NewReader(body)); err != nil {
		return fmt.Errorf("%s: toxic %s: %w", l.Name, name, err)
	}
	l.mu.Lock()
	l.toxics = append(l.toxics, name)
	l.mu.Unlock()
	return nil
}

// Blackhole drops everything in both directions, leaving connections
// open (a partition); new connections are accepted and hang too.
func (l *Link) Blackhole() error {
	if err := l.add("blackhole-up", "timeout", "upstream", `{"timeout":0}`); err != nil {
		return err
	}
	return l.add("blackhole-down", "timeout", "downstream", `{"timeout":0}`)
}

// Latency delays each direction by latency ± jitter milliseconds.
func (l *Link) Latency(latency, jitter int) error {
	attrs := fmt.Sprintf(`{"latency":%d,"jitter":%d}`, latency, jitter)
	if err := l.add("latency-up", "latency", "upstream", attrs); err != nil {
		return err
	}
	return l.add("latency-down", "latency", "downstream", attrs)
}

// Reset closes every open connection of the link at once, then resets
// (TCP RST) every connection that sends data while it lasts.
func (l *Link) Reset() error {
	if err := l.Cut(); err != nil {
		return err
	}
	return l.add("reset", "reset_peer", "upstream", `{"timeout":0}`)
}

// Cut closes every open connection of the link (both ends see it end);
// the link keeps accepting new ones, on the same address.
func (l *Link) Cut() error {
	l.p.Stop()
	if err := l.p.Start(); err != nil {
		return fmt.Errorf("%s: restart proxy: %w", l.Name, err)
	}
	return nil
}

// Heal removes every toxic (a blackhole's connections are then closed).
func (l *Link) Heal() {
	l.mu.Lock()
	names := l.toxics
	l.toxics = nil
	l.mu.Unlock()
	for _, n := range names {
		_ = l.p.Toxics.RemoveToxic(context.Background(), n)
	}
}

// Faulty reports whether the link has toxics.
func (l *Link) Faulty() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.toxics) > 0
}

// HealAll heals every link.
func (n *Network) HealAll() {
	n.mu.Lock()
	links := append([]*Link(nil), n.links...)
	n.mu.Unlock()
	for _, l := range links {
		l.Heal()
	}
}

// Close stops every proxy.
func (n *Network) Close() {
	n.mu.Lock()
	links := n.links
	n.links = nil
	n.mu.Unlock()
	for _, l := range links {
		l.Heal()
		l.p.Stop()
	}
}
