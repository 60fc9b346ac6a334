package broker

import "context"

// SetValue changes the value of session's hold on key without giving it
// up; the sequencer stays the same. With token > 0 it changes only that
// grant's value. The write goes through the caller's tenant's store (its
// Consul token), as every write made for a tenant does.
func (b *Broker) SetValue(ctx context.Context, key, session string, value []byte, token uint64) (*Sequencer, error) {
	for attempt := range maxWriteAttempts {
		if attempt > 0 {
			// Another write of the key won (the holder's own SetValues
			// racing with a token each check the entry's index): back off
			// a little, with jitter, so that each of them gets its turn.
			backoff(ctx, attempt)
		}
		st, rec, err := b.readHold(ctx, key, session)
		if err != nil {
			return nil, err
		}
		if err := allowed(ctx, rec, TenantFrom(ctx)); err != nil {
			return nil, err
		}
		hd, ok := st.holder(session)
		if !ok && token == 0 && rec.waitsFor(key) {
			// A waiter holds nothing, so no token exists for it: not
			// held, before the token rule (as Release answers).
			return nil, b.waiterNotHolder(ctx, st, session)
		}
		if err := rec.tokenRequired(token); err != nil {
			return nil, err
		}
		if !ok {
			if _, err := b.store.Session(ctx, session); err != nil {
				return nil, sessionError(err, session)
			}
			b.fillTokens(ctx, st)
			return nil, newError(ErrNotHolder, ReasonNotHolder, "session %s does not hold %q", session, key).withState(st)
		}
		seq := Sequencer{Key: key, Session: session, LockIndex: hd.LockIndex, Token: hd.Token, Kind: st.Kind}
		if t := rec.token(key); t > 0 {
			seq.Token = t
		}
		if token != 0 && token != seq.Token {
			return nil, newError(ErrNotHolder, ReasonNotHolder, "session %s holds %q with token %d, not %d", session, key, seq.Token, token).withState(st)
		}
		target, flags := key, LockFlagValue
		if st.Kind == KindSemaphore {
			target, flags = contenderKey(key, session), SemaphoreFlagValue
		}
		if st.Kind == KindRWLock {
			target, flags = contenderKey(key, session), st.child(session).Flags
			seq.Read = hd.Read
		}
		// Still held by the session; with a token, by this very grant
		// (its entry unchanged since the read). The record is as read
		// too: readHold reads it at the same time as the state, so it may
		// be the older of the two, and its token must still be the
		// grant's.
		ops := []Op{rec.guard(), {Verb: OpCheckSession, Key: target, Session: session}}
		if token != 0 {
			ops = append(ops, Op{Verb: OpCheckIndex, Key: target, Index: st.entry(target).ModifyIndex})
		}
		ops = append(ops, Op{Verb: OpLock, Key: target, Value: value, Flags: flags, Session: session})
		_, err = b.storeFor(TenantFrom(ctx)).Txn(ctx, ops)
		if te := asTxnError(err); te != nil {
			if te.Has(TxnSessionInvalid) {
				return nil, sessionError(ErrSessionNotFound, session)
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		return &seq, nil
	}
	return nil, newError(ErrUnavailable, ReasonConsulUnavailable, "key %q kept changing; retry", key)
}

// TryAcquire takes key now for a client-owned session and returns the
// grant, without a stream: the hold lasts until the client releases it or
// the session ends. A busy key is ErrBusy with the holders.
func (b *Broker) TryAcquire(ctx context.Context, spec AcquireSpec) (*Sequencer, error) {
	if !b.enter() {
		return nil, newError(ErrShutdown, ReasonBrokerShuttingDown, "the broker is shutting down; retry on another replica")
	}
	defer b.holds.Done()
	if spec.SessionID == "" {
		return nil, invalid("session_id", "is required")
	}
	spec.Wait, spec.WaitForever, spec.NewSession, spec.Resume = 0, false, nil, nil
	h := b.newHold(ctx, spec, func(Event) error { return nil })
	if err := h.openSession(ctx); err != nil {
		return nil, err
	}
	h.sub = b.hub.subscribeLazy(spec.Key)
	defer h.sub.close()
	seq, err := h.wait(ctx)
	if err != nil {
		h.abandon()
		return nil, err
	}
	return seq, nil
}
