package chaos

import (
	"fmt"
	"time"
)

// DESIGN.md's 1 s for a lock taken away in Consul presumes that the
// holder's broker runs and can read Consul. While it is paused, killed,
// cut off from its Consul server, or while Consul elects a leader, it
// cannot see the change; what it promises then is the other bound (lost
// before the guaranteed deadline, and before anyone else gets the lock),
// which the loss-bound checker checks for every hold anyway.

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
		if blinds(g, f) {
			return true
		}
	}
	return false
}

// blinds says whether fault g keeps the broker that held f's lock (f's
// Replica and Server, any when unknown) from seeing Consul.
func blinds(g, f Fault) bool {
	owner := f.Replica == "" || g.Target == f.Replica
	switch g.Kind {
	case FBrokerPause, FBrokerPauseLong, FBrokerPauseFailover, FBrokerTerm, FBrokerKill:
		return owner
	case FConsulBlackhole, FConsulBlackholeLong, FConsulReset:
		return f.Replica == "" || g.Target == f.Replica+"↔consul"
	case FConsulFollowerKill:
		return f.Server == "" || g.Target == f.Server
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
