package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"testing/iotest"
	"time"

	"github.com/syncular/caddy-syncular/segid"
	"github.com/syncular/caddy-syncular/store"
)

// brokenBodyStore serves records from fakeStore, but every body it opens
// fails after failAfter bytes, as a disk or an S3 connection can mid-stream.
type brokenBodyStore struct {
	*fakeStore
	failAfter int64
}

func (b *brokenBodyStore) Open(ctx context.Context, pid segid.ID, off, n int64) (io.ReadCloser, error) {
	id := pid.String()
	rc, err := b.fakeStore.Open(ctx, idOf(id), off, n)
	if err != nil {
		return nil, err
	}
	return io.NopCloser(io.MultiReader(io.LimitReader(rc, b.failAfter),
		iotest.ErrReader(errors.New("segment source failed mid-stream")))), nil
}

// TestBodyFailureAborts: when the store's body fails after the status
// line was sent, the response is aborted (http.ErrAbortHandler), never
// ended cleanly with a short body; over a real connection the client sees
// the body fail, on HTTP/1.1 and HTTP/2.
func TestBodyFailureAborts(t *testing.T) {
	fs := newFakeStore()
	body := make([]byte, 256<<10)
	for i := range body {
		body[i] = byte(i * 7)
	}
	id := fs.add(body, pub("p1", digestA, testNow.Add(time.Hour)))
	st := &brokenBodyStore{fakeStore: fs, failAfter: 100 << 10}
	h := newTestHandler(t, st, nil)
	target := "/sync/segments/" + id + "?st=" + mintToken(id, digestA, "aud:p1", testNow.Add(10*time.Minute))

	t.Run("recorder", func(t *testing.T) {
		panicked := func() (p any) {
			defer func() { p = recover() }()
			serve(t, h, http.MethodGet, target, nil)
			return nil
		}()
		if panicked != http.ErrAbortHandler {
			t.Fatalf("ServeHTTP ended with %v, want a panic with http.ErrAbortHandler", panicked)
		}
	})

	// Over a real connection. Where the Content-Length reaches the client
	// net/http would also cut the connection of a short body; where a
	// handler around this one drops it (encode does, to compress), the
	// body is chunked and only the abort keeps a short body from ending
	// cleanly.
	for _, tc := range []struct {
		proto   string
		chunked bool
	}{{"HTTP/1.1", false}, {"HTTP/2.0", false}, {"HTTP/1.1", true}, {"HTTP/2.0", true}} {
		proto := tc.proto
		t.Run(fmt.Sprintf("%s chunked=%v", proto, tc.chunked), func(t *testing.T) {
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tc.chunked {
					w = &dropLength{ResponseWriter: w}
				}
				_ = h.ServeHTTP(w, r, nextHandler)
			}))
			srv.EnableHTTP2 = proto == "HTTP/2.0"
			srv.StartTLS()
			defer srv.Close()
			resp, err := srv.Client().Get(srv.URL + target)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.Proto != proto {
				t.Fatalf("served over %s, want %s", resp.Proto, proto)
			}
			wantLength := strconv.Itoa(len(body))
			if tc.chunked {
				wantLength = ""
			}
			if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Length") != wantLength {
				t.Fatalf("status %d, Content-Length %q", resp.StatusCode, resp.Header.Get("Content-Length"))
			}
			got, err := io.ReadAll(resp.Body)
			if err == nil {
				t.Fatalf("body of %d bytes (of %d) ended cleanly; want a read error", len(got), len(body))
			}
			if int64(len(got)) > st.failAfter {
				t.Fatalf("read %d bytes, more than the source gave (%d)", len(got), st.failAfter)
			}
		})
	}

	// The same store's body, whole, goes out cleanly: the abort is the
	// failure's doing.
	st.failAfter = int64(len(body)) + 1
	rec, _ := serve(t, h, http.MethodGet, target, nil)
	if rec.Code != http.StatusOK || rec.Body.Len() != len(body) {
		t.Fatalf("intact body: status %d, %d bytes", rec.Code, rec.Body.Len())
	}
}

// dropLength removes Content-Length as the response starts, as a
// compressing handler around this one does.
type dropLength struct{ http.ResponseWriter }

func (d *dropLength) WriteHeader(status int) {
	d.Header().Del("Content-Length")
	d.ResponseWriter.WriteHeader(status)
}

// TestRefusalsCarryNoSuccessHeaders: a refusal decided after the grant
// (416, bytes gone from the store, a store fault) carries none of the
// headers of a successful answer.
func TestRefusalsCarryNoSuccessHeaders(t *testing.T) {
	fs := newFakeStore()
	body := []byte("refused after the grant")
	id := fs.add(body, pub("p1", digestA, testNow.Add(time.Hour)))
	h := newTestHandler(t, fs, nil)
	target := "/sync/segments/" + id + "?st=" + mintToken(id, digestA, "aud:p1", testNow.Add(10*time.Minute))

	check := func(name string, rec *httptest.ResponseRecorder, status int, code string) {
		t.Helper()
		wantError(t, rec, status, code)
		for _, k := range []string{"ETag", "Accept-Ranges", "Location"} {
			if v := rec.Header().Get(k); v != "" {
				t.Errorf("%s: %s %q on a refusal", name, k, v)
			}
		}
		if cc := rec.Header().Get("Cache-Control"); cc != "no-store" {
			t.Errorf("%s: Cache-Control %q, want no-store", name, cc)
		}
	}
	rec, _ := serve(t, h, http.MethodGet, target, map[string]string{"Range": "bytes=9999-"})
	check("416", rec, http.StatusRequestedRangeNotSatisfiable, "edge.range_not_satisfiable")
	if cr := rec.Header().Get("Content-Range"); cr != "bytes */"+strconv.Itoa(len(body)) {
		t.Errorf("416 Content-Range %q", cr)
	}

	fs.mu.Lock()
	fs.openErr = errors.New("disk unreadable")
	fs.mu.Unlock()
	rec, _ = serve(t, h, http.MethodGet, target, nil)
	check("open fault", rec, http.StatusServiceUnavailable, "edge.store_unavailable")

	fs.mu.Lock()
	fs.openErr = nil
	delete(fs.data, id) // record still there, bytes gone
	fs.mu.Unlock()
	rec, _ = serve(t, h, http.MethodGet, target, nil)
	check("bytes gone", rec, http.StatusNotFound, "sync.not_found")
}

// TestDecisionCountedWithoutReplacer: the outcome is recorded in the
// request's decision, not read back from placeholders, so a request
// without a replacer is still counted.
func TestDecisionCountedWithoutReplacer(t *testing.T) {
	fs := newFakeStore()
	id := fs.add([]byte("counted without a replacer"), pub("p1", digestA, testNow.Add(time.Hour)))
	h := newTestHandler(t, fs, nil)
	useMetrics(h, unknownServer)
	before := requestsOf("sync.forbidden", "serve")
	req := httptest.NewRequest(http.MethodGet, "/sync/segments/"+id+"?st="+mintToken(id, digestB, "aud:p1", testNow.Add(time.Minute)), nil)
	rec := httptest.NewRecorder()
	if err := h.ServeHTTP(rec, req, nextHandler); err != nil {
		t.Fatal(err)
	}
	wantError(t, rec, http.StatusForbidden, "sync.forbidden")
	if got := requestsOf("sync.forbidden", "serve") - before; got != 1 {
		t.Fatalf("refusal counted %v times, want 1", got)
	}
}

var _ store.Store = (*brokenBodyStore)(nil)
