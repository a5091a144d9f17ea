package caddymodule

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/syncular/caddy-syncular/internal/seed"
)

// Strong test keys (32 random bytes, generated once for these tests).
const (
	strongKey  = "hex:6f1d3c9a0be24a7587e1c05fd2a94b3e8c7160d5a2f94e0b13c68d7fa5e20c4b"
	strongKey2 = "hex:b8a2e75c14f09d36a1c7e48b20fd5a9e63c1b07d8f42a5e91c0d36b7e48f2a15"
)

func provision(t *testing.T, h *Handler) error {
	t.Helper()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	err := h.Provision(ctx)
	if err == nil {
		err = h.Validate()
	}
	// Cleanup must be safe after any Provision, failed or not.
	if cerr := h.Cleanup(); cerr != nil {
		t.Errorf("Cleanup: %v", cerr)
	}
	return err
}

func TestProvisionErrors(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "sync.db")
	w, err := seed.Create(db, 3)
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	notSQLite := filepath.Join(dir, "garbage.db")
	os.WriteFile(notSQLite, []byte("this is not a database, it is a sentence of some length....................................."), 0o644)
	t.Setenv("SYNCULAR_TEST_KEY", "s3cr3t-from-env-0123456789")
	t.Setenv("SYNCULAR_TEST_EMPTY", "")
	t.Setenv("SYNCULAR_TEST_SHORT", "s3cr3t-short")
	os.Unsetenv("SYNCULAR_TEST_MISSING")
	k := strongKey

	tmpl := &AudienceConfig{Kind: "template", Template: "aud:{partition}"}
	sqlite := func(p string) *StoreConfig { return &StoreConfig{Backend: "sqlite", Path: p} }
	cases := []struct {
		name string
		h    Handler
		want string
	}{
		{"ok with env key", Handler{Keys: []string{"{env.SYNCULAR_TEST_KEY}"}, Audience: tmpl, Store: sqlite(db)}, ""},
		{"no key", Handler{Audience: tmpl, Store: sqlite(db)}, "at least one key is required"},
		{"empty env key", Handler{Keys: []string{"{env.SYNCULAR_TEST_EMPTY}"}, Audience: tmpl, Store: sqlite(db)}, "key 1: environment variable SYNCULAR_TEST_EMPTY is unset or empty"},
		{"missing env key", Handler{Keys: []string{k, "{env.SYNCULAR_TEST_MISSING}"}, Audience: tmpl, Store: sqlite(db)}, "key 2: environment variable SYNCULAR_TEST_MISSING is unset or empty"},
		{"missing env key with suffix", Handler{Keys: []string{"{env.SYNCULAR_TEST_MISSING}x"}, Audience: tmpl, Store: sqlite(db)}, "key 1: environment variable SYNCULAR_TEST_MISSING is unset or empty"},
		{"missing env inside a long key", Handler{Keys: []string{"0123456789abcdef{env.SYNCULAR_TEST_MISSING}"}, Audience: tmpl, Store: sqlite(db)}, "environment variable SYNCULAR_TEST_MISSING"},
		{"missing file key", Handler{Keys: []string{"{file." + filepath.Join(dir, "no-key-file") + "}"}, Audience: tmpl, Store: sqlite(db)}, "key 1: file " + filepath.Join(dir, "no-key-file") + " is missing"},
		{"unknown placeholder", Handler{Keys: []string{"0123456789abcdef{zz-secret-zz}"}, Audience: tmpl, Store: sqlite(db)}, "key 1 has a placeholder that is not known at provision"},
		{"escaped brace", Handler{Keys: []string{`0123456789abcdef\{zz-secret-zz\}`}, Audience: tmpl, Store: sqlite(db)}, ""},
		{"short text key", Handler{Keys: []string{"a"}, Audience: tmpl, Store: sqlite(db)}, "key 1 is too short: at least 16 bytes"},
		{"15-byte key", Handler{Keys: []string{"zz-secret-zz-15"}, Audience: tmpl, Store: sqlite(db)}, "key 1 is too short"},
		{"16-byte key", Handler{Keys: []string{"zz-secret-zz-16b"}, Audience: tmpl, Store: sqlite(db)}, ""},
		{"short env key", Handler{Keys: []string{"{env.SYNCULAR_TEST_SHORT}"}, Audience: tmpl, Store: sqlite(db)}, "key 1 is too short"},
		{"hex:00", Handler{Keys: []string{"hex:00"}, Audience: tmpl, Store: sqlite(db)}, "key 1 is too short"},
		{"base64:AAAA", Handler{Keys: []string{k, "base64:AAAA"}, Audience: tmpl, Store: sqlite(db)}, "key 2 is too short"},
		{"32 zero bytes", Handler{Keys: []string{"hex:" + strings.Repeat("00", 32)}, Audience: tmpl, Store: sqlite(db)}, "key 1 is all zero bytes"},
		{"short audience key", Handler{Keys: []string{k}, Audience: &AudienceConfig{Kind: "hmac_sha256", Key: "z"}, Store: sqlite(db)}, "audience hmac_sha256 key is too short"},
		{"zero audience key", Handler{Keys: []string{k}, Audience: &AudienceConfig{Kind: "hmac_sha256", Key: "base64:" + strings.Repeat("A", 43)}, Store: sqlite(db)}, "audience hmac_sha256 key is all zero bytes"},
		{"strong audience key", Handler{Keys: []string{k}, Audience: &AudienceConfig{Kind: "hmac_sha256", Key: strongKey2}, Store: sqlite(db)}, ""},
		{"bad hex key", Handler{Keys: []string{"hex:zz-secret-zz"}, Audience: tmpl, Store: sqlite(db)}, "key 1"},
		{"no audience", Handler{Keys: []string{k}, Store: sqlite(db)}, "an audience rule is required"},
		{"template without partition", Handler{Keys: []string{k}, Audience: &AudienceConfig{Kind: "template", Template: "aud:fixed"}, Store: sqlite(db)}, "must contain {partition}"},
		{"hmac audience unset env", Handler{Keys: []string{k}, Audience: &AudienceConfig{Kind: "hmac_sha256", Key: "{env.SYNCULAR_TEST_EMPTY}"}, Store: sqlite(db)}, "audience hmac_sha256 key: environment variable SYNCULAR_TEST_EMPTY is unset or empty"},
		{"no store", Handler{Keys: []string{k}, Audience: tmpl}, "a store is required"},
		{"missing file", Handler{Keys: []string{k}, Audience: tmpl, Store: sqlite(filepath.Join(dir, "nope.db"))}, "opening sqlite store"},
		{"not sqlite", Handler{Keys: []string{k}, Audience: tmpl, Store: sqlite(notSQLite)}, "opening sqlite store"},
		{"redirect with sqlite", Handler{Keys: []string{k}, Audience: tmpl, Store: sqlite(db), Delivery: "redirect"}, "needs an s3 store"},
		{"unknown backend", Handler{Keys: []string{k}, Audience: tmpl, Store: &StoreConfig{Backend: "redis"}}, "unknown store backend"},
		{"s3 without bucket", Handler{Keys: []string{k}, Audience: tmpl, Store: &StoreConfig{Backend: "s3", S3: &S3Config{}}}, "needs a bucket"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := c.h
			err := provision(t, &h)
			if c.want == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want %q", err, c.want)
			}
			if strings.Contains(c.want, "too short") || strings.Contains(c.want, "all zero") {
				if !strings.Contains(err.Error(), "openssl rand -hex 32") {
					t.Errorf("weak-key error does not say how to make a key: %v", err)
				}
			}
			for _, s := range []string{"s3cr3t-from-env", "s3cr3t-short", "zz-secret-zz", strongKey, "AAAA"} {
				if strings.Contains(err.Error(), s) {
					t.Fatalf("error echoes a secret: %v", err)
				}
			}
		})
	}
}

// TestSQLiteHandleShared: two handlers on one file share one handle, and
// it stays open until the last one is cleaned up (a config reload).
func TestSQLiteHandleShared(t *testing.T) {
	db := filepath.Join(t.TempDir(), "sync.db")
	w, err := seed.Create(db, 3)
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	mk := func() *Handler {
		h := &Handler{Keys: []string{strongKey}, Audience: &AudienceConfig{Kind: "template", Template: "{partition}"}, Store: &StoreConfig{Backend: "sqlite", Path: db}}
		if err := h.Provision(ctx); err != nil {
			t.Fatal(err)
		}
		return h
	}
	old, neu := mk(), mk()
	// Each handler has its own cache in front of the shared handle.
	if old.backend != neu.backend {
		t.Fatal("two handlers on one file opened two handles")
	}
	if err := old.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if _, err := neu.store.Lookup(context.Background(), idOf("sha256:"+strings.Repeat("0", 64))); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("handle unusable after the old config's cleanup: %v", err)
	}
	if err := neu.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if _, loaded := sqlitePool.References("sqlite:" + db); loaded {
		t.Fatal("handle still pooled after the last cleanup")
	}
}

// TestSkewZeroIsZero: "skew": 0 (JSON) and `skew 0s` (Caddyfile) mean no
// skew at all; only an absent skew is the 60 s default.
func TestSkewZeroIsZero(t *testing.T) {
	for _, c := range []struct {
		json string
		want time.Duration
	}{
		{`{}`, 60 * time.Second},
		{`{"skew": 0}`, 0},
		{`{"skew": 5000000000}`, 5 * time.Second},
		{`{"skew": "90s"}`, 90 * time.Second},
	} {
		var h Handler
		if err := json.Unmarshal([]byte(c.json), &h); err != nil {
			t.Fatal(err)
		}
		if err := h.setDefaults(); err != nil {
			t.Fatal(err)
		}
		if h.skew != c.want {
			t.Errorf("%s: skew %v, want %v", c.json, h.skew, c.want)
		}
	}
	// A provisioned handler round-trips an explicit zero.
	var h Handler
	if err := json.Unmarshal([]byte(`{"skew": 0}`), &h); err != nil {
		t.Fatal(err)
	}
	if b, _ := json.Marshal(&h); !strings.Contains(string(b), `"skew":0`) {
		t.Errorf("explicit zero skew lost on marshal: %s", b)
	}

	fs := newFakeStore()
	id := fs.add([]byte("skew bytes"), pub("p1", digestA, testNow.Add(time.Hour)))
	zero := caddy.Duration(0)
	for _, c := range []struct {
		name   string
		skew   *caddy.Duration
		past   time.Duration // token exp this long before now
		status int
	}{
		{"zero skew, exp now", &zero, 0, 200},
		{"zero skew, 1s past exp", &zero, time.Second, 403},
		{"default skew, 59s past exp", nil, 59 * time.Second, 200},
		{"default skew, 60s past exp", nil, 60 * time.Second, 200},
		{"default skew, 61s past exp", nil, 61 * time.Second, 403},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newTestHandler(t, fs, func(h *Handler) { h.Skew = c.skew })
			rec, _ := serve(t, h, "GET", "/segments/"+id+"?st="+mintToken(id, digestA, "aud:p1", testNow.Add(-c.past)), nil)
			if c.status == 403 {
				wantError(t, rec, 403, "sync.forbidden")
			} else if rec.Code != c.status {
				t.Fatalf("status %d, want %d: %s", rec.Code, c.status, rec.Body)
			}
		})
	}
}

// TestZeroDurationsRefusedInCaddyfile: presign_ttl, store_timeout and
// max_token_length have no meaningful zero; an explicit 0 is an error, not
// the default.
func TestZeroDurationsRefusedInCaddyfile(t *testing.T) {
	for _, in := range []string{
		"syncular_segments {\n presign_ttl 0s\n}",
		"syncular_segments {\n store_timeout 0\n}",
		"syncular_segments {\n max_token_length 0\n}",
	} {
		err := new(Handler).UnmarshalCaddyfile(caddyfile.NewTestDispenser(in))
		if err == nil || !strings.Contains(err.Error(), "positive") {
			t.Errorf("%q: error %v, want a refusal", in, err)
		}
	}
	for _, c := range []struct {
		in   string
		want *caddy.Duration
	}{
		{"syncular_segments {\n skew 0s\n}", new(caddy.Duration)},
		{"syncular_segments {\n skew 0\n}", new(caddy.Duration)},
		{"syncular_segments {\n key k\n}", nil},
	} {
		h := new(Handler)
		if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(c.in)); err != nil {
			t.Fatal(err)
		}
		if (h.Skew == nil) != (c.want == nil) || (h.Skew != nil && *h.Skew != *c.want) {
			t.Errorf("%q: skew %v, want %v", c.in, h.Skew, c.want)
		}
	}
}

// TestConfigCheckedBeforeStoreOpened: every check of the options runs
// before a store is opened. delivery redirect with a sqlite store is
// refused without touching the database file (before, the file was
// opened and Validate refused the config afterwards), and an out-of-range
// presign_ttl is refused before the S3 store is built and its bucket
// probed.
func TestConfigCheckedBeforeStoreOpened(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "never-created.db")
	db := filepath.Join(dir, "sync.db")
	w, err := seed.Create(db, 3)
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	tmpl := &AudienceConfig{Kind: "template", Template: "aud:{partition}"}
	for _, path := range []string{missing, db} {
		h := &Handler{Keys: []string{strongKey}, Audience: tmpl, Delivery: DeliveryRedirect,
			Store: &StoreConfig{Backend: backendSQLite, Path: path}}
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		err := h.Provision(ctx)
		if err == nil || !strings.Contains(err.Error(), "delivery redirect needs an s3 store") {
			t.Fatalf("%s: Provision error %v, want the delivery refused", path, err)
		}
		if _, loaded := sqlitePool.References("sqlite:" + path); loaded || h.store != nil {
			t.Fatalf("%s: the database was opened before the config was refused", path)
		}
		if err := h.Cleanup(); err != nil {
			t.Fatal(err)
		}
		cancel()
	}
	if _, err := os.Stat(missing); !os.IsNotExist(err) {
		t.Fatalf("database path touched: %v", err)
	}

	// An S3 endpoint nothing listens on: reaching it would fail with
	// "unreachable", after the store_timeout.
	for _, ttl := range []time.Duration{8 * 24 * time.Hour, 1500 * time.Millisecond} {
		h := &Handler{Keys: []string{strongKey}, Audience: tmpl, Delivery: DeliveryRedirect,
			PresignTTL: caddy.Duration(ttl), StoreTimeout: caddy.Duration(time.Minute),
			Store: &StoreConfig{Backend: backendS3, S3: &S3Config{Bucket: "b", Region: "r", Endpoint: "http://127.0.0.1:1"}}}
		err := provision(t, h)
		if err == nil || !strings.Contains(err.Error(), "presign_ttl must be whole seconds") {
			t.Fatalf("presign_ttl %v: error %v, want it refused before the bucket is probed", ttl, err)
		}
	}
}
