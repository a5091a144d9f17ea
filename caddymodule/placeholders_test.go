package caddymodule

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// The {http.syncular.*} placeholders read as Replacer.Set made them:
// unknown until the handler decides them, the decided value after, and
// overwritten (never shadowed) when the handler runs a second time on the
// same request, as an error route could make it.
//
// Both with the vars map Caddy's server gives every request (where the
// handler finds its placeholders again) and without one.
func TestPlaceholdersTwoPasses(t *testing.T) {
	for _, withVars := range []bool{true, false} {
		name := "vars"
		if !withVars {
			name = "no_vars"
		}
		t.Run(name, func(t *testing.T) { placeholdersTwoPasses(t, withVars) })
	}
}

func placeholdersTwoPasses(t *testing.T, withVars bool) {
	fs := newFakeStore()
	id := fs.add([]byte("placeholder bytes"), pub("p1", digestA, testNow.Add(time.Hour)))
	h := newTestHandler(t, fs, nil)

	req := httptest.NewRequest(http.MethodGet, "/sync/segments/"+id+"?st=forged", nil)
	repl := caddyhttp.NewTestReplacer(req)
	ctx := context.WithValue(req.Context(), caddy.ReplacerCtxKey, repl)
	if withVars {
		ctx = context.WithValue(ctx, caddyhttp.VarsCtxKey, map[string]any{})
	}
	req = req.WithContext(ctx)
	for _, name := range placeholderNames {
		if v, ok := repl.Get(placeholderPrefix + name); ok {
			t.Fatalf("%s known before the handler ran: %v", name, v)
		}
	}

	// Pass 1: a forged token is refused after the segment id is known.
	rec := httptest.NewRecorder()
	if err := h.ServeHTTP(rec, req, nextHandler); err != nil {
		t.Fatal(err)
	}
	wantError(t, rec, 403, "sync.forbidden")
	want := map[string]string{"segment_id": id, "outcome": "sync.forbidden", "key_slot": "none"}
	for k, v := range want {
		if got := replString(repl, placeholderPrefix+k); got != v {
			t.Errorf("pass 1: %s = %q, want %q", k, got, v)
		}
	}
	reason := replString(repl, placeholderPrefix+"reason")
	if reason == "" {
		t.Errorf("pass 1: no reason")
	}
	if _, ok := repl.Get(placeholderPrefix + "delivery"); ok {
		t.Errorf("pass 1: delivery known on a refusal")
	}
	first, _ := repl.Get(placeholderState)

	// Pass 2 on the same request, with a good token: granted. The reason
	// of pass 1 stays (pass 2 does not publish one), the rest is pass 2's.
	req.URL.RawQuery = "st=" + mintToken(id, digestA, "aud:p1", testNow.Add(10*time.Minute))
	rec = httptest.NewRecorder()
	if err := h.ServeHTTP(rec, req, nextHandler); err != nil {
		t.Fatal(err)
	}
	if rec.Code != http.StatusOK {
		t.Fatalf("pass 2: %d %s", rec.Code, rec.Body)
	}
	want = map[string]string{"segment_id": id, "outcome": "granted", "key_slot": "1", "delivery": "serve", "reason": reason}
	for k, v := range want {
		if got := replString(repl, placeholderPrefix+k); got != v {
			t.Errorf("pass 2: %s = %q, want %q", k, got, v)
		}
	}
	if second, _ := repl.Get(placeholderState); second != first || first == nil {
		t.Errorf("pass 2 added a second provider (%p, %p)", first, second)
	}
	if _, ok := repl.Get(placeholderPrefix + "unknown"); ok {
		t.Errorf("an unknown http.syncular placeholder is known")
	}
}
