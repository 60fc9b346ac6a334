//go:build !race

package e2e

// lkRace: the race detector is on (see lock_race_test.go).
const lkRace = false
