// Package otlptest is a minimal OpenTelemetry trace receiver for tests:
// OTLP/HTTP with protobuf bodies (the OTLP specification's default), as
// a broker process with OTEL_EXPORTER_OTLP_ENDPOINT sends them.
package otlptest

import (
	"crypto/rand"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// Receiver keeps every span it is sent, and the services' names.
type Receiver struct {
	// URL is the endpoint to give as OTEL_EXPORTER_OTLP_ENDPOINT.
	URL string

	mu       sync.Mutex
	spans    []*tracepb.Span
	services map[string]bool
}

// Start runs a Receiver until the test ends.
func Start(t testing.TB) *Receiver {
	r := &Receiver{services: map[string]bool{}}
	srv := httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(srv.Close)
	r.URL = srv.URL
	return r
}

func (r *Receiver) serve(w http.ResponseWriter, req *http.Request) {
	if req.URL.Path != "/v1/traces" || req.Header.Get("Content-Type") != "application/x-protobuf" {
		http.Error(w, "want a protobuf POST to /v1/traces", http.StatusUnsupportedMediaType)
		return
	}
	body, err := io.ReadAll(io.LimitReader(req.Body, 16<<20))
	var msg coltracepb.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(body, &msg)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	for _, rs := range msg.GetResourceSpans() {
		for _, a := range rs.GetResource().GetAttributes() {
			if a.GetKey() == "service.name" {
				r.services[a.GetValue().GetStringValue()] = true
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			r.spans = append(r.spans, ss.GetSpans()...)
		}
	}
	r.mu.Unlock()
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// Of returns the spans received so far of trace id.
func (r *Receiver) Of(id []byte) []*tracepb.Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*tracepb.Span
	for _, s := range r.spans {
		if string(s.GetTraceId()) == string(id) {
			out = append(out, s)
		}
	}
	return out
}

// All returns every span received so far.
func (r *Receiver) All() []*tracepb.Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*tracepb.Span(nil), r.spans...)
}

// Service reports whether spans of the service name have been received.
func (r *Receiver) Service(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.services[name]
}

// Traceparent returns a W3C traceparent header for a new sampled trace,
// with its trace and parent span ids.
func Traceparent(t testing.TB) (header string, traceID, spanID []byte) {
	traceID, spanID = make([]byte, 16), make([]byte, 8)
	if _, err := rand.Read(traceID); err != nil {
		t.Fatal(err)
	}
	if _, err := rand.Read(spanID); err != nil {
		t.Fatal(err)
	}
	return "00-" + hex.EncodeToString(traceID) + "-" + hex.EncodeToString(spanID) + "-01", traceID, spanID
}

// Env is the broker process environment that sends its spans to r at
// once, under the service name service.
func (r *Receiver) Env(service string) []string {
	return []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + r.URL, "OTEL_BSP_SCHEDULE_DELAY=50", "OTEL_SERVICE_NAME=" + service}
}
