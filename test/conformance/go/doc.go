// Package conformance is the Go runner of the client conformance scenarios
// (test/conformance/scenarios.md): each TestS<N>... runs scenario S<N>
// against real processes — a Consul dev agent (internal/consultest) and
// broker processes (internal/brokertest.StartProcess) — through package
// client's public API only. TestS5CrossLanguage holds one semaphore with Go,
// Python, Node and Java holders at once.
//
//	go test -count=1 -v ./test/conformance/go/
//
// Each test logs its timing figures as "FIGURE name: value" lines.
package conformance
