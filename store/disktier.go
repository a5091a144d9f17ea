package store

import "github.com/syncular/caddy-syncular/store/disk"

// The disk tier (package store/disk) as a Cached uses it
// (CacheOptions.Disk), under this package's names so that a caller needs
// no other import: segments too large for the memory tier are filled once
// into a directory of the tier's own, verified, and served from their
// files. The tier's bodies reach callers as Bodies, whose errors match
// ErrCorruptSegment when bytes do not match their id, so a caller never
// needs the tier's own errors.

// DiskTier is a disk tier; several Cached may share one (the caller owns
// it and closes it).
type DiskTier = disk.Cache

// DiskOptions configures NewDiskTier.
type DiskOptions = disk.Options

// DiskStats are a disk tier's counters (DiskTier.Stats).
type DiskStats = disk.Stats

// DefaultDiskMaxBytes is a disk tier's budget when none is given.
const DefaultDiskMaxBytes = disk.DefaultMaxBytes

// NewDiskTier opens (or creates) the disk tier in opts.Dir.
func NewDiskTier(opts DiskOptions) (*DiskTier, error) { return disk.New(opts) }

// DiskSystemDir reports whether dir is a system directory a disk tier
// refuses (extra adds more, such as the server's own data directory): the
// tier removes files in its directory.
func DiskSystemDir(dir string, extra ...string) bool { return disk.SystemDir(dir, extra...) }

// CheckDiskDir reports, creating nothing, whether a disk tier could use
// dir (disk.Check): used where opening it would leave files behind, such
// as `caddy validate`.
func CheckDiskDir(dir string) error { return disk.Check(dir) }

// ErrDiskForeignDir matches the errors of a directory that is not the
// disk tier's own (not empty and unmarked, or a system directory).
var ErrDiskForeignDir = disk.ErrForeignDir
