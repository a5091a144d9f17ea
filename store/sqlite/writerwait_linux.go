package sqlite

import (
	"bufio"
	"bytes"
	"os"
	"strconv"
	"syscall"
)

// SQLite's unix VFS lock bytes (os_unix.c): a writer's RESERVED and
// PENDING locks are write locks on these two bytes, its EXCLUSIVE lock a
// write lock on the SHARED range after them.
const (
	sqlitePendingByte = 0x40000000
	sqliteLockEnd     = sqlitePendingByte + 2 + 510 // exclusive
)

// writerProbe identifies the file for writerActive: its inode, 0 when
// unknown. The probe reads /proc/locks rather than asking fcntl on a
// descriptor of its own: closing such a descriptor would drop every POSIX
// lock this process holds on the file, its SQLite connections' included.
func writerProbe(fi os.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ino
	}
	return 0
}

// writerActive reports whether another process holds a POSIX write lock
// on the file's SQLite lock bytes: a writer between its first write and
// the end of its commit. It reads /proc/locks and takes no lock; false
// when that cannot be read.
func writerActive(ino uint64) bool {
	if ino == 0 {
		return false
	}
	b, err := os.ReadFile("/proc/locks")
	if err != nil {
		return false
	}
	return locksShowWriter(b, ino, os.Getpid())
}

// locksShowWriter is writerActive's parse of /proc/locks lines such as
// "3: POSIX  ADVISORY  WRITE 1234 fd:01:5678 1073741825 1073741825"
// (waiters, "3: -> POSIX ...", hold nothing and are skipped).
func locksShowWriter(b []byte, ino uint64, self int) bool {
	want := []byte(":" + strconv.FormatUint(ino, 10))
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) < 8 || string(f[1]) == "->" || string(f[1]) != "POSIX" && string(f[1]) != "OFDLCK" ||
			string(f[3]) != "WRITE" || !bytes.HasSuffix(f[5], want) {
			continue
		}
		if pid, err := strconv.Atoi(string(f[4])); err == nil && pid == self {
			continue
		}
		start, err := strconv.ParseInt(string(f[6]), 10, 64)
		if err != nil {
			continue
		}
		end := int64(1 << 62)
		if string(f[7]) != "EOF" {
			if end, err = strconv.ParseInt(string(f[7]), 10, 64); err != nil {
				continue
			}
		}
		if start < sqliteLockEnd && end >= sqlitePendingByte { // end is inclusive
			return true
		}
	}
	return false
}

// fOFDGetlk is Linux's F_OFD_GETLK (the same number on every
// architecture; the syscall package does not name it).
const fOFDGetlk = 36

// writerLockHeld reports whether any process holds a write lock on the
// file's SQLite lock bytes (RESERVED, PENDING or EXCLUSIVE, which a
// writer takes before it writes), asking the kernel with F_OFD_GETLK on
// f, a descriptor of the file the caller keeps open: a test for a read
// lock there conflicts only with a write lock, and takes none. The
// kernel answers for every owner of a lock on the file, including one in
// another PID namespace (a sync server in another container sharing the
// file), whose locks /proc/locks filters out, and this process's own too
// (the edge's connections only ever take read locks, so a write lock of
// this process is a writer's, as in tests). known is false when the
// kernel cannot answer.
func writerLockHeld(f *os.File) (held, known bool) {
	if f == nil {
		return false, false
	}
	lk := syscall.Flock_t{Type: syscall.F_RDLCK, Whence: 0, Start: sqlitePendingByte, Len: sqliteLockEnd - sqlitePendingByte}
	if err := syscall.FcntlFlock(f.Fd(), fOFDGetlk, &lk); err != nil {
		return false, false
	}
	return lk.Type != syscall.F_UNLCK, true
}

// fileTimes is the file's modification and change times in nanoseconds.
func fileTimes(fi os.FileInfo) (mtime, ctime int64, ok bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, 0, false
	}
	return st.Mtim.Nano(), st.Ctim.Nano(), true
}
