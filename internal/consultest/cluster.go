package consultest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/consul/api"
)

// ClusterConfig configures StartCluster. The zero value is usable.
type ClusterConfig struct {
	// Binary is the consul binary to run; "" means Binary().
	Binary string
	// Servers is the number of Consul servers; 0 means 3.
	Servers int
	// Dir holds every server's data directory (Dir/server-N); "" means a
	// fresh temporary directory that Close removes.
	Dir string
	// LogWriter returns where server i's output goes (its every
	// incarnation); nil, or a nil result, discards it.
	LogWriter func(i int) io.Writer
	// HCL holds extra configuration fragments for every server, applied
	// after the harness's own, e.g. `session_ttl_min = "1s"`.
	HCL []string
}

// Cluster is a real multi-server Consul cluster on loopback: one `consul
// agent -server` process per server, each on its own free ports, joined to
// the others, with raft_multiplier 1 (the fastest elections). Servers can be
// stopped, killed and restarted on the same ports and data directories, so
// a restarted server rejoins with its Raft state. Its methods are safe for
// concurrent use.
type Cluster struct {
	cfg     ClusterConfig
	dir     string
	tempDir bool
	servers []*clusterServer
	tr      *transportSet
}

// clusterServer is one server slot: its fixed ports, name and data
// directory, and the current incarnation (nil while down).
type clusterServer struct {
	i       int
	ports   ports
	node    string
	dataDir string
	log     io.Writer

	mu   sync.Mutex
	proc *Process
}

// transportSet closes the HTTP transports handed out by Client.
type transportSet struct {
	mu  sync.Mutex
	all []interface{ CloseIdleConnections() }
}

func (s *transportSet) add(t interface{ CloseIdleConnections() }) {
	s.mu.Lock()
	s.all = append(s.all, t)
	s.mu.Unlock()
}

func (s *transportSet) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range s.all {
		t.CloseIdleConnections()
	}
}

// StartCluster starts cfg.Servers Consul servers (default 3) bound to
// 127.0.0.1, with distinct free ports, bootstrap_expect set to their
// number and retry_join to one another, and waits (within ctx, capped at
// 60s) until they have elected a leader that accepts a KV write. On error
// every started server is stopped.
func StartCluster(ctx context.Context, cfg ClusterConfig) (*Cluster, error) {
	if cfg.Binary == "" {
		bin, err := Binary()
		if err != nil {
			return nil, err
		}
		cfg.Binary = bin
	}
	if cfg.Servers <= 0 {
		cfg.Servers = 3
	}
	c := &Cluster{cfg: cfg, dir: cfg.Dir, tr: &transportSet{}}
	if c.dir == "" {
		dir, err := os.MkdirTemp("", "consultest-cluster-")
		if err != nil {
			return nil, fmt.Errorf("consultest: cluster dir: %w", err)
		}
		c.dir, c.tempDir = dir, true
	}
	var err error
	for range startAttempts {
		if err = c.launchAll(ctx); err == nil || !errors.Is(err, errBind) || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if _, err := c.WaitLeader(wctx); err != nil {
		_ = c.Close()
		return nil, err
	}
	return c, nil
}

// launchAll picks ports for every server and starts them all.
func (c *Cluster) launchAll(ctx context.Context) error {
	for _, s := range c.servers {
		_ = s.stop(false)
	}
	pp, err := freePortSets(c.cfg.Servers)
	if err != nil {
		return err
	}
	c.servers = c.servers[:0]
	for i := range c.cfg.Servers {
		s := &clusterServer{
			i: i, ports: pp[i],
			node:    fmt.Sprintf("consultest-%d-%d-s%d", os.Getpid(), nodeSeq.Add(1), i),
			dataDir: filepath.Join(c.dir, fmt.Sprintf("server-%d", i)),
			log:     io.Discard,
		}
		if c.cfg.LogWriter != nil {
			if w := c.cfg.LogWriter(i); w != nil {
				s.log = w
			}
		}
		c.servers = append(c.servers, s)
	}
	for _, s := range c.servers {
		if err := c.launch(ctx, s); err != nil {
			return err
		}
	}
	return nil
}

// serverHCL is the harness's configuration of server s.
func (c *Cluster) serverHCL(s *clusterServer) string {
	var join []string
	for _, o := range c.servers {
		if o != s {
			join = append(join, strconv.Quote("127.0.0.1:"+strconv.Itoa(o.ports.SerfLAN)))
		}
	}
	return baseHCL(s.ports) + fmt.Sprintf(`
server = true
bootstrap_expect = %d
retry_join = [%s]
retry_interval = "1s"
performance { raft_multiplier = 1 }
autopilot { cleanup_dead_servers = false }
leave_on_terminate = false
disable_update_check = true
`, len(c.servers), strings.Join(join, ", "))
}

// launch starts an incarnation of s and waits until its HTTP API answers
// (not for a leader: a lone restarted server cannot elect one). A bind
// error is wrapped in errBind.
func (c *Cluster) launch(ctx context.Context, s *clusterServer) error {
	if err := os.MkdirAll(s.dataDir, 0o700); err != nil {
		return fmt.Errorf("consultest: data dir: %w", err)
	}
	p := &Process{cfg: ProcessConfig{Binary: c.cfg.Binary, HTTPPort: s.ports.HTTP, DataDir: s.dataDir, LogWriter: s.log},
		ports: s.ports, node: s.node, dataDir: s.dataDir, tail: new(tailBuffer), done: make(chan struct{})}
	args := []string{"agent", "-node=" + s.node, "-data-dir=" + s.dataDir, "-hcl=" + c.serverHCL(s)}
	for _, h := range c.cfg.HCL {
		args = append(args, "-hcl="+h)
	}
	p.cmd = exec.Command(c.cfg.Binary, args...)
	out := io.MultiWriter(s.log, p.tail)
	p.cmd.Stdout, p.cmd.Stderr = out, out
	p.cmd.SysProcAttr = sysProcAttr()
	if err := p.cmd.Start(); err != nil {
		return fmt.Errorf("consultest: start %s: %w", c.cfg.Binary, err)
	}
	go p.reap()
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	err := waitHTTP(ctx, p.HTTPAddr(), p.done)
	if err != nil {
		stopErr := p.Stop()
		if portConflict(p.tail) {
			err = fmt.Errorf("%w: %w", errBind, err)
		}
		return fmt.Errorf("consultest: consul server %d on %s not up: %w\n--- last output ---\n%s",
			s.i, p.HTTPAddr(), errors.Join(err, stopErr), p.tail.lastLines(tailLines))
	}
	s.mu.Lock()
	s.proc = p
	s.mu.Unlock()
	return nil
}

// waitHTTP polls addr until the agent's HTTP API answers, the agent exits,
// or ctx ends.
func waitHTTP(ctx context.Context, addr string, exited <-chan struct{}) error {
	tr := newTransport()
	defer tr.CloseIdleConnections()
	cl, err := api.NewClient(&api.Config{Address: addr, Scheme: "http", Transport: tr})
	if err != nil {
		return err
	}
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := cl.Status().LeaderWithQueryOptions((&api.QueryOptions{}).WithContext(pctx))
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("agent exited during startup (last probe: %v)", err)
		case <-ctx.Done():
			return fmt.Errorf("%w (last probe: %v)", ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Size is the number of servers.
func (c *Cluster) Size() int { return len(c.servers) }

// HTTPAddr is server i's HTTP API address, "127.0.0.1:NNNN"; it stays the
// same across restarts.
func (c *Cluster) HTTPAddr(i int) string { return "127.0.0.1:" + strconv.Itoa(c.servers[i].ports.HTTP) }

// ServerAddr is server i's Raft/RPC address, as /v1/status/leader names it.
func (c *Cluster) ServerAddr(i int) string {
	return "127.0.0.1:" + strconv.Itoa(c.servers[i].ports.Server)
}

// Client returns an API client of server i (it keeps working across the
// server's restarts).
func (c *Cluster) Client(i int) (*api.Client, error) {
	tr := newTransport()
	c.tr.add(tr)
	return api.NewClient(&api.Config{Address: c.HTTPAddr(i), Scheme: "http", Transport: tr})
}

// Running reports whether server i has a live incarnation.
func (c *Cluster) Running(i int) bool {
	s := c.servers[i]
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc != nil && s.proc.running()
}

// Pid is the process id of server i's incarnation, 0 while it is down.
func (c *Cluster) Pid(i int) int {
	s := c.servers[i]
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil || !s.proc.running() {
		return 0
	}
	return s.proc.cmd.Process.Pid
}

// Stop stops server i gracefully (SIGTERM, SIGKILL after 5s; a server does
// not leave the cluster on SIGTERM) and waits for it to exit. Stopping a
// stopped server does nothing.
func (c *Cluster) Stop(i int) error { return c.servers[i].stop(false) }

// Kill SIGKILLs server i (a crash) and waits for it to exit.
func (c *Cluster) Kill(i int) error { return c.servers[i].stop(true) }

// stop ends the current incarnation, if any.
func (s *clusterServer) stop(kill bool) error {
	s.mu.Lock()
	p := s.proc
	s.proc = nil
	s.mu.Unlock()
	if p == nil {
		return nil
	}
	if kill {
		return p.Kill()
	}
	return p.Stop()
}

// Restart starts server i again (stopping it first if it runs) on the same
// ports and data directory, and waits until its HTTP API answers. It does
// not wait for a leader: see WaitLeader.
func (c *Cluster) Restart(ctx context.Context, i int) error {
	s := c.servers[i]
	if err := s.stop(false); err != nil {
		return err
	}
	fmt.Fprintf(s.log, "==> consultest: restarting server %d on %s\n", i, c.HTTPAddr(i))
	return c.launch(ctx, s)
}

// Leader returns the index of the server that the running servers agree
// is the leader, or an error if they do not (yet) agree on one.
func (c *Cluster) Leader(ctx context.Context) (int, error) {
	var leader string
	asked := 0
	for i := range c.servers {
		if !c.Running(i) {
			continue
		}
		l, err := c.status(ctx, i)
		if err != nil {
			return -1, fmt.Errorf("server %d: %w", i, err)
		}
		if l == "" {
			return -1, fmt.Errorf("server %d knows no leader", i)
		}
		if leader != "" && l != leader {
			return -1, fmt.Errorf("servers disagree on the leader: %s and %s", leader, l)
		}
		leader = l
		asked++
	}
	if asked == 0 {
		return -1, errors.New("no server is running")
	}
	for i := range c.servers {
		if c.ServerAddr(i) == leader {
			return i, nil
		}
	}
	return -1, fmt.Errorf("leader %s is not a server of this cluster", leader)
}

// status asks server i who the leader is.
func (c *Cluster) status(ctx context.Context, i int) (string, error) {
	cl, err := c.Client(i)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return cl.Status().LeaderWithQueryOptions((&api.QueryOptions{}).WithContext(ctx))
}

// WaitLeader waits until the running servers agree on a leader and a KV
// write through the leader succeeds, and returns the leader's index. It
// fails when ctx ends first.
func (c *Cluster) WaitLeader(ctx context.Context) (int, error) {
	var last error
	for {
		i, err := c.Leader(ctx)
		if err == nil {
			err = c.probeWrite(ctx, i)
			if err == nil {
				return i, nil
			}
		}
		last = err
		select {
		case <-ctx.Done():
			return -1, fmt.Errorf("consultest: no cluster leader: %w (last: %v)", ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// probeWrite writes and deletes the readiness key through server i.
func (c *Cluster) probeWrite(ctx context.Context, i int) error {
	cl, err := c.Client(i)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	w := (&api.WriteOptions{}).WithContext(ctx)
	if _, err := cl.KV().Put(&api.KVPair{Key: readyKey, Value: []byte("ok")}, w); err != nil {
		return fmt.Errorf("kv put: %w", err)
	}
	_, err = cl.KV().Delete(readyKey, w)
	return err
}

// KillLeader SIGKILLs the current leader and returns its index.
func (c *Cluster) KillLeader(ctx context.Context) (int, error) {
	i, err := c.Leader(ctx)
	if err != nil {
		return -1, err
	}
	return i, c.Kill(i)
}

// Close stops every server and removes the data directory if StartCluster
// created it.
func (c *Cluster) Close() error {
	var errs []error
	for _, s := range c.servers {
		if err := s.stop(false); err != nil {
			errs = append(errs, err)
		}
	}
	c.tr.closeAll()
	if c.tempDir {
		if err := os.RemoveAll(c.dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Kill SIGKILLs the agent (a crash: no cleanup of its own) and waits for it
// to exit; Wait then reports no error. Like Stop it is idempotent and
// removes a temporary data directory.
func (p *Process) Kill() error {
	p.stopOnce.Do(func() {
		p.mu.Lock()
		p.stopping = true
		p.mu.Unlock()
		var errs []error
		if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
			errs = append(errs, fmt.Errorf("consultest: kill consul agent: %w", err))
		}
		<-p.done
		if err := p.removeTempDir(); err != nil {
			errs = append(errs, err)
		}
		p.stopErr = errors.Join(errs...)
	})
	return p.stopErr
}

// freePortSets picks ports for n agents at once, all distinct, holding
// every probe until all are chosen (see freePorts).
func freePortSets(n int) ([]ports, error) {
	var held []io.Closer
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	used := map[int]bool{}
	pick := func() (int, error) {
		for range 20 {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return 0, fmt.Errorf("consultest: pick free port: %w", err)
			}
			held = append(held, l)
			port := l.Addr().(*net.TCPAddr).Port
			u, err := net.ListenPacket("udp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
			if err != nil || used[port] {
				continue
			}
			held = append(held, u)
			used[port] = true
			return port, nil
		}
		return 0, errors.New("consultest: no free TCP+UDP loopback port found")
	}
	out := make([]ports, n)
	for i := range out {
		for _, dst := range []*int{&out[i].HTTP, &out[i].Server, &out[i].SerfLAN, &out[i].SerfWAN} {
			var err error
			if *dst, err = pick(); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}
