package caddymodule

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/syncular/caddy-syncular/internal/seed"
	"github.com/syncular/caddy-syncular/store"
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
	t.Setenv("SYNCULAR_TEST_KEY", "s3cr3t-from-env")
	t.Setenv("SYNCULAR_TEST_EMPTY", "")

	tmpl := &AudienceConfig{Kind: "template", Template: "aud:{partition}"}
	sqlite := func(p string) *StoreConfig { return &StoreConfig{Backend: "sqlite", Path: p} }
	cases := []struct {
		name string
		h    Handler
		want string
	}{
		{"ok with env key", Handler{Keys: []string{"{env.SYNCULAR_TEST_KEY}"}, Audience: tmpl, Store: sqlite(db)}, ""},
		{"no key", Handler{Audience: tmpl, Store: sqlite(db)}, "at least one key is required"},
		{"unset env key", Handler{Keys: []string{"{env.SYNCULAR_TEST_EMPTY}"}, Audience: tmpl, Store: sqlite(db)}, "key 1 is empty"},
		{"bad hex key", Handler{Keys: []string{"hex:zz-secret-zz"}, Audience: tmpl, Store: sqlite(db)}, "key 1"},
		{"no audience", Handler{Keys: []string{"k"}, Store: sqlite(db)}, "an audience rule is required"},
		{"template without partition", Handler{Keys: []string{"k"}, Audience: &AudienceConfig{Kind: "template", Template: "aud:fixed"}, Store: sqlite(db)}, "must contain {partition}"},
		{"hmac audience unset env", Handler{Keys: []string{"k"}, Audience: &AudienceConfig{Kind: "hmac_sha256", Key: "{env.SYNCULAR_TEST_EMPTY}"}, Store: sqlite(db)}, "audience hmac_sha256 key is empty"},
		{"no store", Handler{Keys: []string{"k"}, Audience: tmpl}, "a store is required"},
		{"missing file", Handler{Keys: []string{"k"}, Audience: tmpl, Store: sqlite(filepath.Join(dir, "nope.db"))}, "opening sqlite store"},
		{"not sqlite", Handler{Keys: []string{"k"}, Audience: tmpl, Store: sqlite(notSQLite)}, "opening sqlite store"},
		{"redirect with sqlite", Handler{Keys: []string{"k"}, Audience: tmpl, Store: sqlite(db), Delivery: "redirect"}, "needs an s3 store"},
		{"unknown backend", Handler{Keys: []string{"k"}, Audience: tmpl, Store: &StoreConfig{Backend: "redis"}}, "unknown store backend"},
		{"s3 without bucket", Handler{Keys: []string{"k"}, Audience: tmpl, Store: &StoreConfig{Backend: "s3", S3: &S3Config{}}}, "needs a bucket"},
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
			for _, s := range []string{"s3cr3t-from-env", "zz-secret-zz"} {
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
		h := &Handler{Keys: []string{"k"}, Audience: &AudienceConfig{Kind: "template", Template: "{partition}"}, Store: &StoreConfig{Backend: "sqlite", Path: db}}
		if err := h.Provision(ctx); err != nil {
			t.Fatal(err)
		}
		return h
	}
	old, neu := mk(), mk()
	// Each handler has its own cache in front of the shared handle.
	type wrapper interface{ Inner() store.Store }
	if old.store.(wrapper).Inner() != neu.store.(wrapper).Inner() {
		t.Fatal("two handlers on one file opened two handles")
	}
	if err := old.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if _, err := neu.store.Lookup(context.Background(), "sha256:"+strings.Repeat("0", 64)); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("handle unusable after the old config's cleanup: %v", err)
	}
	if err := neu.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if _, loaded := sqlitePool.References("sqlite:" + db); loaded {
		t.Fatal("handle still pooled after the last cleanup")
	}
}
