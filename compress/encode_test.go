package compress

import (
	"bytes"
	stdgzip "compress/gzip"
	"crypto/rand"
	"errors"
	"io"
	"runtime"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/syncular/caddy-syncular/internal/segdata"
)

var codingsUnderTest = []Coding{Gzip, Zstd}

// samples are small real segments: a rows segment and a SQLite image.
func samples(t testing.TB) map[string][]byte {
	t.Helper()
	img, err := segdata.SQLiteImage(t.TempDir(), 300)
	if err != nil {
		t.Fatal(err)
	}
	return map[string][]byte{
		"rows":   segdata.RowsSegment(300),
		"sqlite": img,
		"text":   []byte(strings.Repeat("SSG2 a short rows segment; ", 20)),
	}
}

func encodeBytes(t testing.TB, c Coding, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	n, err := Encode(c, &buf, bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(buf.Len()) {
		t.Fatalf("Encode reported %d bytes, wrote %d", n, buf.Len())
	}
	return buf.Bytes()
}

func TestRoundTrip(t *testing.T) {
	for name, b := range samples(t) {
		for _, c := range codingsUnderTest {
			t.Run(name+"/"+c.String(), func(t *testing.T) {
				enc := encodeBytes(t, c, b)
				if err := Verify(c, bytes.NewReader(enc), idOf(segmentID(b)), int64(len(b))); err != nil {
					t.Fatalf("Verify: %v", err)
				}
				if !Worthwhile(int64(len(b)), int64(len(enc))) {
					t.Errorf("%d -> %d bytes is not worthwhile", len(b), len(enc))
				}
				if got := decodeIndependently(t, c, enc); !bytes.Equal(got, b) {
					t.Error("decoded bytes differ")
				}
				if again := encodeBytes(t, c, b); !bytes.Equal(again, enc) {
					t.Error("encoding is not deterministic")
				}
				v, err := Variant(c, b, idOf(segmentID(b)))
				if err != nil {
					t.Fatalf("Variant: %v", err)
				}
				if !bytes.Equal(v, enc) {
					t.Error("Variant differs from Encode")
				}
			})
		}
	}
}

// decodeIndependently decodes as a client would: gzip with the standard
// library (not the package's own decoder), zstd with a default decoder.
func decodeIndependently(t testing.TB, c Coding, enc []byte) []byte {
	t.Helper()
	var r io.Reader
	switch c {
	case Gzip:
		zr, err := stdgzip.NewReader(bytes.NewReader(enc))
		if err != nil {
			return nil
		}
		r = zr
	case Zstd:
		zr, err := zstd.NewReader(bytes.NewReader(enc))
		if err != nil {
			return nil
		}
		defer zr.Close()
		r = zr
	}
	out, err := io.ReadAll(r)
	if err != nil {
		return nil
	}
	return out
}

func TestVerifyDetectsFlippedBytes(t *testing.T) {
	b := segdata.RowsSegment(100)
	id, size := segmentID(b), int64(len(b))
	for _, c := range codingsUnderTest {
		t.Run(c.String(), func(t *testing.T) {
			enc := encodeBytes(t, c, b)
			detected, tried := 0, 0
			step := max(1, len(enc)/200)
			for i := 0; i < len(enc); i += step {
				for _, mask := range []byte{0x01, 0x80} {
					bad := bytes.Clone(enc)
					bad[i] ^= mask
					tried++
					if err := Verify(c, bytes.NewReader(bad), idOf(id), size); err != nil {
						if !errors.Is(err, ErrMismatch) {
							t.Fatalf("flip at %d: error %v is not ErrMismatch", i, err)
						}
						detected++
						continue
					}
					// Accepted: only a harmless flip (a gzip header's time or
					// OS byte) may be, and then a client decodes the segment.
					if got := decodeIndependently(t, c, bad); !bytes.Equal(got, b) {
						t.Fatalf("flip %#x at %d of %d: Verify accepted a variant that decodes to other bytes", mask, i, len(enc))
					}
				}
			}
			// The last byte is checksum or length in both formats.
			bad := bytes.Clone(enc)
			bad[len(bad)-1] ^= 0x01
			if Verify(c, bytes.NewReader(bad), idOf(id), size) == nil {
				t.Error("a flipped last byte was accepted")
			}
			if detected < tried*9/10 {
				t.Errorf("only %d of %d flips detected", detected, tried)
			}
		})
	}
}

func TestVerifyDetectsTruncationAndExtension(t *testing.T) {
	b := segdata.RowsSegment(100)
	id, size := segmentID(b), int64(len(b))
	for _, c := range codingsUnderTest {
		t.Run(c.String(), func(t *testing.T) {
			enc := encodeBytes(t, c, b)
			step := max(1, len(enc)/300)
			for n := 0; n < len(enc); n += step {
				if err := Verify(c, bytes.NewReader(enc[:n]), idOf(id), size); !errors.Is(err, ErrMismatch) {
					t.Fatalf("truncated to %d of %d: %v", n, len(enc), err)
				}
			}
			if err := Verify(c, bytes.NewReader(enc[:len(enc)-1]), idOf(id), size); !errors.Is(err, ErrMismatch) {
				t.Fatalf("missing last byte: %v", err)
			}
			for name, tail := range map[string][]byte{
				"garbage":       []byte("garbage"),
				"zero byte":     {0},
				"second stream": encodeBytes(t, c, []byte("more")),
				"same stream":   enc,
			} {
				ext := append(bytes.Clone(enc), tail...)
				if err := Verify(c, bytes.NewReader(ext), idOf(id), size); !errors.Is(err, ErrMismatch) {
					t.Errorf("with %s appended: %v", name, err)
				}
			}
		})
	}
}

func TestVerifyWrongSegment(t *testing.T) {
	b := []byte(strings.Repeat("SSG2 segment one ", 100))
	other := []byte(strings.Repeat("SSG2 segment two ", 100))
	for _, c := range codingsUnderTest {
		enc := encodeBytes(t, c, b)
		cases := []struct {
			name string
			id   string
			size int64
			want error
		}{
			{"other id", segmentID(other), int64(len(b)), ErrMismatch},
			{"size too small", segmentID(b), int64(len(b)) - 1, ErrMismatch},
			{"size too large", segmentID(b), int64(len(b)) + 1, ErrMismatch},
			{"negative size", segmentID(b), -1, ErrMismatch},
			{"uppercase id", strings.ToUpper(segmentID(b)), int64(len(b)), ErrSegmentID},
			{"no prefix", segmentID(b)[7:], int64(len(b)), ErrSegmentID},
			{"short id", segmentID(b)[:70], int64(len(b)), ErrSegmentID},
			{"empty id", "", int64(len(b)), ErrSegmentID},
		}
		for _, tc := range cases {
			if err := Verify(c, bytes.NewReader(enc), idOf(tc.id), tc.size); !errors.Is(err, tc.want) {
				t.Errorf("%v %s: %v, want %v", c, tc.name, err, tc.want)
			}
		}
		if err := Verify(c, bytes.NewReader(enc), idOf(segmentID(b)), int64(len(b))); err != nil {
			t.Errorf("%v: the right id fails: %v", c, err)
		}
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// countReader counts the compressed bytes Verify consumes.
type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func TestVerifyStopsDecompressionBomb(t *testing.T) {
	// 64 concatenated streams (gzip members, zstd frames) of 1 MiB of
	// zeros each: 64 MiB decoded from some tens of KiB.
	const copies, each = 64, 1 << 20
	for _, c := range codingsUnderTest {
		t.Run(c.String(), func(t *testing.T) {
			var one bytes.Buffer
			if _, err := Encode(c, &one, io.LimitReader(zeros{}, each)); err != nil {
				t.Fatal(err)
			}
			bomb := bytes.Repeat(one.Bytes(), copies)
			claimed := []byte("SSG2 small")
			in := &countReader{r: bytes.NewReader(bomb)}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			err := Verify(c, in, idOf(segmentID(claimed)), int64(len(claimed)))
			runtime.ReadMemStats(&after)
			if !errors.Is(err, ErrMismatch) {
				t.Fatalf("Verify of a %d-byte bomb claimed as %d bytes: %v", copies*each, len(claimed), err)
			}
			// Decoding all of it would read every compressed byte; stopping
			// at size+1 reads a buffer or two.
			if in.n > int64(len(bomb))/4 {
				t.Errorf("Verify read %d of %d compressed bytes", in.n, len(bomb))
			}
			// Memory is bounded by the window (zstd) or less (gzip), not
			// by what the bomb would expand to.
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > ZstdWindow+4<<20 {
				t.Errorf("Verify allocated %d bytes for a %d-byte bomb", alloc, copies*each)
			}
			// The same bomb claimed at its real size and id verifies: the
			// bound is the claimed size, not a fixed cap.
			full := make([]byte, copies*each)
			if err := Verify(c, bytes.NewReader(bomb), idOf(segmentID(full)), int64(len(full))); err != nil {
				t.Errorf("the bomb at its true size: %v", err)
			}
		})
	}
}

// TestVerifyRejectsLargeZstdWindow: a frame needing more than the 8 MiB
// window a browser decodes is not a variant we may keep.
func TestVerifyRejectsLargeZstdWindow(t *testing.T) {
	b := bytes.Repeat(segdata.RowsSegment(100), 3)
	var buf bytes.Buffer
	w, err := zstd.NewWriter(&buf, zstd.WithWindowSize(64<<20))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := Verify(Zstd, bytes.NewReader(buf.Bytes()), idOf(segmentID(b)), int64(len(b))); !errors.Is(err, ErrMismatch) {
		t.Fatalf("a 64 MiB-window frame: %v", err)
	}
}

func TestIncompressibleFlagged(t *testing.T) {
	random := make([]byte, 256<<10)
	rand.Read(random)
	seg := append([]byte("SSG2"), random...)
	for _, c := range codingsUnderTest {
		t.Run(c.String(), func(t *testing.T) {
			if _, err := Variant(c, seg, idOf(segmentID(seg))); !errors.Is(err, ErrIncompressible) {
				t.Fatalf("Variant of random bytes: %v", err)
			}
			var buf bytes.Buffer
			n, err := EncodeBounded(c, &buf, bytes.NewReader(seg), int64(len(seg)))
			if !errors.Is(err, ErrIncompressible) {
				t.Fatalf("EncodeBounded of random bytes: %v", err)
			}
			if n > budget(int64(len(seg))) || int64(buf.Len()) != n {
				t.Errorf("EncodeBounded wrote %d (reported %d), budget %d", buf.Len(), n, budget(int64(len(seg))))
			}
			full := encodeBytes(t, c, seg)
			if Worthwhile(int64(len(seg)), int64(len(full))) {
				t.Errorf("%d -> %d counted as worthwhile", len(seg), len(full))
			}
			if _, err := Variant(c, nil, idOf(segmentID(nil))); !errors.Is(err, ErrIncompressible) {
				t.Errorf("Variant of an empty segment: %v", err)
			}
		})
	}
}

func TestEncodeBoundedCompressible(t *testing.T) {
	b := segdata.RowsSegment(200)
	for _, c := range codingsUnderTest {
		var buf bytes.Buffer
		n, err := EncodeBounded(c, &buf, bytes.NewReader(b), int64(len(b)))
		if err != nil {
			t.Fatalf("%v: %v", c, err)
		}
		if n != int64(buf.Len()) || !bytes.Equal(buf.Bytes(), encodeBytes(t, c, b)) {
			t.Errorf("%v: EncodeBounded differs from Encode", c)
		}
	}
}

func TestWorthwhile(t *testing.T) {
	cases := []struct {
		identity, compressed int64
		want                 bool
	}{
		{100, 90, true},
		{100, 91, false},
		{100, 100, false},
		{100, 150, false},
		{100, 0, true},
		{10, 9, true},
		{11, 9, true},
		{11, 10, false}, // 10 > 9.9
		{9, 8, true},    // 8 <= 8.1
		{1, 1, false},
		{0, 0, false},
		{-5, 0, false},
		{100, -1, false},
		{64 << 20, 64 << 20 * 9 / 10, true},
		{64 << 20, 64<<20*9/10 + 1, false},
	}
	for _, tc := range cases {
		if got := Worthwhile(tc.identity, tc.compressed); got != tc.want {
			t.Errorf("Worthwhile(%d, %d) = %v, want %v", tc.identity, tc.compressed, got, tc.want)
		}
	}
}

func TestIdentityIsNotACoding(t *testing.T) {
	b := []byte("SSG2 x")
	for _, c := range []Coding{Identity, Coding(9)} {
		if _, err := Encode(c, io.Discard, bytes.NewReader(b)); !errors.Is(err, ErrCoding) {
			t.Errorf("Encode(%v): %v", c, err)
		}
		if err := Verify(c, bytes.NewReader(b), idOf(segmentID(b)), int64(len(b))); !errors.Is(err, ErrCoding) {
			t.Errorf("Verify(%v): %v", c, err)
		}
		if _, err := Variant(c, b, idOf(segmentID(b))); !errors.Is(err, ErrCoding) {
			t.Errorf("Variant(%v): %v", c, err)
		}
	}
}

// failingReader fails after some bytes, like a store read that breaks.
type failingReader struct{ left int }

var errRead = errors.New("read broke")

func (f *failingReader) Read(p []byte) (int, error) {
	if f.left <= 0 {
		return 0, errRead
	}
	n := min(len(p), f.left)
	clear(p[:n])
	f.left -= n
	return n, nil
}

func TestEncodeReportsReadErrors(t *testing.T) {
	for _, c := range codingsUnderTest {
		if _, err := Encode(c, io.Discard, &failingReader{left: 100000}); !errors.Is(err, errRead) {
			t.Errorf("%v: %v", c, err)
		}
	}
}
