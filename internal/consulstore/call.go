package consulstore

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/lockbroker/lockbroker/internal/broker"
)

// defaultRetryAfter is the retry hint of a 429 without a Retry-After header
// (Consul's connection limiter sends none).
const defaultRetryAfter = time.Second

// call is one Consul request: its context (the caller's, bounded by the
// Store's timeout and carrying the transport's record) and its outcome.
type call struct {
	s      *Store
	op     opKind
	parent context.Context
	ctx    context.Context
	cancel context.CancelFunc
	rec    record
	stale  bool // a "not found" a consistent read contradicted (renewNotFound)
	start  time.Time
	span   trace.Span // nil unless traced (Options.Tracer)
}

// begin starts a call of kind op bounded by timeout, unless ctx ends
// first anyway.
func (s *Store) begin(ctx context.Context, op opKind, timeout time.Duration) *call {
	c := &call{s: s, op: op, parent: ctx, cancel: noCancel, start: time.Now()}
	if d, ok := ctx.Deadline(); !ok || time.Until(d) > timeout {
		ctx, c.cancel = context.WithTimeout(ctx, timeout)
	}
	if s.opts.Tracer != nil && trace.SpanContextFromContext(ctx).IsSampled() {
		ctx, c.span = s.opts.Tracer.Start(ctx, "consul "+opNames[op].consul, trace.WithSpanKind(trace.SpanKindClient),
			trace.WithAttributes(attribute.String("lockbroker.consul.op", opNames[op].metric)))
	}
	c.ctx = context.WithValue(ctx, recordKey{}, &c.rec)
	return c
}

func noCancel() {}

// opName names the Consul operation, e.g. "kv txn", for errors.
func (c *call) opName() string { return opNames[c.op].consul }

// end finishes the call: it classifies err (nil is success), counts the
// outcome and returns the error to give the caller.
func (c *call) end(err error) error {
	if err != nil {
		err = c.classify(err)
	}
	c.cancel()
	r := resultOf(err)
	if c.stale && r == resUnavailable {
		r = resStaleNotFound
	}
	c.s.counts.add(c.op, r)
	c.s.latency.observe(c.op, time.Since(c.start))
	if c.span != nil {
		c.span.SetAttributes(attribute.String("lockbroker.consul.result", resultNames[r]))
		if r != resOK {
			c.span.SetStatus(otelcodes.Error, resultNames[r])
		}
		c.span.End()
	}
	return err
}

// classify turns an error of the api package into the Store's typed errors.
// Errors already typed pass through.
func (c *call) classify(err error) error {
	var se *broker.StoreError
	var te *broker.TxnError
	if errors.As(err, &se) || errors.As(err, &te) || errors.Is(err, broker.ErrSessionNotFound) {
		return err
	}
	if perr := c.parent.Err(); perr != nil {
		return perr // the caller gave up: its own error, unwrapped
	}
	if c.ctx.Err() != nil {
		return c.unavailable(0, fmt.Errorf("no answer within %v", c.timeout()))
	}
	status := c.rec.status
	var statusErr api.StatusError
	if errors.As(err, &statusErr) {
		status = statusErr.Code
	}
	if status != 0 {
		err = fmt.Errorf("HTTP %d: %w", status, err)
	}
	switch {
	case status == 0 || status/100 == 2:
		// No answer (refused, reset, EOF, TLS, timeout) or an answer that
		// could not be read.
		return c.unavailable(0, err)
	case status == http.StatusForbidden:
		return c.fail(broker.StorePermissionDenied, err)
	case status == http.StatusTooManyRequests:
		return c.unavailable(retryAfter(c.rec.retryAfter, defaultRetryAfter), err)
	case status >= 500:
		return c.unavailable(retryAfter(c.rec.retryAfter, 0), err)
	default:
		return c.fail(broker.StoreRejected, err)
	}
}

// timeout is the deadline the Store gave the call, for messages.
func (c *call) timeout() time.Duration {
	if c.op == opKVWatch {
		return c.s.opts.watchTimeout()
	}
	return c.s.opts.CallTimeout
}

func (c *call) unavailable(retry time.Duration, cause error) *broker.StoreError {
	e := c.fail(broker.StoreUnavailable, cause)
	e.RetryAfter = retry
	return e
}

// fail returns a StoreError of kind k for this call. The cause is kept as
// text only, with every secret removed: wrapping it would let a token in a
// URL reach a log, and a wrapped context error would pass for the caller's.
func (c *call) fail(k broker.StoreErrorKind, cause error) *broker.StoreError {
	return &broker.StoreError{Kind: k, Op: c.opName(), Err: errors.New(c.s.redact(cause.Error()))}
}

// maxCauseLen bounds the cause text kept from a Consul answer.
const maxCauseLen = 512

// redact removes the Store's secrets and anything that looks like a token
// parameter from msg, and bounds its length.
func (s *Store) redact(msg string) string {
	for _, sec := range s.secrets {
		msg = strings.ReplaceAll(msg, sec, "<redacted>")
	}
	for _, param := range []string{"token=", "Token="} {
		for i := 0; ; {
			j := strings.Index(msg[i:], param)
			if j < 0 {
				break
			}
			start := i + j + len(param)
			end := start
			for end < len(msg) && !strings.ContainsRune("&\" \n\t", rune(msg[end])) {
				end++
			}
			msg = msg[:start] + "<redacted>" + msg[end:]
			i = start + len("<redacted>")
		}
	}
	if len(msg) > maxCauseLen {
		msg = msg[:maxCauseLen] + "..."
	}
	return msg
}

// retryAfter parses a Retry-After header (seconds or an HTTP date), or
// returns def.
func retryAfter(h string, def time.Duration) time.Duration {
	if h == "" {
		return def
	}
	if n, err := strconv.Atoi(strings.TrimSpace(h)); err == nil && n >= 0 {
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(h); err == nil {
		if d := time.Until(t); d > 0 {
			return d
		}
		return 0
	}
	return def
}
