package disk

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// The index: what is on disk, the budget, scans after a restart and
// re-hashes before first use.

// unavailable wraps a disk fault so it matches ErrUnavailable (and still
// matches the fault itself, e.g. syscall.ENOSPC).
func unavailable(err error) error {
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

// prepareLocked makes the directory usable (and the cache's: owner.go)
// and indexes it once. It returns files to remove once c.mu is released.
func (c *Cache) prepareLocked() (victims []string, err error) {
	if err := c.claim(); err != nil { // owner.go
		c.downLocked(err)
		return nil, c.downErr
	}
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

// scanLocked indexes the complete files in the directory (variants
// included, unverified until first use: variants.go), least recently
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
		if strings.HasPrefix(d.Name(), dropPrefix) { // dropped before a crash
			victims = append(victims, filepath.Join(c.tmp, d.Name()))
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
			if !d.Type().IsRegular() || (len(name) != 64 || !isHex(name)) && !variantFileKey(name) || name[:2] != s.Name() {
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

func (c *Cache) path(key string) string { return filepath.Join(c.dir, key[:2], key) }

// unindexLocked removes e from the index, leaving its file alone (the
// caller has just renamed a new file over it).
func (c *Cache) unindexLocked(e *entry) {
	c.lru.Remove(e.elem)
	delete(c.entries, e.key)
	c.bytes.Add(-e.size)
	c.files.Add(-1)
}

// dropLocked removes e from the index and moves its file aside, to a
// name in tmp/ that removeFiles unlinks later without c.mu (unlinking a
// large file takes a while). The move is made under c.mu so that it
// always comes before the rename of a new file for the same key: a fill
// or a variant build of that key can start only once the entry is gone.
// Removing by the old name after the lock is released would race with
// that rename and could unlink the new file. A file already missing
// returns "". If the move fails otherwise, the old name is returned and
// removed later (what the directory allowed).
func (c *Cache) dropLocked(e *entry) string {
	c.unindexLocked(e)
	p := c.path(e.key)
	aside := filepath.Join(c.tmp, fmt.Sprintf("%s%d", dropPrefix, c.dropSeq.Add(1)))
	switch err := os.Rename(p, aside); {
	case err == nil:
		return aside
	case errors.Is(err, fs.ErrNotExist):
		return ""
	default:
		return p
	}
}

// removeFiles unlinks files dropped from the index (moved aside by
// dropLocked) and stale temporary files. Open readers keep reading them.
func (c *Cache) removeFiles(paths []string) {
	for _, p := range paths {
		if p == "" {
			continue
		}
		if c.hooks.remove != nil {
			c.hooks.remove(p)
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			c.warn("disk cache: cannot remove a file", err)
		}
	}
}
