package store

import (
	"errors"
	"strconv"
)

// The faults a backing store reports in terms the cache and the handler
// understand: a backend (store/sqlite, store/s3) wraps its own errors in
// these, so that nothing above it names a backend's error type.

// ErrCorruptSegment is a store fault: the bytes a store returned for a
// segment id do not hash to it (or are not the record's byteLength long).
// They are never served and never cached.
var ErrCorruptSegment = errors.New("segment bytes do not match their id")

// ErrCorruptRecord marks a segment record that is missing, undecodable or
// inconsistent with its object (protocol §5.2). It is a store fault,
// never ErrNotFound and never a grant. Its messages name the segment id
// and the offending field, never a field's value (a partition id must not
// reach a log a client can see).
var ErrCorruptRecord = errors.New("corrupt segment record")

// ErrRefused means the store answered and refused the request itself (an
// S3 store's 4xx other than a missing key, 408 or 429: access denied, a
// malformed request): the store is up, so it is no outage (Unreadable is
// false), but the request gets no record or bytes. A backend's errors
// match it with errors.Is; they keep their own message.
var ErrRefused = errors.New("store refused the request")

// ErrRangeNotSatisfiable is the sentinel of a store's 416 answer. Errors
// carrying it are *RangeNotSatisfiableError.
var ErrRangeNotSatisfiable = errors.New("range not satisfiable")

// RangeNotSatisfiableError is a store's 416 (an S3 store's): the
// requested range does not overlap the object. Size is the object's length when the store
// said so (Content-Range: bytes */N), else -1 (versitygw and AWS do not
// send it on 416; use the record's ByteLength).
type RangeNotSatisfiableError struct {
	// Size is the object's length, -1 when the store did not say.
	Size int64
}

func (e *RangeNotSatisfiableError) Error() string {
	if e.Size >= 0 {
		return "store: range not satisfiable (object size " + strconv.FormatInt(e.Size, 10) + ")"
	}
	return "store: range not satisfiable"
}

// Is makes errors.Is(err, ErrRangeNotSatisfiable) true.
func (e *RangeNotSatisfiableError) Is(target error) bool { return target == ErrRangeNotSatisfiable }
