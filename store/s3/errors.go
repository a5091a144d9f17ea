package s3

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
	"github.com/syncular/caddy-syncular/store"
)

// Error is a store fault from the object store. Its message is built
// from classified parts only (operation, key, HTTP status, the service's
// error code, a transport class) and never carries credentials, signatures
// or URLs with query strings. Unwrap gives the SDK error for errors.Is
// (e.g. context.DeadlineExceeded).
type Error struct {
	Op         string // SDK operation, e.g. "HeadObject"
	Key        string // object key
	StatusCode int    // HTTP status, 0 when no response arrived
	Code       string // the service's error code, e.g. "AccessDenied"
	Reason     string // transport class when no response arrived
	err        error
}

func (e *Error) Error() string {
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

func (e *Error) Unwrap() error { return e.err }

// Is makes errors.Is(err, store.ErrRefused) true for an answer that
// refused the request: any status but a 5xx, 408 or 429 (a 3xx the
// client does not follow included). No answer at all, or one of those,
// is an outage.
func (e *Error) Is(target error) bool {
	if target != store.ErrRefused || e.StatusCode == 0 {
		return false
	}
	s := e.StatusCode
	return s < 500 && s != http.StatusRequestTimeout && s != http.StatusTooManyRequests
}

// Timeout reports whether the call ran out of time.
func (e *Error) Timeout() bool { return errors.Is(e.err, context.DeadlineExceeded) }

// s3MapError turns an SDK error into ErrNotFound, a
// *RangeNotSatisfiableError or an *Error.
func s3MapError(op, key string, err error) error {
	var (
		nf  *types.NotFound
		nsk *types.NoSuchKey
	)
	if errors.As(err, &nf) || errors.As(err, &nsk) {
		return store.ErrNotFound
	}
	e, hdr := s3Classify(op, key, err)
	switch {
	case e.StatusCode == http.StatusRequestedRangeNotSatisfiable:
		return &store.RangeNotSatisfiableError{Size: contentRangeSize(hdr.Get("Content-Range"))}
	case e.StatusCode == http.StatusNotFound && (e.Code == "" || e.Code == "NotFound" || e.Code == "NoSuchKey"):
		// A HEAD 404 has no body: a missing bucket looks the same as a
		// missing key there (Check tells them apart). A GET says
		// NoSuchBucket, which stays a fault.
		return store.ErrNotFound
	}
	return e
}

// s3Classify describes err as an *Error (and returns the response
// headers, if a response arrived).
func s3Classify(op, key string, err error) (*Error, http.Header) {
	e := &Error{Op: op, Key: key, err: err}
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

// ErrorStats counts the faults an S3 store met, by class: the
// object store answered 4xx (other than a missing key, which is not a
// fault) or 5xx, the call ran out of time, or no answer arrived
// (refused, reset, DNS, TLS). A call the client abandoned (canceled) is
// not counted.
type ErrorStats struct {
	Status4xx, Status5xx, Timeout, Network uint64
}

// s3ErrorCounts are an S3 store's ErrorStats.
type s3ErrorCounts struct {
	status4xx, status5xx, timeout, network atomic.Uint64
}

func (c *s3ErrorCounts) stats() ErrorStats {
	return ErrorStats{
		Status4xx: c.status4xx.Load(), Status5xx: c.status5xx.Load(),
		Timeout: c.timeout.Load(), Network: c.network.Load(),
	}
}

// count counts err when it is an *Error, and returns it.
func (c *s3ErrorCounts) count(err error) error {
	var e *Error
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
func (s *Store) ErrorStats() ErrorStats { return s.errs.stats() }

// Report returns the store's ErrorStats (store.Reporter): the cache hands
// them on in FlowStats.Backend.
func (s *Store) Report() any { return s.ErrorStats() }
