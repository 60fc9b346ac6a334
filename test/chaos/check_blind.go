package chaos

import (
	"fmt"
	"slices"
	"time"
)

// DESIGN.md's 1 s for a lock taken away in Consul presumes that the
// holder's broker runs and can read Consul. While it is paused, killed,
// cut off from its Consul server, or while Consul elects a leader, it
// cannot see the change; what it promises then is the other bound (lost
// before the guaranteed deadline, and before anyone else gets the lock),
// which the loss-bound checker checks for every hold anyway.

// takenBound is DESIGN.md's bound for a lock taken away in Consul to be
// reported to its holder.
const takenBound = time.Second

// An operator destroying a session takes the lock away in Consul at once,
// and the broker tells the holder within takenBound: if the broker can see
// it and the holder can hear it. A client cut off from the broker holding
// its stream (a partition from it, or from every broker) cannot hear it; a
// broker that is paused, stopped, cut off from Consul, or whose Consul has
// no leader (blinded) cannot see it. The client believes until its
// guaranteed deadline, and Consul's lock-delay (2 s in these runs, shorter
// than a guaranteed_for) may let the next holder in first. Nothing can do
// better (nobody can tell the client, and Consul has handed the key on):
// only the token protects the resource then, which the fencing checker
// checks, and the proto says so (AcquireKeepalive: the guarantee is against
// expiry, not against an operator). Such a hold's belief is checked up to
// the destroy and not after, like a paused client's.

// unheardTake returns when an admin fault took h away while h's client was
// cut off from the broker holding it, or that broker was blinded (from the
// destroy until the bound ran out), or 0. A partition from one broker
// counts only when the fault names the holder's broker, and that one.
func unheardTake(s *Snapshot, h Hold, taken time.Duration) time.Duration {
	f := adminFault(s, h)
	if f == nil {
		return 0
	}
	if blinded(s, *f, h, taken) {
		return f.Start
	}
	for _, g := range s.Faults {
		if g.Kind != FClientPartition || !slices.Contains(g.Clients, h.Client) {
			continue
		}
		if g.Replica != "" && g.Replica != f.Replica {
			continue
		}
		end := g.End
		if end == 0 {
			end = s.End
		}
		if g.Start <= f.Start+taken && end >= f.Start {
			return f.Start
		}
	}
	return 0
}

// blinded reports whether a fault that keeps the holder's broker from
// seeing Consul was on when admin fault f took h's lock away, or began
// before the 1 s bound ran out.
func blinded(s *Snapshot, f Fault, h Hold, taken time.Duration) bool {
	for _, g := range s.Faults {
		end := g.End
		if end == 0 {
			end = s.End
		}
		if g.Start > f.Start+taken || end < f.Start-time.Second {
			continue
		}
		if hitsHolder(g, f.Replica, f.Server) {
			return true
		}
	}
	return false
}

// hitsHolder says whether fault g stops the broker that holds a hold, or
// cuts it off from Consul: that broker (replica) paused, stopped or
// killed, its link to Consul cut, its Consul server killed, or a Consul
// leader election. An empty replica or server matches any.
func hitsHolder(g Fault, replica, server string) bool {
	switch g.Kind {
	case FBrokerPause, FBrokerPauseLong, FBrokerPauseFailover, FBrokerTerm, FBrokerKill:
		return replica == "" || g.Target == replica
	case FConsulBlackhole, FConsulBlackholeLong, FConsulReset:
		return replica == "" || g.Target == replica+"↔consul"
	case FConsulFollowerKill:
		return server == "" || g.Target == server
	case FConsulLeaderKill, FConsulRestartAll:
		return true
	}
	return false
}

// replicaOf names the broker whose stream holds client id's lock now, and
// its Consul server ("" when unknown).
func (r *run) replicaOf(id int) (replica, server string) {
	for _, c := range r.clients {
		if c.ID != id {
			continue
		}
		if i := c.Replica(); i >= 0 && i < len(r.brokers) {
			return r.brokers[i].Name(), fmt.Sprintf("consul-%d", i%r.cluster.Size())
		}
	}
	return "", ""
}
