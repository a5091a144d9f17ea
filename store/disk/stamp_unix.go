//go:build unix

package disk

import (
	"io/fs"
	"syscall"
)

// fileID is the file's device and inode numbers.
func fileID(fi fs.FileInfo) (dev, ino uint64) {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Dev), uint64(st.Ino) // Dev is int32 on some systems
	}
	return 0, 0
}
