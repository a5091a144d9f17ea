package disk

import (
	"fmt"
	"io/fs"
)

// Stamps: what a verified file looked like when it was verified. A
// complete file is served only while its size, file id (device and inode)
// and modification time are the ones recorded then; otherwise it was
// changed (rewritten, truncated, replaced) behind the cache's back and is
// discarded and filled again. A change that keeps all three (bytes
// rewritten in place with the same length and the old mtime restored, or
// within the filesystem's timestamp granularity) is not seen until the
// next restart re-hashes the file.

// stamp identifies a file's state.
type stamp struct {
	size     int64
	mtime    int64 // UnixNano
	dev, ino uint64
}

func stampOf(fi fs.FileInfo) stamp {
	dev, ino := fileID(fi) // stamp_unix.go, stamp_other.go
	return stamp{size: fi.Size(), mtime: fi.ModTime().UnixNano(), dev: dev, ino: ino}
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
	}
	return ""
}
