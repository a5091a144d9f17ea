package caddymodule

import (
	"os"
	"strings"
)

// Off switches for the module's three effects on the whole process. They
// are environment variables, not Caddyfile settings, because they act on
// the process, not on one handler (docs/operations.md, "Process-wide
// switches"):
//
//	SYNCULAR_RAW_SENDFILE=off    whole-range disk tier answers go through
//	                             Go's own sendfile path (net's ReadFrom)
//	                             instead of raw sendfile(2) calls
//	                             (sendfile_raw_linux.go): more CPU per
//	                             large answer (docs/performance.md, "Raw
//	                             sendfile calls and large page cache
//	                             folios").
//	SYNCULAR_RAW_WRITE=off       memory tier answers larger than one chunk
//	                             of the idle timeout writer are one Write,
//	                             chunked by the writer through Go's own
//	                             write path, instead of one chunk in raw
//	                             write(2) calls (membody.go): more CPU per
//	                             answer (docs/performance.md, "Memory-tier
//	                             hits as one chunk").
//	SYNCULAR_MEMORY_RELEASE=off  no debug.FreeOSMemory after a crowd of
//	                             SQLite streams leaves (memrelease.go): the
//	                             crowd's memory stays with the process
//	                             until the runtime's own collection and
//	                             scavenger return it (minutes).
//
// "off", "0", "false" and "no" (any case) turn an effect off; anything
// else, or unset, leaves it on.
const (
	envRawSendfile   = "SYNCULAR_RAW_SENDFILE"
	envRawWrite      = "SYNCULAR_RAW_WRITE"
	envMemoryRelease = "SYNCULAR_MEMORY_RELEASE"
)

// envOff reports whether the environment variable name turns its effect
// off.
func envOff(name string) bool {
	switch strings.ToLower(strings.TrimSpace(os.Getenv(name))) {
	case "off", "0", "false", "no":
		return true
	}
	return false
}

// rawSendfileOn reports whether a whole-range answer may use raw
// sendfile(2) calls. Read per answer (one environment lookup beside a
// multi-megabyte send).
func rawSendfileOn() bool { return !envOff(envRawSendfile) }

// rawWriteOn reports whether a memory tier answer may go as one chunk
// in raw write(2) calls. Read per answer, like rawSendfileOn.
func rawWriteOn() bool { return !envOff(envRawWrite) }

// processMemReleaser is the process's memory releaser, or nil (which does
// nothing) when SYNCULAR_MEMORY_RELEASE is off. Read when a handler's
// stream slots are made (at provision).
func processMemReleaser() *memReleaser {
	if envOff(envMemoryRelease) {
		return nil
	}
	return processMemRelease
}
