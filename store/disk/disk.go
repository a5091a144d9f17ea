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
// the caller streams from the store directly; a fill that fails on the
// disk mid-way hands its readers over to a verified stream from the store
// (handoff.go). A complete file is served only while its size, inode and
// modification time are those it had when verified (stamp.go), and the
// cache works only in a directory it marks as its own (owner.go).
//
// A caller serves a segment like this:
//
//	h, err := c.Get(ctx, id, rec.ByteLength, src)
//	if err != nil {
//		// stream from the store directly (bounded memory)
//	}
//	defer h.Close()
//	h.SetReopen(openStoreAt) // how readers go on if the disk fails mid-fill
//	r, err := h.Reader(ctx, off, n)
//	// write the headers, then
//	written, err := io.Copy(w, r) // sendfile for a complete file
//	if err != nil {
//		// never end the response cleanly: abort it (http.ErrAbortHandler)
//	}
//
// Files are unlinked while readers may hold them open, which POSIX
// systems allow; the package is meant for Linux and other Unix systems.
//
// The package knows nothing of Caddy or of the stores; it logs nothing
// (Options.Warn receives the faults worth a log line).
package disk

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/syncular/caddy-syncular/segid"
)

// Defaults of Options.
const (
	// DefaultMaxBytes is the budget when Options.MaxBytes is 0: room for
	// about eighty 48 MiB segments, small beside a typical volume and
	// large beside the 64 MiB memory cache. Set it below the free space
	// of the volume: a fill that meets a full disk is abandoned (its
	// readers go on from the store) and the directory bypassed for
	// RetryInterval.
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
	dropPrefix  = tmpPrefix + "drop-" // dropped files awaiting unlink (dropLocked)
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
	// creatable, read-only, full, an I/O error, not the cache's) or the
	// cache is closed. A reader's error matching it means the disk failed
	// during the fill and the handle had no Reopen (or could not read
	// back what the fill wrote).
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
	// (the segment id's digest), fills in progress under <Dir>/tmp, and
	// the marker MarkerName. It is created if missing; an existing one
	// must be empty, marked, or hold only this package's files (owner.go).
	// Give each Cache its own directory, and share one Cache across
	// configuration reloads: two caches on one directory each keep their
	// own budget and index.
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
	MaxBytes int64 // the budget (Options.MaxBytes, or its default)
	// Usable reports whether the directory was usable at the last
	// check: false after it proved unusable (or the disk full) until a
	// retry finds it usable again, and after Close.
	Usable bool

	FillsInFlight int64 // fills running now
	Following     int64 // handles of followers not closed yet (Handle.Followed)

	Hits              uint64 // Gets served from a complete file
	Fills             uint64 // fills committed (verified and renamed into place)
	Followers         uint64 // Gets that attached to a fill already running
	FillErrors        uint64 // fills that failed (source, size, hash, disk)
	Handoffs          uint64 // readers of a fill that failed on the disk that continued from the store
	Evictions         uint64 // complete files removed for room
	Discarded         uint64 // files removed: wrong size or hash, or changed since verified
	BypassTooLarge    uint64 // Gets answered ErrTooLarge
	BypassNoRoom      uint64 // Gets answered ErrNoRoom
	BypassUnavailable uint64 // Gets answered ErrUnavailable

	// Variants (variants.go): built, verified and kept; rejected by
	// verification (at build or after a restart); stopped for not
	// shrinking by 10%.
	VariantsMade, VariantsRejected, VariantsIncompressible uint64
	// Growing variants (grow.go): builds that followed a fill, ended
	// (kept, dropped or failed); handles given to their followers.
	VariantsGrown, VariantFollowers uint64
}

// Cache is the disk tier. Safe for concurrent use.
type Cache struct {
	dir, tmp    string
	max         int64
	fillTimeout time.Duration
	retry       time.Duration
	now         func() time.Time
	warnf       func(string, error)
	hooks       hooks         // test fault injection (export_test.go); zero in production
	dropSeq     atomic.Uint64 // names of files moved aside (dropLocked)

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
	following                                       atomic.Int64 // open handles of followers (Handle.Followed)
	evictions, discarded, handoffs                  atomic.Uint64
	bypassTooLarge, bypassNoRoom, bypassUnavailable atomic.Uint64

	vs                                                     *variantLedger // variants.go; under mu
	variantsMade, variantsRejected, variantsIncompressible atomic.Uint64
	variantsGrown, variantFollowers                        atomic.Uint64
}

// hooks inject faults in tests.
type hooks struct {
	write   func(p []byte) error   // before each write to a fill's file
	create  func() error           // before a fill's file is created
	variant func(f *os.File) error // after a variant is encoded, before it is verified
	grow    func(p []byte) []byte  // what a growing variant writes instead of p
	remove  func(p string)         // before a dropped file is unlinked
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

	// stamp is the file as it was verified (stamp.go); a hit serves it
	// only while it still matches. Set before verified; then under smu.
	smu   sync.Mutex
	stamp stamp
}

// fill is one copy from a source into a temporary file.
type fill struct {
	key  string
	want segid.Digest // the digest key names
	size int64
	// checked: the source checks its bytes against the id itself
	// (GetVerified), so the fill does not hash them.
	checked bool

	mu      sync.Mutex
	path    string // the temporary file once created; the final file once renamed
	written int64  // bytes in the file, readable by followers
	done    bool
	err     error         // set with done when the fill failed
	resume  *resumePoint  // set with err when the disk failed (handoff.go)
	stamp   stamp         // the committed file, set with done
	wake    chan struct{} // closed (and replaced) on every change
}

// broadcast wakes the fill's readers. f.mu held.
func (f *fill) broadcast() {
	close(f.wake)
	f.wake = make(chan struct{})
}

// New returns a cache on opts.Dir. It creates the directory (or adopts
// an empty one, or one laid out by an earlier version of this package)
// and marks it as its own (owner.go), indexes the complete files already
// there (a restart keeps the cache), and removes temporary files older
// than FillTimeout (leftovers of a crash; younger ones may be a live fill
// of another process). An unusable directory is not an error: the cache
// then bypasses (ErrUnavailable) and tries again after RetryInterval. New
// fails on invalid options and, with an error matching ErrForeignDir, on
// a system directory or a directory that holds files that are not the
// cache's and no marker: it writes nothing there.
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
	if SystemDir(dir) {
		return nil, fmt.Errorf("%w: %s is a system directory; give the disk tier a directory of its own", ErrForeignDir, dir)
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.mu.Lock()
	victims, err := c.prepareLocked()
	c.mu.Unlock()
	c.removeFiles(victims)
	if errors.Is(err, ErrForeignDir) {
		c.cancel()
		return nil, err
	}
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
	reserved, filling, usable := c.reserved, len(c.fills), c.ready && !c.closed
	c.mu.Unlock()
	return Stats{
		Bytes:             c.bytes.Load(),
		Files:             c.files.Load(),
		Reserved:          reserved,
		MaxBytes:          c.max,
		Usable:            usable,
		FillsInFlight:     int64(filling),
		Following:         c.following.Load(),
		Hits:              c.hits.Load(),
		Fills:             c.fillsDone.Load(),
		Followers:         c.followers.Load(),
		FillErrors:        c.fillErrors.Load(),
		Handoffs:          c.handoffs.Load(),
		Evictions:         c.evictions.Load(),
		Discarded:         c.discarded.Load(),
		BypassTooLarge:    c.bypassTooLarge.Load(),
		BypassNoRoom:      c.bypassNoRoom.Load(),
		BypassUnavailable: c.bypassUnavailable.Load(),

		VariantsMade:           c.variantsMade.Load(),
		VariantsRejected:       c.variantsRejected.Load(),
		VariantsIncompressible: c.variantsIncompressible.Load(),
		VariantsGrown:          c.variantsGrown.Load(),
		VariantFollowers:       c.variantFollowers.Load(),
	}
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
