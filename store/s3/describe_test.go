package s3_test

import (
	"context"
	"testing"

	"github.com/syncular/caddy-syncular/internal/s3test"
	"github.com/syncular/caddy-syncular/internal/storetest"
)

// TestS3DescribeLayouts writes a segment in each layout into versitygw
// and checks which objects Describe reports.
func TestS3DescribeLayouts(t *testing.T) {
	srv := s3test.Start(t)
	srv.CreateBucket(t, storetest.S3Bucket)
	c := srv.Client()
	const prefix = "inspect/"
	st := storetest.S3Store(t, srv, prefix, nil)
	ctx := context.Background()

	recOnly := []byte("describe: record object only")
	hdrOnly := []byte("describe: legacy header only")
	both := []byte("describe: record object and header")
	bare := []byte("describe: bytes without a record")
	idRec := s3test.PutSegment(t, c, storetest.S3Bucket, prefix, recOnly, "")
	s3test.PutRecordObject(t, c, storetest.S3Bucket, prefix, idRec, storetest.S3RecordMap(recOnly, nil))
	idHdr := s3test.PutSegment(t, c, storetest.S3Bucket, prefix, hdrOnly, s3test.RecordHeader(storetest.S3RecordMap(hdrOnly, nil)))
	idBoth := s3test.PutSegment(t, c, storetest.S3Bucket, prefix, both, s3test.RecordHeader(storetest.S3RecordMap(both, nil)))
	s3test.PutRecordObject(t, c, storetest.S3Bucket, prefix, idBoth, storetest.S3RecordMap(both, nil))
	idBare := s3test.PutSegment(t, c, storetest.S3Bucket, prefix, bare, "")
	idGone := s3test.SegmentID([]byte("never written"))

	cases := []struct {
		name               string
		id                 string
		bytes, hdr, recObj bool
		size               int
		recLen             int
		layout             string
	}{
		{"record object", idRec, true, false, true, len(recOnly), len(s3test.RecordJSON(storetest.S3RecordMap(recOnly, nil))), "record object"},
		{"header only", idHdr, true, true, false, len(hdrOnly), 0, "legacy x-amz-meta-syncular-record header only (no record object)"},
		{"both", idBoth, true, true, true, len(both), len(s3test.RecordJSON(storetest.S3RecordMap(both, nil))), "record object (the bytes object also carries a legacy x-amz-meta-syncular-record header, which is not read)"},
		{"bare", idBare, true, false, false, len(bare), 0, "bytes without a record (the edge answers not found)"},
		{"missing", idGone, false, false, false, 0, 0, "no bytes object (the edge answers not found)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d, err := st.Describe(ctx, tc.id)
			if err != nil {
				t.Fatal(err)
			}
			if d.Bucket != storetest.S3Bucket || d.Prefix != prefix || d.ObjectKey != s3test.ObjectKey(prefix, tc.id) || d.RecordKey != s3test.RecordKey(prefix, tc.id) {
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
	if d, err := st.Describe(ctx, ""); err != nil || d.Bucket != storetest.S3Bucket || d.ObjectKey != "" {
		t.Errorf("Describe without a segment = %+v, %v", d, err)
	}
	if _, err := st.Describe(ctx, "sha256:nope"); err == nil {
		t.Error("Describe of a malformed id succeeded")
	}
}
