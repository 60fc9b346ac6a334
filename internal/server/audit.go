package server

import (
	"strings"

	"go.uber.org/zap"
	"google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/status"
)

// AuditLoggerName is the name of the audit logger: its lines carry
// "logger":"audit".
const AuditLoggerName = "audit"

// record writes the audit line of a call: one JSON object with who
// (identity, tenant, peer address), what (action, key, session) and the
// result (the gRPC code, the ErrorInfo reason, the Consul operation of a
// Consul denial). It never writes a token (a bearer token appears only as
// its token-sha256 identity), a value or an error message.
func (a *access) record(c *call, err error) {
	st := status.Convert(err)
	fields := []zap.Field{
		zap.String("identity", c.caller.Identity),
		zap.String("tenant", c.caller.TenantName()),
		zap.Bool("admin", c.caller.Admin),
		zap.String("peer", c.peer()),
		zap.String("action", strings.TrimPrefix(c.method, "/")),
		zap.String("result", code.Code(st.Code()).String()),
	}
	n := c.names()
	if len(n.keys) > 0 {
		fields = append(fields, zap.String("key", n.keys[0]))
	}
	if n.session != "" {
		fields = append(fields, zap.String("session", n.session))
	}
	if n.tenant != "" {
		fields = append(fields, zap.String("target_tenant", n.tenant))
	}
	if c.foreign != nil && c.foreign() {
		fields = append(fields, zap.Bool("foreign_session", true))
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			fields = append(fields, zap.String("reason", info.GetReason()))
			if op := info.GetMetadata()["consulOperation"]; op != "" {
				fields = append(fields, zap.String("consul_operation", op))
			}
			if q := info.GetMetadata()["quota"]; q != "" {
				fields = append(fields, zap.String("quota", q))
			}
		}
	}
	a.audit.Info("audit", fields...)
}
