// Command lockctl is lockbroker's command-line client. It runs a command
// while holding a distributed lock or semaphore slot, and inspects and
// manages locks and sessions, talking only gRPC to one or more broker
// replicas (tried in order until one answers).
//
// Run `lockctl --help` for the commands and `lockctl COMMAND --help` for
// their flags. Exit codes: 0 success (for `lock`, the command's own exit
// code), 1 usage or other error, 73 busy (`lock --try`, `try-acquire`), 74
// wait timed out (`lock --timeout`, `acquire --timeout`), 75 lock lost while
// the command ran.
package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/lockbroker/lockbroker/internal/buildinfo"
)

// Exit codes. The BSD sysexits range is used for lock outcomes so that they
// do not collide with the small codes most commands exit with.
const (
	exitOK    = 0
	exitError = 1  // usage or any other error
	exitBusy  = 73 // lock, acquire, try-acquire: try-once found the key held (ABORTED)
	exitTime  = 74 // lock, acquire: bounded wait ran out (DEADLINE_EXCEEDED)
	exitLost  = 75 // lock: the hold was lost while the command ran
)

// exitCodesHelp documents the exit codes in every --help.
const exitCodesHelp = `Exit codes:
  0    success; for lock, the command's own exit code (128+N if it died of signal N)
  1    usage or other error, one line on stderr: "lockctl: CODE: message"
  73   lock, acquire, try-acquire: the key is busy (--try, --timeout 0, try-acquire), the
       holders are named on stderr
  74   lock, acquire: --timeout ran out while waiting
  75   lock: the lock was lost, or no keepalive came before its guarantee ended, while the
       command ran (it got SIGTERM, then SIGKILL after --grace or before the guarantee ended)
`

// mainUsage is the top-level help.
const mainUsage = `Usage: lockctl [--addr HOST:PORT[,...]] COMMAND [flags] [args]
       lockctl --version

lockctl is the command-line client of lockbroker, a gRPC lock service over Consul.

Commands:
  lock KEY [flags] -- CMD [ARGS...]   run CMD while holding a lock (or a semaphore slot with -n,
                                      a read or write hold with --read or --write)
  lock KEY1 KEY2 ... -- CMD [ARGS...] run CMD while holding every key (a multi-key lock)
  get KEY                             print who holds KEY
  watch KEY                           print KEY's state now and after every change
  acquire KEY SESSION                 take KEY for a client-owned session (waits), print the grant
  try-acquire KEY SESSION             the same, now or not at all (exit 73 if busy)
  release KEY SESSION                 end a hold given its session, from anywhere
  session create|list|renew|destroy|get   manage sessions for holds that outlive a process
  admin list-holds|list-sessions|force-release   operate a shared broker (admins only)
  health                              check that a broker is serving

Run 'lockctl COMMAND --help' for a command's flags.

Every command takes --addr (repeated or comma-separated; default $LOCKBROKER_ADDR,
else 127.0.0.1:8700): brokers are tried in order until one answers. For a broker
serving TLS: --cacert FILE (verify it), --cert FILE --key FILE (a client certificate,
mTLS), --token TOKEN (a bearer token); each also from $LOCKBROKER_CACERT,
$LOCKBROKER_CERT, $LOCKBROKER_CERT_KEY, $LOCKBROKER_BEARER_TOKEN (prefer the
variable for the token: command lines are visible to other users). lockctl
does not read $LOCKBROKER_KEY and $LOCKBROKER_TOKEN: those are the lock's key
and fencing token that 'lockctl lock' gives its command, so a lockctl run by
that command uses its parent's settings.

` + exitCodesHelp

// commands maps each command name to its implementation.
var commands = map[string]func(ctx context.Context, c *cli, args []string) error{
	"lock":        cmdLock,
	"get":         cmdGet,
	"watch":       cmdWatch,
	"release":     cmdRelease,
	"acquire":     cmdAcquire(false),
	"try-acquire": cmdAcquire(true),
	"session":     cmdSession,
	"admin":       cmdAdmin,
	"health":      cmdHealth,
}

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// run executes one lockctl invocation and returns its exit code.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	c := &cli{stdin: stdin, stdout: stdout, stderr: stderr}
	fs := c.flagSet("", "", mainUsage)
	version := fs.Bool("version", false, "print lockctl's version, VCS revision and Go version, and exit")
	rest, err := c.parseFlags(fs, args)
	if err == nil && *version {
		fmt.Fprintln(stdout, "lockctl", buildinfo.Read())
		return exitOK
	}
	if err == nil && len(rest) == 0 {
		err = usageErrorf("missing command")
	}
	if err == nil {
		cmd, ok := commands[rest[0]]
		if !ok {
			err = usageErrorf("unknown command %q", rest[0])
		} else {
			err = cmd(ctx, c, rest[1:])
		}
	}
	return c.report(err)
}
