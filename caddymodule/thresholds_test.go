package caddymodule

import (
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
)

// TestThresholdWarnings: grace, presign_ttl, store_timeout,
// max_token_length and cache max_bytes each warn past their threshold,
// naming the setting and the reason, and stay quiet at it.
func TestThresholdWarnings(t *testing.T) {
	defer func(f func() int64) { memTotal = f }(memTotal)
	memTotal = func() int64 { return 8 << 30 }
	t.Setenv("GUARD_SEG_KEY", strongKey)
	env := "{env.GUARD_SEG_KEY}"
	tmpl := &AudienceConfig{Kind: "template", Template: "aud:{partition}"}
	sqlite := &StoreConfig{Backend: backendSQLite, Path: "/nonexistent/sync.db"}
	s3 := &StoreConfig{Backend: backendS3, S3: &S3Config{Bucket: "b", AccessKeyID: "AKIDGUARD", SecretAccessKey: env}}
	dur := func(d time.Duration) *caddy.Duration { c := caddy.Duration(d); return &c }
	size := func(n int64) *int64 { return &n }
	base := func(mod func(h *Handler)) Handler {
		h := Handler{Keys: []string{env}, Audience: tmpl, Store: sqlite}
		mod(&h)
		return h
	}
	cases := []struct {
		name string
		h    Handler
		want string // "" no warning
	}{
		{"grace 1h", base(func(h *Handler) { h.Grace = dur(time.Hour) }), ""},
		{"grace 1000000h", base(func(h *Handler) { h.Grace = dur(1000000 * time.Hour) }), "grace 1000000h0m0s is above 1h0m0s: a revocation"},
		{"presign_ttl 1h", base(func(h *Handler) { h.Store = s3; h.PresignTTL = caddy.Duration(time.Hour) }), ""},
		{"presign_ttl 7 days", base(func(h *Handler) { h.Store = s3; h.PresignTTL = caddy.Duration(168 * time.Hour) }), "presign_ttl 168h0m0s is above 1h0m0s: a presigned URL cannot be revoked"},
		{"store_timeout 1m", base(func(h *Handler) { h.StoreTimeout = caddy.Duration(time.Minute) }), ""},
		{"store_timeout 1h", base(func(h *Handler) { h.StoreTimeout = caddy.Duration(time.Hour) }), "store_timeout 1h0m0s is above 1m0s: a request waits"},
		{"max_token_length 65536", base(func(h *Handler) { h.MaxTokenLength = 65536 }), ""},
		{"max_token_length 100000000", base(func(h *Handler) { h.MaxTokenLength = 100000000 }), "max_token_length 100000000 is above 65536"},
		{"max_bytes at memory", base(func(h *Handler) { h.Cache = &CacheConfig{MaxBytes: size(8 << 30)} }), ""},
		{"max_bytes 100TiB", base(func(h *Handler) { h.Cache = &CacheConfig{MaxBytes: size(100 << 40)} }), "cache max_bytes 100 TiB is above this machine's memory (MemTotal 8.0 GiB)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := c.h
			if err := h.setDefaults(); err != nil {
				t.Fatal(err)
			}
			got := h.configWarnings(caddy.NewReplacer())
			if c.want == "" {
				if len(got) != 0 {
					t.Fatalf("warnings at the threshold:\n%s", strings.Join(got, "\n"))
				}
				return
			}
			if len(got) != 1 || !strings.Contains(got[0], c.want) {
				t.Fatalf("warnings %q, want one containing %q", got, c.want)
			}
			if strings.Contains(got[0], strings.TrimPrefix(strongKey, "hex:")) || strings.ContainsAny(got[0], "\n\r") {
				t.Fatalf("warning shows a secret or spans lines: %q", got[0])
			}
		})
	}
}

// TestReadMemTotal: this machine's MemTotal is read (the tests run on
// Linux, where /proc/meminfo exists) and is plausible.
func TestReadMemTotal(t *testing.T) {
	m := readMemTotal()
	if m < 64<<20 || m > 1<<50 {
		t.Fatalf("MemTotal %d bytes", m)
	}
}
