// Package testbroker is gone: its broker-process harness is now part of
// internal/brokertest (StartDev, StartProcess, Build, BuildIn, RepoRoot).
// Only RepoRoot is left here, for test/compose, until it imports
// internal/brokertest; then delete this directory.
package testbroker

import (
	"testing"

	"github.com/lockbroker/lockbroker/internal/brokertest"
)

// RepoRoot returns the root of the lockbroker repository.
//
// Deprecated: use brokertest.RepoRoot.
func RepoRoot(t testing.TB) string {
	t.Helper()
	return brokertest.RepoRoot(t)
}
