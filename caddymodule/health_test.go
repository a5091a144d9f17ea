package caddymodule

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/syncular/caddy-syncular/store"
)

type fakeBreaker struct {
	since time.Time
	open  bool
}

func (f *fakeBreaker) BreakerOpenSince() (time.Time, bool) { return f.since, f.open }

func TestHealthCaddyfile(t *testing.T) {
	for _, tc := range []struct {
		in, err string
		grace   time.Duration
	}{
		{in: "syncular_health", grace: time.Duration(DefaultHealthGrace)},
		{in: "syncular_health {\n grace 30s\n}", grace: 30 * time.Second},
		{in: "syncular_health {\n grace 0s\n}", grace: 0},
		{in: "syncular_health extra", err: "wrong argument count"},
		{in: "syncular_health {\n grace\n}", err: "wrong argument count"},
		{in: "syncular_health {\n grace 1s 2s\n}", err: "wrong argument count"},
		{in: "syncular_health {\n grace 1s\n grace 2s\n}", err: "grace given twice"},
		{in: "syncular_health {\n grace soon\n}", err: "grace:"},
		{in: "syncular_health {\n verbose\n}", err: "unknown subdirective"},
	} {
		hh := new(HealthHandler)
		err := hh.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.in))
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: err %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%q: %v", tc.in, err)
		}
		if err := hh.Provision(caddy.Context{}); err != nil {
			t.Fatal(err)
		}
		if hh.grace != tc.grace {
			t.Errorf("%q: grace %v, want %v", tc.in, hh.grace, tc.grace)
		}
	}
	neg := caddy.Duration(-time.Second)
	hh := &HealthHandler{Grace: &neg}
	if err := hh.Provision(caddy.Context{}); err != nil || hh.Validate() == nil {
		t.Fatal("negative grace accepted")
	}
}

// TestHealthAnswers: 200 while the breaker is closed or open for less
// than grace, 503 past it; a store shared by two handlers is reported
// once; an unusable disk tier is reported but keeps 200.
func TestHealthAnswers(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	brk := &fakeBreaker{}
	disk, err := store.NewDiskTier(store.DiskOptions{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	a, b := new(Handler), new(Handler)
	healthSet.mu.Lock()
	saved := healthSet.m
	healthSet.m = map[*Handler]healthMember{
		a: {backend: "s3", store: brk, disk: disk},
		b: {backend: "s3", store: brk},
	}
	healthSet.mu.Unlock()
	defer func() {
		healthSet.mu.Lock()
		healthSet.m = saved
		healthSet.mu.Unlock()
	}()
	hh := &HealthHandler{now: func() time.Time { return now }}
	if err := hh.Provision(caddy.Context{}); err != nil {
		t.Fatal(err)
	}
	ask := func(method string) (int, healthReport, string) {
		t.Helper()
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(method, "/healthz", nil).WithContext(context.Background())
		if err := hh.ServeHTTP(rec, req, nil); err != nil {
			t.Fatal(err)
		}
		var rep healthReport
		if method == http.MethodGet {
			if err := json.Unmarshal(rec.Body.Bytes(), &rep); err != nil {
				t.Fatalf("body %q: %v", rec.Body, err)
			}
		}
		return rec.Code, rep, rec.Body.String()
	}
	code, rep, body := ask("GET")
	if code != 200 || rep.Status != "ok" || len(rep.Stores) != 1 || rep.Stores[0].Breaker != "closed" ||
		len(rep.Disks) != 1 || !rep.Disks[0].Usable {
		t.Fatalf("closed: %d %s", code, body)
	}
	brk.open, brk.since = true, now.Add(-5*time.Second)
	if code, rep, body = ask("GET"); code != 200 || rep.Stores[0].Breaker != "open" || rep.Stores[0].OpenSeconds != 5 {
		t.Fatalf("open within grace: %d %s", code, body)
	}
	brk.since = now.Add(-11 * time.Second)
	if code, rep, body = ask("GET"); code != 503 || rep.Status != "unhealthy" {
		t.Fatalf("open past grace: %d %s", code, body)
	}
	if code, _, body = ask("HEAD"); code != 503 || body != "" {
		t.Fatalf("HEAD: %d %q", code, body)
	}
	disk.Close() // a closed tier is not usable
	brk.open = false
	if code, rep, body = ask("GET"); code != 200 || rep.Disks[0].Usable {
		t.Fatalf("disk off: %d %s", code, body)
	}
}
