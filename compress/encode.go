package compress

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/syncular/caddy-syncular/segid"
)

// The levels: the best ratio whose encode of a 64 MiB segment stays within
// a few seconds of one core, measured in CPU time with a real SQLite
// image and a rows segment; gzip 9 and SpeedBestCompression do not fit
// (docs/performance.md, "Compression levels"; README.md has the table).
const (
	// GzipLevel is gzip's level (klauspost/compress/gzip; 1..9). Level 6
	// would cost less CPU for a slightly larger variant (same section).
	GzipLevel = 7
	// ZstdLevel is zstd's level.
	ZstdLevel = zstd.SpeedBetterCompression
	// ZstdWindow is the zstd window: 8 MiB, the most a browser accepts for
	// Content-Encoding: zstd (RFC 9659 caps it at 8 MiB).
	ZstdWindow = 8 << 20
	// zstdConcurrency 1: two goroutines used no less CPU per byte (and the
	// concurrent-blocks mode more), and one encoding should leave the
	// other core to the request path.
	zstdConcurrency = 1
)

// Errors. Wrapped errors keep these for errors.Is.
var (
	// ErrCoding: the coding cannot be encoded or decoded (Identity, or not
	// a Coding).
	ErrCoding = errors.New("compress: not a content coding")
	// ErrIncompressible: the variant would not shrink the segment by 10%.
	ErrIncompressible = errors.New("compress: segment does not shrink by 10%")
	// ErrMismatch: a variant does not decode to the segment's bytes.
	ErrMismatch = errors.New("compress: variant does not decode to the segment")
	// ErrSegmentID: the zero segid.ID, which names no segment.
	ErrSegmentID = errors.New("compress: malformed segment id")
)

// Worthwhile reports whether a variant of compressedSize bytes is worth
// keeping for a segment of identitySize bytes: it must shrink it by at
// least 10% (compressedSize <= 0.9 × identitySize). An empty segment is
// never worth a variant.
func Worthwhile(identitySize, compressedSize int64) bool {
	return identitySize > 0 && compressedSize >= 0 && compressedSize <= budget(identitySize)
}

// budget is the largest worthwhile variant: floor(0.9 × size).
func budget(size int64) int64 { return size - (size+9)/10 }

// EncodeBounded writes src, identitySize bytes, compressed with c to dst,
// streaming: memory stays bounded by the coder's window whatever the size
// of src. It returns the number of compressed bytes written. The output
// is deterministic (no name or time in the gzip header), so every edge
// makes the same bytes. Identity is ErrCoding: a variant is never the
// identity bytes. It gives up, with ErrIncompressible, as soon as the
// output exceeds what Worthwhile allows; dst then holds a partial stream
// to discard.
func EncodeBounded(c Coding, dst io.Writer, src io.Reader, identitySize int64) (written int64, err error) {
	if identitySize <= 0 {
		return 0, ErrIncompressible
	}
	cw := &countWriter{w: dst, limit: budget(identitySize)}
	err = chosen().encode(c, cw, src)
	if errors.Is(err, errOverBudget) {
		err = ErrIncompressible
	}
	return cw.n, err
}

// coder is a set of encoder settings; chosen is the one EncodeBounded
// uses, the others exist for the level benchmarks.
type coder struct {
	gzipLevel        int
	zstdLevel        zstd.EncoderLevel
	zstdConcurrency  int
	zstdConcurrentBk bool // zstd.WithConcurrentBlocks
	zstdWindow       int  // 0: ZstdWindow
}

// window is the zstd window of k's encoders.
func (k coder) window() int {
	if k.zstdWindow > 0 {
		return k.zstdWindow
	}
	return ZstdWindow
}

func chosen() coder {
	return coder{gzipLevel: GzipLevel, zstdLevel: ZstdLevel, zstdConcurrency: zstdConcurrency}
}

func (k coder) encode(c Coding, dst io.Writer, src io.Reader) error {
	var zw io.WriteCloser
	switch c {
	case Gzip:
		w, err := gzip.NewWriterLevel(dst, k.gzipLevel)
		if err != nil {
			return fmt.Errorf("compress: gzip: %w", err)
		}
		zw = w
	case Zstd:
		w, err := zstd.NewWriter(dst,
			zstd.WithEncoderLevel(k.zstdLevel),
			zstd.WithWindowSize(ZstdWindow),
			zstd.WithEncoderConcurrency(k.zstdConcurrency),
			zstd.WithConcurrentBlocks(k.zstdConcurrentBk))
		if err != nil {
			return fmt.Errorf("compress: zstd: %w", err)
		}
		zw = w
	default:
		return fmt.Errorf("%w: %v", ErrCoding, c)
	}
	if _, err := io.Copy(zw, src); err != nil {
		zw.Close()
		return fmt.Errorf("compress: encode %v: %w", c, err)
	}
	if err := zw.Close(); err != nil {
		return fmt.Errorf("compress: encode %v: %w", c, err)
	}
	return nil
}

var errOverBudget = errors.New("compress: over budget")

// countWriter counts what passes to w and, with limit > 0, refuses to let
// more than limit bytes through.
type countWriter struct {
	w     io.Writer
	n     int64
	limit int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	if c.limit > 0 && c.n+int64(len(p)) > c.limit {
		return 0, errOverBudget
	}
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// Verify decodes a stored variant and checks that it yields exactly size
// bytes hashing to id (the digest of the identity bytes). Any
// decoding error (a flipped byte, a truncated or extended stream, trailing
// garbage, a zstd window over ZstdWindow) and any length or hash
// difference is ErrMismatch. Decoding stops one byte past size, so a
// decompression bomb costs at most size+1 decoded bytes. The zero ID is
// ErrSegmentID.
func Verify(c Coding, compressed io.Reader, id segid.ID, size int64) error {
	if id.IsZero() {
		return ErrSegmentID
	}
	if size < 0 {
		return fmt.Errorf("%w: negative size", ErrMismatch)
	}
	var dec io.Reader
	switch c {
	case Gzip:
		zr, err := gzip.NewReader(compressed)
		if err != nil {
			return fmt.Errorf("%w: gzip: %v", ErrMismatch, err)
		}
		defer zr.Close()
		dec = zr
	case Zstd:
		zr, err := zstd.NewReader(compressed,
			zstd.WithDecoderConcurrency(1),
			zstd.WithDecoderMaxWindow(ZstdWindow))
		if err != nil {
			return fmt.Errorf("%w: zstd: %v", ErrMismatch, err)
		}
		defer zr.Close()
		dec = zr
	default:
		return fmt.Errorf("%w: %v", ErrCoding, c)
	}
	var h segid.Hasher
	n, err := io.Copy(&h, io.LimitReader(dec, size+1))
	switch {
	case err != nil:
		return fmt.Errorf("%w: %v: %v", ErrMismatch, c, err)
	case n != size:
		return fmt.Errorf("%w: %v decodes to more or fewer than %d bytes", ErrMismatch, c, size)
	}
	if !h.Matches(id.Digest()) {
		return fmt.Errorf("%w: %v decodes to other bytes", ErrMismatch, c)
	}
	return nil
}

// Variant makes the c variant of a segment held in memory: it encodes
// identity (stopping early with ErrIncompressible when the result would
// not be Worthwhile), verifies the result against id, and returns it. A
// nil error means the bytes may be stored under (id, c). The zero ID is
// ErrSegmentID.
func Variant(c Coding, identity []byte, id segid.ID) ([]byte, error) {
	if id.IsZero() {
		return nil, ErrSegmentID
	}
	size := int64(len(identity))
	var buf bytes.Buffer
	if _, err := EncodeBounded(c, &buf, bytes.NewReader(identity), size); err != nil {
		return nil, err
	}
	if err := Verify(c, bytes.NewReader(buf.Bytes()), id, size); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
