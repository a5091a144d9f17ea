package s3

import (
	"context"
	"errors"
	"net/http"
	"syscall"
	"testing"

	smithyhttp "github.com/aws/smithy-go/transport/http"
	"github.com/syncular/caddy-syncular/store"
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
		store.ErrCorruptRecord,
	} {
		if got := c.count(err); got != err {
			t.Fatalf("count changed the error: %v -> %v", err, got)
		}
	}
	want := ErrorStats{Status4xx: 1, Status5xx: 2, Timeout: 1, Network: 1}
	if got := c.stats(); got != want {
		t.Fatalf("stats %+v, want %+v", got, want)
	}
}

// TestUnreadableS3: the cache tells the S3 store's outages from its
// answers by the core errors an *Error matches (store.ErrRefused), never
// by its type.
func TestUnreadableS3(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&Error{StatusCode: http.StatusForbidden, Code: "AccessDenied"}, false},
		{&Error{StatusCode: http.StatusBadRequest}, false},
		{&Error{StatusCode: http.StatusMovedPermanently}, false},
		{&Error{Op: "HeadObject", Reason: "connection refused", err: syscall.ECONNREFUSED}, true},
		{&Error{StatusCode: 500, Code: "InternalError"}, true},
		{&Error{StatusCode: 503, Code: "SlowDown"}, true},
		{&Error{StatusCode: 429}, true},
		{&Error{StatusCode: http.StatusRequestTimeout}, true},
		{&Error{Reason: "timed out", err: context.DeadlineExceeded}, true},
		{s3MapError("GetObject", "k", &smithyhttp.ResponseError{Response: &smithyhttp.Response{Response: &http.Response{StatusCode: 416, Header: http.Header{}}}, Err: errors.New("x")}), false},
	} {
		if got := store.Unreadable(tc.err); got != tc.want {
			t.Errorf("Unreadable(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// store.Cached finds a backend's stats by assertion.
var _ store.Reporter = (*Store)(nil)
