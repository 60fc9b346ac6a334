package chaos

import (
	"context"
	"time"
)

// FBrokerPauseFailover stops the replica that holds the most streams and
// resets its clients' links, so that they resume their holds elsewhere
// while it is stopped; it continues after TTL+1…TTL+3s. The stale replica
// wakes past its safe deadline (its hold timers fire before it can read
// that the sessions moved) with holds whose sessions other replicas now
// own: it must not touch them (DESIGN.md, "Resume": every write is
// conditioned on still owning the session). This is the fault that
// exposes the no-resume-fence mutant.
const FBrokerPauseFailover = "broker-pause-failover"

// pauseFailover injects FBrokerPauseFailover (waiting up to 5s for a
// replica with at least minStreams holds, else taking the busiest).
func (r *run) pauseFailover(ctx context.Context, p Planned) {
	const minStreams = 2
	i, n := r.busiestReplica(p.Pick)
	for try := 0; n < minStreams && try < 25 && ctx.Err() == nil; try++ {
		sleep(ctx, 200*time.Millisecond)
		i, n = r.busiestReplica(p.Pick)
	}
	b := r.brokers[i]
	if !b.Running() || b.Paused() {
		r.note(p.Kind + ": " + b.Name() + " not running")
		return
	}
	f := r.start(Fault{Kind: p.Kind, Target: b.Name(), Note: p.Dur.String()})
	if err := b.Pause(); err != nil {
		r.note(p.Kind + ": " + err.Error())
	}
	var txs []*Toxics
	for _, c := range r.clients {
		tx, err := c.Links[i].Reset()
		if err != nil {
			r.note(p.Kind + ": " + err.Error())
		}
		txs = append(txs, tx)
	}
	sleep(ctx, p.Dur)
	for _, tx := range txs {
		tx.Heal()
	}
	_ = b.Continue()
	r.end(f)
}

// busiestReplica is the running replica whose streams hold the most of
// the clients' current holds, and how many (ties go by pick).
func (r *run) busiestReplica(pick uint64) (int, int) {
	count := make([]int, len(r.brokers))
	for _, c := range r.clients {
		if i := c.Replica(); i >= 0 && i < len(count) {
			count[i]++
		}
	}
	best, n := -1, -1
	for k := range count {
		i := (int(pick%uint64(len(count))) + k) % len(count)
		if r.brokers[i].Running() && !r.brokers[i].Paused() && count[i] > n {
			best, n = i, count[i]
		}
	}
	if best < 0 {
		return int(pick % uint64(len(count))), 0
	}
	return best, n
}
