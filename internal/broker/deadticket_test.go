package broker

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// tidyQueue's deadTicketOps(st, "") deletes every dead ticket (a ticket
// whose session ended has no session, and was spared when compared with
// ""), and never a live one; a grant's spares the grantee's own.
func TestDeadTicketOps(t *testing.T) {
	const key = "dead/k"
	entries := []*Entry{
		{Key: key + queueSuffix, Flags: QueueFlagValue, ModifyIndex: 5},
		{Key: ticketKey(key, "s1"), Flags: QueueFlagValue, CreateIndex: 6, ModifyIndex: 7},                // dead
		{Key: ticketKey(key, "s2"), Flags: QueueFlagValue, CreateIndex: 8, ModifyIndex: 8, Session: "s2"}, // live
		{Key: ticketKey(key, "s3"), Flags: QueueFlagValue, CreateIndex: 9, ModifyIndex: 10},               // dead
	}
	st := queueState(key, entries, 10)
	keys := func(ops []Op) []string {
		var out []string
		for _, o := range ops {
			assert.Equal(t, OpDeleteCAS, o.Verb)
			out = append(out, o.Key)
		}
		return out
	}
	assert.Equal(t, []string{ticketKey(key, "s1"), ticketKey(key, "s3")}, keys(deadTicketOps(st, "")), "a tidy deletes every dead ticket")
	assert.Equal(t, []string{ticketKey(key, "s1"), ticketKey(key, "s3")}, keys(deadTicketOps(st, "s2")), "a grant to s2 deletes the dead ones")
	assert.Equal(t, 1, st.Waiting)
}
