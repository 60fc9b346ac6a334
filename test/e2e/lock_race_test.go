//go:build race

package e2e

// lkRace: the race detector is on (it slows the broker and Consul's
// clients about threefold; long tests scale down to stay within time).
const lkRace = true
