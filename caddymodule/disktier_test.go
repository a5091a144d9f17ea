package caddymodule

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap/zaptest/observer"

	"github.com/syncular/caddy-syncular/internal/seed"
	"github.com/syncular/caddy-syncular/store"
	"github.com/syncular/caddy-syncular/store/disk"
)

func TestUnmarshalCacheDisk(t *testing.T) {
	wrap := func(block string) string {
		return "syncular_segments {\n key k\n audience template a:{partition}\n store sqlite db\n" + block + "\n}"
	}
	h := new(Handler)
	if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(wrap("cache {\n disk /var/cache/seg\n disk_max_bytes 8GiB\n}"))); err != nil {
		t.Fatal(err)
	}
	if c := h.Cache; c.Disk != "/var/cache/seg" || *c.DiskMaxBytes != 8<<30 || c.diskDir() != "/var/cache/seg" || c.diskMaxBytes() != 8<<30 {
		t.Fatalf("parsed %+v", c)
	}
	h = new(Handler)
	if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(wrap("cache {\n disk off\n}"))); err != nil {
		t.Fatal(err)
	}
	if d := h.Cache.diskDir(); d != "" {
		t.Fatalf("disk off: dir %q", d)
	}
	zero := int64(0)
	if d := (&CacheConfig{DiskMaxBytes: &zero}).diskDir(); d != "" {
		t.Fatalf("disk_max_bytes 0: dir %q", d)
	}
	if d := (*CacheConfig)(nil).diskDir(); d != filepath.Join(caddy.AppDataDir(), "syncular", "segments") {
		t.Fatalf("default dir %q", d)
	}
	if m := (*CacheConfig)(nil).diskMaxBytes(); m != store.DefaultDiskMaxBytes {
		t.Fatalf("default budget %d", m)
	}
	for name, block := range map[string]string{
		"missing dir":   "cache {\n disk\n}",
		"extra dir":     "cache {\n disk a b\n}",
		"repeated dir":  "cache {\n disk a\n disk b\n}",
		"bad size":      "cache {\n disk_max_bytes lots\n}",
		"negative size": "cache {\n disk_max_bytes -1\n}",
		"missing size":  "cache {\n disk_max_bytes\n}",
	} {
		h := new(Handler)
		if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(wrap(block))); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	neg := int64(-1)
	if err := (&CacheConfig{DiskMaxBytes: &neg}).check(); err == nil {
		t.Error("negative disk_max_bytes validated")
	}
}

// largeHandler serves one 2 MiB segment (above a 1 MiB max_entry) whose
// stored bytes are data, through the disk tier in dir ("" for none).
func largeHandler(t *testing.T, data []byte, corrupt bool, dir string) (*Handler, *fakeStore, string, *observer.ObservedLogs) {
	h, fs, target, logs, _ := largeHandlerDisk(t, data, corrupt, dir)
	return h, fs, target, logs
}

func largeHandlerDisk(t *testing.T, data []byte, corrupt bool, dir string) (*Handler, *fakeStore, string, *observer.ObservedLogs, *store.DiskTier) {
	t.Helper()
	fs := newFakeStore()
	id := fs.add(data, pub("p1", digestA, testNow.Add(time.Hour)))
	if corrupt {
		bad := bytes.Clone(data)
		bad[len(bad)-10] ^= 0xff
		fs.data[id] = bad
	}
	h := newTestHandler(t, nil, nil)
	logs := observeLogs(h)
	opts := h.Cache.options(time.Duration(h.StoreTimeout), h.now)
	opts.MaxEntry = 1 << 20
	var d *store.DiskTier
	if dir != "" {
		var err error
		d, err = store.NewDiskTier(store.DiskOptions{Dir: dir})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		opts.Disk = d
	}
	h.setStore(store.NewCached(fs, opts))
	return h, fs, "/sync/segments/" + id + "?st=" + mintToken(id, digestA, "aud:p1", testNow.Add(10*time.Minute)), logs, d
}

// serveAbort is serve, returning the value ServeHTTP panicked with.
func serveAbort(t *testing.T, h *Handler, target string, hdr map[string]string) (rec *httptest.ResponseRecorder, panicked any) {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, target, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	repl := caddyhttp.NewTestReplacer(req)
	req = req.WithContext(context.WithValue(req.Context(), caddy.ReplacerCtxKey, repl))
	rec = httptest.NewRecorder()
	func() {
		defer func() { panicked = recover() }()
		if err := h.ServeHTTP(rec, req, nextHandler); err != nil {
			t.Fatalf("ServeHTTP returned %v", err)
		}
	}()
	return rec, panicked
}

// A large segment whose stored bytes do not hash to its id: when headers
// are out by the time that shows, the response is aborted
// (http.ErrAbortHandler) short of its length, with a warning naming no
// partition; through the disk tier the fill may also fail before any
// header (a 503 store fault).
func TestServeLargeCorruptAborts(t *testing.T) {
	data := make([]byte, 2<<20)
	rand.Read(data)
	for _, tc := range []struct{ name, dir string }{
		{"disk tier", t.TempDir()},
		{"no disk tier", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, _, target, logs := largeHandler(t, data, true, tc.dir)
			rec, p := serveAbort(t, h, target, nil)
			if p == nil && tc.dir != "" && rec.Code == http.StatusServiceUnavailable {
				// The fill failed before Get returned: a store fault
				// answered before any header, also never a 200.
				return
			}
			if p != http.ErrAbortHandler {
				t.Fatalf("ServeHTTP panicked with %v (status %d, %d bytes), want http.ErrAbortHandler", p, rec.Code, rec.Body.Len())
			}
			if rec.Body.Len() >= len(data) {
				t.Fatalf("%d of %d bytes written before the abort", rec.Body.Len(), len(data))
			}
			warned := logs.FilterMessageSnippet("do not match their id").All()
			if len(warned) == 0 {
				t.Fatalf("no store-fault warning; logs: %v", logs.All())
			}
			for _, e := range logs.All() {
				for _, f := range e.Context {
					if strings.Contains(f.String, "p1") || strings.Contains(f.String, "st=") {
						t.Fatalf("log line %q leaks %q", e.Message, f.String)
					}
				}
			}
		})
	}
}

// A right large segment through the disk tier: one store read, whole,
// Range, HEAD and 304 right, and the disk tier's metrics count it.
func TestServeLargeFromDiskTier(t *testing.T) {
	data := make([]byte, 2<<20)
	rand.Read(data)
	dir := t.TempDir()
	h, fs, target, _, dc := largeHandlerDisk(t, data, false, dir)
	for range 3 {
		rec, p := serveAbort(t, h, target, nil)
		if p != nil || rec.Code != http.StatusOK || !bytes.Equal(rec.Body.Bytes(), data) {
			t.Fatalf("whole: panic %v, status %d, %d bytes", p, rec.Code, rec.Body.Len())
		}
	}
	rec, _ := serve(t, h, http.MethodGet, target, map[string]string{"Range": "bytes=1000-1999"})
	if rec.Code != http.StatusPartialContent || !bytes.Equal(rec.Body.Bytes(), data[1000:2000]) {
		t.Fatalf("range: %d, %d bytes", rec.Code, rec.Body.Len())
	}
	rec, _ = serve(t, h, http.MethodHead, target, nil)
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Length") != "2097152" || rec.Body.Len() != 0 {
		t.Fatalf("head: %d %v", rec.Code, rec.Header())
	}
	rec, _ = serve(t, h, http.MethodGet, target, map[string]string{"If-None-Match": rec.Header().Get("ETag")})
	if rec.Code != http.StatusNotModified {
		t.Fatalf("conditional: %d", rec.Code)
	}
	if _, opens := fs.counts(); opens != 1 {
		t.Fatalf("store opened %d times, want 1", opens)
	}

	col := newScrapeCollector("test_")
	col.addDisk(dc)
	for name, want := range map[string]float64{"test_disk_files": 1, "test_disk_fills_total": 1, "test_disk_hits_total": 3, "test_disk_bytes": 2 << 20} {
		if got := collectOne(t, col, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
}

// collectOne is the value of the metric name among c's.
func collectOne(t *testing.T, c prometheus.Collector, name string) float64 {
	t.Helper()
	all := make(chan prometheus.Metric, 64)
	c.Collect(all)
	close(all)
	for m := range all {
		if strings.Contains(m.Desc().String(), `"`+name+`"`) {
			return metricValue(m)
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// An unusable disk directory costs nothing but a warning: the segment
// streams from the store, verified, and is answered 200.
func TestServeLargeUnusableDiskDirectory(t *testing.T) {
	data := make([]byte, 2<<20)
	rand.Read(data)
	f := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(f, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	h, _, target, _ := largeHandler(t, data, false, filepath.Join(f, "segments"))
	rec, p := serveAbort(t, h, target, nil)
	if p != nil || rec.Code != http.StatusOK || !bytes.Equal(rec.Body.Bytes(), data) {
		t.Fatalf("panic %v, status %d, %d bytes", p, rec.Code, rec.Body.Len())
	}
}

// sendFile hands a complete disk file to the connection's ReadFrom
// as the *io.LimitedReader over *os.File that sendfile needs (no idle
// timeout writer in between); a short file is an error (sendBody checks
// the count: TestSendBodyKinds).
func TestCopyBodyShapes(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "seg")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.Write(bytes.Repeat([]byte("x"), 100))
	f.Seek(0, 0)
	var seen io.Reader
	w := readFromRecorder{seen: &seen}
	n, err := sendFile(w, f, 0, 100)
	if err != nil || n != 100 {
		t.Fatalf("copied %d: %v", n, err)
	}
	if lr, ok := seen.(*io.LimitedReader); !ok || lr.R != io.Reader(f) {
		t.Fatalf("ReadFrom got %T, want an *io.LimitedReader over the file", seen)
	}
}

// readFromRecorder is a connection's writer: it records what ReadFrom got.
type readFromRecorder struct{ seen *io.Reader }

func (w readFromRecorder) Header() http.Header { return http.Header{} }
func (w readFromRecorder) WriteHeader(int)     {}

func (w readFromRecorder) Write(p []byte) (int, error) { return len(p), nil }
func (w readFromRecorder) ReadFrom(r io.Reader) (int64, error) {
	*w.seen = r
	return io.Copy(io.Discard, r)
}

// The disk directory must be the tier's own: system directories fail the
// config check (so `caddy validate` refuses them), a directory holding
// other files fails provisioning and is left as it was, and an empty one
// is marked and used.
func TestDiskDirectoryRules(t *testing.T) {
	db := filepath.Join(t.TempDir(), "sync.db")
	w, err := seed.Create(db, 3)
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	handler := func(dir string) *Handler {
		return &Handler{Keys: []string{strongKey}, Audience: &AudienceConfig{Kind: "template", Template: "aud:{partition}"},
			Store: &StoreConfig{Backend: "sqlite", Path: db}, Cache: &CacheConfig{Disk: dir}}
	}
	for _, dir := range []string{"/", "/etc", "/var", "/tmp", "/home", caddy.AppDataDir(), caddy.AppConfigDir()} {
		h := handler(dir)
		if err := h.setDefaults(); err != nil {
			t.Fatal(err)
		}
		err := h.checkConfig()
		if err == nil || !strings.Contains(err.Error(), "is a system directory") || !strings.Contains(err.Error(), dir) {
			t.Errorf("disk %s: %v", dir, err)
		}
	}

	foreign := t.TempDir()
	if err := os.WriteFile(filepath.Join(foreign, "report.pdf"), []byte("keep"), 0o640); err != nil {
		t.Fatal(err)
	}
	err = provision(t, handler(foreign))
	if err == nil || !strings.Contains(err.Error(), "cache disk "+foreign) || !strings.Contains(err.Error(), "is not empty") ||
		!strings.Contains(err.Error(), `"report.pdf"`) {
		t.Fatalf("foreign directory: %v", err)
	}
	if ents, _ := os.ReadDir(foreign); len(ents) != 1 {
		t.Fatalf("the foreign directory changed: %v", ents)
	}

	empty := t.TempDir()
	if err := provision(t, handler(empty)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(empty, disk.MarkerName)); err != nil {
		t.Fatalf("no marker in the adopted directory: %v", err)
	}
	if err := provision(t, handler("off")); err != nil {
		t.Fatal(err)
	}
}

// A disk directory named in the config that cannot be created fails
// provisioning with the directory and the fix named, unless
// disk_best_effort; `caddy validate` checks it the same way and creates
// nothing, neither the directory nor its marker.
func TestDiskDirectoryUnusableFails(t *testing.T) {
	db := filepath.Join(t.TempDir(), "sync.db")
	w, err := seed.Create(db, 3)
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	handler := func(dir string, bestEffort bool) *Handler {
		return &Handler{Keys: []string{strongKey}, Audience: &AudienceConfig{Kind: "template", Template: "aud:{partition}"},
			Store: &StoreConfig{Backend: "sqlite", Path: db}, Cache: &CacheConfig{Disk: dir, DiskBestEffort: bestEffort}}
	}
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(file, "segments")
	err = provision(t, handler(bad, false))
	if err == nil || !strings.Contains(err.Error(), "cache disk "+bad) || !strings.Contains(err.Error(), "is a file, not a directory") ||
		!strings.Contains(err.Error(), "disk_best_effort") {
		t.Fatalf("uncreatable directory: %v", err)
	}
	if err := provision(t, handler(bad, true)); err != nil {
		t.Fatalf("disk_best_effort: %v", err)
	}

	setValidatingOnly(t, true)
	fresh := filepath.Join(t.TempDir(), "a", "segments")
	if err := provision(t, handler(fresh, false)); err != nil {
		t.Fatalf("validating a creatable directory: %v", err)
	}
	if _, err := os.Stat(filepath.Dir(fresh)); !os.IsNotExist(err) {
		t.Fatalf("validating created %s: %v", filepath.Dir(fresh), err)
	}
	if err := provision(t, handler(bad, false)); err == nil || !strings.Contains(err.Error(), "cache disk "+bad) {
		t.Fatalf("validating an uncreatable directory: %v", err)
	}
}

func TestValidatingArgs(t *testing.T) {
	for args, want := range map[string]bool{
		"caddy validate --config x":            true,
		"caddy adapt --config x --validate":    true,
		"caddy adapt --config x":               false,
		"caddy run --config x":                 false,
		"caddy":                                false,
		"caddy reload --config x --force":      false,
		"caddy start --config validate --pidf": false,
	} {
		if got := validatingArgs(strings.Fields(args)); got != want {
			t.Errorf("%q: %v, want %v", args, got, want)
		}
	}
}
