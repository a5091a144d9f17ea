package store

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
)

// ErrRangeNotSatisfiable is the sentinel of a 416 answer from the object
// store. Errors carrying it are *RangeNotSatisfiableError.
var ErrRangeNotSatisfiable = errors.New("range not satisfiable")

// RangeNotSatisfiableError is the object store's 416: the requested range
// does not overlap the object. Size is the object's length when the store
// said so (Content-Range: bytes */N), else -1 (versitygw and AWS do not
// send it on 416; use the record's ByteLength).
type RangeNotSatisfiableError struct {
	// Size is the object's length, -1 when the store did not say.
	Size int64
}

func (e *RangeNotSatisfiableError) Error() string {
	if e.Size >= 0 {
		return "store: s3 range not satisfiable (object size " + strconv.FormatInt(e.Size, 10) + ")"
	}
	return "store: s3 range not satisfiable"
}

// Is makes errors.Is(err, ErrRangeNotSatisfiable) true.
func (e *RangeNotSatisfiableError) Is(target error) bool { return target == ErrRangeNotSatisfiable }

// S3Error is a store fault from the object store. Its message is built
// from classified parts only (operation, key, HTTP status, the service's
// error code, a transport class) and never carries credentials, signatures
// or URLs with query strings. Unwrap gives the SDK error for errors.Is
// (e.g. context.DeadlineExceeded).
type S3Error struct {
	Op         string // SDK operation, e.g. "HeadObject"
	Key        string // object key
	StatusCode int    // HTTP status, 0 when no response arrived
	Code       string // the service's error code, e.g. "AccessDenied"
	Reason     string // transport class when no response arrived
	err        error
}

func (e *S3Error) Error() string {
	var b strings.Builder
	b.WriteString("store: s3 ")
	b.WriteString(e.Op)
	b.WriteString(" ")
	b.WriteString(e.Key)
	b.WriteString(": ")
	if e.StatusCode != 0 {
		b.WriteString("HTTP ")
		b.WriteString(strconv.Itoa(e.StatusCode))
		if e.Code != "" {
			b.WriteString(" ")
			b.WriteString(e.Code)
		}
	} else {
		b.WriteString(e.Reason)
	}
	return b.String()
}

func (e *S3Error) Unwrap() error { return e.err }

// Timeout reports whether the call ran out of time.
func (e *S3Error) Timeout() bool { return errors.Is(e.err, context.DeadlineExceeded) }

// s3MapError turns an SDK error into ErrNotFound, a
// *RangeNotSatisfiableError or an *S3Error.
func s3MapError(op, key string, err error) error {
	var (
		nf  *types.NotFound
		nsk *types.NoSuchKey
	)
	if errors.As(err, &nf) || errors.As(err, &nsk) {
		return ErrNotFound
	}
	e, hdr := s3Classify(op, key, err)
	switch {
	case e.StatusCode == http.StatusRequestedRangeNotSatisfiable:
		return &RangeNotSatisfiableError{Size: contentRangeSize(hdr.Get("Content-Range"))}
	case e.StatusCode == http.StatusNotFound && (e.Code == "" || e.Code == "NotFound" || e.Code == "NoSuchKey"):
		// A HEAD 404 has no body: a missing bucket looks the same as a
		// missing key there (Check tells them apart). A GET says
		// NoSuchBucket, which stays a fault.
		return ErrNotFound
	}
	return e
}

// s3Classify describes err as an *S3Error (and returns the response
// headers, if a response arrived).
func s3Classify(op, key string, err error) (*S3Error, http.Header) {
	e := &S3Error{Op: op, Key: key, err: err}
	var hdr http.Header
	var re *smithyhttp.ResponseError
	if errors.As(err, &re) && re.Response != nil {
		e.StatusCode = re.Response.StatusCode
		hdr = re.Response.Header
	}
	var ae smithy.APIError
	if errors.As(err, &ae) {
		e.Code = safeErrorCode(ae.ErrorCode())
	}
	if e.StatusCode == 0 {
		e.Reason = transportReason(err)
	}
	return e, hdr
}

// safeErrorCode keeps an error code only if it looks like one (letters,
// digits, '.', '_', '-'; bounded), so nothing else a server echoes is logged.
func safeErrorCode(c string) string {
	if len(c) > 64 {
		return ""
	}
	for i := 0; i < len(c); i++ {
		b := c[i]
		if !(b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' || b == '.' || b == '_' || b == '-') {
			return ""
		}
	}
	return c
}

func transportReason(err error) string {
	var (
		dnsErr  *net.DNSError
		certErr *tls.CertificateVerificationError
		uaErr   x509.UnknownAuthorityError
		hostErr x509.HostnameError
		netErr  net.Error
		maxErr  *retry.MaxAttemptsError
	)
	reason := "request failed"
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		reason = "timed out"
	case errors.Is(err, context.Canceled):
		reason = "canceled"
	case errors.Is(err, syscall.ECONNREFUSED):
		reason = "connection refused"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		reason = "connection reset"
	case errors.As(err, &dnsErr):
		reason = "dns lookup failed"
	case errors.As(err, &certErr), errors.As(err, &uaErr), errors.As(err, &hostErr):
		reason = "tls certificate rejected"
	case errors.As(err, &netErr) && netErr.Timeout():
		reason = "timed out"
	case strings.Contains(err.Error(), "credential"):
		// Credential resolution failed (default chain empty, STS refused).
		// The SDK's texts name providers, not secrets; keep ours generic.
		reason = "no usable credentials"
	}
	if errors.As(err, &maxErr) {
		reason += " (after " + strconv.Itoa(maxErr.Attempt) + " attempts)"
	}
	return reason
}

// S3ErrorStats counts the faults an S3 store met, by class: the
// object store answered 4xx (other than a missing key, which is not a
// fault) or 5xx, the call ran out of time, or no answer arrived
// (refused, reset, DNS, TLS). A call the client abandoned (canceled) is
// not counted.
type S3ErrorStats struct {
	Status4xx, Status5xx, Timeout, Network uint64
}

// s3ErrorCounts are an S3 store's S3ErrorStats.
type s3ErrorCounts struct {
	status4xx, status5xx, timeout, network atomic.Uint64
}

func (c *s3ErrorCounts) stats() S3ErrorStats {
	return S3ErrorStats{
		Status4xx: c.status4xx.Load(), Status5xx: c.status5xx.Load(),
		Timeout: c.timeout.Load(), Network: c.network.Load(),
	}
}

// count counts err when it is an *S3Error, and returns it.
func (c *s3ErrorCounts) count(err error) error {
	var e *S3Error
	if !errors.As(err, &e) {
		return err
	}
	switch {
	case e.StatusCode >= 500:
		c.status5xx.Add(1)
	case e.StatusCode >= 400:
		c.status4xx.Add(1)
	case e.StatusCode != 0:
		// A 3xx the client does not follow: the store answered, wrongly.
		c.status4xx.Add(1)
	case e.Timeout():
		c.timeout.Add(1)
	case errors.Is(e.err, context.Canceled):
	default:
		c.network.Add(1)
	}
	return err
}

// ErrorStats returns the faults the store met so far, by class.
func (s *S3) ErrorStats() S3ErrorStats { return s.errs.stats() }
