//go:build linux

package disk_test

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"unsafe"

	"github.com/syncular/caddy-syncular/compress"
	"github.com/syncular/caddy-syncular/store/disk"
)

// folioPages is the size, in 4 KiB pages, of each page cache folio of
// the file at path, in file order (the file's pages are faulted in
// through a read-only mapping; /proc/kpageflags tells heads from tails).
// ok is false when this process cannot read page frame numbers (no
// CAP_SYS_ADMIN) or the pages are not 4 KiB.
func folioPages(t *testing.T, path string) (folios []int, ok bool) {
	t.Helper()
	if os.Getpagesize() != 4096 {
		return nil, false
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	m, err := syscall.Mmap(int(f.Fd()), 0, int(fi.Size()), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(m)
	pagemap, err := os.Open("/proc/self/pagemap")
	if err != nil {
		return nil, false
	}
	defer pagemap.Close()
	kflags, err := os.Open("/proc/kpageflags")
	if err != nil {
		return nil, false
	}
	defer kflags.Close()
	const tail = 1 << 16 // KPF_COMPOUND_TAIL: a page inside a folio, not its first
	base := uintptr(unsafe.Pointer(&m[0]))
	var b [8]byte
	for off := 0; off < len(m); off += 4096 {
		touched += m[off] // fault the page in
		if _, err := pagemap.ReadAt(b[:], int64((base+uintptr(off))/4096*8)); err != nil {
			return nil, false
		}
		pfn := binary.LittleEndian.Uint64(b[:]) & (1<<55 - 1)
		if pfn == 0 {
			return nil, false // not privileged: frame numbers read as zero
		}
		if _, err := kflags.ReadAt(b[:], int64(pfn*8)); err != nil {
			return nil, false
		}
		fl := binary.LittleEndian.Uint64(b[:])
		if fl&tail != 0 && len(folios) > 0 {
			folios[len(folios)-1]++
			continue
		}
		folios = append(folios, 1)
	}
	return folios, true
}

var touched byte

// A fill that gets its bytes in 32 KiB writes leaves the segment's file
// in the page cache in 2 MiB folios, as a file written in one piece is
// (the cheaper pages for sendfile: prefill.go). The control is a file of the
// same size written in one write: when it does not get large folios
// either (a file system without them) or frame numbers cannot be read,
// the test skips.
func TestFillLeavesLargeFolios(t *testing.T) {
	dir := t.TempDir()
	s := newSegment(8<<20, 12)
	control := filepath.Join(dir, "control")
	if err := os.WriteFile(control, s.b, 0o600); err != nil {
		t.Fatal(err)
	}
	cf, ok := folioPages(t, control)
	if !ok {
		t.Skip("page frame numbers are not readable here (needs CAP_SYS_ADMIN)")
	}
	if len(cf) > 8 {
		t.Skipf("a file written in one write is in %d folios here: no large folios to compare with", len(cf))
	}
	c := newCache(t, disk.Options{Dir: filepath.Join(dir, "cache")})
	small := func(ctx context.Context, w io.Writer) error {
		for i := 0; i < len(s.b); i += 32 << 10 {
			if _, err := w.Write(s.b[i : i+32<<10]); err != nil {
				return err
			}
		}
		return nil
	}
	mustRead(t, get(t, c, s, small), s.b)
	folios, ok := folioPages(t, disk.PathForTest(c, s.key))
	if !ok {
		t.Fatal("frame numbers readable for the control but not for the fill's file")
	}
	if len(folios) > 2*len(cf) {
		t.Fatalf("the filled file is in %d folios (sizes in pages, first: %v), the control in %d", len(folios), folios[:min(len(folios), 8)], len(cf))
	}
	t.Logf("fill: %d folios, control: %d", len(folios), len(cf))
}

// A variant built after its segment's fill is in large folios too, and
// exactly its encoded size (the zeros ahead of it are cut).
func TestVariantLeavesLargeFolios(t *testing.T) {
	dir := t.TempDir()
	// Hex text of random bytes: zstd halves it, so the variant is
	// megabytes.
	raw := newSegment(4<<20, 13).b
	s := segmentOf([]byte(hex.EncodeToString(raw)))
	c := newCache(t, disk.Options{Dir: filepath.Join(dir, "cache")})
	got := readyVariant(t, c, s, compress.Zstd)
	path := disk.PathForTest(c, s.key+"+zstd")
	fi, err := os.Stat(path)
	if err != nil || fi.Size() != int64(len(got)) {
		t.Fatalf("variant file %v (%v), want %d bytes", fi, err, len(got))
	}
	control := filepath.Join(dir, "control")
	if err := os.WriteFile(control, got, 0o600); err != nil {
		t.Fatal(err)
	}
	cf, ok := folioPages(t, control)
	if !ok || len(cf) > 8 {
		t.Skip("no large folios to compare with here (or frame numbers not readable)")
	}
	folios, ok := folioPages(t, path)
	if !ok {
		t.Fatal("frame numbers readable for the control but not for the variant")
	}
	if len(folios) > 2*len(cf)+2 {
		t.Fatalf("the %d-byte variant is in %d folios (first sizes in pages: %v), the control in %d", len(got), len(folios), folios[:min(len(folios), 8)], len(cf))
	}
	t.Logf("variant of %d bytes: %d folios, control: %d", len(got), len(folios), len(cf))
}
