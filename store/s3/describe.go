package s3

import (
	"context"
	"errors"

	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/syncular/caddy-syncular/segid"
	"github.com/syncular/caddy-syncular/store"
)

// This file is read-only introspection for an operator's tool: what an
// S3 store holds and in which layout. Nothing here is on the request
// path. Its results name partition ids (the operator's own data); a
// caller that answers clients must not pass them on.

// Description is where an S3 store reads, and for one segment which of
// its objects exist (protocol §5.2).
type Description struct {
	Bucket string
	Prefix string

	// Set when a segment id was given.
	SegmentID string
	ObjectKey string // {prefix}seg/sha256/<hex>
	RecordKey string // {prefix}rec/sha256/<hex>.json

	BytesObject  bool  // the bytes object exists
	BytesLength  int64 // its Content-Length
	LegacyHeader bool  // it carries x-amz-meta-syncular-record
	RecordObject bool  // the record object exists
	RecordLength int64 // its Content-Length
}

// Layout names where the segment's record comes from, the way Lookup
// chooses it: the record object when it exists, else the legacy header.
func (d *Description) Layout() string {
	switch {
	case !d.BytesObject:
		return "no bytes object (the edge answers not found)"
	case d.RecordObject && d.LegacyHeader:
		return "record object (the bytes object also carries a legacy x-amz-meta-syncular-record header, which is not read)"
	case d.RecordObject:
		return "record object"
	case d.LegacyHeader:
		return "legacy x-amz-meta-syncular-record header only (no record object)"
	default:
		return "bytes without a record (the edge answers not found)"
	}
}

// Describe returns the bucket and prefix, and for a segment id (not
// empty) a HEAD of its bytes object and of its record object, under the
// store's timeout. Nothing is read but object headers.
func (s *Store) Describe(ctx context.Context, segmentID string) (*Description, error) {
	d := &Description{Bucket: s.bucket, Prefix: s.prefix}
	if segmentID == "" {
		return d, nil
	}
	id, err := segid.ParseID(segmentID)
	if err != nil {
		return nil, errors.New("store: s3 describe: not a segment id")
	}
	d.SegmentID, d.ObjectKey, d.RecordKey = segmentID, s.ObjectKey(id), s.RecordKey(id)
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	head := func(key string) (*awss3.HeadObjectOutput, error) {
		out, err := s.client.HeadObject(ctx, &awss3.HeadObjectInput{Bucket: &s.bucket, Key: &key})
		if err != nil {
			err = s3MapError("HeadObject", key, err)
			if errors.Is(err, store.ErrNotFound) {
				return nil, nil
			}
			return nil, err
		}
		return out, nil
	}
	out, err := head(d.ObjectKey)
	if err != nil {
		return nil, err
	}
	if out != nil {
		d.BytesObject = true
		if out.ContentLength != nil {
			d.BytesLength = *out.ContentLength
		}
		_, d.LegacyHeader = out.Metadata[RecordMetaKey]
	}
	if out, err = head(d.RecordKey); err != nil {
		return nil, err
	}
	if out != nil {
		d.RecordObject = true
		if out.ContentLength != nil {
			d.RecordLength = *out.ContentLength
		}
	}
	return d, nil
}
