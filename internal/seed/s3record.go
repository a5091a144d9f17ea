package seed

import (
	"encoding/json"

	"github.com/syncular/caddy-syncular/store"
)

// S3Record is the record a current reference S3 writer stores for a
// segment (protocol §5.2), as JSON: the latest publication's fields at
// the top level, every digest in scopeDigests, and the explicit
// publications list (which rules alone when present). The same JSON goes
// into a record object ({prefix}rec/sha256/{hex}.json, plain) or, for an
// older writer, base64url into the x-amz-meta-syncular-record header.
// pubs must not be empty.
func S3Record(segmentID string, pubs ...store.Publication) []byte {
	if len(pubs) == 0 {
		panic("seed: S3Record needs a publication")
	}
	top := pubs[len(pubs)-1]
	var digests []string
	seen := map[string]bool{}
	for _, p := range pubs {
		if !seen[p.ScopeDigest] {
			seen[p.ScopeDigest] = true
			digests = append(digests, p.ScopeDigest)
		}
	}
	rec := struct {
		SegmentID string `json:"segmentId"`
		store.Publication
		ScopeDigests []string            `json:"scopeDigests"`
		Publications []store.Publication `json:"publications"`
	}{segmentID, top, digests, pubs}
	b, err := json.Marshal(rec)
	if err != nil {
		panic("seed: S3Record: " + err.Error()) // plain structs always marshal
	}
	return b
}
