package broker

import "context"

// Watch sends key's state now and after every change until ctx ends or
// send fails. With prefix it sends the state of every lock and semaphore
// under key/ (and key itself), one key per call, then a nil state that
// marks the end of the initial snapshot, then each change (a KindNone
// state for a key that disappears). skipped counts the publications this
// reader missed because it read slowly; it always gets the newest state.
// All watchers of one key on this replica share one watch.
func (b *Broker) Watch(ctx context.Context, key string, prefix bool, send func(st *State, skipped uint64) error) error {
	s := b.hub.subscribe(key)
	defer s.close()
	// The first state is a consistent read, so that it is never older than
	// a grant the caller already saw; shared states older than it are
	// skipped.
	entries, idx, err := b.store.List(ctx, key, true)
	if err != nil {
		return err
	}
	entries = under(key, entries)
	if !prefix {
		return b.watchKey(ctx, s, deriveState(key, entries, idx), send)
	}
	return b.watchPrefix(ctx, s, key, entries, idx, send)
}

// watchPrefix follows every key under key/ (and key itself), from their
// consistent listing entries at idx. It is a function of its own so that
// Watch's frame, parked under it for the watch's life, stays small (see
// Acquire).
func (b *Broker) watchPrefix(ctx context.Context, s *sub, key string, entries []*Entry, idx uint64, send func(*State, uint64) error) error {
	last := map[string]*State{}
	for k, st := range subStates(key, entries, idx) {
		b.fillTokens(ctx, st)
		last[k] = st
		if err := send(st, 0); err != nil {
			return err
		}
	}
	if err := send(nil, 0); err != nil {
		return err
	}
	for {
		if err := b.await(ctx, s); err != nil {
			return err
		}
		entries, at, skipped, ok := s.listing()
		if !ok || at < idx {
			continue
		}
		if err := b.sendChanges(ctx, key, entries, at, skipped, last, send); err != nil {
			return err
		}
	}
}

// watchKey follows one key.
func (b *Broker) watchKey(ctx context.Context, s *sub, last *State, send func(*State, uint64) error) error {
	b.fillTokens(ctx, last)
	if err := send(last, 0); err != nil {
		return err
	}
	for {
		if err := b.await(ctx, s); err != nil {
			return err
		}
		st, skipped := s.state()
		if st == nil || st.Index < last.Index {
			continue
		}
		b.fillTokens(ctx, st)
		if sameHolders(st, last) {
			continue
		}
		last = st
		if err := send(st, skipped); err != nil {
			return err
		}
	}
}

// sendChanges sends the states under key that changed since last, and a
// KindNone state for each key that disappeared.
func (b *Broker) sendChanges(ctx context.Context, key string, entries []*Entry, at, skipped uint64, last map[string]*State, send func(*State, uint64) error) error {
	now := subStates(key, entries, at)
	for k, st := range now {
		b.fillTokens(ctx, st)
		if prev, seen := last[k]; seen && sameHolders(prev, st) {
			continue
		}
		last[k] = st
		if err := send(st, skipped); err != nil {
			return err
		}
		skipped = 0
	}
	for k := range last {
		if _, ok := now[k]; !ok {
			delete(last, k)
			if err := send(&State{Key: k, Kind: KindNone, Index: at}, skipped); err != nil {
				return err
			}
			skipped = 0
		}
	}
	return nil
}

// await waits for the next wake-up of s. A replica cut off from Consul
// (see reach.go) ends its watches, whose states would stay as they were
// whatever happens to the keys: the client libraries watch on another
// replica.
func (b *Broker) await(ctx context.Context, s *sub) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-b.shutdown:
		return newError(ErrShutdown, ReasonBrokerShuttingDown, "the broker is shutting down; watch on another replica")
	case <-b.reach.lost():
		return newError(ErrUnavailable, ReasonReplicaCutOff, "this replica's Consul agent has not answered for %s; watch on another replica", reachGrace)
	case <-s.wake:
		return nil
	}
}
