package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"time"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
)

// adminHelp is the description in `lockctl admin --help`.
const adminHelp = `Operate a shared broker through AdminService. With a tenants file only the
identities listed as admins may (PERMISSION_DENIED otherwise); every call is
written to the broker's audit log.

  admin list-holds [PREFIX]            every hold and waiter under PREFIX (all keys when absent):
                                       key, tenant, session, token, since, replica
  admin list-sessions [--tenant NAME]  the broker's sessions, with tenant and keys held
  admin force-release KEY              end the current hold on KEY whoever holds it;
                                       the holder's stream gets lost within a second
`

// cmdAdmin implements `lockctl admin list-holds|list-sessions|force-release`.
func cmdAdmin(ctx context.Context, c *cli, args []string) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		fs := c.flagSet("admin", "list-holds|list-sessions|force-release [flags] [ARGS]", adminHelp)
		if _, err := c.parseFlags(fs, args); err != nil {
			return err
		}
		return usageErrorf("admin wants list-holds, list-sessions or force-release")
	}
	sub, args := args[0], args[1:]
	var (
		asJSON bool
		tenant string
		names  []string
		help   string
	)
	switch sub {
	case "list-holds":
		help = "List every hold the broker granted, and the answering replica's waiters, on keys\nstarting with PREFIX (AdminService.ListHolds).\n"
	case "list-sessions":
		help = "List the broker's sessions with their tenant and held keys (AdminService.ListSessions).\n"
	case "force-release":
		help, names = "End the current hold on KEY, whoever holds it (AdminService.ForceRelease).\n", []string{"KEY"}
	default:
		return usageErrorf("unknown admin command %q", sub)
	}
	fs := c.flagSet("admin "+sub, map[string]string{"list-holds": "[PREFIX] [flags]", "list-sessions": "[flags]", "force-release": "KEY [flags]"}[sub], help)
	fs.BoolVar(&asJSON, "json", false, "print the response as one line of JSON")
	if sub == "list-sessions" {
		fs.StringVar(&tenant, "tenant", "", "only this tenant's sessions")
	}
	var pos []string
	var err error
	if sub == "list-holds" {
		pos, err = c.parseOptionalArg(fs, args, "PREFIX")
	} else {
		pos, err = c.parseArgs(fs, args, names...)
	}
	if err != nil {
		return err
	}
	conn, err := c.dial(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	admin := lockbrokerv1.NewAdminServiceClient(conn)
	switch sub {
	case "list-holds":
		req := &lockbrokerv1.ListHoldsRequest{}
		if len(pos) == 1 {
			req.KeyPrefix = pos[0]
		}
		resp, err := admin.ListHolds(ctx, req)
		if err != nil {
			return err
		}
		if asJSON {
			return printJSON(c.stdout, resp)
		}
		for _, h := range resp.GetHolds() {
			fmt.Fprintln(c.stdout, holdLine(h))
		}
	case "list-sessions":
		resp, err := admin.ListSessions(ctx, &lockbrokerv1.AdminServiceListSessionsRequest{Tenant: tenant})
		if err != nil {
			return err
		}
		if asJSON {
			return printJSON(c.stdout, resp)
		}
		for _, s := range resp.GetSessions() {
			fmt.Fprintln(c.stdout, sessionLine(s))
		}
	case "force-release":
		resp, err := admin.ForceRelease(ctx, &lockbrokerv1.ForceReleaseRequest{Key: pos[0]})
		if err != nil {
			return err
		}
		if asJSON {
			return printJSON(c.stdout, resp)
		}
		fmt.Fprintf(c.stdout, "%q: %d hold(s) ended\n", pos[0], resp.GetReleased())
	}
	return nil
}

// parseOptionalArg is parseArgs for zero or one positional argument.
func (c *cli) parseOptionalArg(fs *flag.FlagSet, args []string, name string) ([]string, error) {
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
	if len(pos) > 1 {
		return nil, usageErrorf("%s wants at most %s, got %d arguments", fs.Name(), name, len(pos))
	}
	return pos, nil
}

// holdLine describes one hold or waiter on one line.
func holdLine(h *lockbrokerv1.HoldInfo) string {
	what := fmt.Sprintf("held token=%d", h.GetToken())
	if h.GetWaiting() {
		what = "waiting"
		if p := h.GetPosition(); p > 0 {
			what = fmt.Sprintf("waiting place=%d", p)
		}
	}
	since := "-"
	if h.GetSince() != nil {
		since = h.GetSince().AsTime().UTC().Format(time.RFC3339)
	}
	return fmt.Sprintf("%q %s tenant=%q session=%s name=%q since=%s replica=%q",
		h.GetKey(), what, h.GetTenant(), h.GetSessionId(), h.GetSessionName(), since, h.GetReplica())
}

// sessionLine describes one session on one line.
func sessionLine(s *lockbrokerv1.TenantSession) string {
	sum := s.GetSummary()
	keys := make([]string, 0, len(sum.GetHolds()))
	for _, h := range sum.GetHolds() {
		keys = append(keys, fmt.Sprintf("%q", h.GetKey()))
	}
	owner := "client-owned"
	if sum.GetBrokerOwned() {
		owner = "broker-owned"
	}
	return fmt.Sprintf("%s tenant=%q name=%q ttl=%v %s holds=[%s]", sum.GetSession().GetId(), s.GetTenant(),
		sum.GetSession().GetName(), sum.GetSession().GetTtl().AsDuration(), owner, strings.Join(keys, " "))
}
