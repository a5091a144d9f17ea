package caddymodule

import (
	"strconv"
	"strings"
)

// byteRange is a satisfiable single range [off, off+n) of a body.
type byteRange struct{ off, n int64 }

// rangeResult says how to answer a request's Range header.
type rangeResult int

const (
	rangeNone          rangeResult = iota // no (usable) Range: send the whole body
	rangePartial                          // one satisfiable range: 206
	rangeUnsatisfiable                    // 416
)

// maxRangeHeader bounds the Range header we are willing to parse.
const maxRangeHeader = 256

// parseRange interprets a Range header for a body of size bytes (RFC 9110
// §14). Only a single range is honoured: a multi-range request, an unknown
// unit or a malformed header is answered with the whole body, which the
// RFC allows, so no request can make the edge build multipart bodies.
func parseRange(h string, size int64) (byteRange, rangeResult) {
	if h == "" || len(h) > maxRangeHeader {
		return byteRange{}, rangeNone
	}
	spec, ok := strings.CutPrefix(h, "bytes=")
	if !ok || strings.Contains(spec, ",") {
		return byteRange{}, rangeNone
	}
	spec = strings.TrimSpace(spec)
	first, last, ok := strings.Cut(spec, "-")
	if !ok {
		return byteRange{}, rangeNone
	}
	first, last = strings.TrimSpace(first), strings.TrimSpace(last)
	if first == "" {
		// suffix range: the last N bytes
		n, err := parseDigits(last)
		if err != nil {
			return byteRange{}, rangeNone
		}
		if n == 0 || size == 0 {
			return byteRange{}, rangeUnsatisfiable
		}
		if n > size {
			n = size
		}
		return byteRange{off: size - n, n: n}, rangePartial
	}
	start, err := parseDigits(first)
	if err != nil {
		return byteRange{}, rangeNone
	}
	end := size - 1
	if last != "" {
		e, err := parseDigits(last)
		if err != nil || e < start {
			return byteRange{}, rangeNone
		}
		if e < end {
			end = e
		}
	}
	if start >= size {
		return byteRange{}, rangeUnsatisfiable
	}
	return byteRange{off: start, n: end - start + 1}, rangePartial
}

// parseDigits parses a non-empty run of ASCII digits.
func parseDigits(s string) (int64, error) {
	if s == "" || len(s) > 18 {
		return 0, strconv.ErrSyntax
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, strconv.ErrSyntax
		}
	}
	return strconv.ParseInt(s, 10, 64)
}

// contentRange renders a Content-Range value.
func (b byteRange) contentRange(size int64) string {
	return "bytes " + strconv.FormatInt(b.off, 10) + "-" + strconv.FormatInt(b.off+b.n-1, 10) + "/" + strconv.FormatInt(size, 10)
}
