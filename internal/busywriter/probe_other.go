//go:build !linux

package busywriter

import "time"

// Probe is unavailable here (see probe_linux.go).
type Probe struct{}

// StartProbe answers ErrUnsupported.
func StartProbe(string, time.Duration) (*Probe, error) { return nil, ErrUnsupported }

// Share is zero.
func (p *Probe) Share() (float64, int64) { return 0, 0 }

// Stop does nothing.
func (p *Probe) Stop() {}
