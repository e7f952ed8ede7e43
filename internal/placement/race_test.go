//go:build race

package placement_test

// raceEnabled: the race detector slows the balance simulation ~10x.
const raceEnabled = true
