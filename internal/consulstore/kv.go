package consulstore

import (
	"context"

	"github.com/hashicorp/consul/api"

	"github.com/lockbroker/lockbroker/internal/broker"
)

// List implements broker.Store. A listing Consul filtered by ACLs is
// StorePermissionDenied, never a shorter or empty result.
func (s *Store) List(ctx context.Context, prefix string, consistent bool) ([]*broker.Entry, uint64, error) {
	c := s.begin(ctx, opKVList, s.opts.CallTimeout)
	q := &api.QueryOptions{RequireConsistent: consistent}
	return s.list(c, s.c, prefix, q)
}

// Watch implements broker.Store. It first takes one of Options.MaxBlocking
// slots, waiting for one (or for ctx) when all are taken, then runs the
// blocking query on the blocking-query transport, bounded by
// Options.WaitTime plus Consul's jitter and Options.CallTimeout.
func (s *Store) Watch(ctx context.Context, prefix string, waitIndex uint64) ([]*broker.Entry, uint64, error) {
	if err := s.acquireSlot(ctx); err != nil {
		return nil, 0, err
	}
	defer s.releaseSlot()
	c := s.begin(ctx, opKVWatch, s.opts.watchTimeout())
	q := &api.QueryOptions{WaitIndex: waitIndex, WaitTime: s.opts.WaitTime}
	return s.list(c, s.blockingC, prefix, q)
}

// acquireSlot takes a blocking-query slot, or returns ctx's error.
func (s *Store) acquireSlot(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case s.slots <- struct{}{}:
	default:
		s.queued.Add(1)
		defer s.queued.Add(-1)
		select {
		case s.slots <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	s.blocking.Add(1)
	return nil
}

func (s *Store) releaseSlot() {
	s.blocking.Add(-1)
	<-s.slots
}

// list runs one KV listing of prefix through client.
func (s *Store) list(c *call, client *api.Client, prefix string, q *api.QueryOptions) ([]*broker.Entry, uint64, error) {
	pairs, meta, err := client.KV().List(prefix, q.WithContext(c.ctx))
	if err == nil && meta.ResultsFilteredByACLs {
		err = c.filtered()
	}
	if err = c.end(err); err != nil {
		return nil, 0, err
	}
	out := make([]*broker.Entry, 0, len(pairs))
	for _, p := range pairs {
		out = append(out, entry(p))
	}
	return out, meta.LastIndex, nil
}

func entry(p *api.KVPair) *broker.Entry {
	return &broker.Entry{
		Key:         p.Key,
		Value:       p.Value,
		Flags:       p.Flags,
		Session:     p.Session,
		LockIndex:   p.LockIndex,
		CreateIndex: p.CreateIndex,
		ModifyIndex: p.ModifyIndex,
	}
}
