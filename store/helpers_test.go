package store_test

import "github.com/syncular/caddy-syncular/segid"

// The tests of Cached in front of a real backend open it with
// internal/storetest.

// idOf is the parsed ID of the segment id s; the zero ID (which every
// layer refuses) when s is not one, so a test of a bad id keeps its case.
func idOf(s string) segid.ID {
	id, _ := segid.ParseID(s)
	return id
}
