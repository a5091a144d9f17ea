package store

import (
	"context"
	"errors"
	"net/http"
	"syscall"
	"testing"

	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// TestS3ErrorCounts: each fault is counted once, in its class; a missing
// key, a canceled call and an error that is not an S3 fault are not.
func TestS3ErrorCounts(t *testing.T) {
	status := func(code int) error {
		return &smithyhttp.ResponseError{Response: &smithyhttp.Response{Response: &http.Response{StatusCode: code, Header: http.Header{}}}, Err: errors.New("x")}
	}
	var c s3ErrorCounts
	for _, err := range []error{
		s3MapError("GetObject", "k", status(500)),
		s3MapError("GetObject", "k", status(503)),
		s3MapError("GetObject", "k", status(403)),
		s3MapError("GetObject", "k", status(404)), // a missing key: ErrNotFound
		s3MapError("GetObject", "k", context.DeadlineExceeded),
		s3MapError("GetObject", "k", context.Canceled),
		s3MapError("GetObject", "k", syscall.ECONNREFUSED),
		ErrCorruptRecord,
	} {
		if got := c.count(err); got != err {
			t.Fatalf("count changed the error: %v -> %v", err, got)
		}
	}
	want := S3ErrorStats{Status4xx: 1, Status5xx: 2, Timeout: 1, Network: 1}
	if got := c.stats(); got != want {
		t.Fatalf("stats %+v, want %+v", got, want)
	}
}
