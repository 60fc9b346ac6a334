package server

import (
	"context"

	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/lockbroker/lockbroker/internal/broker"
)

// cutOffGate refuses the requests of the three services while this
// replica counts as cut off from its Consul agent (broker.Admit): once
// access and validation let a request in, it fails UNAVAILABLE with
// REPLICA_CUT_OFF at once, and every client library takes it to another
// replica, where its own Consul call would have waited for its timeout.
// Health and reflection are never refused (health says NOT_SERVING).
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

func (g cutOffGate) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if !exempt(info.FullMethod) {
		if err := g.admit(); err != nil {
			return nil, err
		}
	}
	return handler(ctx, req)
}
