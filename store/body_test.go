package store

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/syncular/caddy-syncular/compress"
)

// writeCounter counts the Write calls it gets.
type writeCounter struct {
	bytes.Buffer
	writes int
}

func (w *writeCounter) Write(p []byte) (int, error) { w.writes++; return w.Buffer.Write(p) }

// fileTaker records the file reader Want.SendFile was handed.
type fileTaker struct {
	bytes.Buffer
	got *io.LimitedReader
}

func takeFile(w io.Writer, lr *io.LimitedReader) (int64, error) {
	if ft, ok := w.(*fileTaker); ok {
		ft.got = lr
	}
	return io.Copy(w, lr)
}

// A Body writes itself: bytes in memory in one Write, a complete file
// through Want.SendFile (the handler's sendfile path), a stream
// verified so that bytes not matching their id end in ErrCorruptSegment
// before their last byte, a file shorter than the body in
// io.ErrUnexpectedEOF.
func TestBodyWriteTo(t *testing.T) {
	ctx := context.Background()
	data := seg(10<<10, 7)
	c, id := cachedWith(t, DefaultCacheOptions(), data)
	b, err := c.OpenBody(ctx, id, Want{N: int64(len(data)), Size: int64(len(data))})
	if err != nil {
		t.Fatal(err)
	}
	var wc writeCounter
	if n, err := b.WriteTo(&wc); err != nil || n != int64(len(data)) || wc.writes != 1 || !bytes.Equal(wc.Bytes(), data) {
		t.Fatalf("memory body: %d bytes in %d writes, %v", n, wc.writes, err)
	}
	if b.Tier() != TierMemory || b.Coding() != compress.Identity || b.Streamed() {
		t.Fatalf("memory body: tier %d coding %v streamed %v", b.Tier(), b.Coding(), b.Streamed())
	}
	b.Close()

	// A complete file: SendFile gets the file.
	path := filepath.Join(t.TempDir(), "seg")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	lr := &io.LimitedReader{R: f, N: int64(len(data))}
	fb := &Body{kind: bodyFile, size: lr.N, file: lr, r: lr, tier: TierDisk, send: takeFile}
	var ft fileTaker
	if n, err := fb.WriteTo(&ft); err != nil || n != int64(len(data)) || ft.got != lr || !bytes.Equal(ft.Bytes(), data) {
		t.Fatalf("file body: %d bytes, %v, WriteFile got %p (want %p)", n, err, ft.got, lr)
	}
	// Shorter than promised: an error, with SendFile or without.
	for _, send := range []func(io.Writer, *io.LimitedReader) (int64, error){takeFile, nil} {
		f.Seek(0, io.SeekStart)
		short := &io.LimitedReader{R: f, N: int64(len(data))}
		sb := &Body{kind: bodyFile, size: int64(len(data)) + 10, file: short, r: short, send: send}
		if _, err := sb.WriteTo(&fileTaker{}); err == nil {
			t.Fatalf("SendFile %v: a file shorter than the body ended cleanly", send != nil)
		}
	}

	// Streamed without the cache: verified, the last byte held back.
	inner := newCountingStore()
	bad := bytes.Clone(data)
	bad[len(bad)-1] ^= 1
	badID := inner.add(bad, segID(data))
	sbody, err := Direct(inner).OpenBody(ctx, badID, Want{N: int64(len(bad)), Size: int64(len(bad))})
	if err != nil {
		t.Fatal(err)
	}
	defer sbody.Close()
	var out bytes.Buffer
	n, err := sbody.WriteTo(&out)
	if !errors.Is(err, ErrCorruptSegment) || n >= int64(len(bad)) || !sbody.Streamed() {
		t.Fatalf("corrupt stream: %d of %d bytes, %v", n, len(bad), err)
	}
}

// caddyLikeWriter is a response writer whose ReadFrom hands its source on
// in 64 KiB io.LimitedReaders, as Caddy's idle timeout writer does: a
// copy through its ReadFrom allocates a buffer per chunk.
type caddyLikeWriter struct{ n int64 }

func (w *caddyLikeWriter) Write(p []byte) (int, error) { w.n += int64(len(p)); return len(p), nil }
func (w *caddyLikeWriter) ReadFrom(r io.Reader) (int64, error) {
	var total int64
	for {
		k, err := io.Copy(writerOnly{w}, io.LimitReader(r, 64<<10))
		total += k
		if err != nil || k == 0 {
			return total, err
		}
	}
}

// A streamed body (neither memory nor a complete file) is copied through
// one pooled buffer: writing it allocates nothing, however many chunks
// the writer would cut it into.
func TestBodyStreamCopyAllocs(t *testing.T) {
	data := seg(1<<20, 9)
	rd := bytes.NewReader(data)
	var src io.Reader = onlyReadFor(rd)
	w := &caddyLikeWriter{}
	for _, size := range []int64{int64(len(data)), -1} {
		b := &Body{kind: bodyStream, size: size, r: src}
		allocs := testing.AllocsPerRun(20, func() {
			rd.Reset(data)
			w.n = 0
			if n, err := b.WriteTo(w); err != nil || n != int64(len(data)) || w.n != n {
				t.Fatalf("copied %d (%d written): %v", n, w.n, err)
			}
		})
		if allocs != 0 {
			t.Fatalf("size %d: %v allocations per body, want 0", size, allocs)
		}
	}
	// A body shorter than its size fails.
	rd.Reset(data[:1000])
	if _, err := (&Body{kind: bodyStream, size: 2000, r: src}).WriteTo(w); err != io.ErrUnexpectedEOF {
		t.Fatalf("short body: %v", err)
	}
}

// readOnly hides a reader's WriteTo.
type readOnly struct{ r io.Reader }

func (o readOnly) Read(p []byte) (int, error) { return o.r.Read(p) }

func onlyReadFor(r io.Reader) io.Reader { return readOnly{r} }
