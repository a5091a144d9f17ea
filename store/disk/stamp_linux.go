package disk

import (
	"io/fs"
	"syscall"
)

// changeTime is the file's inode change time (st_ctim) in UnixNano.
func changeTime(fi fs.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ctim.Nano()
	}
	return 0
}
