package caddymodule

import (
	"encoding/json"
	"errors"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// TestErrorsNameTheModuleOnce: Caddy puts the module id before every
// error of Provision ("provision http.handlers.syncular_segments: …", as
// `caddy validate`, `caddy run` and a reload print it), so the handler's
// own messages carry no "syncular_segments:" of their own: the id
// appears once. Each case fails in another step of provisioning.
func TestErrorsNameTheModuleOnce(t *testing.T) {
	t.Setenv("XDG_DATA_HOME", t.TempDir())
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	key := "hex:" + strings.Repeat("5a17c3e9", 8)
	base := func() map[string]any {
		return map[string]any{
			"handler":  "syncular_segments",
			"keys":     []string{key},
			"audience": map[string]any{"kind": "template", "template": "aud:{partition}"},
			"store":    map[string]any{"backend": "sqlite", "path": filepath.Join(t.TempDir(), "missing.db")},
			"cache":    map[string]any{"disk": "off"},
		}
	}
	for _, c := range []struct {
		name string
		mod  func(map[string]any)
		want string
	}{
		{"defaults", func(h map[string]any) { h["store_queue"] = -1 }, "store_concurrency, store_queue and store_queue_wait must not be negative"},
		{"ignored setting", func(h map[string]any) { h["presign_ttl"] = "30s" }, "presign_ttl applies to delivery redirect only"},
		{"check", func(h map[string]any) { h["delivery"] = "redirect" }, "delivery redirect needs an s3 store"},
		{"store config", func(h map[string]any) { h["store"] = map[string]any{"backend": "s3"} }, "store s3 needs a bucket"},
		{"secret", func(h map[string]any) { h["keys"] = []string{"{env.SYNCULAR_TEST_UNSET_KEY}"} }, "key 1: environment variable SYNCULAR_TEST_UNSET_KEY is unset or empty"},
		{"store open", func(map[string]any) {}, "opening sqlite store "},
		{"disk tier", func(h map[string]any) { h["cache"] = map[string]any{"disk": "/etc"} }, `cache disk "/etc" is a system directory`},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := base()
			c.mod(h)
			raw, err := json.Marshal(map[string]any{"servers": map[string]any{"srv0": map[string]any{
				"listen": []string{"127.0.0.1:0"},
				"routes": []any{map[string]any{"handle": []any{h}}},
			}}})
			if err != nil {
				t.Fatal(err)
			}
			err = caddy.Validate(&caddy.Config{AppsRaw: caddy.ModuleMap{"http": raw}})
			if err == nil {
				t.Fatal("config accepted")
			}
			msg := err.Error()
			if !strings.Contains(msg, "http.handlers.syncular_segments: "+c.want) {
				t.Errorf("error lacks %q after the module id:\n%s", c.want, msg)
			}
			if n := strings.Count(msg, "syncular_segments:"); n != 1 {
				t.Errorf("the module named %d times:\n%s", n, msg)
			}
		})
	}
}

// TestValidateErrorHasNoPrefix: Validate's errors (Caddy wraps them as
// "http.handlers.syncular_segments: invalid configuration: …") carry no
// prefix of their own either.
func TestValidateErrorHasNoPrefix(t *testing.T) {
	h := &Handler{Untokened: "maybe", Delivery: DeliveryServe}
	err := h.Validate()
	if err == nil || err.Error() != `untokened must be next or reject, not "maybe"` {
		t.Fatalf("Validate: %v", err)
	}
}

// TestProvisionErrorsWrap: a provisioning error wraps its cause (%w), so
// errors.Is still finds it (here: the missing database file).
func TestProvisionErrorsWrap(t *testing.T) {
	h := &Handler{Store: &StoreConfig{Backend: backendSQLite, Path: filepath.Join(t.TempDir(), "missing.db")}}
	if err := h.setDefaults(); err != nil {
		t.Fatal(err)
	}
	err := h.provisionSQLite()
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("provisionSQLite: %v, want an error wrapping fs.ErrNotExist", err)
	}
}
