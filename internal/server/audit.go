package server

import (
	"strconv"
	"strings"
	"unicode/utf8"

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
// its token-sha256 identity), a value or an error message, and each field
// it takes from the call is clipped (see clip).
func (a *access) record(c *call, err error) {
	st := status.Convert(err)
	fields := []zap.Field{
		zap.String("identity", clip(c.caller.Identity)),
		zap.String("tenant", c.caller.TenantName()),
		zap.Bool("admin", c.caller.Admin),
		zap.String("peer", c.peer()),
		zap.String("action", strings.TrimPrefix(c.method, "/")),
		zap.String("result", code.Code(st.Code()).String()),
	}
	n := c.names()
	if len(n.keys) > 0 {
		fields = append(fields, zap.String("key", clip(n.keys[0])))
	}
	if n.session != "" {
		fields = append(fields, zap.String("session", clip(n.session)))
	}
	if n.tenant != "" {
		fields = append(fields, zap.String("target_tenant", clip(n.tenant)))
	}
	if c.foreign != nil && c.foreign() {
		fields = append(fields, zap.Bool("foreign_session", true))
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			fields = append(fields, zap.String("reason", clip(info.GetReason())))
			if op := info.GetMetadata()["consulOperation"]; op != "" {
				fields = append(fields, zap.String("consul_operation", clip(op)))
			}
			if q := info.GetMetadata()["quota"]; q != "" {
				fields = append(fields, zap.String("quota", clip(q)))
			}
		}
	}
	a.audit.Info("audit", fields...)
}

// clipBytes bounds what a log line or an error message takes of a field a
// caller chose (a key, a session id, an identity): validation refuses
// what is over the API's limits before anything logs it, and this keeps
// every field a few hundred bytes all the same.
const clipBytes = 256

// clip is s when it is at most clipBytes long; else its first clipBytes
// (cut on a character boundary), a mark and its length.
func clip(s string) string {
	return clipTo(s, clipBytes)
}

// clipTo is clip with a bound of n bytes.
func clipTo(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "...(" + strconv.Itoa(len(s)) + " bytes)"
}
