// Package disk is a content-addressed disk tier for segment bytes: segments
// too large for the memory cache are copied once from the store into a file
// named by their SHA-256 and served from that file to every later reader
// (with sendfile(2) where the caller's writer supports it).
//
// A miss starts one fill per segment id, however many callers ask at once.
// The fill streams the source into a temporary file while hashing it, and
// callers that arrive during the fill read the temporary file as the bytes
// land, so their first byte comes about when the store's does. A reader
// never sees a clean end of bytes that did not hash to their id: it gets
// io.EOF only after the whole fill was verified, and an error if the fill
// failed. Complete files are evicted least recently used first when the
// total size passes the budget; a file evicted while read keeps serving its
// open readers.
//
// The cache never makes a request fail: when it cannot help (the segment is
// larger than the budget, the directory is unusable, the disk is full) Get
// returns an error matching ErrTooLarge, ErrNoRoom or ErrUnavailable and
// the caller streams from the store directly.
//
// A caller serves a segment like this:
//
//	h, err := c.Get(ctx, id, rec.ByteLength, src)
//	if err != nil {
//		// stream from the store directly (bounded memory)
//	}
//	defer h.Close()
//	r, err := h.Reader(ctx, off, n)
//	// write the headers, then
//	written, err := io.Copy(w, r) // sendfile for a complete file
//	if err != nil {
//		// never end the response cleanly: abort it (http.ErrAbortHandler),
//		// or, when errors.Is(err, ErrUnavailable) (the disk failed, the
//		// store did not), continue from the store at off+written.
//	}
//
// Files are unlinked while readers may hold them open, which POSIX
// systems allow; the package is meant for Linux and other Unix systems.
//
// The package knows nothing of Caddy or of the stores; it logs nothing
// (Options.Warn receives the faults worth a log line).
package disk

import (
	"bytes"
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of Options.
const (
	// DefaultMaxBytes is the budget when Options.MaxBytes is 0: room for
	// about eighty 48 MiB segments, small beside a typical volume and
	// large beside the 64 MiB memory cache. Set it below the free space
	// of the volume: a fill that meets a full disk is abandoned.
	DefaultMaxBytes = 4 << 30 // 4 GiB
	// DefaultFillTimeout bounds one fill when Options.FillTimeout is 0.
	DefaultFillTimeout = 10 * time.Minute
	// DefaultRetryInterval is how long an unusable directory is left
	// alone before the cache tries it again (Options.RetryInterval 0).
	DefaultRetryInterval = 30 * time.Second

	// touchInterval: a hit rewrites the file's mtime (the recency a
	// restart restores) at most this often.
	touchInterval = time.Minute
	// maxAttempts bounds Get's retries when an entry changes under it
	// (evicted, committed, discarded) between two steps.
	maxAttempts = 8
	copyBufSize = 256 << 10
	tmpPrefix   = "fill-"
)

// Errors. Get's errors that match ErrTooLarge, ErrNoRoom or ErrUnavailable
// are the cache declining (counted in Stats as bypasses): serve from the
// store. Other errors of Get come from the fill source or the context.
var (
	// ErrTooLarge: the segment is larger than the whole budget and is
	// never cached.
	ErrTooLarge = errors.New("disk cache: segment larger than the cache budget")
	// ErrNoRoom: the budget is held by fills in progress, so nothing can
	// be evicted to make room now.
	ErrNoRoom = errors.New("disk cache: budget held by fills in progress")
	// ErrUnavailable: the directory cannot be used (missing and not
	// creatable, read-only, full, an I/O error) or the cache is closed.
	// A reader's error matching it means the disk failed during the
	// fill; the store was fine, so the caller may resume from the store
	// at the offset it reached.
	ErrUnavailable = errors.New("disk cache: directory unusable")
	// ErrHashMismatch: the source's bytes do not hash to the segment id.
	// Readers that streamed them must abort their response.
	ErrHashMismatch = errors.New("disk cache: segment bytes do not hash to their id")
	// ErrSizeMismatch: the source produced more or fewer bytes than the
	// size Get was given.
	ErrSizeMismatch = errors.New("disk cache: segment length differs from its record")
)

// Source copies a segment's bytes into w and returns nil once all were
// written. It runs in the fill's own goroutine with a context detached from
// the request that started the fill (cancelled by Close and after
// Options.FillTimeout); w is a file, so a source that copies from inside a
// database read transaction holds it only as long as the local copy takes.
type Source func(ctx context.Context, w io.Writer) error

// FromReader adapts an open-a-stream function (an S3 GET, a store's Open)
// to a Source.
func FromReader(open func(ctx context.Context) (io.ReadCloser, error)) Source {
	return func(ctx context.Context, w io.Writer) error {
		rc, err := open(ctx)
		if err != nil {
			return err
		}
		defer rc.Close()
		_, err = io.Copy(w, rc)
		return err
	}
}

// Options configures New. Only Dir is required.
type Options struct {
	// Dir holds the cache: complete files at <Dir>/<2 hex>/<64 hex>
	// (the segment id's digest), fills in progress under <Dir>/tmp. It is
	// created if missing. Give each Cache its own directory, and share
	// one Cache across configuration reloads: two caches on one
	// directory each keep their own budget and index.
	Dir string
	// MaxBytes is the budget: complete files plus the sizes of fills in
	// progress. 0 means DefaultMaxBytes (4 GiB). A segment larger than it
	// is not cached (ErrTooLarge).
	MaxBytes int64
	// FillTimeout bounds one fill from start to commit; a fill still
	// running then fails and its readers get an error. 0 means
	// DefaultFillTimeout (10 minutes).
	FillTimeout time.Duration
	// RetryInterval is how long Get bypasses the cache after the
	// directory proved unusable (or the disk full) before trying it
	// again. 0 means DefaultRetryInterval (30 s).
	RetryInterval time.Duration
	// Now is the clock (recency, retry times, the age of leftover
	// temporary files). nil means time.Now.
	Now func() time.Time
	// Warn, if set, is called (from any goroutine, without locks held
	// by the cache) for faults an operator should see: an unusable
	// directory, a failed fill, a discarded corrupt file. err never
	// holds segment bytes.
	Warn func(msg string, err error)
}

// Stats is a snapshot of the cache's counters.
type Stats struct {
	Bytes    int64 // size of the complete files indexed
	Files    int64 // number of complete files indexed
	Reserved int64 // bytes reserved by fills in progress

	Hits              uint64 // Gets served from a complete file
	Fills             uint64 // fills committed (verified and renamed into place)
	Followers         uint64 // Gets that attached to a fill already running
	FillErrors        uint64 // fills that failed (source, size, hash, disk)
	Evictions         uint64 // complete files removed for room
	Discarded         uint64 // files removed because their size or hash was wrong
	BypassTooLarge    uint64 // Gets answered ErrTooLarge
	BypassNoRoom      uint64 // Gets answered ErrNoRoom
	BypassUnavailable uint64 // Gets answered ErrUnavailable
}

// Cache is the disk tier. Safe for concurrent use.
type Cache struct {
	dir, tmp    string
	max         int64
	fillTimeout time.Duration
	retry       time.Duration
	now         func() time.Time
	warnf       func(string, error)
	hooks       hooks // test fault injection (export_test.go); zero in production

	ctx    context.Context // cancelled by Close: stops fills and verifications
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	closed   bool
	ready    bool      // the directory was usable at the last check
	scanned  bool      // the directory's files are indexed
	retryAt  time.Time // when !ready: next attempt
	downErr  error     // when !ready: why
	entries  map[string]*entry
	lru      list.List // of *entry, most recently used at the front
	reserved int64     // sizes of running fills
	fills    map[string]*fill

	bytes, files                                    atomic.Int64 // complete files (written under mu)
	hits, fillsDone, followers, fillErrors          atomic.Uint64
	evictions, discarded                            atomic.Uint64
	bypassTooLarge, bypassNoRoom, bypassUnavailable atomic.Uint64
}

// hooks inject faults in tests.
type hooks struct {
	write  func(p []byte) error // before each write to a fill's file
	create func() error         // before a fill's file is created
}

// entry is a complete file.
type entry struct {
	key     string // 64 hex
	size    int64
	elem    *list.Element
	touched time.Time // last mtime written (or read at the scan)

	// A file found by the scan at New is hashed once before it is first
	// served: verified says it was; verifying is non-nil while a
	// verification runs and closed when it ends.
	verified  bool
	verifying chan struct{}
}

// fill is one copy from a source into a temporary file.
type fill struct {
	key  string
	size int64

	mu      sync.Mutex
	path    string // the temporary file once created; the final file once renamed
	written int64  // bytes in the file, readable by followers
	done    bool
	err     error         // set with done when the fill failed
	wake    chan struct{} // closed (and replaced) on every change
}

// broadcast wakes the fill's readers. f.mu held.
func (f *fill) broadcast() {
	close(f.wake)
	f.wake = make(chan struct{})
}

// New returns a cache on opts.Dir. It creates the directory, indexes the
// complete files already there (a restart keeps the cache), and removes
// temporary files older than FillTimeout (leftovers of a crash; younger
// ones may be a live fill of another process). An unusable directory is
// not an error: the cache then bypasses (ErrUnavailable) and tries again
// after RetryInterval. New fails only on invalid options.
func New(opts Options) (*Cache, error) {
	if opts.Dir == "" {
		return nil, errors.New("disk cache: empty directory")
	}
	if opts.MaxBytes < 0 || opts.FillTimeout < 0 || opts.RetryInterval < 0 {
		return nil, errors.New("disk cache: negative option")
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("disk cache: %w", err)
	}
	c := &Cache{
		dir:         dir,
		tmp:         filepath.Join(dir, "tmp"),
		max:         opts.MaxBytes,
		fillTimeout: opts.FillTimeout,
		retry:       opts.RetryInterval,
		now:         opts.Now,
		warnf:       opts.Warn,
		entries:     make(map[string]*entry),
		fills:       make(map[string]*fill),
	}
	if c.max == 0 {
		c.max = DefaultMaxBytes
	}
	if c.fillTimeout == 0 {
		c.fillTimeout = DefaultFillTimeout
	}
	if c.retry == 0 {
		c.retry = DefaultRetryInterval
	}
	if c.now == nil {
		c.now = time.Now
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.mu.Lock()
	victims, err := c.prepareLocked()
	c.mu.Unlock()
	c.removeFiles(victims)
	if err != nil {
		c.warn("disk cache directory unusable; serving from the store", err)
	}
	return c, nil
}

func (c *Cache) warn(msg string, err error) {
	if c.warnf != nil {
		c.warnf(msg, err)
	}
}

// Close stops fills and verifications in progress (their readers get an
// error) and waits for them. Handles already returned stay readable.
// Get after Close answers ErrUnavailable.
func (c *Cache) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.cancel()
	c.wg.Wait()
	return nil
}

// Stats returns the counters.
func (c *Cache) Stats() Stats {
	c.mu.Lock()
	reserved := c.reserved
	c.mu.Unlock()
	return Stats{
		Bytes:             c.bytes.Load(),
		Files:             c.files.Load(),
		Reserved:          reserved,
		Hits:              c.hits.Load(),
		Fills:             c.fillsDone.Load(),
		Followers:         c.followers.Load(),
		FillErrors:        c.fillErrors.Load(),
		Evictions:         c.evictions.Load(),
		Discarded:         c.discarded.Load(),
		BypassTooLarge:    c.bypassTooLarge.Load(),
		BypassNoRoom:      c.bypassNoRoom.Load(),
		BypassUnavailable: c.bypassUnavailable.Load(),
	}
}

// unavailable wraps a disk fault so it matches ErrUnavailable (and still
// matches the fault itself, e.g. syscall.ENOSPC).
func unavailable(err error) error {
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

// prepareLocked makes the directory usable and indexes it once. It returns
// files to remove once c.mu is released.
func (c *Cache) prepareLocked() (victims []string, err error) {
	if err := os.MkdirAll(c.tmp, 0o750); err != nil {
		c.downLocked(err)
		return nil, c.downErr
	}
	if !c.scanned {
		victims, err = c.scanLocked()
		if err != nil {
			c.downLocked(err)
			return victims, c.downErr
		}
		c.scanned = true
	}
	c.ready, c.downErr = true, nil
	return victims, nil
}

// downLocked marks the directory unusable until now + RetryInterval.
func (c *Cache) downLocked(err error) {
	c.ready = false
	c.retryAt = c.now().Add(c.retry)
	if !errors.Is(err, ErrUnavailable) {
		err = unavailable(err)
	}
	c.downErr = err
}

// usableLocked reports whether fills may start, retrying an unusable
// directory once its interval passed.
func (c *Cache) usableLocked() ([]string, error) {
	if c.closed {
		return nil, fmt.Errorf("%w: closed", ErrUnavailable)
	}
	if c.ready {
		return nil, nil
	}
	if c.now().Before(c.retryAt) {
		return nil, c.downErr
	}
	return c.prepareLocked()
}

// scanLocked indexes the complete files in the directory, least recently
// used (oldest mtime) last, and lists stale temporary files and what is
// over budget for removal. Only names this package writes are touched:
// anything else in the directory is left alone.
func (c *Cache) scanLocked() (victims []string, err error) {
	tmps, err := os.ReadDir(c.tmp)
	if err != nil {
		return nil, err
	}
	stale := c.now().Add(-c.fillTimeout)
	for _, d := range tmps {
		if !d.Type().IsRegular() || !strings.HasPrefix(d.Name(), tmpPrefix) {
			continue
		}
		if fi, err := d.Info(); err == nil && fi.ModTime().Before(stale) {
			victims = append(victims, filepath.Join(c.tmp, d.Name()))
		}
	}
	shards, err := os.ReadDir(c.dir)
	if err != nil {
		return victims, err
	}
	type found struct {
		key   string
		size  int64
		mtime time.Time
	}
	var all []found
	for _, s := range shards {
		if !s.IsDir() || len(s.Name()) != 2 || !isHex(s.Name()) {
			continue
		}
		files, err := os.ReadDir(filepath.Join(c.dir, s.Name()))
		if err != nil {
			return victims, err
		}
		for _, d := range files {
			name := d.Name()
			if !d.Type().IsRegular() || len(name) != 64 || !isHex(name) || name[:2] != s.Name() {
				continue
			}
			fi, err := d.Info()
			if err != nil {
				continue // removed meanwhile
			}
			all = append(all, found{name, fi.Size(), fi.ModTime()})
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].mtime.Before(all[j].mtime) })
	for _, f := range all {
		if e := c.entries[f.key]; e != nil { // a rescan after the directory came back
			continue
		}
		e := &entry{key: f.key, size: f.size, touched: f.mtime}
		e.elem = c.lru.PushFront(e)
		c.entries[f.key] = e
		c.bytes.Add(f.size)
		c.files.Add(1)
	}
	for c.bytes.Load() > c.max { // the budget shrank since the last run
		e := c.lru.Back().Value.(*entry)
		victims = append(victims, c.dropLocked(e))
		c.evictions.Add(1)
	}
	return victims, nil
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// parseID returns the hex digest of "sha256:<64 lowercase hex>".
func parseID(id string) (string, bool) {
	if len(id) != 71 || id[:7] != "sha256:" || !isHex(id[7:]) {
		return "", false
	}
	return id[7:], true
}

func (c *Cache) path(key string) string { return filepath.Join(c.dir, key[:2], key) }

// dropLocked removes e from the index and returns its path for removal.
func (c *Cache) dropLocked(e *entry) string {
	c.lru.Remove(e.elem)
	delete(c.entries, e.key)
	c.bytes.Add(-e.size)
	c.files.Add(-1)
	return c.path(e.key)
}

// removeFiles unlinks files dropped from the index. Open readers keep
// reading them. Called without c.mu: a fill that commits the same name
// in between is lost from the disk, not served wrong (its Get finds the
// file missing and fills again).
func (c *Cache) removeFiles(paths []string) {
	for _, p := range paths {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			c.warn("disk cache: cannot remove a file", err)
		}
	}
}

// Get returns a handle on the bytes of segmentID, which are size bytes
// long (the record's byteLength). A complete file is served at once (Hit).
// Otherwise the first caller starts one fill from src and every caller
// during it attaches to it; Get returns once the fill's first byte is on
// disk (or the fill ended), so its handle reads as the fill progresses.
//
// On any error the caller serves from the store. Errors matching
// ErrTooLarge, ErrNoRoom or ErrUnavailable are the cache declining
// (counted); others are the fill's failure before its first byte (the
// source's error, wrapped) or ctx's.
func (c *Cache) Get(ctx context.Context, segmentID string, size int64, src Source) (*Handle, error) {
	key, ok := parseID(segmentID)
	if !ok {
		return nil, errors.New("disk cache: invalid segment id")
	}
	if size < 0 {
		return nil, errors.New("disk cache: negative size")
	}
	for range maxAttempts {
		h, again, err := c.get(ctx, key, size, src)
		if !again {
			c.countBypass(err)
			return h, err
		}
	}
	err := fmt.Errorf("%w: the entry kept changing", ErrUnavailable)
	c.countBypass(err)
	return nil, err
}

func (c *Cache) countBypass(err error) {
	switch {
	case err == nil:
	case errors.Is(err, ErrTooLarge):
		c.bypassTooLarge.Add(1)
	case errors.Is(err, ErrNoRoom):
		c.bypassNoRoom.Add(1)
	case errors.Is(err, ErrUnavailable):
		c.bypassUnavailable.Add(1)
	}
}

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
			c.lru.MoveToFront(e.elem)
			now := c.now()
			touch := now.Sub(e.touched) >= touchInterval
			if touch {
				e.touched = now
			}
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
		return c.attach(ctx, f)
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

// openComplete opens a complete file for one reader and checks its size.
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
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() || fi.Size() != e.size {
		f.Close()
		c.forget(e, true)
		if err == nil {
			err = fmt.Errorf("%w: file is %d bytes, record %d", ErrSizeMismatch, fi.Size(), e.size)
		}
		c.warn("disk cache: discarded a file of the wrong size", err)
		return nil, true, nil
	}
	if touch {
		_ = os.Chtimes(p, now, now) // recency for the next restart; best effort
	}
	c.hits.Add(1)
	return &Handle{file: f, size: e.size, hit: true}, false, nil
}

// forget drops e if it is still indexed, removing its file if remove.
func (c *Cache) forget(e *entry, remove bool) {
	c.mu.Lock()
	var p string
	if c.entries[e.key] == e {
		p = c.dropLocked(e)
		if remove {
			c.discarded.Add(1)
		}
	}
	c.mu.Unlock()
	if remove && p != "" {
		c.removeFiles([]string{p})
	}
}

// verify hashes a file indexed by the scan before its first use.
func (c *Cache) verify(e *entry, done chan struct{}) {
	defer c.wg.Done()
	err := c.hashFile(c.path(e.key), e.key, e.size)
	var p string
	c.mu.Lock()
	if c.ctx.Err() != nil {
		err = nil // closed mid-way: the file is not known bad, keep it unverified
	} else if c.entries[e.key] == e {
		if err == nil {
			e.verified = true
		} else {
			p = c.dropLocked(e)
			c.discarded.Add(1)
		}
	}
	e.verifying = nil
	close(done)
	c.mu.Unlock()
	if p != "" {
		c.removeFiles([]string{p})
		c.warn("disk cache: discarded a file that failed verification", err)
	}
}

func (c *Cache) hashFile(path, key string, size int64) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	buf := make([]byte, copyBufSize)
	var n int64
	for {
		if err := c.ctx.Err(); err != nil {
			return err
		}
		m, err := f.Read(buf)
		h.Write(buf[:m])
		n += int64(m)
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
	}
	if n != size {
		return fmt.Errorf("%w: file is %d bytes, record %d", ErrSizeMismatch, n, size)
	}
	if !sumMatches(h, key) {
		return ErrHashMismatch
	}
	return nil
}

func sumMatches(h hash.Hash, key string) bool {
	want, err := hex.DecodeString(key)
	return err == nil && bytes.Equal(h.Sum(nil), want)
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
	done := f.done
	f.mu.Unlock()
	if err != nil {
		if done && errors.Is(err, fs.ErrNotExist) { // committed, then evicted
			return nil, true, nil
		}
		return nil, false, unavailable(err)
	}
	if done { // committed: a complete file
		return &Handle{file: fd, size: f.size}, false, nil
	}
	return &Handle{file: fd, size: f.size, fill: f}, false, nil
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
		c.fail(f, unavailable(err), true)
		return
	}
	tmp := tf.Name()
	f.mu.Lock()
	f.path = tmp
	f.mu.Unlock()

	w := &fillWriter{c: c, f: f, file: tf, h: sha256.New()}
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
	case !sumMatches(w.h, f.key):
		err = ErrHashMismatch
	}
	disk := w.diskErr != nil
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
		now := c.now()
		_ = os.Chtimes(tmp, now, now) // the recency a restart reads
		f.mu.Lock()
		if rerr := os.Rename(tmp, final); rerr != nil {
			err, disk = unavailable(rerr), true
		} else {
			f.path = final
		}
		f.mu.Unlock()
	}
	if err != nil {
		c.fail(f, err, disk)
		return
	}
	c.commit(f)
}

// commit indexes a renamed fill and ends it.
func (c *Cache) commit(f *fill) {
	c.mu.Lock()
	delete(c.fills, f.key)
	c.reserved -= f.size
	if old := c.entries[f.key]; old != nil { // not expected: Get fills only a missing key
		c.dropLocked(old)
	}
	e := &entry{key: f.key, size: f.size, touched: c.now(), verified: true}
	e.elem = c.lru.PushFront(e)
	c.entries[f.key] = e
	c.bytes.Add(f.size)
	c.files.Add(1)
	c.fillsDone.Add(1) // counted before anyone can see the end
	f.mu.Lock()
	f.done = true
	f.broadcast()
	f.mu.Unlock()
	c.mu.Unlock()
}

// fail ends f with err; disk says the directory failed (not the source).
func (c *Cache) fail(f *fill, err error, disk bool) {
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
	f.done, f.err = true, err
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
	c       *Cache
	f       *fill
	file    *os.File
	h       hash.Hash
	n       int64
	long    bool
	diskErr error
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
		n, err = w.file.Write(p)
	}
	w.h.Write(p[:n])
	w.n += int64(n)
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

// Handle is one reader's access to a cached segment: a complete file, or
// a fill in progress. It holds a file descriptor until Close. Not safe for
// concurrent use; one Reader at a time.
type Handle struct {
	file *os.File
	size int64
	fill *fill // nil for a complete file
	hit  bool
}

// Size is the segment's length in bytes.
func (h *Handle) Size() int64 { return h.size }

// Hit reports whether Get found the segment complete on disk (no fill
// started or joined).
func (h *Handle) Hit() bool { return h.hit }

// File returns the complete, verified file (positioned anywhere), or nil
// while the handle reads a fill in progress. For http.ServeContent.
func (h *Handle) File() *os.File {
	if h.fill != nil {
		return nil
	}
	return h.file
}

// Reader returns the bytes [off, off+n) (n < 0: to the end).
//
// For a complete file it is an *io.LimitedReader over the handle's
// *os.File positioned at off: io.Copy to an http.ResponseWriter then
// reaches (*net.TCPConn).ReadFrom, whose sendfile path accepts exactly
// that type, so the bytes go from the page cache to the socket without a
// copy through user space.
//
// During a fill it reads bytes as they land and blocks for more (until ctx
// is done). It returns the range's last byte, and io.EOF, only after the
// whole fill hashed to the segment id, so a failed fill or a mismatch
// reaches the reader as an error before its last byte: the caller must
// then abort the response, never end it cleanly.
func (h *Handle) Reader(ctx context.Context, off, n int64) (io.Reader, error) {
	if off < 0 || off > h.size {
		return nil, fmt.Errorf("disk cache: offset %d outside 0..%d", off, h.size)
	}
	if n < 0 || n > h.size-off {
		n = h.size - off
	}
	if h.fill == nil {
		if _, err := h.file.Seek(off, io.SeekStart); err != nil {
			return nil, err
		}
		return &io.LimitedReader{R: h.file, N: n}, nil
	}
	return &fillReader{h: h, ctx: ctx, pos: off, end: off + n}, nil
}

// avail is how many bytes r may return now. f.mu held. The last byte of
// the range is held back until the fill is verified: a client that got
// every byte it was promised sees a complete response, so the bytes of a
// fill that then fails must stop short of the end.
func (r *fillReader) avail(f *fill) int64 {
	lim := min(f.written, r.end)
	if !f.done && lim == r.end {
		lim--
	}
	return lim - r.pos
}

// Close releases the handle's file descriptor.
func (h *Handle) Close() error { return h.file.Close() }

// fillReader reads a fill in progress through its handle's descriptor.
type fillReader struct {
	h        *Handle
	ctx      context.Context
	pos, end int64
}

func (r *fillReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	f := r.h.fill
	for {
		f.mu.Lock()
		if f.err != nil {
			err := f.err
			f.mu.Unlock()
			return 0, err
		}
		if r.pos >= r.end {
			if f.done {
				f.mu.Unlock()
				return 0, io.EOF
			}
		} else if avail := r.avail(f); avail > 0 {
			f.mu.Unlock()
			if int64(len(p)) > avail {
				p = p[:avail]
			}
			m, err := r.h.file.ReadAt(p, r.pos)
			r.pos += int64(m)
			if m > 0 {
				return m, nil
			}
			if err == nil || err == io.EOF {
				err = io.ErrUnexpectedEOF // written bytes must be there
			}
			return 0, unavailable(err)
		}
		ch := f.wake
		f.mu.Unlock()
		select {
		case <-ch:
		case <-r.ctx.Done():
			return 0, r.ctx.Err()
		}
	}
}

// Interface guards
var (
	_ io.Writer = (*fillWriter)(nil)
	_ io.Reader = (*fillReader)(nil)
)
