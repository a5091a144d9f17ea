package compress

import (
	"fmt"
	"io"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

// The storm path: a variant encoded while its segment is still being
// filled, with readers following the encoder's output. Its levels favour
// speed (the encoder paces every follower), its output is flushed every
// StormFlushEvery bytes of input so followers get bytes as they land.
// Measured on a 64 MiB SQLite image (README.md, "Storm levels").
const (
	// StormGzipLevel is gzip's level on the storm path.
	StormGzipLevel = 6
	// StormZstdLevel is zstd's level on the storm path.
	StormZstdLevel = zstd.SpeedDefault
	// StormFlushEvery is how much input the storm encoder takes between
	// two flushes of its output.
	StormFlushEvery = 256 << 10
)

// EncodeStorm writes src compressed with c to dst at the storm levels,
// flushing the coder every StormFlushEvery bytes of input, so that the
// bytes written so far always end on a flush point. It returns the
// compressed size. Unlike EncodeBounded it never gives up on the ratio:
// its readers are already following it.
func EncodeStorm(c Coding, dst io.Writer, src io.Reader) (written int64, err error) {
	cw := &countWriter{w: dst}
	k := coder{gzipLevel: StormGzipLevel, zstdLevel: StormZstdLevel, zstdConcurrency: 1}
	err = k.encodeFlushing(c, cw, src, StormFlushEvery)
	return cw.n, err
}

type flushWriteCloser interface {
	io.WriteCloser
	Flush() error
}

// encodeFlushing is encode with a flush of the coder after every every
// bytes of input.
func (k coder) encodeFlushing(c Coding, dst io.Writer, src io.Reader, every int) error {
	var zw flushWriteCloser
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
			zstd.WithEncoderConcurrency(max(1, k.zstdConcurrency)))
		if err != nil {
			return fmt.Errorf("compress: zstd: %w", err)
		}
		zw = w
	default:
		return fmt.Errorf("%w: %v", ErrCoding, c)
	}
	buf := make([]byte, every)
	for {
		n, rerr := io.ReadFull(src, buf)
		if n > 0 {
			if _, err := zw.Write(buf[:n]); err != nil {
				zw.Close()
				return fmt.Errorf("compress: encode %v: %w", c, err)
			}
			if err := zw.Flush(); err != nil {
				zw.Close()
				return fmt.Errorf("compress: encode %v: %w", c, err)
			}
		}
		// The sentinels themselves, not wrapped errors: a source's own
		// failure must not read as the end.
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF { //nolint:errorlint // ReadFull's own sentinels

			break
		}
		if rerr != nil {
			zw.Close()
			return fmt.Errorf("compress: encode %v: %w", c, rerr)
		}
	}
	if err := zw.Close(); err != nil {
		return fmt.Errorf("compress: encode %v: %w", c, err)
	}
	return nil
}
