// Command leader is a leader-election candidate on lockbroker: it
// campaigns for a key with its identity as the value, prints when it
// starts and stops leading, and campaigns again after losing leadership.
// With -observe it also prints the leader as every observer sees it,
// "no leader" included.
//
// Run two or more against one broker and stop the leader (Ctrl-C resigns
// at once; kill -9 leaves the lock to expire after the session TTL):
//
//	leader -broker 127.0.0.1:8700 -id a
//	leader -broker 127.0.0.1:8700 -id b
//
// Leadership is a lease: it can end at any moment, and a leader that is
// paused (GC, swap) can find out late. Pass the token it prints to the
// resources the leader writes to, so they can refuse an old leader.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"

	"github.com/lockbroker/lockbroker/client"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "leader:", err)
		os.Exit(1)
	}
}

// config is the command line.
type config struct {
	brokers   []string
	key       string
	id        string
	ttl       time.Duration
	lockDelay time.Duration
	observe   bool
}

func parse(args []string, stderr io.Writer) (*config, error) {
	host, _ := os.Hostname()
	fs := flag.NewFlagSet("leader", flag.ContinueOnError)
	fs.SetOutput(stderr)
	brokers := fs.String("broker", "127.0.0.1:8700", "broker address; several, comma-separated, are replicas to fail over to")
	cfg := &config{}
	fs.StringVar(&cfg.key, "key", "service/leader", "the election's lock key")
	fs.StringVar(&cfg.id, "id", fmt.Sprintf("%s-%d", host, os.Getpid()), "this candidate's identity, the lock's value while it leads")
	fs.DurationVar(&cfg.ttl, "ttl", 10*time.Second, "session TTL (10s to 24h): how long a crashed leader keeps the key")
	fs.DurationVar(&cfg.lockDelay, "lock-delay", time.Second, "Consul lock-delay (0 to 60s): after a leader fails, nobody leads for this long")
	fs.BoolVar(&cfg.observe, "observe", true, "also print the leader as observers see it")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	for _, b := range strings.Split(*brokers, ",") {
		if b = strings.TrimSpace(b); b != "" {
			cfg.brokers = append(cfg.brokers, b)
		}
	}
	if len(cfg.brokers) == 0 {
		return nil, errors.New("-broker: no address")
	}
	return cfg, nil
}

// run campaigns until ctx ends, then resigns.
func run(ctx context.Context, args []string, stdout io.Writer) error {
	cfg, err := parse(args, stdout)
	if err != nil {
		return err
	}
	out := &lockedWriter{w: stdout}
	dopts, err := client.DialOptions() // plaintext; client.WithCACert, WithClientCert, WithToken for TLS
	if err != nil {
		return err
	}
	var conns []grpc.ClientConnInterface
	for _, addr := range cfg.brokers {
		conn, err := grpc.NewClient(addr, dopts...)
		if err != nil {
			return err
		}
		defer conn.Close()
		conns = append(conns, conn)
	}
	c := client.New(conns[0], client.WithReplicas(conns[1:]...))
	e := c.Election(cfg.key, client.WithTTL(cfg.ttl), client.WithLockDelay(cfg.lockDelay))

	var wg sync.WaitGroup
	defer wg.Wait()
	if cfg.observe {
		obs, err := e.Observe(ctx)
		if err != nil {
			return fmt.Errorf("observe %s: %w", cfg.key, err)
		}
		wg.Go(func() { observe(obs, cfg.id, out) })
	}
	return campaign(ctx, e, cfg, out)
}

// campaign leads whenever it can until ctx ends.
func campaign(ctx context.Context, e *client.Election, cfg *config, out io.Writer) error {
	backoff := 100 * time.Millisecond
	for {
		fmt.Fprintf(out, "%s: campaigning for %s\n", cfg.id, cfg.key)
		lease, err := e.Campaign(ctx, []byte(cfg.id))
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			fmt.Fprintf(out, "%s: campaign failed: %v; retrying in %s\n", cfg.id, err, backoff)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 5*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
		seq := lease.Sequencer()
		fmt.Fprintf(out, "%s: leading (token %d, session %s)\n", cfg.id, seq.GetToken(), seq.GetSessionId())
		select {
		case <-lease.Lost():
			fmt.Fprintf(out, "%s: stopped leading: %v\n", cfg.id, lease.Err())
		case <-ctx.Done():
			rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := e.Resign(rctx)
			cancel()
			if err != nil {
				fmt.Fprintf(out, "%s: stopped leading: resign failed (the lock ends with the session): %v\n", cfg.id, err)
				return nil
			}
			fmt.Fprintf(out, "%s: stopped leading: resigned\n", cfg.id)
			return nil
		}
	}
}

// observe prints each leader change as observers see it: a new leader, a
// new value (the leader proclaimed), or no leader at all.
func observe(obs *client.Observer, id string, out io.Writer) {
	last := "" // what was printed last
	for h := range obs.C {
		line := "no leader"
		if h != nil {
			line = fmt.Sprintf("leader is %s (token %d)", h.GetValue(), h.GetToken())
		}
		if line != last {
			fmt.Fprintf(out, "%s: observed: %s\n", id, line)
			last = line
		}
	}
}

// lockedWriter serialises writes from the campaign and the observer.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
