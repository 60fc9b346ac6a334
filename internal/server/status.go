// Package server is the thin gRPC layer of lockbroker: it converts
// requests, calls internal/broker, maps errors and sends results.
package server

import (
	"context"
	"errors"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lockbroker/lockbroker/internal/broker"
)

// toStatus maps a domain error to a gRPC status; unknown errors are
// INTERNAL and logged once.
func toStatus(log *zap.Logger, err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	code := codes.Internal
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	case errors.Is(err, broker.ErrInvalid):
		code = codes.InvalidArgument
	case errors.Is(err, broker.ErrBusy), errors.Is(err, broker.ErrAborted):
		code = codes.Aborted
	case errors.Is(err, broker.ErrTimeout):
		code = codes.DeadlineExceeded
	case errors.Is(err, broker.ErrConflict), errors.Is(err, broker.ErrNotHolder):
		code = codes.FailedPrecondition
	case errors.Is(err, broker.ErrSessionNotFound):
		code = codes.NotFound
	case errors.Is(err, broker.ErrUnavailable), errors.Is(err, broker.ErrShutdown):
		code = codes.Unavailable
	default:
		log.Error("internal error", zap.Error(err))
	}
	return status.Error(code, err.Error())
}
