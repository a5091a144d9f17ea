package caddymodule

import (
	"io"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/syncular/caddy-syncular/store"
)

// The one writer of segment bytes. A store.Body says what it holds, and
// sendBody writes each kind the one way that suits it: bytes in memory
// in one Write, or as one chunk in raw write(2) calls (membody.go), a
// range of a complete disk tier file with sendfile(2) through Caddy's
// writers (sendfile.go), and a stream through one pooled copy, the only
// place a stall deadline is pushed while bytes are copied. Every way
// that ends short of the body's Size, or with bytes that do not match
// their id, is an error: the caller aborts the answer.

// sendBody writes b to w. stall > 0 cuts a stream whose client takes no
// byte for stall (never past hard, zero: none); it is the SQLite
// stream's bound (streamcap.go), 0 for every other body.
func sendBody(w http.ResponseWriter, b *store.Body, stall time.Duration, hard time.Time) (int64, error) {
	switch b.Kind() {
	case store.BodyMemory:
		return sendMemory(w, b.Bytes()) // membody.go
	case store.BodyFile:
		f, off := b.File()
		k, err := sendFile(w, f, off, b.Size())
		if err == nil && k != b.Size() {
			err = io.ErrUnexpectedEOF // the file is shorter than it was at open
		}
		return k, err
	}
	// Connection deadlines are wall-clock times: time.Now, not the
	// handler's injected clock.
	return copyBody(w, b, b.Size(), stall, hard, time.Now)
}

// sendFile writes n bytes of f from off to w with sendfile(2), through
// the response writers (sendfile.go).
func sendFile(w io.Writer, f *os.File, off, n int64) (int64, error) {
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return 0, err
	}
	src, done := sendfileSource(w, f, n)
	defer done()
	// w's ReadFrom, not io.Copy: a rawRange is an io.WriterTo that must
	// reach the connection (not be asked to write itself to w), and not
	// CopyN: its LimitedReader would hide the file.
	return readFrom(w, src)
}

// copier is the state of one copyBody, pooled whole so that a copy
// allocates nothing.
type copier struct{ buf []byte }

var copiers = sync.Pool{New: func() any { return &copier{buf: make([]byte, streamCopyBuffer)} }}

// copyBody writes n bytes of r to w (n < 0: to r's end) in Writes
// through a pooled buffer. Not io.Copy to w's ReadFrom: Caddy's idle
// timeout writer hands each chunk on as an io.LimitedReader, and the
// connection's generic ReadFrom then allocates a buffer per chunk.
// Fewer than n bytes is io.ErrUnexpectedEOF.
//
// With stall > 0 the write deadline is pushed to now()+stall (never past
// hard, zero: none) before every write, so a client that takes no byte
// for stall ends the copy with a timeout however long the whole transfer
// lasts, and put back to hard afterwards. Where the connection has no
// deadlines (the writer does not support them) it copies without.
func copyBody(w http.ResponseWriter, r io.Reader, n int64, stall time.Duration, hard time.Time, now func() time.Time) (int64, error) {
	var rc *http.ResponseController
	if stall > 0 {
		rc = http.NewResponseController(w)
		if rc.SetWriteDeadline(idleDeadline(now(), stall, hard)) != nil {
			rc = nil
		}
	}
	c := copiers.Get().(*copier)
	defer func() {
		copiers.Put(c)
		if rc != nil {
			_ = rc.SetWriteDeadline(hard) // the server's own bound again
		}
	}()
	var written int64
	for n < 0 || written < n {
		p := c.buf
		if n >= 0 {
			p = p[:min(int64(len(p)), n-written)]
		}
		m, rerr := r.Read(p)
		if m > 0 {
			if rc != nil {
				_ = rc.SetWriteDeadline(idleDeadline(now(), stall, hard))
			}
			k, werr := w.Write(p[:m])
			written += int64(k)
			if werr != nil {
				return written, werr
			}
		}
		switch {
		case rerr == io.EOF && n >= 0 && written < n:
			return written, io.ErrUnexpectedEOF // short of its size
		case rerr == io.EOF:
			return written, nil
		case rerr != nil:
			return written, rerr
		}
	}
	return written, nil
}

// Interface guards
var _ io.ReadCloser = (*store.Body)(nil)
