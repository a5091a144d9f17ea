package presign

import (
	"context"
	"testing"

	"github.com/syncular/caddy-syncular/store/s3"
)

// TestS3CachedURL: CachedURL answers exactly what URL would from its
// cache, and nothing before URL signed it.
func TestS3CachedURL(t *testing.T) {
	st := s3tStore(t, s3.Options{Prefix: "syncular/"})
	p := s3tPresigner(t, st, S3Options{})
	for _, tc := range []struct{ now, notAfter float64 }{{1, 1e6}, {100, 130}, {200.5, 201.9}} {
		now, notAfter := s3tAt(tc.now), s3tAt(tc.notAfter)
		if _, _, ok := p.CachedURL(idOf(s3tSeg), now, notAfter); ok {
			t.Fatalf("%v: hit before any URL was signed", tc)
		}
		u, exp, err := p.URL(context.Background(), idOf(s3tSeg), now, notAfter)
		if err != nil {
			t.Fatal(err)
		}
		cu, cexp, ok := p.CachedURL(idOf(s3tSeg), now, notAfter)
		if !ok || cu != u || !cexp.Equal(exp) {
			t.Fatalf("%v: CachedURL = %q %v %v, URL = %q %v", tc, cu, cexp, ok, u, exp)
		}
	}
	if _, _, ok := p.CachedURL(idOf(s3tSeg), s3tAt(5), s3tAt(5)); ok {
		t.Fatal("hit for an ended grant")
	}
	// A grant too short for any URL (no whole second strictly between now
	// and notAfter) is never a hit, not even after URL was asked.
	if _, _, err := p.URL(context.Background(), idOf(s3tSeg), s3tAt(200.5), s3tAt(200.9)); err != ErrS3GrantTooShort {
		t.Fatalf("URL for a grant ending within the second: %v", err)
	}
	if _, _, ok := p.CachedURL(idOf(s3tSeg), s3tAt(200.5), s3tAt(200.9)); ok {
		t.Fatal("hit for a grant too short for a URL")
	}
	if _, _, ok := p.CachedURL(idOf("sha256:xyz"), s3tAt(1), s3tAt(1e6)); ok {
		t.Fatal("hit for a malformed id")
	}
}
