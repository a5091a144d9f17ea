package disk

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"

	"github.com/syncular/caddy-syncular/compress"
	"github.com/syncular/caddy-syncular/segid"
)

// Variants: content-coded copies of complete, verified segment files,
// kept beside them as <Dir>/<2 hex>/<64 hex>+gzip (or +zstd), indexed and
// evicted like the identity files and counted in the same budget.
//
// A variant is built once per (segment, coding), in the background, from
// the verified identity file (never from a stream still being filled),
// into a temporary file; it is renamed into place only after
// compress.Verify decoded it to bytes that hash to the segment id. A
// variant file found by the scan at New is verified the same way (decoded
// and hashed) before its first use. A segment that does not shrink by 10%
// with a coding, or whose variant failed verification, is remembered and
// not tried again until the process restarts.

// VariantState says what Variant found.
type VariantState uint8

const (
	// VariantReady: the handle reads the verified variant file.
	VariantReady VariantState = iota
	// VariantBuilding: a build or a verification is under way; serve
	// identity meanwhile.
	VariantBuilding
	// VariantNotWorth: the variant does not shrink the segment by 10%,
	// or failed verification; serve identity.
	VariantNotWorth
	// VariantUnavailable: no variant and none can be built now (the
	// identity file is not complete on disk, the build slots are busy,
	// the budget has no room for the build beside the identity file, the
	// directory is unusable); serve identity.
	VariantUnavailable
	// VariantFollowing: the handle reads a variant still being encoded
	// from a fill in progress (grow.go): its length is unknown (Size
	// -1), its reader blocks for more bytes and fails, rather than end,
	// if the variant does not verify.
	VariantFollowing
)

// notWorthMax bounds the remembered (segment, coding) keys not worth a
// variant; past it the memory is cleared (a segment is then tried again).
const notWorthMax = 10_000

// variantLedger is the Cache's part for variants; guarded by Cache.mu.
// The builds from complete files take their slots from the process's one
// build budget (compress.Builds).
type variantLedger struct {
	building map[string]bool
	notWorth map[string]struct{}
	// growing are the builds that follow a fill (grow.go), also in
	// building; growSlots bounds them apart from the builds from
	// complete files.
	growing   map[string]*vfill
	growSlots chan struct{}
}

func (c *Cache) variantsLocked() *variantLedger {
	if c.vs == nil {
		c.vs = &variantLedger{
			building: make(map[string]bool),
			notWorth: make(map[string]struct{}),
			growing:  make(map[string]*vfill),
			// One per core, at least two: a fill followed in two codings.
			growSlots: make(chan struct{}, max(2, runtime.GOMAXPROCS(0))),
		}
	}
	return c.vs
}

// variantSuffix reports whether name is a variant file's suffix ("+gzip",
// "+zstd").
func variantSuffix(s string) bool { return s == "+gzip" || s == "+zstd" }

// variantFileKey reports whether a directory entry's name is a variant
// file this package writes: "<64 hex>+gzip" or "<64 hex>+zstd".
func variantFileKey(name string) bool {
	return len(name) > 64 && isHex(name[:64]) && variantSuffix(name[64:])
}

// Variant returns a handle on the verified coding variant of id
// (size identity bytes, the record's byteLength) when it is on disk, and
// otherwise starts building it in the background when it can: it never
// waits for a build. While the segment's fill runs, the build follows the
// fill and Variant returns a handle on the growing variant
// (VariantFollowing, grow.go). The handle reads the variant's bytes; its Size is
// the variant's length and its Reader over a complete file suits
// sendfile(2). Only gzip and zstd have variants.
func (c *Cache) Variant(id segid.ID, size int64, coding compress.Coding) (*Handle, VariantState) {
	key := id.Hex()
	if id.IsZero() || size <= 0 || (coding != compress.Gzip && coding != compress.Zstd) {
		return nil, VariantUnavailable
	}
	vkey := key + "+" + coding.String()
	for range maxAttempts {
		h, st, again := c.variant(id, key, vkey, size, coding)
		if !again {
			return h, st
		}
	}
	return nil, VariantUnavailable
}

func (c *Cache) variant(id segid.ID, key, vkey string, size int64, coding compress.Coding) (*Handle, VariantState, bool) {
	c.mu.Lock()
	if c.closed || !c.ready {
		c.mu.Unlock()
		return nil, VariantUnavailable, false
	}
	vs := c.variantsLocked()
	if e := c.entries[vkey]; e != nil {
		if !e.verified {
			if e.verifying == nil {
				e.verifying = make(chan struct{})
				c.wg.Add(1)
				go c.verifyVariant(e, id, size, coding)
			}
			c.mu.Unlock()
			return nil, VariantBuilding, false
		}
		touch, now := c.useLocked(e)
		c.mu.Unlock()
		h, again, err := c.openComplete(e, touch, now)
		if err != nil {
			return nil, VariantUnavailable, false
		}
		if again {
			return nil, VariantUnavailable, true
		}
		return h, VariantReady, false
	}
	if _, ok := vs.notWorth[vkey]; ok {
		c.mu.Unlock()
		return nil, VariantNotWorth, false
	}
	if vf := vs.growing[vkey]; vf != nil {
		c.mu.Unlock()
		return c.followGrow(vf)
	}
	if vs.building[vkey] {
		c.mu.Unlock()
		return nil, VariantBuilding, false
	}
	e := c.entries[key]
	if f := c.fills[key]; e == nil && f != nil && f.size == size {
		// The segment is being filled: encode while it lands (grow.go).
		vf, victims := c.startGrowLocked(vs, f, id, vkey, size, coding)
		c.mu.Unlock()
		c.removeFiles(victims)
		if vf == nil {
			return nil, VariantUnavailable, false
		}
		return c.followGrow(vf)
	}
	if e == nil || !e.verified || e.size != size {
		c.mu.Unlock()
		return nil, VariantUnavailable, false
	}
	// A build reserves the identity size (the encoder stops at 90% of
	// it). Making that room may evict other files, never the identity
	// file itself (the build would cost the segment its fast path, and
	// its fill would then wait for the build's reservation).
	if e.size+c.reserved+size > c.max { // the most room evicting every other file gives
		c.mu.Unlock()
		return nil, VariantUnavailable, false
	}
	if !compress.Builds.TryAcquire() {
		c.mu.Unlock()
		return nil, VariantUnavailable, false // every slot busy: a later request retries
	}
	// Opened under mu: the build reads this verified file even if it is
	// evicted meanwhile.
	src, err := os.Open(c.path(key))
	if err != nil {
		compress.Builds.Release()
		c.mu.Unlock()
		return nil, VariantUnavailable, false
	}
	c.lru.MoveToFront(e.elem) // evicted last: the check above keeps it
	victims, ok := c.reserveLocked(size)
	if !ok {
		compress.Builds.Release()
		c.mu.Unlock()
		src.Close()
		return nil, VariantUnavailable, false
	}
	vs.building[vkey] = true
	c.wg.Add(1)
	c.mu.Unlock()
	c.removeFiles(victims)
	go c.buildVariant(src, id, vkey, size, coding)
	return nil, VariantBuilding, false
}

// HeldVariant returns a handle on the verified coding variant of
// id (size identity bytes) when its complete file is on disk, else
// nil. Unlike Variant it starts nothing (no build, no verification) and
// does not follow a variant still being encoded.
func (c *Cache) HeldVariant(id segid.ID, size int64, coding compress.Coding) *Handle {
	key := id.Hex()
	if id.IsZero() || size <= 0 || (coding != compress.Gzip && coding != compress.Zstd) {
		return nil
	}
	vkey := key + "+" + coding.String()
	for range maxAttempts {
		c.mu.Lock()
		e := c.entries[vkey]
		if c.closed || !c.ready || e == nil || !e.verified {
			c.mu.Unlock()
			return nil
		}
		touch, now := c.useLocked(e)
		c.mu.Unlock()
		h, again, err := c.openComplete(e, touch, now)
		if err != nil {
			return nil
		}
		if !again {
			return h
		}
	}
	return nil
}

// VariantSize reports, without I/O and without touching the index, the
// length of the verified coding variant of id on disk; with
// growing, a variant still being encoded from a fill counts too (length
// -1).
func (c *Cache) VariantSize(id segid.ID, size int64, coding compress.Coding, growing bool) (int64, bool) {
	key := id.Hex()
	if id.IsZero() || size <= 0 || (coding != compress.Gzip && coding != compress.Zstd) {
		return 0, false
	}
	vkey := key + "+" + coding.String()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || !c.ready {
		return 0, false
	}
	if e := c.entries[vkey]; e != nil && e.verified {
		return e.size, true
	}
	if growing && c.vs != nil {
		if vf := c.vs.growing[vkey]; vf != nil {
			return -1, true
		}
	}
	return 0, false
}

// buildVariant encodes the identity file into a temporary file, verifies
// it and renames it into place; or remembers vkey as not worth a variant.
func (c *Cache) buildVariant(src *os.File, id segid.ID, vkey string, size int64, coding compress.Coding) {
	defer c.wg.Done()
	defer src.Close()
	ctx, cancel := context.WithTimeout(c.ctx, c.fillTimeout)
	defer cancel()
	written, tmp, err := c.encodeVariant(ctx, src, id, size, coding)
	notWorth := false
	switch {
	case errors.Is(err, compress.ErrIncompressible):
		c.variantsIncompressible.Add(1)
		notWorth = true
	case errors.Is(err, compress.ErrMismatch):
		c.variantsRejected.Add(1)
		notWorth = true
	}
	final := c.path(vkey)
	var st stamp
	if err == nil {
		if err = os.MkdirAll(filepath.Dir(final), 0o750); err == nil {
			now := c.now()
			_ = os.Chtimes(tmp, now, now)
			var fi fs.FileInfo
			if fi, err = os.Stat(tmp); err == nil {
				st, written = stampOf(fi), fi.Size()
				if err = os.Rename(tmp, final); err == nil {
					st = restamp(st, final) // the rename moved the change time
				}
			}
		}
	}
	if err != nil && tmp != "" {
		_ = os.Remove(tmp)
	}
	c.mu.Lock()
	vs := c.variantsLocked()
	delete(vs.building, vkey)
	compress.Builds.Release()
	c.reserved -= size
	if notWorth {
		if len(vs.notWorth) >= notWorthMax {
			clear(vs.notWorth)
		}
		vs.notWorth[vkey] = struct{}{}
	}
	if err == nil {
		if old := c.entries[vkey]; old != nil {
			c.unindexLocked(old)
		}
		e := &entry{key: vkey, size: written, touched: c.now(), verified: true, stamp: st}
		e.elem = c.lru.PushFront(e)
		c.entries[vkey] = e
		c.bytes.Add(written)
		c.files.Add(1)
		c.variantsMade.Add(1)
	}
	c.mu.Unlock()
	if err != nil && !errors.Is(err, compress.ErrIncompressible) && c.ctx.Err() == nil {
		c.warn("disk cache: variant build failed", err)
	}
}

// encodeVariant writes the coding variant of the identity file src to
// a temporary file and verifies it; it returns the file's path and size.
func (c *Cache) encodeVariant(ctx context.Context, src *os.File, id segid.ID, size int64, coding compress.Coding) (int64, string, error) {
	tf, err := os.CreateTemp(c.tmp, tmpPrefix+"*")
	if err != nil {
		return 0, "", unavailable(err)
	}
	tmp := tf.Name()
	// Prefilled for large page cache pages (prefill.go), then cut to the
	// encoded size.
	pw := newPrefillWriter(tf, size)
	written, err := compress.EncodeBounded(coding, &pw, compress.ContextReader(ctx, src), size)
	if err == nil {
		err = pw.trim()
	}
	if err == nil && c.hooks.variant != nil {
		err = c.hooks.variant(tf)
	}
	if err == nil {
		_, err = tf.Seek(0, io.SeekStart)
	}
	if err == nil {
		err = compress.Verify(coding, compress.ContextReader(ctx, tf), id, size)
	}
	if cerr := tf.Close(); err == nil && cerr != nil {
		err = unavailable(cerr)
	}
	if err == nil {
		// The file, not the encoder's count, is what readers get.
		var fi fs.FileInfo
		if fi, err = os.Stat(tmp); err == nil {
			written = fi.Size()
		}
	}
	return written, tmp, err
}

// verifyVariant decodes and hashes a variant file found by the scan before
// its first use; a file that fails is removed and remembered.
func (c *Cache) verifyVariant(e *entry, id segid.ID, size int64, coding compress.Coding) {
	defer c.wg.Done()
	st, err := c.checkVariantFile(c.path(e.key), id, size, coding)
	var p string
	dropped := false
	c.mu.Lock()
	if c.ctx.Err() != nil {
		err = nil // closed mid-way: not known bad
	} else if c.entries[e.key] == e {
		if err == nil {
			e.smu.Lock()
			e.stamp = st
			e.smu.Unlock()
			e.verified = true
		} else {
			p, dropped = c.dropLocked(e), true
			c.discarded.Add(1)
			if errors.Is(err, compress.ErrMismatch) {
				c.variantsRejected.Add(1)
			}
		}
	}
	close(e.verifying)
	e.verifying = nil
	c.mu.Unlock()
	if dropped {
		c.removeFiles([]string{p})
		c.warn("disk cache: discarded a variant file that failed verification", err)
	}
}

// checkVariantFile verifies a variant file and returns its stamp as it
// was before it was read.
func (c *Cache) checkVariantFile(path string, id segid.ID, size int64, coding compress.Coding) (stamp, error) {
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
	return st, compress.Verify(coding, compress.ContextReader(c.ctx, f), id, size)
}
