//go:build !linux

package caddymodule

import "syscall"

// rawWriteOK: off Linux a memory tier answer is one Write, chunked by the
// idle timeout writer (membody_raw_linux.go says why Linux differs).
const rawWriteOK = false

// writeRaw is never called off Linux (rawWriteOK).
func (s *rawBytes) writeRaw(syscall.RawConn) (int64, error) {
	return 0, syscall.EINVAL
}

// writeStep is never called off Linux (rawWriteOK).
func (s *rawBytes) writeStep(uintptr) bool { return true }

// unsent is unknown off Linux.
func unsent(syscall.RawConn) int64 { return 0 }
