package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// defaultAddr is the broker address used when neither --addr nor
// $LOCKBROKER_ADDR gives one.
const defaultAddr = "127.0.0.1:8700"

// cli holds what every command shares: standard streams and the
// connection flags.
type cli struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	addrs          addrList
	connectTimeout time.Duration
	sec            securityFlags
	usages         map[*flag.FlagSet]func() // --help text of each flag set
}

// exitErr ends a command with a given exit code. An empty msg prints
// nothing (the code says it all, e.g. the child's own exit code).
type exitErr struct {
	code int
	msg  string
}

func (e *exitErr) Error() string { return e.msg }

// errHelp marks a --help that was answered: exit 0.
var errHelp = flag.ErrHelp

// usageErrorf reports a command-line mistake (exit 1).
func usageErrorf(format string, args ...any) error {
	return &exitErr{code: exitError, msg: "usage: " + fmt.Sprintf(format, args...) + " (see --help)"}
}

// report prints err as one line on stderr and returns the exit code.
func (c *cli) report(err error) int {
	var ee *exitErr
	switch {
	case err == nil, errors.Is(err, errHelp):
		return exitOK
	case errors.As(err, &ee):
		if ee.msg != "" {
			fmt.Fprintln(c.stderr, "lockctl: "+oneLine(ee.msg))
		}
		return ee.code
	default:
		line := errorLine(err)
		if status.Code(err) == codes.Unauthenticated && c.sec.token == "" && os.Getenv("LOCKBROKER_TOKEN") != "" {
			line += " ($LOCKBROKER_TOKEN is not read as the bearer token: set $" + envToken + ")"
		}
		fmt.Fprintln(c.stderr, line)
		return exitError
	}
}

// errorLine renders err as "lockctl: CODE: message" for gRPC statuses
// (CODE as in the API docs, e.g. INVALID_ARGUMENT) and "lockctl: message"
// for anything else.
func errorLine(err error) string {
	return "lockctl: " + statusText(err)
}

// statusText renders err as "CODE: message" for a gRPC status and as its
// message otherwise, on one line.
func statusText(err error) string {
	if st, ok := status.FromError(err); ok && st.Code() != 0 {
		return fmt.Sprintf("%s: %s", code.Code(st.Code()), oneLine(st.Message()))
	}
	return oneLine(err.Error())
}

// oneLine folds a possibly multi-line message onto one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", "; ")), " ")
}

// flagSet returns a FlagSet for a command that prints usage (a synopsis,
// then the flags) on --help and nothing on its own for errors. Every
// command gets the connection flags.
func (c *cli) flagSet(name, synopsis, help string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Var(&c.addrs, "addr", "broker `HOST:PORT`, repeated or comma-separated, tried in order\n(default $LOCKBROKER_ADDR, else "+defaultAddr+")")
	if c.connectTimeout == 0 { // keep a value given before the command name
		c.connectTimeout = 5 * time.Second
	}
	fs.DurationVar(&c.connectTimeout, "connect-timeout", c.connectTimeout, "how long to try each broker address")
	c.sec.register(fs)
	fs.Usage = func() {} // the flag package calls it on errors too: stay quiet
	if c.usages == nil {
		c.usages = map[*flag.FlagSet]func(){}
	}
	c.usages[fs] = func() {
		if synopsis != "" {
			fmt.Fprintf(c.stdout, "Usage: lockctl %s %s\n\n", name, synopsis)
		}
		fmt.Fprint(c.stdout, help)
		fmt.Fprintln(c.stdout, "\nFlags:")
		printFlags(c.stdout, fs)
	}
	return fs
}

// printFlags lists fs's flags GNU-style (--name TYPE), which is also how
// lockctl accepts them (Go's flag package takes - and --).
func printFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		typ, usage := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if len(f.Name) == 1 {
			line = "  -" + f.Name
		}
		if typ != "" {
			line += " " + typ
		}
		if f.DefValue != "" && f.DefValue != "0" && f.DefValue != "false" && f.DefValue != "[]" {
			usage += " (default " + f.DefValue + ")"
		}
		fmt.Fprintf(w, "%s\n      %s\n", line, strings.ReplaceAll(usage, "\n", "\n      "))
	})
}

// parseFlags parses fs up to the first argument that is not a flag (or
// after "--") and returns the rest. --help prints usage and returns errHelp.
func (c *cli) parseFlags(fs *flag.FlagSet, args []string) ([]string, error) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			c.usages[fs]()
			return nil, errHelp
		}
		return nil, usageErrorf("%v", err)
	}
	return fs.Args(), nil
}

// brokerAddrs returns the addresses to try, in order: --addr, else
// $LOCKBROKER_ADDR, else defaultAddr.
func (c *cli) brokerAddrs() []string {
	if len(c.addrs) > 0 {
		return c.addrs
	}
	var env addrList
	_ = env.Set(os.Getenv("LOCKBROKER_ADDR"))
	if len(env) > 0 {
		return env
	}
	return []string{defaultAddr}
}

// parseArgs parses flags anywhere among the arguments ("get KEY --json" as
// well as "get --json KEY") and checks the number of positional arguments.
func (c *cli) parseArgs(fs *flag.FlagSet, args []string, names ...string) ([]string, error) {
	var pos []string
	for {
		rest, err := c.parseFlags(fs, args)
		if err != nil {
			return nil, err
		}
		if len(rest) == 0 {
			break
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
	if len(pos) != len(names) {
		return nil, usageErrorf("%s wants %s, got %d argument(s)", fs.Name(), strings.Join(names, " "), len(pos))
	}
	return pos, nil
}

// addrList is a repeatable, comma-separated list of broker addresses.
type addrList []string

func (a *addrList) String() string { return strings.Join(*a, ",") }

// Set appends the comma-separated addresses in s.
func (a *addrList) Set(s string) error {
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*a = append(*a, p)
		}
	}
	return nil
}

// optDuration is a duration flag that remembers whether it was given, so
// that "absent" (server default) and "0" stay distinct.
type optDuration struct {
	d   time.Duration
	set bool
}

func (o *optDuration) String() string {
	if o == nil || !o.set {
		return ""
	}
	return o.d.String()
}

// Set parses a Go duration ("1m30s"); negative durations are refused.
func (o *optDuration) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	if d < 0 {
		return errors.New("must not be negative")
	}
	o.d, o.set = d, true
	return nil
}

// proto returns the duration for a request, nil when absent.
func (o *optDuration) proto() *durationpb.Duration {
	if !o.set {
		return nil
	}
	return durationpb.New(o.d)
}
