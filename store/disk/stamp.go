package disk

import (
	"fmt"
	"io/fs"
	"os"
)

// Stamps: what a verified file looked like when it was verified. A
// complete file is served only while its size, file id (device and inode),
// modification time and change time are the ones recorded then;
// otherwise it was changed (rewritten, truncated, replaced) behind the
// cache's back and is discarded and filled again. The change time
// (st_ctim, Linux) is what user space cannot set back: bytes rewritten in
// place with the old mtime restored (touch -d, os.Chtimes) still move it.
// Where it is not read (other systems), such a change is not seen until
// the next restart re-hashes the file. The cache's own renames and
// touches move it too, so each is followed by restamp.

// stamp identifies a file's state.
type stamp struct {
	size     int64
	mtime    int64 // UnixNano
	ctime    int64 // UnixNano of the inode change time; 0 where unknown
	dev, ino uint64
}

func stampOf(fi fs.FileInfo) stamp {
	dev, ino := fileID(fi) // stamp_unix.go, stamp_other.go
	return stamp{size: fi.Size(), mtime: fi.ModTime().UnixNano(), ctime: changeTime(fi), dev: dev, ino: ino}
}

// restamp is s with the change time the file at p has now, when p is
// still the file s describes (inode, size and mtime): the cache's rename
// of a verified file into place changes its change time. Otherwise s as
// it was, which the next open finds changed.
func restamp(s stamp, p string) stamp {
	fi, err := os.Stat(p)
	if err != nil {
		return s
	}
	now := stampOf(fi)
	if s.dev != now.dev || s.ino != now.ino || s.size != now.size || s.mtime != now.mtime {
		return s
	}
	return now
}

// changed describes how now differs from s ("" when it does not).
func (s stamp) changed(now stamp) string {
	switch {
	case s.dev != now.dev || s.ino != now.ino:
		return "replaced (another inode)"
	case s.size != now.size:
		return fmt.Sprintf("size changed from %d to %d bytes", s.size, now.size)
	case s.mtime != now.mtime:
		return "modification time changed"
	case s.ctime != now.ctime:
		return "change time changed (written in place, its modification time set back)"
	}
	return ""
}
