package compress

import (
	"crypto/sha256"
	"encoding/hex"
)

// segmentID is the protocol's id of b: "sha256:" + lowercase hex.
func segmentID(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}
