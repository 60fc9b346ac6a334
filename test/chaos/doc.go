// Package chaos is lockbroker's fault-injection suite: a 3-server Consul
// cluster, broker replicas as processes, toxiproxy on every link, many
// clients holding locks, semaphore slots and leadership while a seeded
// schedule of faults runs, and checkers over the recorded history
// (fencing, belief overlap, linearizability, loss bound, liveness, leaks).
// cmd/chaos runs it; docs/chaos.md says how.
package chaos
