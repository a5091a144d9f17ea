package disk

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// Ownership: the cache works only in a directory it marks as its own, so
// that a mistyped `disk` path never costs anyone a file.
//
// A directory is the cache's when it holds the marker file (MarkerName).
// The cache writes the marker when it creates the directory, when it
// finds it empty, and when every entry in it is one the cache itself
// writes (the layout of earlier versions, which had no marker: tmp/ with
// fill-* files, <2 hex>/ with <64 hex>[+gzip|+zstd] files), plus a
// lost+found directory (the root of a volume made for the cache). Any
// other directory is refused (ErrForeignDir) and nothing in it is
// touched. System directories (SystemDir) are refused even when empty.
//
// Inside its directory the cache creates, renames and removes only those
// names; any other file there is left alone.

// MarkerName is the file that marks a directory as the disk tier's.
const MarkerName = ".syncular-disk-tier"

// markerText is the marker's content; markerMagic its first line, which
// the cache checks.
const (
	markerMagic = "caddy-syncular disk tier"
	markerText  = markerMagic + "\n" +
		"format 1\n" +
		"This directory holds verified segment files written by the caddy-syncular\n" +
		"disk tier, which creates and removes files here. Put nothing else here.\n"
)

// ErrForeignDir: the directory is not empty and not marked as the disk
// tier's (or is a system directory). The cache writes nothing there.
var ErrForeignDir = errors.New("disk cache: not a directory of the disk tier")

// systemDirs are refused as the cache's directory whatever they hold:
// removing a file there would be someone else's loss, and an empty one
// (/mnt, /srv) is still shared.
var systemDirs = []string{
	"/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64",
	"/libx32", "/media", "/mnt", "/opt", "/proc", "/root", "/run", "/sbin",
	"/srv", "/sys", "/tmp", "/usr", "/usr/bin", "/usr/lib", "/usr/local",
	"/usr/local/bin", "/usr/sbin", "/usr/share", "/var", "/var/cache",
	"/var/lib", "/var/log", "/var/mail", "/var/run", "/var/spool", "/var/tmp",
	"/var/www",
	// macOS
	"/Applications", "/Library", "/System", "/Users", "/Volumes", "/private",
	"/private/etc", "/private/tmp", "/private/var",
}

// SystemDir reports whether dir is a system directory the cache refuses
// (extra adds more, such as the server's own data directory): the root,
// the top-level system directories, /tmp and the temporary directory,
// the user's home directory. dir is compared cleaned and, when it exists,
// with its symbolic links resolved.
func SystemDir(dir string, extra ...string) bool {
	refused := append([]string(nil), systemDirs...)
	refused = append(refused, os.TempDir())
	if home, err := os.UserHomeDir(); err == nil && home != "" {
		refused = append(refused, home)
	}
	refused = append(refused, extra...)
	for _, cand := range pathForms(dir) {
		for _, r := range refused {
			for _, rr := range pathForms(r) {
				if cand == rr {
					return true
				}
			}
		}
	}
	return false
}

// pathForms is p absolute and cleaned, and with symbolic links resolved
// when that differs.
func pathForms(p string) []string {
	if p == "" {
		return nil
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		return nil
	}
	forms := []string{abs}
	if real, err := filepath.EvalSymlinks(abs); err == nil && real != abs {
		forms = append(forms, real)
	}
	return forms
}

// claim makes c.dir the cache's: creates it (marked) when missing, checks
// the marker, or adopts an empty directory or one that holds only the
// cache's own names. A directory it cannot read is an error that does not
// match ErrForeignDir (the cache retries later); one that holds anything
// else matches ErrForeignDir.
func (c *Cache) claim() error {
	fi, err := os.Stat(c.dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := os.MkdirAll(c.dir, 0o750); err != nil {
			return err
		}
		return writeMarker(c.dir)
	case err != nil:
		return err
	case !fi.IsDir():
		return &fs.PathError{Op: "open", Path: c.dir, Err: syscall.ENOTDIR}
	}
	if ok, err := hasMarker(c.dir); ok || err != nil {
		return err
	}
	entries, err := os.ReadDir(c.dir)
	if err != nil {
		return err
	}
	var foreign []string
	for _, d := range entries {
		if !c.ownEntry(d) {
			foreign = append(foreign, d.Name())
		}
	}
	if len(foreign) > 0 {
		return foreignError(c.dir, foreign)
	}
	return writeMarker(c.dir)
}

// foreignError names a few of the entries that are not the cache's.
func foreignError(dir string, foreign []string) error {
	const show = 3
	names := make([]string, 0, show)
	for _, n := range foreign[:min(len(foreign), show)] {
		names = append(names, fmt.Sprintf("%q", n))
	}
	more := ""
	if len(foreign) > show {
		more = fmt.Sprintf(" and %d more", len(foreign)-show)
	}
	return fmt.Errorf("%w: %s is not empty and has no %s marker (it holds %s%s); "+
		"give the disk tier an empty directory of its own (it creates a missing one)",
		ErrForeignDir, dir, MarkerName, strings.Join(names, ", "), more)
}

// ownEntry reports whether a top-level entry of an unmarked directory is
// one the cache writes (checked to its files), or lost+found.
func (c *Cache) ownEntry(d fs.DirEntry) bool {
	name := d.Name()
	switch {
	case name == MarkerName && d.Type().IsRegular():
		// A marker cut short (a crash while writing it) is rewritten.
		b, err := os.ReadFile(filepath.Join(c.dir, name))
		return err == nil && strings.HasPrefix(markerText, string(b))
	case !d.IsDir():
		return false
	case name == "lost+found":
		return true
	case name == "tmp":
		return onlyFiles(filepath.Join(c.dir, name), func(n string) bool {
			return strings.HasPrefix(n, tmpPrefix)
		})
	case len(name) == 2 && isHex(name):
		return onlyFiles(filepath.Join(c.dir, name), func(n string) bool {
			return (len(n) == 64 && isHex(n) || variantFileKey(n)) && n[:2] == name
		})
	}
	return false
}

// onlyFiles reports whether dir holds only regular files whose names
// pass ok.
func onlyFiles(dir string, ok func(string) bool) bool {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, d := range entries {
		if !d.Type().IsRegular() || !ok(d.Name()) {
			return false
		}
	}
	return true
}

// hasMarker reports whether dir holds the cache's marker.
func hasMarker(dir string) (bool, error) {
	p := filepath.Join(dir, MarkerName)
	fi, err := os.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if !fi.Mode().IsRegular() {
		return false, nil
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return false, err
	}
	return bytes.HasPrefix(b, []byte(markerMagic+"\n")), nil
}

// writeMarker marks dir as the cache's. A marker another process wrote
// first is as good; one cut short is completed.
func writeMarker(dir string) error {
	p := filepath.Join(dir, MarkerName)
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o640)
	if errors.Is(err, fs.ErrExist) {
		if ok, err := hasMarker(dir); ok || err != nil {
			return err
		}
		b, rerr := os.ReadFile(p)
		if rerr != nil {
			return rerr
		}
		if !strings.HasPrefix(markerText, string(b)) {
			return fmt.Errorf("%w: %s holds a %s that is not the disk tier's", ErrForeignDir, dir, MarkerName)
		}
		f, err = os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0o640)
	}
	if err != nil {
		return err
	}
	_, err = f.WriteString(markerText)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(f.Name()) // ours: created just now
	}
	return err
}
