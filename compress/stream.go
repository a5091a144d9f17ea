package compress

import (
	"fmt"
	"io"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

// The storm path: a variant encoded while its segment is still being
// filled, with readers following the encoder's output. Its output is
// flushed first after StormFirstFlush bytes of input, then every
// StormFlushEvery, so followers get bytes as they land.
//
// Levels, measured on a SQLite image (BenchmarkStormLevels;
// docs/performance.md, "Compression levels"): of gzip 1 and 6 and zstd
// fastest and default, the two of better ratio are kept: even the slower
// of them encodes a segment far faster than a mobile client receives
// the variant, so the encoder
// does not hold a follower back while the ratio is what every follower
// (and every later hit of the kept variant) pays for.
//
// What does hold the first byte back is the encoder's start: every
// follower waits for the first flush. zstd's window sets its history
// buffer (twice the window, allocated at the first block: 16 MiB for
// 8 MiB), and allocating that while a crowd of requests runs was slow on
// a loaded edge; a 256 KiB first block added its encoding.
// StormZstdWindow is 2 MiB (a 4 MiB history; the ratio on the image above
// is all but the 8 MiB window's: same section): zstd default's match
// tables do not reach much further back anyway. The first flush comes
// after 64 KiB, one block, quick to encode.
const (
	// StormGzipLevel is gzip's level on the storm path.
	StormGzipLevel = 6
	// StormZstdLevel is zstd's level on the storm path.
	StormZstdLevel = zstd.SpeedDefault
	// StormZstdWindow is zstd's window on the storm path (the frame
	// header declares it; within RFC 9659's 8 MiB for browsers).
	StormZstdWindow = 2 << 20
	// StormFirstFlush is how much input the storm encoder takes before
	// its first flush: the bytes every follower waits for, and those
	// that decide whether the variant shrinks the segment.
	StormFirstFlush = 64 << 10
	// StormFlushEvery is how much input the storm encoder takes between
	// two later flushes of its output.
	StormFlushEvery = 256 << 10
)

// EncodeStorm writes src compressed with c to dst at the storm levels,
// flushing the coder after the first StormFirstFlush bytes of input and
// then every StormFlushEvery. After each
// flush it calls flushed (when not nil) with the input read and the
// output written so far, both ending on that flush point; an error from
// flushed stops the encoding and is returned. It returns the compressed
// size. Unlike EncodeBounded it never gives up on the ratio by itself:
// flushed decides (its readers may already be following it).
func EncodeStorm(c Coding, dst io.Writer, src io.Reader, flushed func(in, out int64) error) (written int64, err error) {
	cw := &countWriter{w: dst}
	k := coder{gzipLevel: StormGzipLevel, zstdLevel: StormZstdLevel, zstdConcurrency: 1, zstdWindow: StormZstdWindow}
	var in int64
	var onFlush func(n int) error
	if flushed != nil {
		onFlush = func(n int) error {
			in += int64(n)
			return flushed(in, cw.n)
		}
	}
	err = k.encodeFlushing(c, cw, src, StormFirstFlush, StormFlushEvery, onFlush)
	return cw.n, err
}

type flushWriteCloser interface {
	io.WriteCloser
	Flush() error
}

// encodeFlushing is encode with a flush of the coder after the first
// first bytes of input and then after every every bytes, each followed
// by a call of onFlush (when not nil) with the bytes of input since the
// last.
func (k coder) encodeFlushing(c Coding, dst io.Writer, src io.Reader, first, every int, onFlush func(n int) error) error {
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
			zstd.WithWindowSize(k.window()),
			zstd.WithEncoderConcurrency(max(1, k.zstdConcurrency)))
		if err != nil {
			return fmt.Errorf("compress: zstd: %w", err)
		}
		zw = w
	default:
		return fmt.Errorf("%w: %v", ErrCoding, c)
	}
	buf := make([]byte, max(first, every))
	next := min(first, every)
	if next <= 0 {
		next = every
	}
	for {
		n, rerr := io.ReadFull(src, buf[:next])
		next = every
		if n > 0 {
			if _, err := zw.Write(buf[:n]); err != nil {
				zw.Close()
				return fmt.Errorf("compress: encode %v: %w", c, err)
			}
			if err := zw.Flush(); err != nil {
				zw.Close()
				return fmt.Errorf("compress: encode %v: %w", c, err)
			}
			if onFlush != nil {
				if err := onFlush(n); err != nil {
					zw.Close()
					return err
				}
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
