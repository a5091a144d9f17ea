package disk

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"time"

	"github.com/syncular/caddy-syncular/segid"
)

// Complete files: one is opened for a reader only while it is still the
// file verified (stamp.go); one the start-up scan indexed is hashed before
// its first use.

// openComplete opens a complete file for one reader. The descriptor is
// served only when the file is still the one verified (stamp.go): the
// same size, inode and modification time; otherwise the file is removed
// and Get fills it again.
func (c *Cache) openComplete(e *entry, touch bool, now time.Time) (*Handle, bool, error) {
	p := c.path(e.key)
	f, err := os.Open(p)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) { // removed behind our back
			c.forget(e, false)
			return nil, true, nil
		}
		return nil, false, unavailable(err)
	}
	if err := c.checkStamp(e, f, p, touch, now); err != nil {
		f.Close()
		c.forget(e, true)
		c.warn("disk cache: discarded a file changed since it was verified", err)
		return nil, true, nil
	}
	c.hits.Add(1)
	return &Handle{file: f, size: e.size, hit: true}, false, nil
}

// checkStamp compares the opened file f (at path p) with what e recorded
// when it was verified, and touches it (its mtime is the recency a
// restart reads) when touch says so, recording the new mtime. Under e.smu,
// so that a reader never compares with a stamp a concurrent touch is
// replacing. A change between the comparison and the touch that keeps the
// size and inode is adopted with the touch's mtime.
func (c *Cache) checkStamp(e *entry, f *os.File, p string, touch bool, now time.Time) error {
	e.smu.Lock()
	defer e.smu.Unlock()
	fi, err := f.Stat()
	switch {
	case err != nil:
		return err
	case !fi.Mode().IsRegular():
		return fmt.Errorf("disk cache: %s is not a regular file", p)
	case fi.Size() != e.size:
		return fmt.Errorf("%w: file is %d bytes, record %d", ErrSizeMismatch, fi.Size(), e.size)
	}
	if why := e.stamp.changed(stampOf(fi)); why != "" {
		return fmt.Errorf("disk cache: %s: %s", p, why)
	}
	if touch && os.Chtimes(p, now, now) == nil { // best effort
		// The same descriptor: only the size and the mtime can differ
		// (the touch missed it when the path now names another file).
		if fi, err := f.Stat(); err == nil {
			if fi.Size() != e.size {
				return fmt.Errorf("%w: file is %d bytes, record %d", ErrSizeMismatch, fi.Size(), e.size)
			}
			e.stamp = stampOf(fi)
		}
	}
	return nil
}

// forget drops e if it is still indexed, removing its file if remove.
func (c *Cache) forget(e *entry, remove bool) {
	c.mu.Lock()
	var p string
	if c.entries[e.key] == e {
		if remove {
			p = c.dropLocked(e)
			c.discarded.Add(1)
		} else {
			c.unindexLocked(e)
		}
	}
	c.mu.Unlock()
	c.removeFiles([]string{p})
}

// verify hashes a file indexed by the scan before its first use.
func (c *Cache) verify(e *entry, done chan struct{}) {
	defer c.wg.Done()
	st, err := c.hashFile(c.path(e.key), e.key, e.size)
	var p string
	dropped := false
	c.mu.Lock()
	if c.ctx.Err() != nil {
		err = nil // closed mid-way: the file is not known bad, keep it unverified
	} else if c.entries[e.key] == e {
		if err == nil {
			e.smu.Lock()
			e.stamp = st
			e.smu.Unlock()
			e.verified = true
		} else {
			p, dropped = c.dropLocked(e), true
			c.discarded.Add(1)
		}
	}
	e.verifying = nil
	close(done)
	c.mu.Unlock()
	if dropped {
		c.removeFiles([]string{p})
		c.warn("disk cache: discarded a file that failed verification", err)
	}
}

// hashFile checks that the file at path holds the segment's bytes and
// returns its stamp as it was before the bytes were read (a change while
// they are read then shows at the next open).
func (c *Cache) hashFile(path, key string, size int64) (stamp, error) {
	f, err := os.Open(path)
	if err != nil {
		return stamp{}, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return stamp{}, err
	}
	st := stampOf(fi)
	var h segid.Hasher
	buf := make([]byte, copyBufSize)
	var n int64
	for {
		if err := c.ctx.Err(); err != nil {
			return st, err
		}
		m, err := f.Read(buf)
		h.Write(buf[:m])
		n += int64(m)
		if err == io.EOF {
			break
		}
		if err != nil {
			return st, err
		}
	}
	if n != size || st.size != size {
		return st, fmt.Errorf("%w: file is %d bytes, record %d", ErrSizeMismatch, n, size)
	}
	if !sumMatches(&h, key) {
		return st, ErrHashMismatch
	}
	return st, nil
}
