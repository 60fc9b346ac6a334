package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/lockbroker/lockbroker/internal/server"
)

// tracing is the broker's OpenTelemetry tracing, configured by the
// standard OTEL_* variables and off unless they ask for it (see
// newTracing). The zero value is off.
type tracing struct {
	tp *sdktrace.TracerProvider
}

// newTracing reads the standard variables: tracing is on when
// OTEL_TRACES_EXPORTER is "otlp", or is unset and an OTLP endpoint is set
// (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT); off
// with OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none. The protocol is
// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL or OTEL_EXPORTER_OTLP_PROTOCOL,
// "http/protobuf" (the default) or "grpc"; the exporters read the other
// OTEL_EXPORTER_OTLP_* variables (headers, timeout, certificates), the SDK
// OTEL_TRACES_SAMPLER*, OTEL_BSP_* and OTEL_RESOURCE_ATTRIBUTES, and
// OTEL_SERVICE_NAME overrides the service name "lockbroker".
func newTracing(ctx context.Context, log *zap.Logger) (*tracing, error) {
	get := func(name string) string { return strings.TrimSpace(os.Getenv(name)) }
	if strings.EqualFold(get("OTEL_SDK_DISABLED"), "true") {
		return &tracing{}, nil
	}
	switch exporter := strings.ToLower(get("OTEL_TRACES_EXPORTER")); exporter {
	case "none":
		return &tracing{}, nil
	case "":
		if get("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
			return &tracing{}, nil
		}
	case "otlp":
	default:
		return nil, fmt.Errorf("OTEL_TRACES_EXPORTER=%s: the broker exports traces with otlp only (or none)", exporter)
	}
	protocol := get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if protocol == "" {
		protocol = get("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	var (
		exp *otlptrace.Exporter
		err error
	)
	switch protocol {
	case "", "http/protobuf":
		protocol = "http/protobuf"
		exp, err = otlptracehttp.New(ctx)
	case "grpc":
		exp, err = otlptracegrpc.New(ctx)
	default:
		return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL=%s: the broker speaks http/protobuf or grpc", protocol)
	}
	if err != nil {
		return nil, fmt.Errorf("otlp trace exporter: %w", err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", "lockbroker")),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
		resource.WithTelemetrySDK(),
	)
	if err != nil {
		return nil, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	log.Info("tracing", zap.String("exporter", "otlp"), zap.String("protocol", protocol))
	return &tracing{tp: tp}, nil
}

// on reports whether spans are made and exported.
func (t *tracing) on() bool { return t.tp != nil }

// tracer is the Consul store's tracer (nil when off: no spans).
func (t *tracing) tracer() trace.Tracer {
	if !t.on() {
		return nil
	}
	return t.tp.Tracer("github.com/lockbroker/lockbroker/internal/consulstore")
}

// serverOptions adds a span per RPC, child of the W3C trace context the
// client sent.
func (t *tracing) serverOptions() []server.Option {
	if !t.on() {
		return nil
	}
	prop := propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	return []server.Option{server.WithTracing(t.tp, prop)}
}

// shutdown sends the spans still buffered, within 5 s.
func (t *tracing) shutdown(log *zap.Logger) {
	if !t.on() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := t.tp.Shutdown(ctx); err != nil {
		log.Warn("tracing: sending the last spans", zap.Error(err))
	}
}
