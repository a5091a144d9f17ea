//go:build unix

package compress

import (
	"syscall"
	"time"
)

// cpuTime is the CPU time (user + system, all threads) the test process
// has used. Benchmarks report it beside wall time because on a shared
// machine wall time measures the neighbours as much as the code.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
