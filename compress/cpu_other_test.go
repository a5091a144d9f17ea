//go:build !unix

package compress

import "time"

// cpuTime is unknown here; benchmarks then omit their CPU metrics.
func cpuTime() time.Duration { return 0 }
