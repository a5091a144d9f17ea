//go:build race

package token

// raceEnabled: the race detector makes sync.Pool drop items at random, so
// allocation counts that rely on a pool are not checked.
const raceEnabled = true
