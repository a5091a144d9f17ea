package disk

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// Check reports, creating and changing nothing, whether New could use
// dir: a system directory or a directory that is not the tier's fails
// with ErrForeignDir (as New does); a directory that cannot be created
// (its nearest existing ancestor is not a writable directory) or is not
// writable fails with an error naming the path and the reason. Caddy's
// `validate` provisions every module, so the disk tier checks its
// directory with Check there instead of opening it, which would create
// the directory and its marker.
//
// Writability is asked of the kernel (access(2) with W_OK|X_OK), so it
// holds for the user the process runs as: root passes a 0500 directory
// but not one on a read-only file system.
func Check(dir string) error {
	if dir == "" {
		return errors.New("disk cache: empty directory")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("disk cache: %w", err)
	}
	if SystemDir(abs) {
		return fmt.Errorf("%w: %s is a system directory; give the disk tier a directory of its own", ErrForeignDir, abs)
	}
	fi, err := os.Stat(abs)
	switch {
	case errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR):
		return checkCreatable(abs)
	case err != nil:
		return fmt.Errorf("%s cannot be read: %w", abs, err)
	case !fi.IsDir():
		return fmt.Errorf("%s is not a directory", abs)
	}
	if ok, err := hasMarker(abs); err != nil {
		return fmt.Errorf("%s cannot be read: %w", abs, err)
	} else if !ok {
		entries, err := os.ReadDir(abs)
		if err != nil {
			return fmt.Errorf("%s cannot be read: %w", abs, err)
		}
		c := &Cache{dir: abs}
		var foreign []string
		for _, d := range entries {
			if !c.ownEntry(d) {
				foreign = append(foreign, d.Name())
			}
		}
		if len(foreign) > 0 {
			return foreignError(abs, foreign)
		}
	}
	for _, p := range []string{abs, filepath.Join(abs, "tmp")} {
		if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err := writable(p); err != nil {
			return fmt.Errorf("%s is not writable by this process (uid %d): %w", p, os.Getuid(), err)
		}
	}
	return nil
}

// checkCreatable checks that the missing directory abs could be created:
// its nearest existing ancestor is a directory this process may write.
func checkCreatable(abs string) error {
	for p := filepath.Dir(abs); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
			if p == filepath.Dir(p) {
				return fmt.Errorf("%s cannot be created: no ancestor exists", abs)
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("%s cannot be created: %w", abs, err)
		}
		if !fi.IsDir() {
			return fmt.Errorf("%s cannot be created: %s is a file, not a directory", abs, p)
		}
		if err := writable(p); err != nil {
			return fmt.Errorf("%s cannot be created: %s is not writable by this process (uid %d): %w", abs, p, os.Getuid(), err)
		}
		return nil
	}
}
