package disk

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/syncular/caddy-syncular/segid"
)

// Fills: one per segment, streamed to a temp file while hashed, renamed
// into place only when the bytes hash to the id.

// get is one attempt; again asks for another (the entry changed under it).
func (c *Cache) get(ctx context.Context, key string, size int64, src Source) (h *Handle, again bool, err error) {
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	var victims []string
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, false, fmt.Errorf("%w: closed", ErrUnavailable)
	}
	if e := c.entries[key]; e != nil {
		switch {
		case e.size != size:
			// Never serve a file whose size is not the record's.
			victims = append(victims, c.dropLocked(e))
			c.discarded.Add(1)
			// then fill below
		case !e.verified:
			ch := e.verifying
			if ch == nil {
				ch = make(chan struct{})
				e.verifying = ch
				c.wg.Add(1)
				go c.verify(e, ch)
			}
			c.mu.Unlock()
			select {
			case <-ch:
				return nil, true, nil
			case <-ctx.Done():
				return nil, false, ctx.Err()
			}
		default:
			touch, now := c.useLocked(e)
			c.mu.Unlock()
			return c.openComplete(e, touch, now)
		}
	}
	if f := c.fills[key]; f != nil {
		c.mu.Unlock()
		c.removeFiles(victims)
		if f.size != size {
			return nil, false, fmt.Errorf("%w: a fill of another length is running", ErrSizeMismatch)
		}
		c.followers.Add(1)
		h, again, err := c.attach(ctx, f)
		if h != nil {
			h.follow = c
			c.following.Add(1)
		}
		return h, again, err
	}
	var more []string
	if size > c.max {
		err = ErrTooLarge // whatever the state of the directory
	} else {
		more, err = c.usableLocked()
		victims = append(victims, more...)
	}
	if err == nil {
		var ok bool
		if more, ok = c.reserveLocked(size); !ok {
			err = ErrNoRoom
		}
		victims = append(victims, more...)
	}
	if err != nil {
		c.mu.Unlock()
		c.removeFiles(victims)
		return nil, false, err
	}
	f := &fill{key: key, size: size, wake: make(chan struct{})}
	c.fills[key] = f
	c.wg.Add(1)
	c.mu.Unlock()
	c.removeFiles(victims)
	go c.run(f, src)
	return c.attach(ctx, f)
}

// reserveLocked makes room for size bytes, evicting least recently used
// complete files, and reserves it for a fill.
func (c *Cache) reserveLocked(size int64) (victims []string, ok bool) {
	if c.reserved+size > c.max {
		return nil, false
	}
	for c.bytes.Load()+c.reserved+size > c.max {
		e := c.lru.Back().Value.(*entry) // non-empty: reserved+size <= max
		victims = append(victims, c.dropLocked(e))
		c.evictions.Add(1)
	}
	c.reserved += size
	return victims, true
}

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

// sumMatches reports whether h hashed the bytes of the segment whose
// digest is key (hex).
func sumMatches(h *segid.Hasher, key string) bool {
	want, err := segid.ParseHex(key)
	return err == nil && h.Matches(want)
}

// attach waits for f's first byte (or its end) and opens the fill's file
// for one reader.
func (c *Cache) attach(ctx context.Context, f *fill) (*Handle, bool, error) {
	f.mu.Lock()
	for !f.done && f.written == 0 {
		ch := f.wake
		f.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
		f.mu.Lock()
	}
	if f.err != nil {
		err := f.err
		f.mu.Unlock()
		return nil, false, err
	}
	// Opened under f.mu: the fill renames or removes its file under it,
	// so this is the file f.path names now.
	fd, err := os.Open(f.path)
	done, st := f.done, f.stamp
	f.mu.Unlock()
	if err != nil {
		if done && errors.Is(err, fs.ErrNotExist) { // committed, then evicted
			return nil, true, nil
		}
		return nil, false, unavailable(err)
	}
	if done { // committed: a complete file, served while it is the one verified
		if fi, err := fd.Stat(); err != nil || st.changed(stampOf(fi)) != "" {
			fd.Close()
			return nil, true, nil // the index's entry decides (openComplete)
		}
		return &Handle{file: fd, size: f.size}, false, nil
	}
	return &Handle{file: fd, size: f.size, fill: f, cache: c}, false, nil
}

// run copies src into a temporary file, then commits it or fails.
func (c *Cache) run(f *fill, src Source) {
	defer c.wg.Done()
	ctx, cancel := context.WithTimeout(c.ctx, c.fillTimeout)
	defer cancel()

	var tf *os.File
	err := c.ctx.Err()
	if err == nil && c.hooks.create != nil {
		err = c.hooks.create()
	}
	if err == nil {
		tf, err = os.CreateTemp(c.tmp, tmpPrefix+"*")
	}
	if err != nil {
		c.fail(f, unavailable(err), true, nil)
		return
	}
	tmp := tf.Name()
	f.mu.Lock()
	f.path = tmp
	f.mu.Unlock()

	w := &fillWriter{c: c, f: f, prefillWriter: newPrefillWriter(tf, f.size)}
	err = src(ctx, w)
	switch {
	case w.diskErr != nil: // the source may report our own write error
		err = w.diskErr
	case w.long:
		err = fmt.Errorf("%w: the source sent more than %d bytes", ErrSizeMismatch, f.size)
	case err != nil && c.ctx.Err() != nil: // Close: the store did not fail
		err = fmt.Errorf("%w: closed during the fill: %w", ErrUnavailable, err)
	case err != nil:
		err = fmt.Errorf("disk cache: fill source: %w", err)
	case w.n != f.size:
		err = fmt.Errorf("%w: the source sent %d of %d bytes", ErrSizeMismatch, w.n, f.size)
	case !sumMatches(&w.h, f.key):
		err = ErrHashMismatch
	}
	disk := w.diskErr != nil
	var st stamp
	if err == nil {
		now := c.now()
		_ = os.Chtimes(tmp, now, now) // the recency a restart reads
		// The verified file as it is now: a hit serves it while it stays so.
		fi, serr := tf.Stat()
		if serr != nil {
			err, disk = unavailable(serr), true
		} else {
			st = stampOf(fi)
		}
	}
	// No fsync: a crash can leave a renamed file with unwritten blocks,
	// but every file found at start-up is hashed before it is served.
	if cerr := tf.Close(); cerr != nil && err == nil {
		err, disk = unavailable(cerr), true
	}
	final := c.path(f.key)
	if err == nil {
		if merr := os.MkdirAll(filepath.Dir(final), 0o750); merr != nil {
			err, disk = unavailable(merr), true
		}
	}
	if err == nil {
		f.mu.Lock()
		if rerr := os.Rename(tmp, final); rerr != nil {
			err, disk = unavailable(rerr), true
		} else {
			f.path = final
			st = restamp(st, final) // the rename moved the change time
		}
		f.mu.Unlock()
	}
	if err != nil {
		var rp *resumePoint
		if disk { // the source was fine: its readers continue from the store
			rp = w.resumePoint()
		}
		c.fail(f, err, disk, rp)
		return
	}
	c.commit(f, st)
}

// commit indexes a renamed fill and ends it.
func (c *Cache) commit(f *fill, st stamp) {
	c.mu.Lock()
	delete(c.fills, f.key)
	c.reserved -= f.size
	if old := c.entries[f.key]; old != nil { // not expected: Get fills only a missing key
		c.unindexLocked(old)
	}
	e := &entry{key: f.key, size: f.size, touched: c.now(), verified: true, stamp: st}
	e.elem = c.lru.PushFront(e)
	c.entries[f.key] = e
	c.bytes.Add(f.size)
	c.files.Add(1)
	c.fillsDone.Add(1) // counted before anyone can see the end
	f.mu.Lock()
	f.done, f.stamp = true, st
	f.broadcast()
	f.mu.Unlock()
	c.mu.Unlock()
}

// fail ends f with err; disk says the directory failed (not the source),
// and rp, when set, where its readers continue from the store.
func (c *Cache) fail(f *fill, err error, disk bool, rp *resumePoint) {
	c.mu.Lock()
	if c.fills[f.key] == f {
		delete(c.fills, f.key)
	}
	c.reserved -= f.size
	if disk && !c.closed {
		c.downLocked(err)
	}
	f.mu.Lock()
	// Removed with the error set, under f.mu: a reader attaching now
	// either opened the file before (and gets the error on its next
	// read) or sees the error.
	var rmErr error
	if f.path != "" {
		if rmErr = os.Remove(f.path); errors.Is(rmErr, fs.ErrNotExist) {
			rmErr = nil
		}
	}
	c.fillErrors.Add(1) // counted before anyone can see the end
	f.done, f.err, f.resume = true, err, rp
	f.broadcast()
	f.mu.Unlock()
	c.mu.Unlock()
	if rmErr != nil {
		c.warn("disk cache: cannot remove a file", rmErr)
	}
	c.warn("disk cache: fill failed", err)
}

// fillWriter is the Source's writer: it refuses bytes past the size,
// hashes what it writes and wakes the readers.
type fillWriter struct {
	c             *Cache
	f             *fill
	prefillWriter // the fill's file, and n: the bytes written
	h             segid.Hasher
	long          bool
	diskErr       error
}

// Large page cache pages for what sendfile(2) sends.
//
// A fill writes what its source hands it: an S3 body or a blob copy
// arrives in writes of 32 KiB or less, and the kernel builds a file's page
// cache in pages (folios) no larger than the write that created them.
// Sending a file cached in 32 KiB folios costs more than one cached in
// large ones: each packet refers to more, smaller pages. Measured on this
// kind of machine with nginx itself (sendfile on, 200 clients, a 64 MiB
// file, alternated rounds): 1.15-1.25x the server CPU per answer for a
// file written in 32 KiB writes against one written in 256 KiB or larger
// writes (or in one, which makes 2 MiB folios on ext4). So a fill writes
// zeros ahead of its data, one aligned prefillChunk at a time, and the
// data overwrites them in the pages those writes made: 2 MiB folios, as
// a file written in one piece gets. It costs one more memory copy per
// byte, once per fill; the readers, who read only what the fill published
// (written), never see the zeros, and the file is exactly the segment's
// size when the data is all there.
const prefillChunk = 2 << 20

var zeros [prefillChunk]byte

// prefillWriter appends to a file and writes zeros ahead of the data
// (see above), up to a limit: the segment's size for a fill, or a bound
// for a variant, whose size is not known beforehand and whose file trim
// cuts to n when the writes are done.
type prefillWriter struct {
	file  *os.File
	n     int64 // bytes written
	pre   int64 // the file's bytes up to here exist (zeros past the data)
	limit int64 // the prefill never goes past this size
}

func newPrefillWriter(f *os.File, limit int64) prefillWriter {
	return prefillWriter{file: f, limit: limit}
}

func (w *prefillWriter) Write(p []byte) (int, error) {
	w.ahead(w.n + int64(len(p)))
	n, err := w.file.Write(p)
	w.n += int64(n)
	return n, err
}

// ahead makes the file's bytes exist up to the prefillChunk boundary at
// or past end (at most the limit). It is best effort: a write that fails
// (a disk with less room than the step) ends the prefill for this file,
// and the data's own writes meet the failure, if any, where they would
// have without it (a fill hands its readers over once bytes are there).
func (w *prefillWriter) ahead(end int64) {
	for w.pre < end && w.pre < w.limit {
		k := min(prefillChunk-w.pre%prefillChunk, w.limit-w.pre)
		if _, err := w.file.WriteAt(zeros[:k], w.pre); err != nil {
			w.limit = w.pre
			return
		}
		w.pre += k
	}
}

// trim cuts the file to the bytes written: the zeros past them go.
func (w *prefillWriter) trim() error {
	if err := w.file.Truncate(w.n); err != nil {
		return unavailable(err)
	}
	return nil
}

var errLong = errors.New("disk cache: more bytes than the record's length")

func (w *fillWriter) Write(p []byte) (int, error) {
	if w.diskErr != nil {
		return 0, w.diskErr
	}
	if int64(len(p)) > w.f.size-w.n {
		w.long = true
		return 0, errLong
	}
	var n int
	var err error
	if w.c.hooks.write != nil {
		err = w.c.hooks.write(p)
	}
	if err == nil {
		n, err = w.prefillWriter.Write(p)
	}
	w.h.Write(p[:n])
	if n > 0 {
		w.f.mu.Lock()
		w.f.written = w.n
		w.f.broadcast()
		w.f.mu.Unlock()
	}
	if err != nil {
		w.diskErr = unavailable(err)
		return n, w.diskErr
	}
	return n, nil
}

// useLocked marks e most recently used and says whether its file's times
// are due a touch (at most every touchInterval); c.mu is held.
func (c *Cache) useLocked(e *entry) (touch bool, now time.Time) {
	c.lru.MoveToFront(e.elem)
	now = c.now()
	if touch = now.Sub(e.touched) >= touchInterval; touch {
		e.touched = now
	}
	return touch, now
}
