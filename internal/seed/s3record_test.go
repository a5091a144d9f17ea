package seed_test

import (
	"testing"

	"github.com/syncular/caddy-syncular/internal/seed"
	"github.com/syncular/caddy-syncular/store"
	"github.com/syncular/caddy-syncular/store/s3"
)

// The record S3Record writes is read back by the store's own decoder with
// every publication intact, and the explicit list rules.
func TestS3RecordDecodes(t *testing.T) {
	id := seed.SegmentID([]byte("s3 record"))
	a := store.Publication{Partition: "p1", LogEpoch: "e1", Table: "t", SchemaVersion: 1, MediaType: "rows",
		ScopeDigest: "aa", ByteLength: 9, CreatedAtMs: 1, ExpiresAtMs: 100}
	b := a
	b.Partition, b.ScopeDigest, b.ExpiresAtMs = "p2", "bb", 200
	rec, err := s3.DecodeRecordObject(seed.S3Record(id, a, b), id)
	if err != nil {
		t.Fatal(err)
	}
	if rec.ByteLength != 9 || len(rec.Publications) != 2 {
		t.Fatalf("record %+v", rec)
	}
	if rec.Publications[0].Partition != "p1" || rec.Publications[1].ExpiresAtMs != 200 {
		t.Fatalf("publications %+v", rec.Publications)
	}
}
