package store

import (
	"os"
	"syscall"
)

// SQLite's unix VFS lock bytes (os_unix.c): a writer's RESERVED and
// PENDING locks are write locks on these two bytes, its EXCLUSIVE lock a
// write lock on the SHARED range after them.
const (
	sqlitePendingByte = 0x40000000
	sqliteLockSpan    = 2 + 510
)

// openWriterProbe opens the file for writerActive. The descriptor must
// stay open until every connection of the handle is closed: closing a
// descriptor drops every POSIX lock the process holds on the file, the
// SQLite connections' SHARED locks included.
func openWriterProbe(path string) *os.File {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	return f
}

// writerActive reports whether another process holds a write lock on the
// file's SQLite lock bytes: a writer between its first write and the end
// of its commit. fcntl(F_GETLK) takes no lock.
func writerActive(f *os.File) bool {
	lk := syscall.Flock_t{Type: syscall.F_RDLCK, Whence: 0, Start: sqlitePendingByte, Len: sqliteLockSpan}
	if err := syscall.FcntlFlock(f.Fd(), syscall.F_GETLK, &lk); err != nil {
		return false
	}
	return lk.Type != syscall.F_UNLCK
}
