package server

import (
	"context"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lockbroker/lockbroker/internal/broker"
)

// cutOffGate refuses the requests of the three services while this
// replica counts as cut off from its Consul agent (broker.Admit): once
// access and validation let a request in, it fails UNAVAILABLE with
// REPLICA_CUT_OFF at once, and every client library takes it to another
// replica, where its own Consul call would have waited for its timeout.
// A unary call already running when the replica comes to count as cut off
// ends the same way then. Health and reflection are never refused (health
// says NOT_SERVING meanwhile).
type cutOffGate struct {
	b   *broker.Broker
	log *zap.Logger
}

// admit is nil, or the status that refuses a request.
func (g cutOffGate) admit() error {
	if err := g.b.Admit(); err != nil {
		return toStatus(g.log, g.b.Placed(err))
	}
	return nil
}

// unary also ends a call the cut catches on its way (see broker.Enter):
// its Consul call is cancelled, and it fails REPLICA_CUT_OFF in place of
// the CANCELLED that comes of that.
func (g cutOffGate) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if exempt(info.FullMethod) {
		return handler(ctx, req)
	}
	rctx, leave, err := g.b.Enter(ctx)
	if err != nil {
		return nil, toStatus(g.log, g.b.Placed(err))
	}
	resp, err := handler(rctx, req)
	cut := leave()
	if cut != nil && status.Code(err) == codes.Canceled {
		return nil, toStatus(g.log, g.b.Placed(cut))
	}
	return resp, err
}
