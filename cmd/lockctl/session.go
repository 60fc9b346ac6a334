package main

import (
	"context"
	"fmt"
	"strings"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
)

// sessionHelp is the description in `lockctl session --help`.
const sessionHelp = `Manage Consul sessions through SessionService, for holds that must outlive
one process: create a session, take keys with it (lockctl acquire or
try-acquire KEY SESSION), renew it within its TTL, release the keys (lockctl
release KEY SESSION) or destroy it.

  session create [flags]     print the new session's id (with --json, the Session)
  session list               list the sessions the broker made, and what each holds
  session renew SESSION      reset the session's TTL
  session destroy SESSION    destroy it: Consul releases every key it holds
  session get SESSION        describe it

On a shared broker, list shows the caller's tenant's sessions; lockctl admin
list-sessions shows every tenant's (admins only).
`

// cmdSession implements `lockctl session create|renew|destroy|get`.
func cmdSession(ctx context.Context, c *cli, args []string) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		fs := c.flagSet("session", "create|list|renew|destroy|get [flags] [SESSION]", sessionHelp)
		if _, err := c.parseFlags(fs, args); err != nil {
			return err
		}
		return usageErrorf("session wants create, list, renew, destroy or get")
	}
	sub, args := args[0], args[1:]
	switch sub {
	case "create":
		return sessionCreate(ctx, c, args)
	case "list":
		return sessionList(ctx, c, args)
	}
	var asJSON bool
	help := map[string]string{
		"renew":   "Reset SESSION's TTL (SessionService.RenewSession).\n",
		"destroy": "Destroy SESSION (SessionService.DestroySession): Consul releases every key\nit holds (or deletes them, for behavior delete) and applies its lock-delay.\n",
		"get":     "Describe SESSION (SessionService.GetSession).\n",
	}[sub]
	if help == "" {
		return usageErrorf("unknown session command %q", sub)
	}
	fs := c.flagSet("session "+sub, "SESSION [flags]", help)
	if sub != "destroy" {
		fs.BoolVar(&asJSON, "json", false, "print the response as one line of JSON")
	}
	pos, err := c.parseArgs(fs, args, "SESSION")
	if err != nil {
		return err
	}
	conn, err := c.dial(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	client, id := lockbrokerv1.NewSessionServiceClient(conn), pos[0]
	switch sub {
	case "renew":
		resp, err := client.RenewSession(ctx, &lockbrokerv1.RenewSessionRequest{SessionId: id})
		if err != nil {
			return err
		}
		if asJSON {
			return printJSON(c.stdout, resp)
		}
		fmt.Fprintf(c.stdout, "renewed %s, guaranteed for %v\n", id, resp.GetGuaranteedFor().AsDuration())
	case "destroy":
		if _, err := client.DestroySession(ctx, &lockbrokerv1.DestroySessionRequest{SessionId: id}); err != nil {
			return err
		}
		fmt.Fprintf(c.stdout, "destroyed %s\n", id)
	case "get":
		resp, err := client.GetSession(ctx, &lockbrokerv1.GetSessionRequest{SessionId: id})
		if err != nil {
			return err
		}
		if asJSON {
			return printJSON(c.stdout, resp)
		}
		printSession(c.stdout, resp.GetSession())
	}
	return nil
}

// sessionCreate implements `lockctl session create`.
func sessionCreate(ctx context.Context, c *cli, args []string) error {
	var (
		ttl, lockDelay optDuration
		behavior, name string
		checks         addrList // comma-separated and repeatable, like --addr
		asJSON         bool
	)
	fs := c.flagSet("session create", "[flags]",
		"Create a session (SessionService.CreateSession) and print its id. Renew it\nwithin its TTL (lockctl session renew) or it expires.\n")
	fs.Var(&ttl, "ttl", "session `TTL`, 10s to 24h (default: the broker's, 15s)")
	fs.Var(&lockDelay, "lock-delay", "Consul lock-delay after the session is invalidated, 0 to 60s (default 15s)")
	fs.StringVar(&behavior, "behavior", "release", "what Consul does with held keys when the session ends: release or delete")
	fs.StringVar(&name, "name", "lockctl", "session name shown by Consul")
	fs.Var(&checks, "check", "Consul health check `NAME` the session depends on, repeated or comma-separated")
	fs.BoolVar(&asJSON, "json", false, "print the CreateSessionResponse as one line of JSON")
	if _, err := c.parseArgs(fs, args); err != nil {
		return err
	}
	b, ok := lockbrokerv1.SessionBehavior_value["SESSION_BEHAVIOR_"+strings.ToUpper(behavior)]
	if !ok || b == 0 {
		return usageErrorf("--behavior must be release or delete, not %q", behavior)
	}
	conn, err := c.dial(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	resp, err := lockbrokerv1.NewSessionServiceClient(conn).CreateSession(ctx, &lockbrokerv1.CreateSessionRequest{
		Options: &lockbrokerv1.SessionOptions{
			Ttl: ttl.proto(), LockDelay: lockDelay.proto(),
			Behavior: lockbrokerv1.SessionBehavior(b), Checks: checks, Name: name,
		},
	})
	if err != nil {
		return err
	}
	if asJSON {
		return printJSON(c.stdout, resp)
	}
	fmt.Fprintln(c.stdout, resp.GetSession().GetId())
	return nil
}

// sessionList implements `lockctl session list`: SessionService.ListSessions.
func sessionList(ctx context.Context, c *cli, args []string) error {
	var asJSON bool
	fs := c.flagSet("session list", "[flags]",
		"List the sessions the broker created (SessionService.ListSessions), oldest\n"+
			"first: who renews each (broker: an Acquire stream's; client: made with\n"+
			"session create), its TTL and name, and the keys it holds with each grant's\n"+
			"token. Sessions made directly in Consul are not listed.\n")
	fs.BoolVar(&asJSON, "json", false, "print the ListSessionsResponse as one line of JSON")
	if _, err := c.parseArgs(fs, args); err != nil {
		return err
	}
	conn, err := c.dial(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	resp, err := lockbrokerv1.NewSessionServiceClient(conn).ListSessions(ctx, &lockbrokerv1.ListSessionsRequest{})
	if err != nil {
		return err
	}
	if asJSON {
		return printJSON(c.stdout, resp)
	}
	printSessions(c.stdout, resp.GetSessions())
	return nil
}
