// Command workers runs mutually exclusive workers on lockbroker: several
// workers (in this process, and in as many other processes as you start)
// share a list of tasks; each task is run by one worker at a time, and is
// recorded done exactly once, in a ledger directory all of them share.
//
//	workers -broker 127.0.0.1:8700 -tasks 50 -workers 3 -ledger /tmp/ledger
//
// Start it several times at once, kill some of them: the survivors finish
// every task. See Worker for the pattern.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
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
		fmt.Fprintln(os.Stderr, "workers:", err)
		os.Exit(1)
	}
}

// run starts the workers and waits until every task is done.
func run(ctx context.Context, args []string, stdout io.Writer) error {
	host, _ := os.Hostname()
	fs := flag.NewFlagSet("workers", flag.ContinueOnError)
	fs.SetOutput(stdout)
	brokers := fs.String("broker", "127.0.0.1:8700", "broker address; several, comma-separated, are replicas to fail over to")
	prefix := fs.String("prefix", "workers/tasks", "where the task locks live")
	tasks := fs.Int("tasks", 20, "number of tasks (task-000, task-001, ...)")
	workers := fs.Int("workers", 3, "workers in this process")
	ledger := fs.String("ledger", "workers-ledger", "directory that records finished tasks (share it between processes)")
	work := fs.Duration("work", 200*time.Millisecond, "how long a task takes")
	name := fs.String("name", fmt.Sprintf("%s-%d", host, os.Getpid()), "this process's name; workers are <name>/w<n>")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *tasks < 1 || *workers < 1 {
		return errors.New("-tasks and -workers must be at least 1")
	}
	dopts, err := client.DialOptions() // plaintext; client.WithCACert, WithClientCert, WithToken for TLS
	if err != nil {
		return err
	}
	var conns []grpc.ClientConnInterface
	for _, addr := range strings.Split(*brokers, ",") {
		conn, err := grpc.NewClient(strings.TrimSpace(addr), dopts...)
		if err != nil {
			return err
		}
		defer conn.Close()
		conns = append(conns, conn)
	}
	c := client.New(conns[0], client.WithReplicas(conns[1:]...))
	l, err := NewFileLedger(*ledger)
	if err != nil {
		return err
	}
	list := make([]string, *tasks)
	for i := range list {
		list[i] = fmt.Sprintf("task-%03d", i)
	}
	out := &lockedWriter{w: stdout}
	errs := make(chan error, *workers)
	var wg sync.WaitGroup
	for i := range *workers {
		w := &Worker{
			Name:   fmt.Sprintf("%s/w%d", *name, i),
			Client: c,
			Prefix: *prefix,
			Tasks:  rotate(list, i*len(list) / *workers), // start apart
			Ledger: l,
			Do:     sleepTask(*work),
			Log:    out,
		}
		wg.Go(func() { errs <- w.Run(ctx) })
	}
	wg.Wait()
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	if err := errors.Join(all...); err != nil {
		return err
	}
	fmt.Fprintf(out, "all %d tasks done\n", len(list))
	return nil
}

// sleepTask is stand-in work that takes d.
func sleepTask(d time.Duration) Task {
	return func(ctx context.Context, _ string, _ *client.Lease) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
			return nil
		}
	}
}

// rotate returns list starting at its i-th element, so that workers
// start on different tasks and contend less.
func rotate(list []string, i int) []string {
	return append(append([]string(nil), list[i:]...), list[:i]...)
}

// FileLedger is a Ledger in a directory: one file per finished task,
// holding the fencing token it was done under and the worker's name.
type FileLedger struct {
	dir string
	mu  sync.Mutex // serialises this process's read-check-write
}

// NewFileLedger uses (and creates) dir.
func NewFileLedger(dir string) (*FileLedger, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	return &FileLedger{dir: dir}, nil
}

// Done implements Ledger.
func (f *FileLedger) Done(_ context.Context, task string) (bool, error) {
	_, err := os.Stat(filepath.Join(f.dir, task))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

// Complete implements Ledger. The token check and the write are not
// atomic across processes; the lock makes them exclusive, and the check
// catches a holder that lost its lock long before.
func (f *FileLedger) Complete(_ context.Context, task, worker string, token uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	path := filepath.Join(f.dir, task)
	if b, err := os.ReadFile(path); err == nil {
		seen, _ := strconv.ParseUint(strings.Fields(string(b) + " 0")[0], 10, 64)
		if token < seen {
			return fmt.Errorf("%w: %s was recorded under token %d, this is %d", ErrStaleToken, task, seen, token)
		}
	}
	tmp, err := os.CreateTemp(f.dir, "."+task+".*")
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(tmp, "%d %s\n", token, worker); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// lockedWriter serialises the workers' log lines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
