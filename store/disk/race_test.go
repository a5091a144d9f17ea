//go:build race

package disk_test

// raceEnabled shrinks the tests that move hundreds of MiB: the race
// detector makes every byte copied slow, and the measurement they make
// does not need it.
const raceEnabled = true
