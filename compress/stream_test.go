package compress

import (
	"bytes"
	stdgzip "compress/gzip"
	"errors"
	"io"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/syncular/caddy-syncular/internal/segdata"
)

// decodePrefix decodes the first n bytes of a coded stream that may end
// mid-stream (a storm variant as it grows).
func decodePrefix(t *testing.T, c Coding, coded []byte, n int64) ([]byte, error) {
	t.Helper()
	var dec io.Reader
	switch c {
	case Gzip:
		zr, err := stdgzip.NewReader(bytes.NewReader(coded))
		if err != nil {
			return nil, err
		}
		dec = zr
	case Zstd:
		zr, err := zstd.NewReader(bytes.NewReader(coded), zstd.WithDecoderConcurrency(1))
		if err != nil {
			return nil, err
		}
		defer zr.Close()
		dec = zr
	}
	out := make([]byte, n)
	_, err := io.ReadFull(dec, out)
	return out, err
}

// The storm encoder's first flush comes after StormFirstFlush bytes of
// input (at most 64 KiB: every follower waits for it), the next ones
// every StormFlushEvery, and at each the bytes
// written so far decode to exactly the input read so far: a follower can
// be sent them.
func TestEncodeStormFlushPoints(t *testing.T) {
	seg := segdata.RowsSegment(20000)
	if len(seg) < StormFirstFlush+3*StormFlushEvery {
		t.Fatalf("segment of %d bytes too short for the test", len(seg))
	}
	for _, c := range codingsUnderTest {
		t.Run(c.String(), func(t *testing.T) {
			var dst bytes.Buffer
			var ins []int64
			n, err := EncodeStorm(c, &dst, bytes.NewReader(seg), func(in, out int64) error {
				if out != int64(dst.Len()) {
					t.Errorf("flush at %d: out %d, %d written", in, out, dst.Len())
				}
				got, err := decodePrefix(t, c, dst.Bytes(), in)
				if err != nil || !bytes.Equal(got, seg[:in]) {
					t.Errorf("flush at %d: the %d bytes written do not decode to the input read (%v)", in, out, err)
				}
				ins = append(ins, in)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(ins) < 3 || ins[0] != StormFirstFlush || ins[0] > 64<<10 {
				t.Fatalf("flushes after %v bytes of input, want the first at %d, at most 64 KiB", ins[:min(3, len(ins))], StormFirstFlush)
			}
			for i := 1; i < len(ins); i++ {
				if step := ins[i] - ins[i-1]; step != StormFlushEvery && ins[i] != int64(len(seg)) {
					t.Fatalf("flush %d after %d more bytes, want %d", i, step, StormFlushEvery)
				}
			}
			if ins[len(ins)-1] != int64(len(seg)) || n != int64(dst.Len()) {
				t.Fatalf("last flush at %d of %d; returned %d of %d written", ins[len(ins)-1], len(seg), n, dst.Len())
			}
			if err := Verify(c, bytes.NewReader(dst.Bytes()), idOf(segmentID(seg)), int64(len(seg))); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// The storm path's zstd frames declare StormZstdWindow: a decoder
// limited to it decodes them, one limited to half of it refuses them.
func TestEncodeStormZstdWindow(t *testing.T) {
	seg := segdata.RowsSegment(20000)
	var dst bytes.Buffer
	if _, err := EncodeStorm(Zstd, &dst, bytes.NewReader(seg), nil); err != nil {
		t.Fatal(err)
	}
	decode := func(window uint64) error {
		zr, err := zstd.NewReader(bytes.NewReader(dst.Bytes()), zstd.WithDecoderMaxWindow(window), zstd.WithDecoderConcurrency(1))
		if err != nil {
			return err
		}
		defer zr.Close()
		got, err := io.ReadAll(zr)
		if err == nil && !bytes.Equal(got, seg) {
			err = errors.New("other bytes")
		}
		return err
	}
	if err := decode(StormZstdWindow); err != nil {
		t.Fatalf("with a %d-byte window: %v", StormZstdWindow, err)
	}
	if err := decode(StormZstdWindow / 2); err == nil {
		t.Fatalf("a decoder limited to %d bytes of window decoded the storm variant: its frame declares less than %d", StormZstdWindow/2, StormZstdWindow)
	}
}
