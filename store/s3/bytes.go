package s3

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	smithyhttp "github.com/aws/smithy-go/transport/http"

	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"

	"github.com/aws/aws-sdk-go-v2/aws"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/syncular/caddy-syncular/segid"
	"github.com/syncular/caddy-syncular/store"
)

// Object is a GET of a segment object, for a handler that forwards a
// client's Range header and answers 200/206 itself.
type Object struct {
	// Body streams the bytes; the caller closes it. It lives under the
	// context given to OpenRange (not under the store's timeout).
	Body io.ReadCloser
	// StatusCode is 200 (whole object) or 206 (a range).
	StatusCode int
	// ContentLength is the number of bytes in Body.
	ContentLength int64
	// ContentRange is the store's Content-Range ("bytes a-b/size") for a
	// 206, else "".
	ContentRange string
	// Size is the whole object's length: from ContentRange on a 206, from
	// ContentLength on a 200, -1 when unknown.
	Size int64
}

// Open returns the bytes of id from off, n bytes long (n < 0: to the
// end), streamed from one GetObject, cut at the object's end as the Store
// contract says. n == 0 returns an empty body without a request; the
// store's 416 for an offset at or past the end (the only 416 a range built
// here can get) is an empty body too.
func (s *Store) Open(ctx context.Context, id segid.ID, off, n int64) (io.ReadCloser, error) {
	if id.IsZero() {
		return nil, fmt.Errorf("store: s3 open: %w", store.ErrNotFound)
	}
	if off < 0 {
		return nil, errors.New("store: s3 open: negative offset")
	}
	if n == 0 {
		return io.NopCloser(strings.NewReader("")), nil
	}
	var rng string
	switch {
	case n > 0:
		rng = "bytes=" + strconv.FormatInt(off, 10) + "-" + strconv.FormatInt(off+n-1, 10)
	case off > 0:
		rng = "bytes=" + strconv.FormatInt(off, 10) + "-"
	}
	obj, err := s.OpenRange(ctx, id, rng)
	if errors.Is(err, store.ErrRangeNotSatisfiable) {
		return io.NopCloser(strings.NewReader("")), nil
	}
	if err != nil {
		return nil, err
	}
	return obj.Body, nil
}

// OpenRange GETs the object of id, passing rangeHeader (a client's
// Range header, "" for none) through verbatim. The store's timeout bounds
// the wait for the response headers; the body then streams under ctx. A 416
// is a *RangeNotSatisfiableError (errors.Is ErrRangeNotSatisfiable); a
// missing object is ErrNotFound; everything else failing is a fault.
func (s *Store) OpenRange(ctx context.Context, id segid.ID, rangeHeader string) (*Object, error) {
	if id.IsZero() {
		return nil, fmt.Errorf("store: s3 open: %w", store.ErrNotFound)
	}
	key := s.ObjectKey(id)
	in := &awss3.GetObjectInput{Bucket: &s.bucket, Key: &key}
	if rangeHeader != "" {
		in.Range = aws.String(rangeHeader)
	}

	// The timeout must not cut the body stream: cancel on a timer that is
	// stopped once the headers are in, and tie the rest to Body.Close.
	ctx, cancel := context.WithCancelCause(ctx)
	timer := time.AfterFunc(s.timeout, func() { cancel(context.DeadlineExceeded) })
	out, err := s.client.GetObject(ctx, in)
	stopped := timer.Stop()
	if err != nil {
		cancel(nil)
		if !stopped && errors.Is(err, context.Canceled) {
			err = fmt.Errorf("%w: %w", context.DeadlineExceeded, err)
		}
		return nil, s.errs.count(s3MapError("GetObject", key, err))
	}
	if !stopped {
		// The timer fired after the headers arrived: the body's context is
		// already canceled.
		out.Body.Close()
		cancel(nil)
		return nil, s.errs.count(s3MapError("GetObject", key, context.DeadlineExceeded))
	}
	obj := &Object{
		Body:          &s3Body{ReadCloser: out.Body, ctx: ctx, cancel: func() { cancel(nil) }},
		StatusCode:    http.StatusOK,
		ContentLength: aws.ToInt64(out.ContentLength),
		ContentRange:  aws.ToString(out.ContentRange),
		Size:          -1,
	}
	if raw, ok := awsmiddleware.GetRawResponse(out.ResultMetadata).(*smithyhttp.Response); ok && raw != nil {
		obj.StatusCode = raw.StatusCode
	} else if obj.ContentRange != "" {
		obj.StatusCode = http.StatusPartialContent
	}
	if obj.StatusCode == http.StatusPartialContent {
		obj.Size = contentRangeSize(obj.ContentRange)
	} else if out.ContentLength != nil {
		obj.Size = *out.ContentLength
	}
	return obj, nil
}

// s3Body cancels the GET's context when the body is closed, and stops
// reading once that context ends: bytes the transport had already
// buffered are not handed to a caller that has gone.
type s3Body struct {
	io.ReadCloser
	ctx    context.Context
	once   sync.Once
	cancel func()
}

func (b *s3Body) Read(p []byte) (int, error) {
	if b.ctx.Err() != nil {
		return 0, context.Cause(b.ctx)
	}
	return b.ReadCloser.Read(p)
}

func (b *s3Body) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(b.cancel)
	return err
}

// contentRangeSize parses the size of "bytes a-b/size" or "bytes */size";
// -1 when absent or "*".
func contentRangeSize(cr string) int64 {
	i := strings.LastIndexByte(cr, '/')
	if i < 0 {
		return -1
	}
	n, err := strconv.ParseInt(strings.TrimSpace(cr[i+1:]), 10, 64)
	if err != nil || n < 0 {
		return -1
	}
	return n
}
