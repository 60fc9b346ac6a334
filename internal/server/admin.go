package server

import (
	"context"

	"go.uber.org/zap"
	"google.golang.org/protobuf/types/known/timestamppb"

	lockbrokerv1 "github.com/lockbroker/lockbroker/gen/lockbroker/v1"
	"github.com/lockbroker/lockbroker/internal/broker"
)

// AdminService implements lockbroker.v1.AdminService. Who may call it is
// decided by the access interceptor (admins only, with tenants).
type AdminService struct {
	lockbrokerv1.UnimplementedAdminServiceServer
	broker *broker.Broker
	log    *zap.Logger
}

// NewAdminService returns the AdminService on b.
func NewAdminService(b *broker.Broker, log *zap.Logger) *AdminService {
	return &AdminService{broker: b, log: log}
}

// ListHolds implements AdminService.ListHolds. Session names come from
// the broker's session list (one more consistent read).
func (s *AdminService) ListHolds(ctx context.Context, req *lockbrokerv1.ListHoldsRequest) (*lockbrokerv1.ListHoldsResponse, error) {
	holds, err := s.broker.ListHolds(ctx, req.GetKeyPrefix())
	if err != nil {
		return nil, toStatus(s.log, s.broker.Placed(err))
	}
	out := &lockbrokerv1.ListHoldsResponse{}
	if len(holds) == 0 {
		return out, nil
	}
	sessions, err := s.broker.ListSessions(ctx, "")
	if err != nil {
		return nil, toStatus(s.log, s.broker.Placed(err))
	}
	names := make(map[string]string, len(sessions))
	for _, x := range sessions {
		names[x.Info.ID] = x.Info.Name
	}
	for _, h := range holds {
		hi := &lockbrokerv1.HoldInfo{
			Tenant:      h.Tenant,
			Key:         h.Key,
			SessionId:   h.Session,
			SessionName: names[h.Session],
			Token:       h.Token,
			Replica:     h.Replica,
			Waiting:     h.Waiting,
			Position:    uint32(max(h.Position, 0)),
			Read:        h.Read,
			WithKeys:    h.WithKeys,
		}
		if !h.Since.IsZero() {
			hi.Since = timestamppb.New(h.Since)
		}
		out.Holds = append(out.Holds, hi)
	}
	return out, nil
}

// ListSessions implements AdminService.ListSessions.
func (s *AdminService) ListSessions(ctx context.Context, req *lockbrokerv1.AdminServiceListSessionsRequest) (*lockbrokerv1.AdminServiceListSessionsResponse, error) {
	list, err := s.broker.ListSessions(ctx, req.GetTenant())
	if err != nil {
		return nil, toStatus(s.log, s.broker.Placed(err))
	}
	out := &lockbrokerv1.AdminServiceListSessionsResponse{}
	for _, x := range list {
		out.Sessions = append(out.Sessions, &lockbrokerv1.TenantSession{Tenant: x.Tenant, Summary: summaryToProto(x)})
	}
	return out, nil
}

// ForceRelease implements AdminService.ForceRelease.
func (s *AdminService) ForceRelease(ctx context.Context, req *lockbrokerv1.ForceReleaseRequest) (*lockbrokerv1.ForceReleaseResponse, error) {
	n, err := s.broker.ForceRelease(ctx, req.GetKey())
	if err != nil {
		return nil, toStatus(s.log, s.broker.Placed(err))
	}
	return &lockbrokerv1.ForceReleaseResponse{Released: uint32(n)}, nil
}
