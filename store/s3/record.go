package s3

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/syncular/caddy-syncular/segid"
	"github.com/syncular/caddy-syncular/store"
)

// RecordMetaKey is the user-metadata key (without the x-amz-meta- prefix)
// that carries a segment's record on its S3 object.
const RecordMetaKey = "syncular-record"

// DecodeRecord decodes the value of an object's x-amz-meta-syncular-record
// header (base64url of the record's UTF-8 JSON; the older writers' layout)
// for segmentID.
//
// The base64 is read loosely (the reference reader uses atob): padding, the
// standard alphabet and ASCII whitespace are accepted. The JSON is then read
// as DecodeRecordObject reads a record object. Every error wraps
// ErrCorruptRecord.
func DecodeRecord(headerValue, segmentID string) (*store.Record, error) {
	if !segid.Valid(segmentID) {
		return nil, fmt.Errorf("store: s3 record: %w: invalid segment id", store.ErrCorruptRecord)
	}
	return decodeRecordHeader(headerValue, segmentID)
}

// decodeRecordHeader is DecodeRecord of a valid id.
func decodeRecordHeader(headerValue, segmentID string) (*store.Record, error) {
	if strings.TrimSpace(headerValue) == "" {
		return nil, fmt.Errorf("store: s3 record of %s: %w: missing x-amz-meta-%s", segmentID, store.ErrCorruptRecord, RecordMetaKey)
	}
	raw, ok := decodeBase64Loose(headerValue)
	if !ok {
		return nil, fmt.Errorf("store: s3 record of %s: %w: header is not base64url", segmentID, store.ErrCorruptRecord)
	}
	return decodeRecordJSON(raw, segmentID, "header")
}

// DecodeRecordObject decodes the body of a record object
// ({prefix}rec/sha256/{hex}.json, the current writers' layout: the record's
// plain UTF-8 JSON) for segmentID.
//
// The JSON is read strictly, with the member names matched exactly (not
// case-insensitively): segmentId, partition, table, scopeDigest (strings);
// schemaVersion, asOfCommitSeq, rowCount, byteLength, createdAtMs,
// expiresAtMs (integers); mediaType ("rows" or "sqlite"); rowCursor and
// nextRowCursor (string or null). logEpoch is a string and may be absent
// (records written before it existed), which reads as "". Optional
// scopeDigests (list of strings) and publications (list of §4 objects,
// checked the same way) follow §4: a publications list, when present, alone
// rules, even when it is empty (then nothing is granted); without one the
// record's own fields are published once for each digest in
// {scopeDigest} ∪ scopeDigests.
//
// A record whose segmentId is not segmentID, or any publication whose
// byteLength differs from the record's, is corrupt. Every error wraps
// ErrCorruptRecord. The returned record is not fenced (S3 has no registry).
func DecodeRecordObject(body []byte, segmentID string) (*store.Record, error) {
	if !segid.Valid(segmentID) {
		return nil, fmt.Errorf("store: s3 record: %w: invalid segment id", store.ErrCorruptRecord)
	}
	return decodeRecordJSON(body, segmentID, "record object")
}

// decodeRecordJSON reads the record JSON raw of segmentID (a valid id);
// what names its source in errors.
func decodeRecordJSON(raw []byte, segmentID, what string) (*store.Record, error) {
	bad := func(why string) error {
		return fmt.Errorf("store: s3 record of %s: %w: %s", segmentID, store.ErrCorruptRecord, why)
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
		return nil, bad(what + " is not a JSON object")
	}
	id, err := recString(obj, "segmentId", false)
	if err != nil {
		return nil, bad(err.Error())
	}
	if id != segmentID {
		return nil, bad("segmentId does not match the object key")
	}
	top, err := recPublication(obj)
	if err != nil {
		return nil, bad(err.Error())
	}
	if top.ByteLength < 0 {
		return nil, bad("negative byteLength")
	}
	rec := &store.Record{SegmentID: segmentID, ByteLength: top.ByteLength, MediaType: top.MediaType}

	var pubsRaw []json.RawMessage
	v, explicit := obj["publications"]
	if explicit {
		if err := json.Unmarshal(v, &pubsRaw); err != nil || isJSONNull(v) {
			return nil, bad("publications is not a list")
		}
	}
	var digests []string
	if v, ok := obj["scopeDigests"]; ok {
		var list []json.RawMessage
		if err := json.Unmarshal(v, &list); err != nil || isJSONNull(v) {
			return nil, bad("scopeDigests is not a list")
		}
		for _, d := range list {
			s, ok := jsonString(d)
			if !ok {
				return nil, bad("scopeDigests holds a non-string")
			}
			digests = append(digests, s)
		}
	}

	if explicit {
		// §4: the list alone rules, even when empty (an empty list grants
		// nothing; the top-level fields are not a fallback).
		rec.Publications = make([]store.Publication, 0, len(pubsRaw))
		for i, pr := range pubsRaw {
			var po map[string]json.RawMessage
			if err := json.Unmarshal(pr, &po); err != nil || po == nil {
				return nil, bad(fmt.Sprintf("publications[%d] is not an object", i))
			}
			p, err := recPublication(po)
			if err != nil {
				return nil, bad(fmt.Sprintf("publications[%d]: %s", i, err))
			}
			if p.ByteLength != top.ByteLength {
				return nil, bad(fmt.Sprintf("publications[%d]: byteLength differs from the record's", i))
			}
			rec.Publications = append(rec.Publications, p)
		}
		return rec, nil
	}

	rec.Publications = make([]store.Publication, 0, 1+len(digests))
	rec.Publications = append(rec.Publications, top)
	for _, d := range digests {
		dup := false
		for i := range rec.Publications {
			if rec.Publications[i].ScopeDigest == d {
				dup = true
				break
			}
		}
		if !dup {
			p := top
			p.ScopeDigest = d
			rec.Publications = append(rec.Publications, p)
		}
	}
	return rec, nil
}

// recPublication reads the §4 publication fields of one JSON object (the
// record's top level or one element of its publications list).
func recPublication(obj map[string]json.RawMessage) (store.Publication, error) {
	var p store.Publication
	var err error
	str := func(name string, optional bool) string {
		if err != nil {
			return ""
		}
		var s string
		s, err = recString(obj, name, optional)
		return s
	}
	num := func(name string) int64 {
		if err != nil {
			return 0
		}
		var n int64
		n, err = recInt(obj, name)
		return n
	}
	cur := func(name string) *string {
		if err != nil {
			return nil
		}
		var c *string
		c, err = recCursor(obj, name)
		return c
	}
	p.Partition = str("partition", false)
	p.LogEpoch = str("logEpoch", true)
	p.Table = str("table", false)
	p.SchemaVersion = num("schemaVersion")
	p.MediaType = str("mediaType", false)
	p.ScopeDigest = str("scopeDigest", false)
	p.AsOfCommitSeq = num("asOfCommitSeq")
	p.RowCount = num("rowCount")
	p.RowCursor = cur("rowCursor")
	p.NextRowCursor = cur("nextRowCursor")
	p.ByteLength = num("byteLength")
	p.CreatedAtMs = num("createdAtMs")
	p.ExpiresAtMs = num("expiresAtMs")
	if err != nil {
		return store.Publication{}, err
	}
	if p.MediaType != store.MediaRows && p.MediaType != store.MediaSQLite {
		return store.Publication{}, errors.New("bad field mediaType")
	}
	return p, nil
}

func recString(obj map[string]json.RawMessage, name string, optional bool) (string, error) {
	v, ok := obj[name]
	if !ok {
		if optional {
			return "", nil
		}
		return "", errors.New("missing field " + name)
	}
	s, ok := jsonString(v)
	if !ok {
		return "", errors.New("bad field " + name)
	}
	return s, nil
}

func recInt(obj map[string]json.RawMessage, name string) (int64, error) {
	v, ok := obj[name]
	if !ok {
		return 0, errors.New("missing field " + name)
	}
	v = bytes.TrimSpace(v)
	if len(v) == 0 || (v[0] != '-' && (v[0] < '0' || v[0] > '9')) {
		return 0, errors.New("bad field " + name)
	}
	n, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil {
		return 0, errors.New("bad field " + name + " (not an integer)")
	}
	return n, nil
}

func recCursor(obj map[string]json.RawMessage, name string) (*string, error) {
	v, ok := obj[name]
	if !ok {
		return nil, errors.New("missing field " + name)
	}
	if isJSONNull(v) {
		return nil, nil
	}
	s, ok := jsonString(v)
	if !ok {
		return nil, errors.New("bad field " + name)
	}
	return &s, nil
}

// jsonString decodes a JSON string value; anything else (null included)
// is not ok. v comes from a document json.Unmarshal already validated.
func jsonString(v json.RawMessage) (string, bool) {
	v = bytes.TrimSpace(v)
	if len(v) < 2 || v[0] != '"' {
		return "", false
	}
	if inner := v[1 : len(v)-1]; bytes.IndexByte(inner, '\\') < 0 && utf8.Valid(inner) {
		return string(inner), true
	}
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		return "", false
	}
	return s, true
}

func isJSONNull(v json.RawMessage) bool {
	return string(bytes.TrimSpace(v)) == "null"
}

// decodeBase64Loose decodes base64url without padding, as written, and on
// failure retries the way the reference reader (atob) would accept it:
// ASCII whitespace removed, the standard alphabet mapped, padding dropped.
func decodeBase64Loose(s string) ([]byte, bool) {
	if b, err := base64.RawURLEncoding.DecodeString(s); err == nil {
		return b, true
	}
	var sb strings.Builder
	sb.Grow(len(s))
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case ' ', '\t', '\n', '\f', '\r':
		case '+':
			sb.WriteByte('-')
		case '/':
			sb.WriteByte('_')
		default:
			sb.WriteByte(c)
		}
	}
	t := sb.String()
	// atob accepts correct padding only: at most two '=' and a padded
	// length that is a multiple of 4.
	if n := len(t) - len(strings.TrimRight(t, "=")); n > 0 {
		if n > 2 || len(t)%4 != 0 {
			return nil, false
		}
		t = t[:len(t)-n]
	}
	b, err := base64.RawURLEncoding.DecodeString(t)
	if err != nil {
		return nil, false
	}
	return b, true
}
