package server

import (
	"fmt"

	"google.golang.org/protobuf/types/known/durationpb"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/broker"
)

var kinds = map[broker.Kind]lockbrokerv1.LockKind{
	broker.KindNone:      lockbrokerv1.LockKind_LOCK_KIND_NONE,
	broker.KindLock:      lockbrokerv1.LockKind_LOCK_KIND_LOCK,
	broker.KindSemaphore: lockbrokerv1.LockKind_LOCK_KIND_SEMAPHORE,
	broker.KindForeign:   lockbrokerv1.LockKind_LOCK_KIND_FOREIGN,
	broker.KindRWLock:    lockbrokerv1.LockKind_LOCK_KIND_RWLOCK,
}

var reasons = map[broker.LostReason]lockbrokerv1.LostReason{
	broker.LostSessionInvalidated: lockbrokerv1.LostReason_LOST_REASON_SESSION_INVALIDATED,
	broker.LostReleasedByOther:    lockbrokerv1.LostReason_LOST_REASON_RELEASED_BY_OTHER,
	broker.LostDeletedByOther:     lockbrokerv1.LostReason_LOST_REASON_DELETED_BY_OTHER,
	broker.LostRenewalFailed:      lockbrokerv1.LostReason_LOST_REASON_RENEWAL_FAILED,
	broker.LostLimitConflict:      lockbrokerv1.LostReason_LOST_REASON_LIMIT_CONFLICT,
	broker.LostBrokerShutdown:     lockbrokerv1.LostReason_LOST_REASON_BROKER_SHUTDOWN,
	broker.LostResumedElsewhere:   lockbrokerv1.LostReason_LOST_REASON_RESUMED_ELSEWHERE,
	broker.LostReplicaCutOff:      lockbrokerv1.LostReason_LOST_REASON_REPLICA_CUT_OFF,
}

func stateToProto(st *broker.State) *lockbrokerv1.LockState {
	if st == nil {
		return nil
	}
	out := &lockbrokerv1.LockState{Key: st.Key, Kind: kinds[st.Kind], Limit: st.Limit, Index: st.Index, Waiting: uint32(max(st.Waiting, 0))}
	for _, h := range st.Holders {
		out.Holders = append(out.Holders, &lockbrokerv1.Holder{
			SessionId:   h.Session,
			Value:       h.Value,
			Token:       h.Token,
			LockIndex:   h.LockIndex,
			SessionName: h.SessionName,
			Read:        h.Read,
		})
	}
	return out
}

func seqToProto(s broker.Sequencer) *lockbrokerv1.Sequencer {
	return &lockbrokerv1.Sequencer{Key: s.Key, SessionId: s.Session, LockIndex: s.LockIndex, Token: s.Token, Kind: kinds[s.Kind], Read: s.Read}
}

func seqsToProto(seqs []broker.Sequencer) []*lockbrokerv1.Sequencer {
	var out []*lockbrokerv1.Sequencer
	for _, s := range seqs {
		out = append(out, seqToProto(s))
	}
	return out
}

func seqFromProto(s *lockbrokerv1.Sequencer) broker.Sequencer {
	out := broker.Sequencer{Key: s.GetKey(), Session: s.GetSessionId(), LockIndex: s.GetLockIndex(), Token: s.GetToken(), Read: s.GetRead()}
	for k, v := range kinds {
		if v == s.GetKind() {
			out.Kind = k
		}
	}
	return out
}

// specFromProto converts session options; nil stays nil (the defaults).
// An absent lock_delay becomes -1, the broker's "use the default".
func specFromProto(o *lockbrokerv1.SessionOptions) *broker.SessionSpec {
	if o == nil {
		return nil
	}
	s := &broker.SessionSpec{
		Name:      o.GetName(),
		TTL:       o.GetTtl().AsDuration(),
		LockDelay: -1,
		Delete:    o.GetBehavior() == lockbrokerv1.SessionBehavior_SESSION_BEHAVIOR_DELETE,
		Checks:    o.GetChecks(),
	}
	if o.LockDelay != nil {
		s.LockDelay = o.GetLockDelay().AsDuration()
	}
	return s
}

func sessionToProto(s *broker.SessionInfo) *lockbrokerv1.Session {
	b := lockbrokerv1.SessionBehavior_SESSION_BEHAVIOR_RELEASE
	if s.Delete {
		b = lockbrokerv1.SessionBehavior_SESSION_BEHAVIOR_DELETE
	}
	return &lockbrokerv1.Session{
		Id:          s.ID,
		Name:        s.Name,
		Ttl:         durationpb.New(s.TTL),
		LockDelay:   durationpb.New(s.LockDelay),
		Behavior:    b,
		Node:        s.Node,
		Checks:      s.Checks,
		CreateIndex: s.CreateIndex,
	}
}

func eventToProto(e broker.Event) *lockbrokerv1.AcquireResponse {
	switch e.Kind {
	case broker.EventQueued:
		q := &lockbrokerv1.AcquireQueued{State: stateToProto(e.State), SessionId: e.Session, Position: uint32(max(e.Position, 0))}
		if e.Heartbeat > 0 {
			q.Heartbeat = durationpb.New(e.Heartbeat)
		}
		if e.LockDelayRemaining > 0 {
			q.LockDelayRemaining = durationpb.New(e.LockDelayRemaining)
		}
		return &lockbrokerv1.AcquireResponse{Event: &lockbrokerv1.AcquireResponse_Queued{Queued: q}}
	case broker.EventAcquired:
		return &lockbrokerv1.AcquireResponse{Event: &lockbrokerv1.AcquireResponse_Acquired{Acquired: &lockbrokerv1.AcquireAcquired{
			Sequencer: seqToProto(e.Sequencer), GuaranteedFor: durationpb.New(e.GuaranteedFor), Resumed: e.Resumed,
			Sequencers: seqsToProto(e.Sequencers),
		}}}
	case broker.EventKeepalive:
		return &lockbrokerv1.AcquireResponse{Event: &lockbrokerv1.AcquireResponse_Keepalive{Keepalive: &lockbrokerv1.AcquireKeepalive{
			GuaranteedFor: durationpb.New(e.GuaranteedFor),
		}}}
	case broker.EventLost:
		lost := &lockbrokerv1.AcquireLost{Reason: reasons[e.Reason], Detail: e.Detail, Key: e.LostKey}
		if e.Reason == broker.LostBrokerShutdown || e.Reason == broker.LostReplicaCutOff {
			lost.GuaranteedFor = durationpb.New(e.GuaranteedFor)
		}
		return &lockbrokerv1.AcquireResponse{Event: &lockbrokerv1.AcquireResponse_Lost{Lost: lost}}
	default:
		return &lockbrokerv1.AcquireResponse{Event: &lockbrokerv1.AcquireResponse_Released{Released: &lockbrokerv1.AcquireReleased{
			Sequencer: seqToProto(e.Sequencer), Sequencers: seqsToProto(e.Sequencers),
		}}}
	}
}

func summaryToProto(s broker.SessionSummary) *lockbrokerv1.SessionSummary {
	out := &lockbrokerv1.SessionSummary{Session: sessionToProto(s.Info), BrokerOwned: s.BrokerOwned}
	for _, h := range s.Holds {
		out.Holds = append(out.Holds, seqToProto(h))
	}
	return out
}

// acquireSpec converts the fields Acquire and TryAcquire share.
func acquireSpec(key string, value []byte, limit uint32, kind lockbrokerv1.AcquireKind) (broker.AcquireSpec, error) {
	spec := broker.AcquireSpec{Key: key, Value: value, Limit: limit}
	switch kind {
	case lockbrokerv1.AcquireKind_ACQUIRE_KIND_LOCK:
		if limit > 1 {
			return spec, &broker.Error{Kind: broker.ErrInvalid, Reason: broker.ReasonInvalidArgument, Field: "limit",
				Msg: fmt.Sprintf("limit: must be 0 or 1 with kind ACQUIRE_KIND_LOCK, got %d", limit)}
		}
	case lockbrokerv1.AcquireKind_ACQUIRE_KIND_SEMAPHORE:
		spec.Semaphore = true
	case lockbrokerv1.AcquireKind_ACQUIRE_KIND_READ, lockbrokerv1.AcquireKind_ACQUIRE_KIND_WRITE:
		if limit > 1 {
			return spec, &broker.Error{Kind: broker.ErrInvalid, Reason: broker.ReasonInvalidArgument, Field: "limit",
				Msg: fmt.Sprintf("limit: must be 0 or 1 with kind %s, got %d", kind, limit)}
		}
		spec.Mode = broker.ModeWrite
		if kind == lockbrokerv1.AcquireKind_ACQUIRE_KIND_READ {
			spec.Mode = broker.ModeRead
		}
	}
	return spec, nil
}
