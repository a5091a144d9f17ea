//go:build !race

package presign

const raceEnabled = false
