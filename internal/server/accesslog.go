package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// accessLog writes one line per finished call at the level accessLevel
// gives its code, with the fields go-grpc-middleware's logging
// interceptor wrote (protocol, grpc.component, grpc.service, grpc.method,
// grpc.method_type, peer.address, grpc.start_time, grpc.request.deadline,
// grpc.code, grpc.error, grpc.time_ms). Unlike that interceptor it builds
// nothing before it knows the line is written: a call whose level the
// logger does not write costs a clock read and a level check, no
// allocation and no write. Streams are not wrapped (see streams).
type accessLog struct{ log *zap.Logger }

func (l accessLog) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	start := time.Now()
	resp, err := handler(ctx, req)
	l.finish(ctx, info.FullMethod, "unary", start, err)
	return resp, err
}

// finish writes the line of a call that ended with err, if its level is on.
func (l accessLog) finish(ctx context.Context, method, kind string, start time.Time, err error) {
	if errors.Is(err, io.EOF) {
		err = nil
	}
	code := status.Code(err)
	ce := l.log.Check(accessLevel(code), "finished call")
	if ce == nil {
		return
	}
	service, name := splitMethod(method)
	fields := make([]zap.Field, 0, 11)
	fields = append(fields, zap.String("protocol", "grpc"), zap.String("grpc.component", "server"),
		zap.String("grpc.service", service), zap.String("grpc.method", name), zap.String("grpc.method_type", kind))
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		fields = append(fields, zap.String("peer.address", p.Addr.String()))
	}
	fields = append(fields, zap.String("grpc.start_time", start.Format(time.RFC3339)))
	if d, ok := ctx.Deadline(); ok {
		fields = append(fields, zap.String("grpc.request.deadline", d.Format(time.RFC3339)))
	}
	fields = append(fields, zap.String("grpc.code", code.String()))
	if err != nil {
		fields = append(fields, zap.String("grpc.error", clipTo(err.Error(), maxLoggedError)))
	}
	ms := float32(time.Since(start).Nanoseconds()/1000) / 1000
	ce.Write(append(fields, zap.String("grpc.time_ms", fmt.Sprintf("%v", ms)))...)
}

// maxLoggedError bounds the error an access log line quotes: a semaphore's
// busy answer names up to 1,024 holders.
const maxLoggedError = 1024

// splitMethod splits "/package.Service/Method".
func splitMethod(full string) (string, string) {
	full = strings.TrimPrefix(full, "/")
	if i := strings.Index(full, "/"); i >= 0 {
		return full[:i], full[i+1:]
	}
	return "unknown", "unknown"
}

// accessLevel is the access log's level for a finished call: successful
// calls (and streams the client closed) only at debug, so the default info
// level writes no line per RPC; answers caused by the request at info;
// Consul or the broker in trouble at warn; bugs at error.
func accessLevel(c codes.Code) zapcore.Level {
	switch c {
	case codes.OK, codes.Canceled:
		return zapcore.DebugLevel
	case codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.Aborted, codes.DeadlineExceeded,
		codes.FailedPrecondition, codes.OutOfRange, codes.Unauthenticated:
		return zapcore.InfoLevel
	case codes.Unavailable, codes.PermissionDenied, codes.ResourceExhausted:
		return zapcore.WarnLevel
	default:
		return zapcore.ErrorLevel
	}
}
