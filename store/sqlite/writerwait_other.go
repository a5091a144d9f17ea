//go:build !linux

package sqlite

import "os"

// writerProbe: no lock probe here; reads do not wait for the writer.
func writerProbe(os.FileInfo) uint64 { return 0 }

func writerActive(uint64) bool { return false }

// writerLockHeld: unknown here, so record reads always take a lock.
func writerLockHeld(*os.File) (held, known bool) { return false, false }

func fileTimes(os.FileInfo) (mtime, ctime int64, ok bool) { return 0, 0, false }
