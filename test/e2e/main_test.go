// Package e2e tests lockbroker end to end: real Consul agents, real gRPC
// listeners, generated clients and the Go client.
package e2e

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
