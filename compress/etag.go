package compress

// ETag is the quoted entity-tag of the c variant of a segment:
// `"sha256:<hex>"` for identity (protocol §6) and `"sha256:<hex>+gzip"`,
// `"sha256:<hex>+zstd"` for the variants, so a cache never confuses the
// bytes of one with another.
func ETag(segmentID string, c Coding) string {
	var b [96]byte
	return string(AppendETag(b[:0], segmentID, c))
}

// AppendETag appends ETag(segmentID, c) to dst.
func AppendETag(dst []byte, segmentID string, c Coding) []byte {
	dst = append(dst, '"')
	dst = append(dst, segmentID...)
	if c != Identity && c.valid() {
		dst = append(dst, '+')
		dst = append(dst, c.String()...)
	}
	return append(dst, '"')
}

// MatchIfNoneMatch reports whether the If-None-Match field values match
// the segment, so a GET or HEAD may answer 304. It matches "*" and any
// listed entity-tag equal, by weak comparison (RFC 9110 §8.8.3.2: a "W/"
// prefix on either side is ignored), to the ETag of any of the segment's
// variants: every variant decodes to the same bytes, so a client holding
// one holds the segment. Parsing follows net/http: tags are read in order
// and a malformed one ends the list (tags before it still count). Pass
// r.Header.Values("If-None-Match"); it does not allocate.
func MatchIfNoneMatch(segmentID string, values ...string) bool {
	if segmentID == "" {
		return false
	}
	for _, v := range values {
		if matchList(v, segmentID) {
			return true
		}
	}
	return false
}

func matchList(s, segmentID string) bool {
	for {
		s = trimOWS(s)
		if s == "" {
			return false
		}
		if s[0] == ',' {
			s = s[1:]
			continue
		}
		if s[0] == '*' {
			return true
		}
		tag, rest, ok := scanETag(s)
		if !ok {
			return false
		}
		if variantOf(tag, segmentID) {
			return true
		}
		s = rest
	}
}

// scanETag reads one entity-tag ([W/] DQUOTE *etagc DQUOTE) from the
// start of s and returns its opaque part without quotes.
func scanETag(s string) (opaque, rest string, ok bool) {
	if len(s) >= 2 && s[0] == 'W' && s[1] == '/' {
		s = s[2:]
	}
	if len(s) < 2 || s[0] != '"' {
		return "", "", false
	}
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"':
			return s[1:i], s[i+1:], true
		case c == 0x21, 0x23 <= c && c <= 0x7e, c >= 0x80:
			// etagc
		default:
			return "", "", false
		}
	}
	return "", "", false
}

func variantOf(opaque, segmentID string) bool {
	if len(opaque) < len(segmentID) || opaque[:len(segmentID)] != segmentID {
		return false
	}
	switch opaque[len(segmentID):] {
	case "", "+gzip", "+zstd":
		return true
	}
	return false
}
