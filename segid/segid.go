// Package segid is the segment id (protocol §1): "sha256:" and the 64
// lowercase hex digits of the SHA-256 of the segment's uncompressed
// bytes. It parses and validates ids (ParseID: an ID, checked once where
// an id enters and carried from there), holds their digests, checks bytes
// against an id (Matches, Hasher, Reader: the one place a hash is
// compared with an id) and maps an id to its S3 object keys (protocol
// §5.2). It imports the standard library alone.
package segid

import (
	"crypto/sha256"
	"errors"
)

const (
	// Prefix starts every segment id.
	Prefix = "sha256:"
	// HexLen is the number of hex digits after Prefix.
	HexLen = 2 * sha256.Size
	// Len is the length of a segment id.
	Len = len(Prefix) + HexLen
	// MaxEscapedLen is the longest a percent-encoded path element can
	// be and still decode to a segment id (every byte written %XX).
	MaxEscapedLen = 3 * Len
)

// ErrInvalid: the string is not a segment id.
var ErrInvalid = errors.New("segid: not sha256: followed by 64 lowercase hex digits")

// Digest is the SHA-256 a segment id names.
type Digest [sha256.Size]byte

// Valid reports whether id is "sha256:" and 64 lowercase hex digits. It
// does not allocate.
func Valid(id string) bool {
	return len(id) == Len && id[:len(Prefix)] == Prefix && ValidHex(id[len(Prefix):])
}

// ValidHex reports whether s is 64 lowercase hex digits (an id without
// its Prefix).
func ValidHex(s string) bool {
	if len(s) != HexLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if hexVal(s[i]) < 0 {
			return false
		}
	}
	return true
}

// Hex returns the 64 hex digits of id, or false when id is not a segment
// id. The result shares id's memory.
func Hex(id string) (string, bool) {
	if !Valid(id) {
		return "", false
	}
	return id[len(Prefix):], true
}

// Parse returns the digest id names; ErrInvalid when id is not a segment
// id. It does not allocate.
func Parse(id string) (Digest, error) {
	if len(id) != Len || id[:len(Prefix)] != Prefix {
		return Digest{}, ErrInvalid
	}
	return ParseHex(id[len(Prefix):])
}

// ParseHex is Parse for the 64 hex digits without the Prefix.
func ParseHex(s string) (Digest, error) {
	var d Digest
	if len(s) != HexLen {
		return d, ErrInvalid
	}
	for i := range d {
		hi, lo := hexVal(s[2*i]), hexVal(s[2*i+1])
		if hi < 0 || lo < 0 {
			return Digest{}, ErrInvalid
		}
		d[i] = byte(hi<<4 | lo)
	}
	return d, nil
}

// Of is the digest of b: Of(b).String() is the id of the segment b.
func Of(b []byte) Digest { return sha256.Sum256(b) }

// Matches reports whether b are the bytes of segment id: id is a segment
// id and b hashes to it.
func Matches(id string, b []byte) bool {
	d, err := Parse(id)
	return err == nil && Of(b) == d
}

const hexDigits = "0123456789abcdef"

// Hex is the 64 lowercase hex digits of d.
func (d Digest) Hex() string {
	var buf [HexLen]byte
	for i, b := range d {
		buf[2*i], buf[2*i+1] = hexDigits[b>>4], hexDigits[b&0xf]
	}
	return string(buf[:])
}

// String is the segment id of d.
func (d Digest) String() string { return Prefix + d.Hex() }

// hexVal is the value of a lowercase hex digit, -1 for any other byte.
func hexVal(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'a' <= c && c <= 'f':
		return int(c-'a') + 10
	}
	return -1
}
