package server

import (
	"context"

	"go.uber.org/zap"
	"google.golang.org/grpc"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/broker"
)

// LockService implements lockbroker.v1.LockService. Requests arrive
// validated by the protovalidate interceptor.
type LockService struct {
	lockbrokerv1.UnimplementedLockServiceServer
	broker *broker.Broker
	log    *zap.Logger
}

// NewLockService returns the LockService on b.
func NewLockService(b *broker.Broker, log *zap.Logger) *LockService {
	return &LockService{broker: b, log: log}
}

// Acquire implements LockService.Acquire. Its frame stays on a held
// hold's stack for the hold's life, so it is kept small (see
// broker.Acquire): the spec is built by a call that returns.
func (s *LockService) Acquire(req *lockbrokerv1.AcquireRequest, stream grpc.ServerStreamingServer[lockbrokerv1.AcquireResponse]) error {
	spec, err := acquireRequestSpec(req)
	if err == nil {
		err = s.broker.Acquire(withConnGone(stream.Context()), spec, func(e broker.Event) error {
			if e.Kind == broker.EventLost && e.LostKey == "" && !wholeHoldLoss(e.Reason) {
				e.LostKey = spec.Key // AcquireLost.key: the request's key
			}
			return stream.Send(eventToProto(e))
		})
	}
	return toStatus(s.log, s.broker.Placed(err))
}

// wholeHoldLoss says whether a loss concerns the whole hold rather than
// one of its keys (AcquireLost.key stays empty).
func wholeHoldLoss(r broker.LostReason) bool {
	return r == broker.LostBrokerShutdown || r == broker.LostReplicaCutOff || r == broker.LostResumedElsewhere
}

// acquireRequestSpec is what req asks the broker for.
func acquireRequestSpec(req *lockbrokerv1.AcquireRequest) (*broker.AcquireSpec, error) {
	if err := checkMultiKey(req); err != nil {
		return nil, err
	}
	spec, err := acquireSpec(req.GetKey(), req.GetValue(), req.GetLimit(), req.GetKind())
	if err != nil {
		return nil, err
	}
	spec.Keys = req.GetKeys()
	spec.WaitForever = req.WaitTimeout == nil
	spec.Wait = req.GetWaitTimeout().AsDuration()
	spec.NewSession = specFromProto(req.GetNewSession())
	spec.SessionID = req.GetSessionId()
	spec.Fair = req.GetFair()
	if r := req.GetResume(); r != nil {
		seq := seqFromProto(r)
		spec.Resume = &seq
	}
	return &spec, nil
}

// TryAcquire implements LockService.TryAcquire.
func (s *LockService) TryAcquire(ctx context.Context, req *lockbrokerv1.TryAcquireRequest) (*lockbrokerv1.TryAcquireResponse, error) {
	spec, err := acquireSpec(req.GetKey(), req.GetValue(), req.GetLimit(), req.GetKind())
	if err != nil {
		return nil, toStatus(s.log, s.broker.Placed(err))
	}
	spec.SessionID = req.GetSessionId()
	seq, err := s.broker.TryAcquire(ctx, spec)
	if err != nil {
		return nil, toStatus(s.log, s.broker.Placed(err))
	}
	return &lockbrokerv1.TryAcquireResponse{Sequencer: seqToProto(*seq)}, nil
}

// Release implements LockService.Release.
func (s *LockService) Release(ctx context.Context, req *lockbrokerv1.ReleaseRequest) (*lockbrokerv1.ReleaseResponse, error) {
	released, err := s.broker.Release(ctx, req.GetKey(), req.GetSessionId(), req.GetToken())
	if err != nil {
		return nil, toStatus(s.log, s.broker.Placed(err))
	}
	return &lockbrokerv1.ReleaseResponse{Released: released}, nil
}

// Watch implements LockService.Watch.
func (s *LockService) Watch(req *lockbrokerv1.WatchRequest, stream grpc.ServerStreamingServer[lockbrokerv1.WatchResponse]) error {
	err := s.broker.Watch(stream.Context(), req.GetKey(), req.GetPrefix(), func(st *broker.State, skipped uint64) error {
		if st == nil {
			return stream.Send(&lockbrokerv1.WatchResponse{SnapshotComplete: true})
		}
		return stream.Send(&lockbrokerv1.WatchResponse{State: stateToProto(st), Skipped: skipped})
	})
	return toStatus(s.log, s.broker.Placed(err))
}

// GetLock implements LockService.GetLock.
func (s *LockService) GetLock(ctx context.Context, req *lockbrokerv1.GetLockRequest) (*lockbrokerv1.GetLockResponse, error) {
	st, err := s.broker.GetLock(ctx, req.GetKey())
	if err != nil {
		return nil, toStatus(s.log, s.broker.Placed(err))
	}
	return &lockbrokerv1.GetLockResponse{State: stateToProto(st)}, nil
}

// SetValue implements LockService.SetValue.
func (s *LockService) SetValue(ctx context.Context, req *lockbrokerv1.SetValueRequest) (*lockbrokerv1.SetValueResponse, error) {
	seq, err := s.broker.SetValue(ctx, req.GetKey(), req.GetSessionId(), req.GetValue(), req.GetToken())
	if err != nil {
		return nil, toStatus(s.log, s.broker.Placed(err))
	}
	return &lockbrokerv1.SetValueResponse{Sequencer: seqToProto(*seq)}, nil
}

// CheckSequencer implements LockService.CheckSequencer.
func (s *LockService) CheckSequencer(ctx context.Context, req *lockbrokerv1.CheckSequencerRequest) (*lockbrokerv1.CheckSequencerResponse, error) {
	ok, st, err := s.broker.CheckSequencer(ctx, seqFromProto(req.GetSequencer()))
	if err != nil {
		return nil, toStatus(s.log, s.broker.Placed(err))
	}
	return &lockbrokerv1.CheckSequencerResponse{Current: ok, State: stateToProto(st)}, nil
}
