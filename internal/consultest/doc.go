// Package consultest runs real Consul agents for tests and local development.
//
// Nothing here is a mock: every agent is a `consul agent -dev` child process
// listening only on loopback, on ports picked freshly for it, with its own
// data directory. StartProcess is the plain (non-test) entry point, used by
// `cmd/broker --dev`; Start wraps it for tests, tying the agent's lifetime to
// a testing.TB. StartCluster runs a multi-server cluster (real `consul
// agent -server` processes) whose servers can be killed, stopped and
// restarted on the same ports, for the chaos suite.
//
// The binary is found by Binary: $LOCKBROKER_CONSUL, then <repo>/bin/consul
// (built from tools/consul), then `consul` on PATH.
package consultest
