package store_test

import (
	"context"
	"errors"
	"testing"

	"github.com/syncular/caddy-syncular/internal/s3test"
	"github.com/syncular/caddy-syncular/store"
)

// TestSQLiteDescribeVectors reads the layout and counts of each vector
// store generation (the counts are the files' own, checked once with the
// sqlite3 shell).
func TestSQLiteDescribeVectors(t *testing.T) {
	cases := []struct {
		file                    string
		gen                     int
		logEpoch, pubs, reg     bool
		segments, pubRows, reg2 int64
	}{
		{"segments-gen3.sqlite", 3, true, true, true, 9, 10, 2},
		{"segments-legacy.sqlite", 2, true, false, false, 7, -1, -1},
		{"segments-pre-logepoch.sqlite", 1, false, false, false, 2, -1, -1},
	}
	for _, c := range cases {
		t.Run(c.file, func(t *testing.T) {
			st, err := store.OpenSQLite(copyVector(t, c.file), store.SQLiteOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			d, err := st.Describe(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if d.Generation != c.gen || d.LogEpoch != c.logEpoch || d.PublicationsTable != c.pubs || d.ScopesTable != c.pubs ||
				d.Registry != c.reg || d.Checkpoints {
				t.Errorf("layout = %+v", d)
			}
			if d.Segments != c.segments || d.Publications != c.pubRows || d.RegistryPartitions != c.reg2 || d.CheckpointRows != -1 {
				t.Errorf("counts = %d segments, %d publications, %d registry rows, %d checkpoint rows; want %d, %d, %d, -1",
					d.Segments, d.Publications, d.RegistryPartitions, d.CheckpointRows, c.segments, c.pubRows, c.reg2)
			}
			if d.JournalMode != "delete" || d.SchemaVersion <= 0 {
				t.Errorf("journal mode %q, schema_version %d", d.JournalMode, d.SchemaVersion)
			}
			// Describe leaves the store usable (its own connection).
			if _, err := st.Lookup(context.Background(), "sha256:"+zeros64); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("Lookup after Describe = %v", err)
			}
		})
	}
}

const zeros64 = "0000000000000000000000000000000000000000000000000000000000000000"

// TestPublicationStatesVectors: the state of each publication of the gen-3
// vector at its nowMs, as the vector's cases say the edge answers them.
func TestPublicationStatesVectors(t *testing.T) {
	const now = int64(1800000000000)
	st, err := store.OpenSQLite(copyVector(t, "segments-gen3.sqlite"), store.SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	type want struct{ partition, state string }
	cases := []struct {
		name, id string
		want     []want
	}{
		{"twoPartitions", "sha256:56fabe73ab9525b8a22d7d1e6106405ed70561156572290422af86f657d073ef", []want{{"p1", store.StateExpired}, {"p2", store.StateLive}}},
		{"expiresSoon", "sha256:82e5709df292e929a76049b651d11c53ab4db60c3f983b988a175eece1e506d4", []want{{"p1", store.StateLive}}},
		{"expiredAtNow", "sha256:6a3f3c23ced4a4b6f7d822c7cc50f087b68b93988c2f15dba9a42e0050db57d6", []want{{"p1", store.StateExpired}}},
		{"rotated epoch", "sha256:85bbb6e22770830b7e95162539b02472c1f97c30247ca098253890489cc5d008", []want{{"p1", store.StateFenced}}},
		{"unregistered", "sha256:e509b8d0b760790b98d61ea7fd12a5899856a58c6be0f0097d36f18762e9a8f1", []want{{"p3-unregistered", store.StateFenced}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rec, err := st.Lookup(context.Background(), c.id)
			if err != nil {
				t.Fatal(err)
			}
			got := store.PublicationStates(rec, now)
			if len(got) != len(c.want) {
				t.Fatalf("%d states, want %d", len(got), len(c.want))
			}
			for i, w := range c.want {
				if got[i].Partition != w.partition || got[i].State != w.state {
					t.Errorf("publication %d: %s %s, want %s %s", i, got[i].Partition, got[i].State, w.partition, w.state)
				}
				reg := w.partition != "p3-unregistered"
				if got[i].Registered != reg || (reg && got[i].CurrentEpoch != "e1") {
					t.Errorf("publication %d: registered %v epoch %q", i, got[i].Registered, got[i].CurrentEpoch)
				}
			}
		})
	}
}

// TestPublicationStatesOvertaken: a live publication below its
// partition's checkpoint is overtaken; the checkpoint is reported.
func TestPublicationStatesOvertaken(t *testing.T) {
	rec := &store.Record{
		Publications: []store.Publication{
			{Partition: "a", ScopeDigest: "d", SchemaVersion: 1, ExpiresAtMs: 2000},
			{Partition: "a", ScopeDigest: "d", SchemaVersion: 2, ExpiresAtMs: 2000},
			{Partition: "b", ScopeDigest: "d", SchemaVersion: 1, ExpiresAtMs: 500},
		},
		Checkpoints: map[string]int64{"a": 2, "b": 9},
	}
	got := store.PublicationStates(rec, 1000)
	want := []string{store.StateOvertaken, store.StateLive, store.StateExpired}
	for i, w := range want {
		if got[i].State != w {
			t.Errorf("publication %d: %s, want %s", i, got[i].State, w)
		}
		if !got[i].HasCheckpoint || got[i].Checkpoint != rec.Checkpoints[got[i].Partition] {
			t.Errorf("publication %d: checkpoint %v %d", i, got[i].HasCheckpoint, got[i].Checkpoint)
		}
	}
	if store.PublicationStates(nil, 0) != nil {
		t.Error("states of no record")
	}
}

// TestS3DescribeLayouts writes a segment in each layout into versitygw
// and checks which objects Describe reports.
func TestS3DescribeLayouts(t *testing.T) {
	srv := s3test.Start(t)
	srv.CreateBucket(t, s3Bucket)
	c := srv.Client()
	const prefix = "inspect/"
	st := s3NewStore(t, srv, prefix, nil)
	ctx := context.Background()

	recOnly := []byte("describe: record object only")
	hdrOnly := []byte("describe: legacy header only")
	both := []byte("describe: record object and header")
	bare := []byte("describe: bytes without a record")
	idRec := s3test.PutSegment(t, c, s3Bucket, prefix, recOnly, "")
	s3test.PutRecordObject(t, c, s3Bucket, prefix, idRec, s3RecordMap(recOnly, nil))
	idHdr := s3test.PutSegment(t, c, s3Bucket, prefix, hdrOnly, s3test.RecordHeader(s3RecordMap(hdrOnly, nil)))
	idBoth := s3test.PutSegment(t, c, s3Bucket, prefix, both, s3test.RecordHeader(s3RecordMap(both, nil)))
	s3test.PutRecordObject(t, c, s3Bucket, prefix, idBoth, s3RecordMap(both, nil))
	idBare := s3test.PutSegment(t, c, s3Bucket, prefix, bare, "")
	idGone := s3test.SegmentID([]byte("never written"))

	cases := []struct {
		name               string
		id                 string
		bytes, hdr, recObj bool
		size               int
		recLen             int
		layout             string
	}{
		{"record object", idRec, true, false, true, len(recOnly), len(s3test.RecordJSON(s3RecordMap(recOnly, nil))), "record object"},
		{"header only", idHdr, true, true, false, len(hdrOnly), 0, "legacy x-amz-meta-syncular-record header only (no record object)"},
		{"both", idBoth, true, true, true, len(both), len(s3test.RecordJSON(s3RecordMap(both, nil))), "record object (the bytes object also carries a legacy x-amz-meta-syncular-record header, which is not read)"},
		{"bare", idBare, true, false, false, len(bare), 0, "bytes without a record (the edge answers not found)"},
		{"missing", idGone, false, false, false, 0, 0, "no bytes object (the edge answers not found)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d, err := st.Describe(ctx, tc.id)
			if err != nil {
				t.Fatal(err)
			}
			if d.Bucket != s3Bucket || d.Prefix != prefix || d.ObjectKey != s3test.ObjectKey(prefix, tc.id) || d.RecordKey != s3test.RecordKey(prefix, tc.id) {
				t.Errorf("where = %+v", d)
			}
			if d.BytesObject != tc.bytes || d.LegacyHeader != tc.hdr || d.RecordObject != tc.recObj || d.BytesLength != int64(tc.size) {
				t.Errorf("objects = bytes %v (%d) header %v record %v", d.BytesObject, d.BytesLength, d.LegacyHeader, d.RecordObject)
			}
			if d.RecordLength != int64(tc.recLen) {
				t.Errorf("record length %d", d.RecordLength)
			}
			if got := d.Layout(); got != tc.layout {
				t.Errorf("layout %q, want %q", got, tc.layout)
			}
		})
	}
	if d, err := st.Describe(ctx, ""); err != nil || d.Bucket != s3Bucket || d.ObjectKey != "" {
		t.Errorf("Describe without a segment = %+v, %v", d, err)
	}
	if _, err := st.Describe(ctx, "sha256:nope"); err == nil {
		t.Error("Describe of a malformed id succeeded")
	}
}
