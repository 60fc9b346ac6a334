package server

import (
	"context"

	"go.uber.org/zap"
	"google.golang.org/protobuf/types/known/durationpb"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/broker"
)

// SessionService implements lockbroker.v1.SessionService.
type SessionService struct {
	lockbrokerv1.UnimplementedSessionServiceServer
	broker *broker.Broker
	log    *zap.Logger
}

// NewSessionService returns the SessionService on b.
func NewSessionService(b *broker.Broker, log *zap.Logger) *SessionService {
	return &SessionService{broker: b, log: log}
}

// CreateSession implements SessionService.CreateSession.
func (s *SessionService) CreateSession(ctx context.Context, req *lockbrokerv1.CreateSessionRequest) (*lockbrokerv1.CreateSessionResponse, error) {
	info, err := s.broker.CreateSession(ctx, specFromProto(req.GetOptions()))
	if err != nil {
		return nil, toStatus(s.log, s.broker.Placed(err))
	}
	return &lockbrokerv1.CreateSessionResponse{Session: sessionToProto(info)}, nil
}

// RenewSession implements SessionService.RenewSession.
func (s *SessionService) RenewSession(ctx context.Context, req *lockbrokerv1.RenewSessionRequest) (*lockbrokerv1.RenewSessionResponse, error) {
	info, err := s.broker.RenewSession(ctx, req.GetSessionId())
	if err != nil {
		return nil, toStatus(s.log, s.broker.Placed(err))
	}
	return &lockbrokerv1.RenewSessionResponse{Session: sessionToProto(info), GuaranteedFor: durationpb.New(info.TTL)}, nil
}

// DestroySession implements SessionService.DestroySession.
func (s *SessionService) DestroySession(ctx context.Context, req *lockbrokerv1.DestroySessionRequest) (*lockbrokerv1.DestroySessionResponse, error) {
	if err := s.broker.DestroySession(ctx, req.GetSessionId()); err != nil {
		return nil, toStatus(s.log, s.broker.Placed(err))
	}
	return &lockbrokerv1.DestroySessionResponse{}, nil
}

// GetSession implements SessionService.GetSession.
func (s *SessionService) GetSession(ctx context.Context, req *lockbrokerv1.GetSessionRequest) (*lockbrokerv1.GetSessionResponse, error) {
	info, err := s.broker.GetSession(ctx, req.GetSessionId())
	if err != nil {
		return nil, toStatus(s.log, s.broker.Placed(err))
	}
	return &lockbrokerv1.GetSessionResponse{Session: sessionToProto(info)}, nil
}

// ListSessions implements SessionService.ListSessions.
func (s *SessionService) ListSessions(ctx context.Context, _ *lockbrokerv1.ListSessionsRequest) (*lockbrokerv1.ListSessionsResponse, error) {
	list, err := s.broker.ListSessions(ctx, broker.TenantFrom(ctx))
	if err != nil {
		return nil, toStatus(s.log, s.broker.Placed(err))
	}
	out := &lockbrokerv1.ListSessionsResponse{}
	for _, x := range list {
		out.Sessions = append(out.Sessions, summaryToProto(x))
	}
	return out, nil
}
