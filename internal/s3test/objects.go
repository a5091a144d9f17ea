package s3test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
)

// ObjectKey is {prefix}seg/sha256/{hex} for segmentID.
func ObjectKey(prefix, segmentID string) string {
	return prefix + "seg/" + strings.Replace(segmentID, ":", "/", 1)
}

// SegmentID is "sha256:" + hex(sha256(b)).
func SegmentID(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// PutSegment writes b as the reference S3SegmentStore does: key
// {prefix}seg/sha256/{hex}, Content-Type application/octet-stream and, when
// recordHeader is not empty, x-amz-meta-syncular-record: recordHeader. It
// returns the segment id.
func PutSegment(t testing.TB, c *s3.Client, bucket, prefix string, b []byte, recordHeader string) string {
	t.Helper()
	id := SegmentID(b)
	in := &s3.PutObjectInput{
		Bucket:        aws.String(bucket),
		Key:           aws.String(ObjectKey(prefix, id)),
		Body:          bytes.NewReader(b),
		ContentLength: aws.Int64(int64(len(b))),
		ContentType:   aws.String("application/octet-stream"),
	}
	if recordHeader != "" {
		in.Metadata = map[string]string{"syncular-record": recordHeader}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.PutObject(ctx, in); err != nil {
		t.Fatalf("s3test: put %s: %v", id, err)
	}
	return id
}

// DeleteSegment removes the object of segmentID, as a lifecycle rule would.
func DeleteSegment(t testing.TB, c *s3.Client, bucket, prefix, segmentID string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.DeleteObject(ctx, &s3.DeleteObjectInput{
		Bucket: aws.String(bucket), Key: aws.String(ObjectKey(prefix, segmentID)),
	}); err != nil {
		var nsk *types.NoSuchKey
		if !errors.As(err, &nsk) {
			t.Fatalf("s3test: delete %s: %v", segmentID, err)
		}
	}
}

// RecordKey is {prefix}rec/sha256/{hex}.json for segmentID: the record
// object of the current reference writers.
func RecordKey(prefix, segmentID string) string {
	return prefix + "rec/" + strings.Replace(segmentID, ":", "/", 1) + ".json"
}

// PutRecordObject writes the record object of segmentID as the current
// reference S3SegmentStore does: key {prefix}rec/sha256/{hex}.json, the
// record's plain JSON as the body (RecordJSON(rec)), Content-Type
// application/json. Current writers put the bytes with no metadata: pair it
// with PutSegment(..., "").
func PutRecordObject(t testing.TB, c *s3.Client, bucket, prefix, segmentID string, rec any) {
	t.Helper()
	body := RecordJSON(rec)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.PutObject(ctx, &s3.PutObjectInput{
		Bucket:        aws.String(bucket),
		Key:           aws.String(RecordKey(prefix, segmentID)),
		Body:          bytes.NewReader(body),
		ContentLength: aws.Int64(int64(len(body))),
		ContentType:   aws.String("application/json"),
	}); err != nil {
		t.Fatalf("s3test: put record of %s: %v", segmentID, err)
	}
}

// DeleteRecordObject removes the record object of segmentID.
func DeleteRecordObject(t testing.TB, c *s3.Client, bucket, prefix, segmentID string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.DeleteObject(ctx, &s3.DeleteObjectInput{
		Bucket: aws.String(bucket), Key: aws.String(RecordKey(prefix, segmentID)),
	}); err != nil {
		var nsk *types.NoSuchKey
		if !errors.As(err, &nsk) {
			t.Fatalf("s3test: delete record of %s: %v", segmentID, err)
		}
	}
}

// RecordHeader encodes a record as the older reference writers do in the
// x-amz-meta-syncular-record header: base64url without padding of
// RecordJSON(rec).
func RecordHeader(rec any) string {
	return base64.RawURLEncoding.EncodeToString(RecordJSON(rec))
}

// RecordJSON is the UTF-8 JSON of a record. A string, []byte or
// json.RawMessage is taken as the JSON text itself (to keep a given key
// order); anything else is marshalled with encoding/json (HTML characters
// not escaped).
func RecordJSON(rec any) []byte {
	var raw []byte
	switch v := rec.(type) {
	case string:
		raw = []byte(v)
	case []byte:
		raw = v
	case json.RawMessage:
		raw = v
	default:
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(rec); err != nil {
			panic("s3test: RecordJSON: " + err.Error())
		}
		raw = bytes.TrimRight(buf.Bytes(), "\n")
	}
	return raw
}
