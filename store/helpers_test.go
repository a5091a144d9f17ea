package store_test

import (
	"testing"

	"github.com/syncular/caddy-syncular/segid"
	"github.com/syncular/caddy-syncular/store"
)

// Small helpers of the tests of Cached in front of a real backend; the
// backends themselves are opened with internal/storetest.

// expiry is the ExpiresAtMs of rec's first publication.
func expiry(t *testing.T, rec *store.Record, err error) int64 {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Publications) == 0 {
		t.Fatal("no publications")
	}
	return rec.Publications[0].ExpiresAtMs
}

// idOf is the parsed ID of the segment id s; the zero ID (which every
// layer refuses) when s is not one, so a test of a bad id keeps its case.
func idOf(s string) segid.ID {
	id, _ := segid.ParseID(s)
	return id
}
