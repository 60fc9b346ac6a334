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
	var last *State
	lastSub := map[string]*State{}
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
			if st == nil || (last != nil && sameHolders(st, last)) {
				continue
			}
			last = st
			if err := send(st, skipped); err != nil {
				return err
			}
			continue
		}
		entries, idx, ok := s.listing()
		_, skipped := s.state()
		if !ok {
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
