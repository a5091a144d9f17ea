package sqlite

import "testing"

// locksShowWriter finds another process's write lock on the SQLite lock
// bytes of the inode, and nothing else: read locks (readers), this
// process's own locks, waiters, other inodes and other byte ranges.
func TestLocksShowWriter(t *testing.T) {
	const self = 100
	for _, tc := range []struct {
		name, locks string
		want        bool
	}{
		{"reserved", "3: POSIX  ADVISORY  WRITE 4546 fe:00:9980878 1073741825 1073741825\n", true},
		{"pending", "3: POSIX  ADVISORY  WRITE 4546 fe:00:9980878 1073741824 1073741824\n", true},
		{"exclusive", "1: POSIX  ADVISORY  WRITE 4546 fe:00:9980878 1073741826 1073742335\n", true},
		{"to EOF", "1: OFDLCK ADVISORY  WRITE -1 fe:00:9980878 0 EOF\n", true},
		{"reader", "2: POSIX  ADVISORY  READ 4546 fe:00:9980878 1073741826 1073742335\n", false},
		{"own lock", "3: POSIX  ADVISORY  WRITE 100 fe:00:9980878 1073741825 1073741825\n", false},
		{"waiter", "3: -> POSIX  ADVISORY  WRITE 4546 fe:00:9980878 1073741825 1073741825\n", false},
		{"other inode", "3: POSIX  ADVISORY  WRITE 4546 fe:00:19980878 1073741825 1073741825\n", false},
		{"shm byte", "3: POSIX  ADVISORY  WRITE 4546 fe:00:9980878 120 120\n", false},
		{"garbage", "x\n\n3: POSIX\n", false},
	} {
		if got := locksShowWriter([]byte("1: POSIX  ADVISORY  READ 3810 fe:00:9980842 123 123\n"+tc.locks), 9980878, self); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
