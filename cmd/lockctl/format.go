package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// enumName turns "LOCK_KIND_SEMAPHORE" into "semaphore".
func enumName(s, prefix string) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(s, prefix)), "_", "-")
}

// stateLine summarizes a key's state on one line, e.g.
// `demo: lock held by session 5e1f... (value "web-1", token 42)`.
func stateLine(st *lockbrokerv1.LockState) string {
	key := fmt.Sprintf("%q", st.GetKey())
	switch st.GetKind() {
	case lockbrokerv1.LockKind_LOCK_KIND_NONE:
		return key + ": free"
	case lockbrokerv1.LockKind_LOCK_KIND_FOREIGN:
		return key + ": not a lock (the key holds another tool's data)"
	}
	kind := enumName(st.GetKind().String(), "LOCK_KIND_")
	switch st.GetKind() {
	case lockbrokerv1.LockKind_LOCK_KIND_SEMAPHORE:
		kind = fmt.Sprintf("semaphore (%d of %d slots)", len(st.GetHolders()), st.GetLimit())
	case lockbrokerv1.LockKind_LOCK_KIND_RWLOCK:
		kind = "read-write lock"
		if hs := st.GetHolders(); len(hs) > 0 && hs[0].GetRead() {
			kind = fmt.Sprintf("read-write lock (%d readers)", len(hs))
		} else if len(hs) > 0 {
			kind = "read-write lock (writer)"
		}
	}
	queue := ""
	if n := st.GetWaiting(); n > 0 {
		queue = fmt.Sprintf("; %d waiting", n)
	}
	if len(st.GetHolders()) == 0 {
		return key + ": " + kind + " free" + queue
	}
	hs := make([]string, len(st.GetHolders()))
	for i, h := range st.GetHolders() {
		hs[i] = holderText(h)
	}
	return key + ": " + kind + " held by " + strings.Join(hs, ", ") + queue
}

// holderText describes one holder.
func holderText(h *lockbrokerv1.Holder) string {
	return fmt.Sprintf("session %s (value %q, token %d)", h.GetSessionId(), h.GetValue(), h.GetToken())
}

// printState prints a key's state for humans: the summary line, then one
// line per holder with every detail.
func printState(w io.Writer, st *lockbrokerv1.LockState) {
	fmt.Fprintln(w, stateLine(st))
	for _, h := range st.GetHolders() {
		fmt.Fprintf(w, "  session=%s token=%d lock-index=%d value=%q session-name=%q\n",
			h.GetSessionId(), h.GetToken(), h.GetLockIndex(), h.GetValue(), h.GetSessionName())
	}
}

// printSession prints a session for humans, one field per line.
func printSession(w io.Writer, s *lockbrokerv1.Session) {
	checks := strings.Join(s.GetChecks(), ",")
	if checks == "" {
		checks = "-"
	}
	fmt.Fprintf(w, "id:           %s\nname:         %s\nttl:          %v\nlock-delay:   %v\nbehavior:     %s\nnode:         %s\nchecks:       %s\ncreate-index: %d\n",
		s.GetId(), s.GetName(), s.GetTtl().AsDuration(), s.GetLockDelay().AsDuration(),
		enumName(s.GetBehavior().String(), "SESSION_BEHAVIOR_"), s.GetNode(), checks, s.GetCreateIndex())
}

// printJSON prints m as one line of protojson (the API's JSON mapping, as
// grpcurl shows it).
func printJSON(w io.Writer, m proto.Message) error {
	b, err := protojson.Marshal(m)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// printSessions prints session summaries as a table, one session a line.
func printSessions(w io.Writer, sessions []*lockbrokerv1.SessionSummary) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SESSION\tOWNER\tTTL\tNAME\tHOLDS")
	for _, s := range sessions {
		owner := "client"
		if s.GetBrokerOwned() {
			owner = "broker"
		}
		holds := make([]string, len(s.GetHolds()))
		for i, h := range s.GetHolds() {
			holds[i] = fmt.Sprintf("%q (token %d)", h.GetKey(), h.GetToken())
		}
		held := strings.Join(holds, ", ")
		if held == "" {
			held = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%v\t%s\t%s\n", s.GetSession().GetId(), owner, s.GetSession().GetTtl().AsDuration(), s.GetSession().GetName(), held)
	}
	_ = tw.Flush()
}
