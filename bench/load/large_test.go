package main

import (
	"bytes"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// The large scenarios stop on a wrong byte: fetch must tell a differing
// or short body from the right one.
func TestFetchChecksEveryByte(t *testing.T) {
	want := bytes.Repeat([]byte("0123456789abcdef"), 1<<14) // 256 KiB
	flipped := bytes.Clone(want)
	flipped[200_000] ^= 1
	bodies := map[string][]byte{"/right": want, "/flipped": flipped, "/short": want[:len(want)-1], "/long": append(bytes.Clone(want), 'x')}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(bodies[r.URL.Path]) }))
	defer srv.Close()
	c := srv.Client()

	if _, n, err := fetch(c, srv.URL+"/right", want, 0, 0); err != nil || n != len(want) {
		t.Fatalf("right body: %d bytes, %v", n, err)
	}
	if _, _, err := fetch(c, srv.URL+"/flipped", want, 0, 0); !errors.Is(err, errWrongBytes) {
		t.Fatalf("flipped byte: %v, want errWrongBytes", err)
	}
	for _, p := range []string{"/short", "/long"} {
		if _, _, err := fetch(c, srv.URL+p, want, 0, 0); err == nil {
			t.Fatalf("%s body accepted", p)
		}
	}
	if _, err := runCrowd(3, func(int) string { return srv.URL + "/flipped" }, want, 0, 0, nil); !errors.Is(err, errWrongBytes) {
		t.Fatalf("runCrowd with a flipped byte: %v, want errWrongBytes", err)
	}
}

// A rate-limited read stops at its time limit having read about rate
// bytes per second.
func TestFetchRateLimit(t *testing.T) {
	want := make([]byte, 1<<20)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(want) }))
	defer srv.Close()
	const rate = 256 << 10
	_, n, err := fetch(srv.Client(), srv.URL, want, rate, 500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if n > rate/2+rate/16 || n < rate/16 {
		t.Fatalf("read %d bytes in 0.5 s at %d B/s", n, rate)
	}
}
