package disk

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/syncular/caddy-syncular/segid"
)

// Fills: one per segment, streamed to a temp file while hashed, renamed
// into place only when the bytes hash to the id.

// Get returns a handle on the bytes of id, which are size bytes
// long (the record's byteLength). A complete file is served at once (Hit).
// Otherwise the first caller starts one fill from src and every caller
// during it attaches to it; Get returns once the fill's first byte is on
// disk (or the fill ended), so its handle reads as the fill progresses.
//
// On any error the caller serves from the store. Errors matching
// ErrTooLarge, ErrNoRoom or ErrUnavailable are the cache declining
// (counted); others are the fill's failure before its first byte (the
// source's error, wrapped) or ctx's.
func (c *Cache) Get(ctx context.Context, id segid.ID, size int64, src Source) (*Handle, error) {
	return c.getFrom(ctx, id, size, src, false)
}

// GetVerified is Get from a source that verifies what it copies: src
// returns nil only when the bytes it wrote are exactly the segment's and
// hash to its id, and an error otherwise (the SQLite store's CopyBlob).
// A fill from it then hashes nothing itself: its bytes are hashed once,
// by the source. A fill that fails on the disk hashes what it wrote
// once more, to hand its readers over to the store (handoff.go).
func (c *Cache) GetVerified(ctx context.Context, id segid.ID, size int64, src Source) (*Handle, error) {
	return c.getFrom(ctx, id, size, src, true)
}

func (c *Cache) getFrom(ctx context.Context, id segid.ID, size int64, src Source, checked bool) (*Handle, error) {
	if id.IsZero() {
		return nil, errors.New("disk cache: the zero segment id")
	}
	if size < 0 {
		return nil, errors.New("disk cache: negative size")
	}
	for range maxAttempts {
		h, again, err := c.get(ctx, id, size, src, checked)
		if !again {
			c.countBypass(err)
			return h, err
		}
	}
	err := fmt.Errorf("%w: the entry kept changing", ErrUnavailable)
	c.countBypass(err)
	return nil, err
}

// get is one attempt; again asks for another (the entry changed under it).
func (c *Cache) get(ctx context.Context, id segid.ID, size int64, src Source, checked bool) (h *Handle, again bool, err error) {
	key := id.Hex()
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
	f := &fill{key: key, want: id.Digest(), size: size, checked: checked, wake: make(chan struct{})}
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

// sumMatches reports whether h hashed the bytes of the segment whose
// digest is key (hex): a file name found in the directory.
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
	case !f.checked && !w.h.Matches(f.want): // a checked source verified its bytes
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
			rp = w.resumePoint(tmp)
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
// hashes what it writes (unless the source verifies them itself) and
// wakes the readers.
type fillWriter struct {
	c             *Cache
	f             *fill
	prefillWriter // the fill's file, and n: the bytes written
	h             segid.Hasher
	long          bool
	diskErr       error
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
	if !w.f.checked {
		w.h.Write(p[:n])
	}
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
