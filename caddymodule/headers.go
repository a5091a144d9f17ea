package caddymodule

import (
	"net/http"
	"strconv"
	"sync"

	"github.com/syncular/caddy-syncular/compress"
)

// The headers of a granted answer and of a redirect (respond.go plans
// them), built from texts made once where they can be.

// setGrantHeaders sets the headers of every successful answer: the ETag
// of the representation (compress.ETag), and a Cache-Control that lets
// only the client's own cache keep the answer (tenant data behind a
// short-lived grant), for maxAge seconds.
func setGrantHeaders(hdr http.Header, segID string, coding compress.Coding, maxAge int64) {
	vals := make([]string, 2)
	vals[0], vals[1], _ = grantHeaderText(segID, coding, maxAge, -1)
	hdr["Etag"], hdr["Cache-Control"] = vals[0:1:1], vals[1:2:2]
}

// setRedirectHeaders sets the headers of a redirect: the Location, and a
// Cache-Control that lets only the client's own cache keep the 302 while
// its URL is valid (maxAge seconds). The two values share one slice, each
// capped at its own element so an append elsewhere copies.
//
// A 302 carries no ETag: a cache revalidating a stale 302 with
// If-None-Match would, on a 304, keep its stored Location, a presigned
// URL that has expired by then. The redirect answer ignores
// If-None-Match altogether, as RFC 9110 section 13.2.1 requires of an
// answer that would not be 2xx without the precondition.
func setRedirectHeaders(hdr http.Header, maxAge int64, location string) {
	vals := make([]string, 2)
	vals[0], vals[1] = redirectCacheControl(maxAge), location
	hdr["Cache-Control"], hdr["Location"] = vals[0:1:1], vals[1:2:2]
}

// maxAgeTexts holds "private, max-age=N" for the lifetimes a presigned URL
// usually has left (presign_ttl defaults to 60 s), built once, so a
// redirect does not format one per request.
var maxAgeTexts = sync.OnceValue(func() []string {
	t := make([]string, 601)
	for i := range t {
		t[i] = "private, max-age=" + strconv.Itoa(i)
	}
	return t
})

// redirectCacheControl is the Cache-Control of a redirect whose URL has
// maxAge seconds left.
func redirectCacheControl(maxAge int64) string {
	if t := maxAgeTexts(); maxAge >= 0 && maxAge < int64(len(t)) {
		return t[maxAge]
	}
	return "private, max-age=" + strconv.FormatInt(max(maxAge, 0), 10)
}

// grantHeaderText is the ETag of the coding's representation, the
// Cache-Control value of a grant and, when size >= 0, the Content-Length
// of size, built as one string.
func grantHeaderText(segID string, coding compress.Coding, maxAge, size int64) (etag, cacheControl, length string) {
	var b [160]byte
	buf := compress.AppendETag(b[:0], segID, coding)
	n := len(buf)
	buf = append(buf, "private, max-age="...)
	buf = strconv.AppendInt(buf, maxAge, 10)
	m := len(buf)
	if size >= 0 {
		buf = strconv.AppendInt(buf, size, 10)
	}
	s := string(buf)
	return s[:n], s[n:m], s[m:]
}
