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
	seq    int
	toxics map[string]bool // on the proxy now
}

// Link starts a proxy on a free loopback port to upstream.
func (n *Network) Link(name, upstream string) (*Link, error) {
	p := toxiproxy.NewProxy(n.srv, name, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("proxy %s: %w", name, err)
	}
	l := &Link{Name: name, p: p, toxics: map[string]bool{}}
	n.mu.Lock()
	n.links = append(n.links, l)
	n.mu.Unlock()
	return l, nil
}

// Addr is where clients of the link connect.
func (l *Link) Addr() string { return l.p.Listen }

// Toxics are the toxics one fault added to a link. Faults overlap (a
// client frozen while a replica's links are reset, a partition of a
// frozen client): each heals only its own, so the end of one fault never
// ends another.
type Toxics struct {
	l     *Link
	names []string
}

// add adds a toxic to t, under a name unique on the link.
func (t *Toxics) add(name, typ, stream, attrs string) error {
	l := t.l
	l.mu.Lock()
	l.seq++
	name = fmt.Sprintf("%s-%d", name, l.seq)
	l.mu.Unlock()
	body := fmt.Sprintf(`{"name":%q,"type":%q,"stream":%q,"toxicity":1,"attributes":%s}`, name, typ, stream, attrs)
	if _, err := l.p.Toxics.AddToxicJson(strings.NewReader(body)); err != nil {
		return fmt.Errorf("%s: toxic %s: %w", l.Name, name, err)
	}
	l.mu.Lock()
	l.toxics[name] = true
	l.mu.Unlock()
	t.names = append(t.names, name)
	return nil
}

// Heal removes t's toxics (a blackhole's connections are then closed);
// other faults' toxics on the link stay. A nil t heals nothing.
func (t *Toxics) Heal() {
	if t == nil {
		return
	}
	t.l.remove(t.names)
	t.names = nil
}

func (l *Link) remove(names []string) {
	for _, n := range names {
		l.mu.Lock()
		ok := l.toxics[n]
		delete(l.toxics, n)
		l.mu.Unlock()
		if ok {
			_ = l.p.Toxics.RemoveToxic(context.Background(), n)
		}
	}
}

// Blackhole drops everything in both directions, leaving connections
// open (a partition); new connections are accepted and hang too.
func (l *Link) Blackhole() (*Toxics, error) {
	t := &Toxics{l: l}
	if err := t.add("blackhole-up", "timeout", "upstream", `{"timeout":0}`); err != nil {
		return t, err
	}
	return t, t.add("blackhole-down", "timeout", "downstream", `{"timeout":0}`)
}

// Latency delays each direction by latency ± jitter milliseconds.
func (l *Link) Latency(latency, jitter int) (*Toxics, error) {
	t := &Toxics{l: l}
	attrs := fmt.Sprintf(`{"latency":%d,"jitter":%d}`, latency, jitter)
	if err := t.add("latency-up", "latency", "upstream", attrs); err != nil {
		return t, err
	}
	return t, t.add("latency-down", "latency", "downstream", attrs)
}

// Reset closes every open connection of the link at once, then resets
// (TCP RST) every connection that sends data while it lasts.
func (l *Link) Reset() (*Toxics, error) {
	t := &Toxics{l: l}
	if err := l.Cut(); err != nil {
		return t, err
	}
	return t, t.add("reset", "reset_peer", "upstream", `{"timeout":0}`)
}

// Cut closes every open connection of the link (both ends see it end);
// the link keeps accepting new ones, on the same address, with its
// toxics.
func (l *Link) Cut() error {
	l.p.Stop()
	if err := l.p.Start(); err != nil {
		return fmt.Errorf("%s: restart proxy: %w", l.Name, err)
	}
	return nil
}

// Heal removes every toxic of the link, whichever fault added it.
func (l *Link) Heal() {
	l.mu.Lock()
	names := make([]string, 0, len(l.toxics))
	for n := range l.toxics {
		names = append(names, n)
	}
	l.mu.Unlock()
	l.remove(names)
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
