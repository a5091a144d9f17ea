package caddymodule

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestSQLiteStreamCap: past maxSQLiteStreams answers streaming from a
// SQLite store, one more waits for a slot, and past the wait is refused
// 503 edge.overloaded with a Retry-After from the injected jitter, before
// any header of a 200; a slot given back while it waits serves it. S3
// streams are not counted.
func TestSQLiteStreamCap(t *testing.T) {
	fs := newFakeStore()
	body := bytes.Repeat([]byte("cap "), 1000)
	id := fs.add(body, pub("p1", digestA, testNow.Add(time.Hour)))
	spread := -1
	h := newTestHandler(t, fs, withJitter(func(n int) int { spread = n; return n - 1 }))
	setSlotWait(h, 50*time.Millisecond)
	target := "/segments/" + id + "?st=" + mintToken(id, digestA, "aud:p1", testNow.Add(time.Minute))
	for range maxSQLiteStreams {
		if !h.sqliteStreams.tryAcquire() {
			t.Fatal("fewer slots than maxSQLiteStreams")
		}
	}
	rec, _ := serve(t, h, "GET", target, nil)
	e := wantError(t, rec, 503, "edge.overloaded")
	if !e.retryableTrue() || rec.Header().Get("Retry-After") != fmt.Sprint(overloadRetrySpread) || spread != overloadRetrySpread {
		t.Fatalf("overloaded answer: retryable %v, Retry-After %q (jitter asked for [0,%d))", e.Retryable, rec.Header().Get("Retry-After"), spread)
	}
	if rec.Header().Get("Etag") != "" || rec.Header().Get("Content-Length") == fmt.Sprint(len(body)) {
		t.Fatalf("the refusal carries the segment's headers: %v", rec.Header())
	}
	// HEAD streams nothing: answered whatever the cap.
	if rec, _ := serve(t, h, "HEAD", target, nil); rec.Code != 200 {
		t.Fatalf("HEAD at the cap: %d", rec.Code)
	}
	// A slot given back while an answer waits: it is served.
	time.AfterFunc(20*time.Millisecond, h.sqliteStreams.release)
	setSlotWait(h, 10*time.Second)
	rec, _ = serve(t, h, "GET", target, nil)
	if rec.Code != 200 || !bytes.Equal(rec.Body.Bytes(), body) {
		t.Fatalf("with a slot given back while waiting: %d", rec.Code)
	}
	if h.sqliteStreams.taken() != maxSQLiteStreams-1 {
		t.Fatalf("%d slots taken after the answer, want %d: a slot leaked", h.sqliteStreams.taken(), maxSQLiteStreams-1)
	}
	// The same store behind an s3 handler: not a SQLite stream.
	h.Store = &StoreConfig{Backend: backendS3}
	h.Delivery = DeliveryProxy
	h.sqliteStreams.tryAcquire()
	if rec, _ := serve(t, h, "GET", target, nil); rec.Code != 200 {
		t.Fatalf("s3 proxy stream at the SQLite cap: %d", rec.Code)
	}
}

func (e errBody) retryableTrue() bool { return e.Retryable != nil && *e.Retryable }

// TestCopyBodyCutsAStalledReader: a client that takes no bytes has its
// response cut after the stall timeout (the write fails with a timeout),
// while one that reads gets every byte though the whole transfer lasts
// longer than the stall timeout.
func TestCopyBodyCutsAStalledReader(t *testing.T) {
	const stall = 2 * time.Second
	body := bytes.Repeat([]byte("0123456789abcdef"), 1<<19) // 8 MiB: more than the socket buffers hold
	done := make(chan error, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(len(body)))
		w.WriteHeader(200)
		n, err := copyBody(w, bytes.NewReader(body), int64(len(body)), stall, time.Time{}, time.Now)
		if err == nil && n != int64(len(body)) {
			err = fmt.Errorf("wrote %d of %d", n, len(body))
		}
		done <- err
	}))
	defer srv.Close()

	// A reader that keeps reading, slower than one stall per buffer but
	// never stalled for a whole one: all bytes.
	res, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	got := new(bytes.Buffer)
	buf := make([]byte, 256<<10)
	for {
		n, rerr := res.Body.Read(buf)
		got.Write(buf[:n])
		if rerr != nil {
			break
		}
		time.Sleep(stall / 20) // the whole transfer outlasts the stall timeout
	}
	res.Body.Close()
	if err := <-done; err != nil || !bytes.Equal(got.Bytes(), body) {
		t.Fatalf("steady reader: server error %v, %d of %d bytes", err, got.Len(), len(body))
	}

	// A reader that stops after the status line.
	conn, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.(*net.TCPConn).SetReadBuffer(4 << 10)
	fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	if _, err := bufio.NewReaderSize(conn, 16).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("stalled reader: server got %v, want a write timeout", err)
		}
	case <-time.After(30 * time.Second): // generous: the stall is 2 s
		t.Fatal("the response to a stalled reader was not cut")
	}
}

// TestStreamSlotsWaiterCap: with every slot taken, up to maxWait answers
// wait; one more is refused at once, and a waiter gets the next slot.
func TestStreamSlotsWaiterCap(t *testing.T) {
	s := newStreamSlots(1, 1)
	if !s.tryAcquire() {
		t.Fatal("no first slot")
	}
	got := make(chan bool)
	go func() { got <- s.acquire(t.Context(), time.Minute) }()
	for s.waiting.Load() != 1 {
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	if s.acquire(t.Context(), time.Minute) {
		t.Fatal("a second waiter past the cap got a slot")
	}
	if time.Since(start) > 30*time.Second {
		t.Fatal("the waiter past the cap waited")
	}
	s.release()
	if !<-got {
		t.Fatal("the waiter did not get the released slot")
	}
	if s.waiting.Load() != 0 || s.taken() != 1 {
		t.Fatalf("waiting %d, taken %d", s.waiting.Load(), s.taken())
	}
}

// A client that has left gets no slot, neither at once nor after
// waiting: a crowd of closing waiters must not each start a stream.
func TestStreamSlotsClientGone(t *testing.T) {
	s := newStreamSlots(1, 8)
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	if s.acquire(gone, time.Minute) {
		t.Fatal("a free slot went to a client that had left")
	}
	if s.taken() != 0 {
		t.Fatalf("taken %d after the refusal, want 0", s.taken())
	}
	// Waiting: the slot frees and the client leaves at the same moment,
	// many times over; a slot may never be handed to the gone client.
	for i := 0; i < 200; i++ {
		if !s.tryAcquire() {
			t.Fatal("no slot to hold")
		}
		ctx, cancel := context.WithCancel(context.Background())
		got := make(chan bool)
		go func() { got <- s.acquire(ctx, time.Minute) }()
		for s.waiting.Load() != 1 {
			time.Sleep(10 * time.Microsecond)
		}
		cancel()
		s.release()
		if <-got {
			t.Fatalf("round %d: a waiter whose client had left got the slot", i)
		}
		if s.taken() != 0 {
			t.Fatalf("round %d: taken %d, want 0", i, s.taken())
		}
	}
}
