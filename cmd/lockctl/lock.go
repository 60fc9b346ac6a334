package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// lockHelp is the description in `lockctl lock --help`.
const lockHelp = `Run CMD while holding a lock on KEY (or, with -n N, one of N semaphore
slots under the prefix KEY; with --read or --write, a read or write hold of
the read-write lock KEY), through LockService.Acquire. The broker creates
and renews the session while lockctl runs, and releases it when lockctl
exits, whatever happens to CMD.

Several keys before "--" (lockctl lock KEY1 KEY2 ... -- CMD) are a
multi-key lock: every key or none, taken in one Consul transaction with one
session (up to 64 keys; plain locks only). The wait holds none of them;
losing any key ends the hold (and releases the others). Without "--", the
first argument after KEY starts CMD, as it always did: put "--" after the
key(s) when CMD's own arguments contain "--".

--read takes a shared hold: many readers hold KEY at once, never beside a
writer. --write takes the exclusive hold of the same read-write lock. A
read-write lock is a kind of its own: a plain lock (without --read or
--write) on its key, or --read/--write on a plain lock or semaphore key, is
refused (FAILED_PRECONDITION, LIMIT_CONFLICT, naming the kind found).
Waiters are served in arrival order: a reader behind a waiting writer waits.

CMD runs in its own process group, as with 'consul lock' (so that it and
everything it starts can be stopped together; it cannot read from a
terminal), with lockctl's standard streams and these variables added to
its environment (pass the token to the resources you protect, which should
refuse tokens lower than the highest they have seen):
  LOCKBROKER_KEY          the key
  LOCKBROKER_SESSION      the Consul session holding it
  LOCKBROKER_TOKEN        the fencing token of this grant
  LOCKBROKER_LOCK_INDEX   Consul's LockIndex of this grant
  LOCKBROKER_KEYS         every key held, one per line, in the order given
  LOCKBROKER_TOKENS       the fencing token of each key, space-separated,
                          in the same order (one key: LOCKBROKER_TOKEN)
  LOCKBROKER_MODE         "read" or "write" with --read or --write
                          (unset for a plain lock)
With several keys, LOCKBROKER_KEY, LOCKBROKER_TOKEN and
LOCKBROKER_LOCK_INDEX are the first key's.
A lockctl that CMD runs (a nested lock) does not read these two as its
key file and bearer token: it reads $LOCKBROKER_CERT_KEY and
$LOCKBROKER_BEARER_TOKEN, which CMD inherits, as it does $LOCKBROKER_ADDR.

SIGINT, SIGTERM and SIGHUP are forwarded to CMD's process group; lockctl
then exits with CMD's exit code. If the lock is lost while CMD runs, CMD's
process group gets SIGTERM, then SIGKILL after --grace (sooner if the hold's
guarantee ends first, see below), and lockctl exits 75.

If the broker holding the lock goes away while CMD runs (it dies, drains
for a restart, is cut off from Consul and says so (lost: REPLICA_CUT_OFF),
or, with several --addr, falls silent for 60% of the last
guarantee, or less so that a resume fits before the command must be
stopped, but never less than 45%), lockctl resumes the hold on the
brokers of --addr in turn, starting with the next: same session, same
token, CMD keeps running. A broker that refuses the resume (the session
is gone) ends the hold. A wait whose broker goes away (it dies, drains,
or, with several --addr, misses three of its heartbeats) goes on at the
next broker that takes it with its session, keeping its place in the
queue (a lock's, a semaphore's, a read-write lock's); when that place is
gone (the session ended) it waits anew there. --timeout counts from the
start.

The broker says how long the hold is guaranteed after every renewal
(guaranteed_for). If no renewal arrives in time and no broker has resumed
the hold (the brokers stalled, or the network to them is gone), lockctl
treats the lock as lost, early enough that CMD is gone when the guarantee
ends: SIGTERM at the end of the guarantee less --grace (at most a third of
the guarantee), SIGKILL a quarter second before the end at the latest,
exit 75.

` + exitCodesHelp

// lockFlags are the options of the lock command.
type lockFlags struct {
	slots     uint
	try       bool
	timeout   optDuration
	ttl       optDuration
	lockDelay optDuration
	value     string
	grace     time.Duration
	verbose   bool
	read      bool     // --read: a shared hold of a read-write lock
	write     bool     // --write: its exclusive hold
	keys      []string // more keys (a multi-key lock)
}

// cmdLock implements `lockctl lock KEY [flags] [--] CMD [ARGS...]` and
// `lockctl lock KEY1 KEY2 ... [flags] -- CMD [ARGS...]`.
func cmdLock(ctx context.Context, c *cli, args []string) error {
	var f lockFlags
	fs := lockFlagSet(c, &f)
	key, argv, err := c.lockArgs(fs, &f, args)
	if err != nil {
		return err
	}
	if len(argv) == 0 {
		return usageErrorf("lock wants a command to run after KEY")
	}
	if f.try && f.timeout.set {
		return usageErrorf("--try and --timeout exclude each other")
	}
	if f.read && f.write {
		return usageErrorf("--read and --write exclude each other")
	}
	if (f.read || f.write) && f.slots > 1 {
		return usageErrorf("--read and --write take a read-write lock, not a semaphore: drop -n")
	}
	if len(f.keys) > 0 && (f.read || f.write || f.slots > 1) {
		return usageErrorf("several keys are a multi-key lock, plain locks only: drop --read, --write and -n")
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return err
	}

	conn, addr, err := c.dialAddr(ctx)
	if err != nil {
		return err
	}
	// Cancelling the stream is how the hold is released: the broker
	// releases the key and destroys its session when the stream ends.
	req := f.request(key)
	cur, err := openStream(ctx, conn, addr, req)
	if err != nil {
		conn.Close()
		return err
	}
	r := newResumer(ctx, c, req, addr, conn)
	defer func() {
		cur.close()
		r.closeAll()
	}()

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)

	w := &waiting{c: c, f: &f, key: key, r: r, cur: cur, sigs: sigs, start: time.Now()}
	acq, err := w.await()
	cur = w.cur
	if err != nil {
		return err
	}
	r.seq, r.seqs = acq.GetSequencer(), grantSequencers(acq)
	g := newGuarantee(acq.GetGuaranteedFor().AsDuration(), f.grace)
	defer g.stop()
	ch, err := startChild(path, argv, seqEnv(r.seqs, &f), c)
	if err != nil {
		return err
	}
	s := &supervisor{c: c, f: &f, ch: ch, g: g, sigs: sigs, r: r, cur: cur}
	defer func() { cur = s.cur }()
	return s.run()
}

// lockFlagSet defines lock's flags on c's flag set, into f.
func lockFlagSet(c *cli, f *lockFlags) *flag.FlagSet {
	fs := c.flagSet("lock", "KEY [KEY2 ... --] [flags] [--] CMD [ARGS...]", lockHelp)
	fs.UintVar(&f.slots, "n", 1, "semaphore slots: hold one of `N` slots under the prefix KEY (1: an exclusive lock)")
	fs.BoolVar(&f.try, "try", false, "try once: if KEY is busy, name the holders and exit 73")
	fs.Var(&f.timeout, "timeout", "wait at most `DURATION` for KEY, then exit 74 (default: wait until interrupted)")
	fs.Var(&f.ttl, "ttl", "session `TTL`, 10s to 24h (default: the broker's, 15s)")
	fs.Var(&f.lockDelay, "lock-delay", "Consul lock-delay after a lost session, 0 to 60s (default: the broker's, 15s)")
	fs.StringVar(&f.value, "value", defaultValue(), "the holder's value (its identity), shown to others")
	fs.DurationVar(&f.grace, "grace", 10*time.Second, "after a lost lock, how long CMD has between SIGTERM and SIGKILL")
	fs.BoolVar(&f.verbose, "v", false, "report waiting, grants and renewals on stderr")
	fs.BoolVar(&f.read, "read", false, "a read (shared) hold of the read-write lock KEY")
	fs.BoolVar(&f.write, "write", false, "the write (exclusive) hold of the read-write lock KEY")
	return fs
}

// recvResult is one Recv from the Acquire stream.
type recvResult struct {
	resp *lockbrokerv1.AcquireResponse
	err  error
}

// receive delivers the stream's events, and finally its error, on events
// until the stream ends or ctx is cancelled; done is closed then.
func receive(ctx context.Context, stream grpc.ServerStreamingClient[lockbrokerv1.AcquireResponse]) (events <-chan recvResult, done <-chan struct{}) {
	ev, d := make(chan recvResult), make(chan struct{})
	go func() {
		defer close(d)
		for {
			resp, err := stream.Recv()
			select {
			case ev <- recvResult{resp, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	return ev, d
}

// defaultValue is the holder value used without --value: "host:pid".
func defaultValue() string {
	host, _ := os.Hostname()
	return host + ":" + strconv.Itoa(os.Getpid())
}

// request builds the AcquireRequest for key from the flags.
func (f *lockFlags) request(key string) *lockbrokerv1.AcquireRequest {
	req := &lockbrokerv1.AcquireRequest{
		Key:         key,
		Value:       []byte(f.value),
		WaitTimeout: f.timeout.proto(),
		Session: &lockbrokerv1.AcquireRequest_NewSession{NewSession: &lockbrokerv1.SessionOptions{
			Ttl:       f.ttl.proto(),
			LockDelay: f.lockDelay.proto(),
			Name:      "lockctl",
		}},
	}
	if f.slots > 1 {
		req.Limit = uint32(min(f.slots, 1<<31))
	}
	switch {
	case f.read:
		req.Kind = lockbrokerv1.AcquireKind_ACQUIRE_KIND_READ
	case f.write:
		req.Kind = lockbrokerv1.AcquireKind_ACQUIRE_KIND_WRITE
	}
	req.Keys = f.keys
	if f.try {
		req.WaitTimeout = durationpb.New(0)
	}
	return req
}

// waiting waits for the `acquired` event. A busy key (ABORTED) exits 73
// and a wait that timed out (DEADLINE_EXCEEDED) exits 74, both with the
// broker's message naming the holders; a signal gives up the wait and
// exits 128+N.
//
// A wait whose broker goes away (the stream fails UNAVAILABLE: the broker
// died or drains; or, with several addresses, it is silent for
// waitStallBeats of its `queued` heartbeats: it is stopped) goes on at the
// next broker of --addr that takes it, as the client libraries' waits do:
// it resumes the wait with its session, so it keeps its place in the key's
// queue (a new request when that place is gone); its --timeout counts from
// the start.
type waiting struct {
	c     *cli
	f     *lockFlags
	key   string
	r     *resumer
	cur   *holdStream
	sigs  <-chan os.Signal
	start time.Time

	said  string        // the last "waiting" line: a heartbeat repeats it
	every time.Duration // the broker's heartbeat
	moves int           // moves since the last `queued`
	// place is the session the wait queued with (from `queued`); placed,
	// that the current stream resumes the wait with it.
	place  string
	placed bool
}

// waitStallBeats: a waiting stream that hears nothing for this many of its
// broker's heartbeats is taken for stalled (as in the client libraries).
const waitStallBeats = 3

func (w *waiting) await() (*lockbrokerv1.AcquireAcquired, error) {
	multi := len(w.c.brokerAddrs()) > 1
	silence := time.NewTimer(time.Hour)
	silence.Stop()
	defer silence.Stop()
	for {
		select {
		case s := <-w.sigs:
			sig, _ := s.(syscall.Signal)
			return nil, &exitErr{code: 128 + int(sig), msg: fmt.Sprintf("%v while waiting for %q", s, w.key)}
		case <-silence.C:
			why := fmt.Sprintf("nothing heard from the broker at %s for %d heartbeats of %v", w.cur.addr, waitStallBeats, w.every)
			if err := w.move(why, status.Error(codes.Unavailable, why)); err != nil {
				return nil, err
			}
		case ev := <-w.cur.events:
			if ev.err != nil {
				code := status.Code(ev.err)
				if w.placed && (code == codes.FailedPrecondition || code == codes.NotFound) {
					// The wait's place is gone (its session ended): wait anew.
					w.place = ""
					if err := w.move("the wait's place in the queue is gone: "+statusText(ev.err), ev.err); err != nil {
						return nil, err
					}
					continue
				}
				if code != codes.Unavailable {
					return nil, waitError(ev.err)
				}
				why := "the stream to the broker at " + w.cur.addr + " broke: " + statusText(ev.err)
				if err := w.move(why, ev.err); err != nil {
					return nil, err
				}
				continue
			}
			switch e := ev.resp.GetEvent().(type) {
			case *lockbrokerv1.AcquireResponse_Queued:
				w.moves = 0
				if sid := e.Queued.GetSessionId(); sid != "" {
					w.place = sid
				}
				if hb := e.Queued.GetHeartbeat().AsDuration(); hb > 0 {
					w.every = hb
				}
				if multi && w.every > 0 {
					silence.Reset(waitStallBeats * w.every)
				}
				if w.f.verbose {
					msg := "waiting: " + stateLine(e.Queued.GetState())
					if p := e.Queued.GetPosition(); p > 0 {
						msg += fmt.Sprintf(" (place %d in the queue)", p)
					}
					if d := e.Queued.GetLockDelayRemaining(); d != nil && d.AsDuration() > 0 {
						msg += fmt.Sprintf(" (Consul lock-delay: %v left)", d.AsDuration().Round(time.Millisecond))
					}
					if msg != w.said {
						fmt.Fprintln(w.c.stderr, "lockctl: "+msg)
						w.said = msg
					}
				}
			case *lockbrokerv1.AcquireResponse_Acquired:
				if w.f.verbose {
					fmt.Fprintf(w.c.stderr, "lockctl: acquired %s, held for at least %v\n",
						grantText(grantSequencers(e.Acquired), w.f), e.Acquired.GetGuaranteedFor().AsDuration().Round(time.Millisecond))
				}
				return e.Acquired, nil
			case *lockbrokerv1.AcquireResponse_Lost:
				return nil, fmt.Errorf("lost while waiting for %q: %s", w.key, lostText(e.Lost))
			case *lockbrokerv1.AcquireResponse_Released:
				return nil, fmt.Errorf("released while waiting for %q", w.key)
			}
		}
	}
}

// move ends the current wait and sends the request again to the brokers
// of --addr in turn, from the next one, until one takes it; err is what
// ends the wait when none does (or after 2 rounds of moves with no
// `queued` heard in between).
func (w *waiting) move(why string, err error) error {
	addrs := w.c.brokerAddrs()
	if w.moves >= 2*len(addrs) {
		return waitError(err)
	}
	if w.moves > 0 && w.moves%len(addrs) == 0 {
		time.Sleep(resumePause)
	}
	w.moves++
	req := proto.CloneOf(w.r.req)
	w.placed = w.place != "" && req.GetSessionId() == ""
	if w.placed {
		req.Session = &lockbrokerv1.AcquireRequest_Resume{Resume: &lockbrokerv1.Sequencer{Key: w.key, SessionId: w.place}}
	}
	if w.f.timeout.set {
		left := w.f.timeout.d - time.Since(w.start)
		if left <= 0 {
			return &exitErr{code: exitTime, msg: fmt.Sprintf("%s; the wait for %q timed out (--timeout %v)", why, w.key, w.f.timeout.d)}
		}
		req.WaitTimeout = durationpb.New(left)
	}
	w.cur.close()
	start := slices.Index(addrs, w.cur.addr) + 1
	for i := range addrs {
		addr := addrs[(start+i)%len(addrs)]
		cc, cerr := w.r.conn(addr)
		if cerr != nil {
			continue
		}
		hs, oerr := openStream(w.r.base, cc, addr, req)
		if oerr != nil {
			err = oerr
			continue
		}
		if w.f.verbose {
			fmt.Fprintf(w.c.stderr, "lockctl: %s; waiting at %s instead\n", why, addr)
		}
		w.cur = hs
		return nil
	}
	return waitError(err)
}

// waitError maps an error that ended the wait to lockctl's exit codes.
func waitError(err error) error {
	if errors.Is(err, io.EOF) {
		return errors.New("the broker ended the stream before the lock was acquired")
	}
	switch status.Code(err) {
	case codes.Aborted:
		return &exitErr{code: exitBusy, msg: statusText(err)}
	case codes.DeadlineExceeded:
		return &exitErr{code: exitTime, msg: statusText(err)}
	}
	return err
}

// seqEnv is the child's environment: lockctl's plus the grants, one per
// key (the first key's in the single-key variables).
func seqEnv(seqs []*lockbrokerv1.Sequencer, f *lockFlags) []string {
	seq := seqs[0]
	keys, tokens := make([]string, len(seqs)), make([]string, len(seqs))
	for i, s := range seqs {
		keys[i], tokens[i] = s.GetKey(), strconv.FormatUint(s.GetToken(), 10)
	}
	env := append(os.Environ(),
		"LOCKBROKER_KEY="+seq.GetKey(),
		"LOCKBROKER_SESSION="+seq.GetSessionId(),
		"LOCKBROKER_TOKEN="+strconv.FormatUint(seq.GetToken(), 10),
		"LOCKBROKER_LOCK_INDEX="+strconv.FormatUint(seq.GetLockIndex(), 10),
		"LOCKBROKER_KEYS="+strings.Join(keys, "\n"),
		"LOCKBROKER_TOKENS="+strings.Join(tokens, " "),
	)
	if m := f.mode(); m != "" {
		env = append(env, "LOCKBROKER_MODE="+m)
	}
	return env
}

// mode is "read" or "write" for a read-write hold, else "".
func (f *lockFlags) mode() string {
	switch {
	case f.read:
		return "read"
	case f.write:
		return "write"
	}
	return ""
}

// grantSequencers is an acquired event's grants, one per key in the
// request's order (the sequencer alone for a single key).
func grantSequencers(a *lockbrokerv1.AcquireAcquired) []*lockbrokerv1.Sequencer {
	if s := a.GetSequencers(); len(s) > 0 {
		return s
	}
	return []*lockbrokerv1.Sequencer{a.GetSequencer()}
}

// grantText describes a grant for -v: `"k": session S, token T` for one
// key (with "(read)" or "(write)" for a read-write hold), `"a" (token 5),
// "b" (token 7): session S` for several.
func grantText(seqs []*lockbrokerv1.Sequencer, f *lockFlags) string {
	seq := seqs[0]
	if len(seqs) == 1 {
		what := strconv.Quote(seq.GetKey())
		if m := f.mode(); m != "" {
			what += " (" + m + ")"
		}
		return fmt.Sprintf("%s: session %s, token %d", what, seq.GetSessionId(), seq.GetToken())
	}
	parts := make([]string, len(seqs))
	for i, s := range seqs {
		parts[i] = fmt.Sprintf("%q (token %d)", s.GetKey(), s.GetToken())
	}
	return fmt.Sprintf("%s: session %s", strings.Join(parts, ", "), seq.GetSessionId())
}

// keysBefore parses args (flags and keys, no command) and returns the
// keys.
func (c *cli) keysBefore(fs *flag.FlagSet, args []string) ([]string, error) {
	var keys []string
	for {
		pos, err := c.parseFlags(fs, args)
		if err != nil {
			return nil, err
		}
		if len(pos) == 0 {
			return keys, nil
		}
		keys, args = append(keys, pos[0]), pos[1:]
	}
}

// lockArgs splits lock's arguments into flags, keys and the command.
// Flags may come before, between and after the keys. With "--" after two
// or more keys, every argument before it that is not a flag is a key (a
// multi-key lock). Otherwise, as lockctl always did, KEY is the first
// argument that is not a flag, and the command starts at "--" or at the
// first argument after KEY that is not a flag.
func (c *cli) lockArgs(fs *flag.FlagSet, f *lockFlags, args []string) (string, []string, error) {
	if i := slices.Index(args, "--"); i >= 0 {
		before, after := args[:i], args[i+1:]
		// A dry run on flags of their own first: arguments that are not
		// keys and flags alone are an old invocation whose command has
		// "--" among its arguments ("lock KEY sh -c ... -- x").
		dry := &cli{stdin: c.stdin, stdout: io.Discard, stderr: io.Discard}
		if keys, err := dry.keysBefore(lockFlagSet(dry, &lockFlags{}), before); (err == nil && len(keys) > 0) || errors.Is(err, errHelp) {
			keys, err := c.keysBefore(fs, before)
			if err != nil {
				return "", nil, err
			}
			if len(keys) > 1 {
				f.keys = keys[1:]
			}
			return keys[0], after, nil
		}
	}
	rest, err := c.parseFlags(fs, args)
	if err != nil {
		return "", nil, err
	}
	if len(rest) == 0 {
		return "", nil, usageErrorf("lock wants KEY and a command")
	}
	argv, err := c.parseFlags(fs, rest[1:])
	if err != nil {
		return "", nil, err
	}
	return rest[0], argv, nil
}

// supervisor runs until the child exits (lockctl exits with its code) or the
// hold ends (the child is stopped and lockctl exits 75): lost, released,
// refused on resume, or not resumed before the guarantee ran out. It
// forwards signals to the child meanwhile, and resumes the hold on another
// broker when its stream breaks, its broker drains or (with several
// addresses) falls silent (see resume.go).
type supervisor struct {
	c    *cli
	f    *lockFlags
	ch   *child
	g    *guarantee
	sigs <-chan os.Signal
	r    *resumer
	cur  *holdStream // the stream that holds (or held) the lock

	stall    *time.Timer // a silent stream's broker counts as stalled (several addresses)
	resuming context.CancelFunc
	resumed  chan resumeResult
	why      string // what started the resume
}

func (s *supervisor) run() error {
	s.stall = time.NewTimer(time.Hour)
	defer s.stall.Stop()
	s.heard(s.g.given)
	defer s.stopResume()
	for {
		var why string
		var events <-chan recvResult
		if s.resuming == nil {
			events = s.cur.events
		}
		select {
		case <-s.ch.done:
			return &exitErr{code: s.ch.exitCode()}
		case sig := <-s.sigs:
			s.ch.signal(sig.(syscall.Signal))
			continue
		case <-s.g.expiring():
			why = fmt.Sprintf("%s: no keepalive from the broker: the hold was guaranteed until %s", causeKeepaliveTimeout, s.g.end().Format("15:04:05.000"))
			if s.resuming != nil {
				why = fmt.Sprintf("%s, and no broker resumed it before then (%s)", why, s.why)
			}
		case <-s.stall.C:
			if s.resuming == nil && len(s.c.brokerAddrs()) > 1 {
				s.resume(fmt.Sprintf("nothing heard from the broker at %s for %v", s.cur.addr, stallAfter(s.g.given, s.f.grace).Round(time.Millisecond)))
			}
			continue
		case res := <-s.resumed:
			s.resuming, s.resumed = nil, nil
			if res.err != nil {
				cause := causeKeepaliveTimeout
				if res.refused {
					cause = causeResumeRefused
				}
				why = fmt.Sprintf("%s: %s; %v", cause, s.why, res.err)
				break
			}
			old := s.cur
			s.cur = res.hs
			old.close()
			d := res.acq.GetGuaranteedFor().AsDuration()
			s.g.renew(d)
			s.heard(d)
			if s.f.verbose {
				seq := res.acq.GetSequencer()
				if seqs := grantSequencers(res.acq); len(seqs) > 1 || s.f.mode() != "" {
					fmt.Fprintf(s.c.stderr, "lockctl: resumed on %s: %s, held for at least %v\n",
						s.cur.addr, grantText(seqs, s.f), d.Round(time.Millisecond))
				} else {
					fmt.Fprintf(s.c.stderr, "lockctl: resumed on %s: session %s, token %d, held for at least %v\n",
						s.cur.addr, seq.GetSessionId(), seq.GetToken(), d.Round(time.Millisecond))
				}
			}
			continue
		case ev := <-events:
			switch e := ev.resp.GetEvent().(type) {
			case *lockbrokerv1.AcquireResponse_Keepalive:
				d := e.Keepalive.GetGuaranteedFor().AsDuration()
				s.g.renew(d)
				s.heard(d)
				if s.f.verbose {
					fmt.Fprintf(s.c.stderr, "lockctl: renewed, held for at least %v\n", d.Round(time.Millisecond))
				}
				continue
			case *lockbrokerv1.AcquireResponse_Acquired:
				d := e.Acquired.GetGuaranteedFor().AsDuration()
				s.g.renew(d)
				s.heard(d)
				continue
			case *lockbrokerv1.AcquireResponse_Lost:
				if r := e.Lost.GetReason(); r == lockbrokerv1.LostReason_LOST_REASON_BROKER_SHUTDOWN || r == lockbrokerv1.LostReason_LOST_REASON_REPLICA_CUT_OFF {
					// The broker drains, or cannot reach Consul: it
					// guarantees the hold until guaranteed_for, and the
					// hold moves to another broker.
					if gf := e.Lost.GetGuaranteedFor(); gf != nil {
						s.g.shorten(gf.AsDuration())
					}
					what := "is shutting down"
					if r == lockbrokerv1.LostReason_LOST_REASON_REPLICA_CUT_OFF {
						what = "is cut off from Consul"
					}
					s.resume(fmt.Sprintf("the broker at %s %s", s.cur.addr, what))
					continue
				}
				why = lostText(e.Lost)
			case *lockbrokerv1.AcquireResponse_Released:
				why = causeReleased + ": released through LockService.Release"
			default:
				if ev.err == nil {
					continue // queued: nothing to do
				}
				what := "the stream to the broker at " + s.cur.addr + " broke: " + statusText(ev.err)
				if errors.Is(ev.err, io.EOF) {
					what = "the broker at " + s.cur.addr + " ended the stream"
				}
				s.resume(what)
				continue
			}
		}
		s.stopResume()
		killAt := s.g.killBy(time.Now().Add(s.f.grace))
		wait := time.Until(killAt).Round(time.Millisecond)
		if s.ch.stop(killAt) {
			why += fmt.Sprintf("; the command ignored SIGTERM and was killed %v later (--grace %v)", wait, s.f.grace)
		} else {
			why += "; the command was terminated"
		}
		return &exitErr{code: exitLost, msg: "lock lost: " + why}
	}
}

// heard notes word from the broker that guaranteed the hold for d: the
// stream is stalled if nothing more comes within stallAfter(d).
func (s *supervisor) heard(d time.Duration) {
	s.stall.Reset(stallAfter(d, s.f.grace))
}

// resume starts re-attaching the hold elsewhere (see resume.go); why is
// what made it necessary. The current stream stays open meanwhile.
func (s *supervisor) resume(why string) {
	if s.resuming != nil {
		return
	}
	s.why = why
	if s.f.verbose {
		fmt.Fprintf(s.c.stderr, "lockctl: %s; resuming the hold\n", why)
	}
	ctx, cancel := context.WithCancel(s.r.base)
	s.resuming, s.resumed = cancel, make(chan resumeResult, 1)
	r, from, done := s.r, s.cur.addr, s.resumed
	go func() { done <- r.run(ctx, from) }()
}

// stopResume ends a resume in progress and closes the stream it may have
// opened (the hold is being given up).
func (s *supervisor) stopResume() {
	if s.resuming == nil {
		return
	}
	s.resuming()
	if res := <-s.resumed; res.hs != nil {
		res.hs.close()
	}
	s.resuming, s.resumed = nil, nil
}

// guarantee tracks until when the hold is safe: the arrival of the last
// acquired or keepalive event plus its guaranteed_for. Its timer fires
// early enough that the command can be stopped before the end: at the end
// less min(--grace, a third of the guarantee).
type guarantee struct {
	grace time.Duration
	until time.Time
	given time.Duration // the last guarantee
	timer *time.Timer
}

// killMargin is how long before the guarantee ends the command is killed
// at the latest.
const killMargin = 250 * time.Millisecond

func newGuarantee(d, grace time.Duration) *guarantee {
	g := &guarantee{grace: grace, timer: time.NewTimer(time.Hour)}
	g.renew(d)
	return g
}

// renew starts a new guarantee of d from now.
func (g *guarantee) renew(d time.Duration) {
	g.until, g.given = time.Now().Add(d), d
	g.timer.Reset(max(stopAfter(d, g.grace), 0))
}

// stopAfter is when, in a guarantee of d, the command must start stopping:
// at its end less min(grace, a third of it).
func stopAfter(d, grace time.Duration) time.Duration { return d - min(grace, d/3) }

// shorten makes the guarantee end within d from now, if it ended later.
func (g *guarantee) shorten(d time.Duration) {
	if time.Now().Add(d).Before(g.until) {
		g.renew(d)
	}
}

// expiring fires when the command must start stopping.
func (g *guarantee) expiring() <-chan time.Time { return g.timer.C }

// end is when the guarantee runs out.
func (g *guarantee) end() time.Time { return g.until }

// killBy is when the command must be killed: at t, or killMargin before the
// guarantee ends if that is sooner (but not before now).
func (g *guarantee) killBy(t time.Time) time.Time {
	now := time.Now()
	if end := g.until.Add(-killMargin); end.Before(t) {
		t = end
	}
	if t.Before(now) {
		return now
	}
	return t
}

func (g *guarantee) stop() { g.timer.Stop() }

// The causes of a loss that lockctl decides itself, spelled as in the
// client libraries (client.CauseKeepaliveTimeout, ...). The broker's are
// its LostReason names without LOST_REASON_ (see lostText).
const (
	causeKeepaliveTimeout = "KEEPALIVE_TIMEOUT"
	causeResumeRefused    = "RESUME_REFUSED"
	causeReleased         = "RELEASED"
)

// lostText describes a `lost` event: the reason's name as every library
// spells it (SESSION_INVALIDATED, ...), then the detail.
func lostText(l *lockbrokerv1.AcquireLost) string {
	s := strings.TrimPrefix(l.GetReason().String(), "LOST_REASON_")
	if d := l.GetDetail(); d != "" {
		s += ": " + d
	}
	return s
}
