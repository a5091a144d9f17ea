package compress

import (
	"crypto/sha256"
	"encoding/hex"

	"github.com/syncular/caddy-syncular/segid"
)

// segmentID is the protocol's id of b: "sha256:" + lowercase hex.
func segmentID(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// idOf is the ID of the segment id s: the zero ID (which Verify and
// Variant refuse) when s is not one.
func idOf(s string) segid.ID {
	id, _ := segid.ParseID(s)
	return id
}
