package broker

// Hand-off without a stampede: the waiters of a key on this replica form
// a local queue in arrival order. A semaphore waiter whose contender entry
// is not listed yet attempts only when as many waiters are ahead of it
// here as there are free slots (rank < free); once listed, its place in
// the key's shared order decides (waiter.turn), as a lock waiter's ticket
// does (ticket.go). The others stay asleep without a Consul call. When a
// waiter leaves (granted, gave up), the others are woken so the next one
// tries.

// setWaiting puts the subscriber in the key's queue of waiters, or takes
// it out; with wake, the others are woken, so that the next may try (see
// wait for who wakes them).
func (s *sub) setWaiting(waiting, wake bool) {
	kw := s.kw
	kw.mu.Lock()
	defer kw.mu.Unlock()
	if s.waiting == waiting {
		return
	}
	s.waiting = waiting
	if waiting {
		kw.arrived++
		s.order = kw.arrived
		s.offered = make(chan struct{})
		return
	}
	s.decided()
	if !wake {
		return
	}
	for o := range kw.subs {
		if o.waiting {
			select {
			case o.wake <- struct{}{}:
			default:
			}
		}
	}
}

// decided closes offered (see sub.offered), under kw.mu.
func (s *sub) decided() {
	if s.offered != nil {
		close(s.offered)
		s.offered = nil
	}
}

// rank is the subscriber's place in the key's queue of waiters (0: first).
func (s *sub) rank() int {
	kw := s.kw
	kw.mu.Lock()
	defer kw.mu.Unlock()
	n := 0
	for o := range kw.subs {
		if o.waiting && o.order < s.order {
			n++
		}
	}
	return n
}

// want asks for a wake-up once the listing reaches index, even if the
// key's entries then look the same as before: a key created and deleted
// between two listings (a grant and its loss) leaves no trace in them.
func (s *sub) want(index uint64) {
	s.kw.mu.Lock()
	s.need = index
	s.kw.mu.Unlock()
}

// state returns the key's newest state (nil before the first read) and
// how many publications were skipped since the previous call.
func (s *sub) state() (*State, uint64) {
	entries, index, skipped, ok := s.listing()
	if !ok {
		return nil, 0
	}
	st := deriveState(s.kw.key, entries, index)
	s.kw.mu.Lock()
	st.partial = s.kw.own && s.kw.index == index
	s.kw.mu.Unlock()
	return st, skipped
}

// listing returns the newest entries at and under the key, their index,
// and how many publications were skipped since the previous read.
func (s *sub) listing() (entries []*Entry, index, skipped uint64, ready bool) {
	kw := s.kw
	kw.mu.Lock()
	defer kw.mu.Unlock()
	if !kw.ready {
		return nil, 0, 0, false
	}
	if s.seen > s.read+1 {
		skipped = s.seen - s.read - 1
	}
	s.read = s.seen
	return kw.entries, kw.index, skipped, true
}

// othersWaiting says whether another subscriber of the key waits.
func (s *sub) othersWaiting() bool {
	kw := s.kw
	kw.mu.Lock()
	defer kw.mu.Unlock()
	for o := range kw.subs {
		if o != s && o.waiting {
			return true
		}
	}
	return false
}
