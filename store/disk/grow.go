package disk

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/syncular/caddy-syncular/compress"
	"github.com/syncular/caddy-syncular/segid"
)

// Growing variants: a variant encoded while its segment is still being
// filled, so that a crowd arriving together gets compressed bytes.
//
// The first Variant call for a (segment, coding) while the segment's fill
// runs starts one build. The build follows the identity fill like any
// other follower (its reader reads the fill's file with pread as bytes
// land, never a second store read, and the fill never waits for it),
// encodes at the storm levels (compress.EncodeStorm, flushed after the
// first compress.StormFirstFlush bytes of input, then every
// compress.StormFlushEvery) into its own temporary file,
// and wakes its readers on every write. A verifier follows that file as
// it grows, decoding and hashing it (compress.Verify). The variant is done
// only when the identity fill verified (the encoder's reader ends cleanly
// only then), the encoder finished, and the decoded bytes hash to the
// segment id with the record's length; until then every follower's
// reader holds the variant's last byte back. Any failure sets the error:
// the followers' readers return it before their last byte, so their
// answers are aborted, never cleanly ended with wrong bytes; nothing is
// kept. Followers attach only after the encoder's first flush showed
// that the variant shrinks the segment by 10%; a segment whose first
// flush does not is dropped before anyone has a byte (its requests get
// identity), and remembered as not worth a variant. A verified variant
// is renamed into place and indexed like a
// variant built after the fill; one that does not shrink the segment by
// 10% was still correct for its followers but is not kept, and the
// (segment, coding) is remembered as not worth a variant.

// growSlack is the room a growing variant may take beyond the identity
// size (a coder's framing on incompressible bytes), and so what its build
// reserves beyond it.
func growSlack(size int64) int64 { return size/64 + 1<<20 }

// vfill is a growing variant.
type vfill struct {
	vkey   string
	coding compress.Coding

	mu      sync.Mutex
	path    string // the temporary file; the final file once renamed; "" once removed
	written int64  // bytes in the file readers may read (0 until started)
	started bool   // the first flush shrank the bytes: followers may attach
	encoded bool   // the encoder finished: written is the variant's length
	done    bool   // verified (and kept or not): the last byte may go
	err     error  // set with done when the build failed
	wake    chan struct{}
}

func (v *vfill) broadcast() {
	close(v.wake)
	v.wake = make(chan struct{})
}

// startGrowLocked starts a growing build of vkey following the fill f,
// when there is a slot and room; c.mu held. It returns the build or nil.
// The files evicted for its room are the caller's to remove, after
// unlocking.
func (c *Cache) startGrowLocked(vs *variantLedger, f *fill, id segid.ID, vkey string, size int64, coding compress.Coding) (vf *vfill, victims []string) {
	select {
	case vs.growSlots <- struct{}{}:
	default:
		return nil, nil
	}
	reserve := size + growSlack(size)
	victims, ok := c.reserveLocked(reserve)
	if !ok {
		<-vs.growSlots
		return nil, victims
	}
	tf, err := os.CreateTemp(c.tmp, tmpPrefix+"*")
	if err != nil {
		c.reserved -= reserve
		<-vs.growSlots
		return nil, victims
	}
	vf = &vfill{vkey: vkey, coding: coding, path: tf.Name(), wake: make(chan struct{})}
	vs.building[vkey] = true
	vs.growing[vkey] = vf
	c.wg.Add(1)
	go c.grow(f, vf, tf, id, size, reserve)
	return vf, victims
}

// grow runs one growing build to its end.
func (c *Cache) grow(f *fill, vf *vfill, tf *os.File, id segid.ID, size, reserve int64) {
	defer c.wg.Done()
	ctx, cancel := context.WithTimeout(c.ctx, c.fillTimeout)
	defer cancel()

	// The verifier follows the variant file as it grows.
	verified := make(chan error, 1)
	vr, err := os.Open(vf.path)
	if err != nil {
		verified <- unavailable(err)
	} else {
		go func() {
			defer vr.Close()
			r := &growReader{vf: vf, file: vr, ctx: ctx, whole: true}
			verr := compress.Verify(vf.coding, r, id, size)
			if verr != nil { // the followers stop now, and the encoder at its next write
				vf.mu.Lock()
				if vf.err == nil {
					vf.err = verr
				}
				vf.broadcast()
				vf.mu.Unlock()
			}
			verified <- verr
		}()
	}

	// The encoder follows the identity fill.
	var src io.Reader
	ih, again, err := c.attach(ctx, f)
	switch {
	case err != nil:
	case again: // committed and evicted before the build attached
		err = fmt.Errorf("%w: the segment's fill ended before its variant could follow it", ErrUnavailable)
	default:
		defer ih.Close()
		src, err = ih.Reader(ctx, 0, -1)
	}
	var written int64
	w := &growWriter{c: c, vf: vf, limit: reserve, prefillWriter: newPrefillWriter(tf, reserve)}
	if err == nil {
		written, err = compress.EncodeStorm(vf.coding, w, src, w.flushed)
		if w.err != nil {
			err = w.err
		}
		if err == nil && !w.started() { // shorter than one flush
			err = w.flushed(size, written)
		}
	}
	if err == nil {
		err = w.trim()
	}
	if cerr := tf.Close(); cerr != nil && err == nil {
		err = unavailable(cerr)
	}
	vf.mu.Lock()
	if err != nil && vf.err == nil {
		vf.err = err // stops the verifier and every follower
	} else if err == nil {
		vf.written, vf.encoded = w.n, true // the bytes after the last flush too
	}
	vf.broadcast()
	vf.mu.Unlock()
	if verr := <-verified; err == nil {
		err = verr
	}
	c.endGrow(vf, id, size, reserve, written, err)
}

// endGrow keeps, drops or fails a growing variant whose encoder and
// verifier ended.
func (c *Cache) endGrow(vf *vfill, id segid.ID, size, reserve, written int64, err error) {
	keep := err == nil && compress.Worthwhile(size, written)
	final := c.path(vf.vkey)
	var st stamp
	if keep {
		if merr := os.MkdirAll(filepath.Dir(final), 0o750); merr != nil {
			keep = false
		} else {
			now := c.now()
			_ = os.Chtimes(vf.path, now, now)
			if fi, serr := os.Stat(vf.path); serr != nil || fi.Size() != written {
				keep = false
			} else {
				st = stampOf(fi)
			}
		}
	}
	c.mu.Lock()
	vs := c.variantsLocked()
	delete(vs.building, vf.vkey)
	delete(vs.growing, vf.vkey)
	<-vs.growSlots
	c.reserved -= reserve
	vf.mu.Lock()
	if keep {
		// Renamed under vf.mu: a follower attaching now opens the name
		// vf.path holds.
		if rerr := os.Rename(vf.path, final); rerr != nil {
			keep = false
		} else {
			vf.path = final
			st = restamp(st, final) // the rename moved the change time
		}
	}
	var rm string
	if !keep {
		rm, vf.path = vf.path, ""
	}
	switch {
	case errors.Is(err, compress.ErrIncompressible): // before any follower attached
		c.variantsIncompressible.Add(1)
		c.markNotWorthLocked(vs, vf.vkey)
	case err != nil:
		if errors.Is(err, compress.ErrMismatch) {
			c.variantsRejected.Add(1)
			c.markNotWorthLocked(vs, vf.vkey)
		}
	case keep:
		if old := c.entries[vf.vkey]; old != nil {
			c.unindexLocked(old)
		}
		e := &entry{key: vf.vkey, size: written, touched: c.now(), verified: true, stamp: st}
		e.elem = c.lru.PushFront(e)
		c.entries[vf.vkey] = e
		c.bytes.Add(written)
		c.files.Add(1)
		c.variantsMade.Add(1)
	case !compress.Worthwhile(size, written):
		c.variantsIncompressible.Add(1)
		c.markNotWorthLocked(vs, vf.vkey)
	}
	c.variantsGrown.Add(1)
	vf.done, vf.err = true, err
	vf.broadcast()
	vf.mu.Unlock()
	c.mu.Unlock()
	if rm != "" {
		if rerr := os.Remove(rm); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
			c.warn("disk cache: cannot remove a file", rerr)
		}
	}
	if err != nil && !errors.Is(err, compress.ErrIncompressible) && c.ctx.Err() == nil {
		c.warn("disk cache: growing variant build failed", err)
	}
}

func (c *Cache) markNotWorthLocked(vs *variantLedger, vkey string) {
	if len(vs.notWorth) >= notWorthMax {
		clear(vs.notWorth)
	}
	vs.notWorth[vkey] = struct{}{}
}

// growStartWait bounds how long Variant waits for a growing variant's
// first flush (the proof that it shrinks the bytes) before answering
// VariantBuilding.
const growStartWait = time.Second

// followGrow opens a growing variant for one follower, once its first
// flush showed that it shrinks the segment: until then no follower has a
// byte, so a variant that would not shrink it is dropped and its
// requests answered identity, never aborted. again: the build ended
// without keeping its file (look the variant up again). A build that
// failed and is not yet cleaned up is VariantBuilding.
func (c *Cache) followGrow(vf *vfill) (*Handle, VariantState, bool) {
	timeout := time.NewTimer(growStartWait)
	defer timeout.Stop()
	vf.mu.Lock()
	defer vf.mu.Unlock()
	for !vf.started && vf.err == nil {
		ch := vf.wake
		vf.mu.Unlock()
		select {
		case <-ch:
		case <-timeout.C:
			vf.mu.Lock()
			return nil, VariantBuilding, false
		case <-c.ctx.Done():
			vf.mu.Lock()
			return nil, VariantUnavailable, false
		}
		vf.mu.Lock()
	}
	switch {
	case errors.Is(vf.err, compress.ErrIncompressible):
		return nil, VariantNotWorth, false
	case vf.err != nil && !vf.done:
		return nil, VariantBuilding, false
	case vf.err != nil || vf.path == "":
		return nil, VariantUnavailable, true
	}
	fd, err := os.Open(vf.path)
	if err != nil {
		return nil, VariantUnavailable, true
	}
	c.variantFollowers.Add(1)
	return &Handle{file: fd, size: -1, vf: vf}, VariantFollowing, false
}

// growWriter is the encoder's writer: it appends to the variant file and
// wakes its readers.
type growWriter struct {
	c             *Cache
	vf            *vfill
	prefillWriter // the variant's file, and n: the bytes written
	limit         int64
	err           error
}

func (w *growWriter) Write(p []byte) (int, error) {
	if w.err != nil {
		return 0, w.err
	}
	if w.n+int64(len(p)) > w.limit {
		w.err = fmt.Errorf("%w: a growing variant passed its reservation", ErrNoRoom)
		return 0, w.err
	}
	if h := w.c.hooks.grow; h != nil {
		p = h(p)
	}
	n, err := w.prefillWriter.Write(p) // large page cache pages (prefill.go)
	// The bytes are published at flush points (flushed), not per write:
	// one wake of every follower per flush of the encoder, and
	// each reads what a flush completed.
	w.vf.mu.Lock()
	if err == nil && w.vf.err != nil { // the verifier failed: stop
		w.err = w.vf.err
		w.vf.mu.Unlock()
		return n, w.err
	}
	w.vf.mu.Unlock()
	if err != nil {
		w.err = unavailable(err)
		return n, w.err
	}
	return n, nil
}

func (w *growWriter) started() bool {
	w.vf.mu.Lock()
	defer w.vf.mu.Unlock()
	return w.vf.started
}

// flushed is the encoder's report at a flush point: in bytes of the
// segment became out bytes of variant. At the first, the variant must
// have shrunk them by 10% (compress.Worthwhile) for followers to attach;
// otherwise the build stops before any follower has a byte.
func (w *growWriter) flushed(in, out int64) error {
	vf := w.vf
	vf.mu.Lock()
	defer vf.mu.Unlock()
	if vf.started {
		vf.written = w.n
		vf.broadcast()
		return nil
	}
	if !compress.Worthwhile(in, out) {
		return fmt.Errorf("%w: its first %d bytes became %d", compress.ErrIncompressible, in, out)
	}
	vf.started, vf.written = true, w.n
	vf.broadcast()
	return nil
}

// growReader reads a growing variant through its own descriptor. A
// follower's reader (whole false) holds the last byte back until the
// variant is verified, and returns the build's error if it fails; the
// verifier's reader (whole true) reads every byte written and ends when
// the encoder finished.
type growReader struct {
	vf    *vfill
	file  *os.File
	ctx   context.Context
	pos   int64
	whole bool
}

func (r *growReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	vf := r.vf
	for {
		vf.mu.Lock()
		if vf.err != nil {
			err := vf.err
			vf.mu.Unlock()
			return 0, err
		}
		end := vf.encoded
		if !r.whole {
			end = vf.done
		}
		avail := vf.written - r.pos
		if !end && !r.whole {
			avail-- // the last byte waits for the verification
		}
		if avail <= 0 && end {
			vf.mu.Unlock()
			return 0, io.EOF
		}
		if avail > 0 {
			vf.mu.Unlock()
			return readWritten(r.file, p, &r.pos, avail)
		}
		ch := vf.wake
		vf.mu.Unlock()
		if err := awaitWake(r.ctx, ch); err != nil {
			return 0, err
		}
	}
}

// Interface guards
var (
	_ io.Writer = (*growWriter)(nil)
	_ io.Reader = (*growReader)(nil)
)
