package broker

import "context"

// Watch sends key's state now and after every change until ctx ends or
// send fails. With prefix it sends the state of every lock and semaphore
// under key/ (and key itself), one key per call, and a KindNone state for
// a key that disappears. skipped counts the publications this reader
// missed because it read slowly; it always gets the newest state. All
// watchers of one key on this replica share one Consul blocking query.
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
	entries = filterUnder(key, entries)
	floor := idx
	var last *State
	lastSub := map[string]*State{}
	if !prefix {
		last = deriveState(key, entries, idx)
		s.fill(last)
		if err := send(last, 0); err != nil {
			return err
		}
	} else {
		for k, st := range subStates(key, entries, idx) {
			s.fill(st)
			lastSub[k] = st
			if err := send(st, 0); err != nil {
				return err
			}
		}
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-b.shutdown:
			return ErrShutdown
		case <-s.wake:
		}
		if !prefix {
			st, skipped := s.state()
			if st == nil || st.Index < last.Index || sameHolders(st, last) {
				continue
			}
			last = st
			if err := send(st, skipped); err != nil {
				return err
			}
			continue
		}
		entries, idx, skipped, ok := s.listing()
		if !ok || idx < floor {
			continue
		}
		now := subStates(key, entries, idx)
		for k, st := range now {
			s.fill(st)
			if prev, seen := lastSub[k]; seen && sameHolders(prev, st) {
				continue
			}
			lastSub[k] = st
			if err := send(st, skipped); err != nil {
				return err
			}
			skipped = 0
		}
		for k := range lastSub {
			if _, ok := now[k]; !ok {
				delete(lastSub, k)
				if err := send(&State{Key: k, Kind: KindNone, Index: idx}, skipped); err != nil {
					return err
				}
				skipped = 0
			}
		}
	}
}
