//go:build !linux

package caddymodule

import "io"

// rawSendfileOK: off Linux the whole-range answer goes through net's own
// sendfile path (sendfile_raw_linux.go says why Linux differs).
const rawSendfileOK = false

type rawRange struct{ r *fileRange }

func (s rawRange) Read(p []byte) (int, error)           { return s.r.Read(p) }
func (s rawRange) WriteTo(dst io.Writer) (int64, error) { return copyRest(dst, s.r) }
