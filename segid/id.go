package segid

import "fmt"

// ID is a parsed segment id: its text and the digest it names, checked
// once where the id entered (ParseID) or made from bytes' digest
// (Digest.ID). A function that takes an ID need not check it again.
//
// The zero ID is no segment's id (IsZero); every other ID is valid. IDs
// are comparable: two IDs are == when they name the same segment, so an
// ID keys a map.
type ID struct {
	s string // "sha256:" and 64 lowercase hex digits; "" for the zero ID
	d Digest
}

// ParseID returns the ID of the segment id s; ErrInvalid (and the zero
// ID) when s is not one. It does not allocate: the ID shares s's memory.
func ParseID(s string) (ID, error) {
	d, err := Parse(s)
	if err != nil {
		return ID{}, err
	}
	return ID{s: s, d: d}, nil
}

// MustParseID is ParseID for ids known to be valid (constants, tests):
// it panics when s is not a segment id.
func MustParseID(s string) ID {
	id, err := ParseID(s)
	if err != nil {
		panic(fmt.Sprintf("segid: MustParseID(%q): %v", s, err))
	}
	return id
}

// ID is the segment id of d.
func (d Digest) ID() ID { return ID{s: d.String(), d: d} }

// String is the segment id: "sha256:" and 64 lowercase hex digits; ""
// for the zero ID.
func (id ID) String() string { return id.s }

// Digest is the SHA-256 the id names (the zero digest for the zero ID).
func (id ID) Digest() Digest { return id.d }

// Hex is the id's 64 hex digits, without the Prefix; "" for the zero ID.
// It shares the id's memory.
func (id ID) Hex() string {
	if id.s == "" {
		return ""
	}
	return id.s[len(Prefix):]
}

// IsZero reports whether id is the zero ID, which names no segment.
func (id ID) IsZero() bool { return id.s == "" }

// Matches reports whether b are the bytes of the segment id names (never
// for the zero ID).
func (id ID) Matches(b []byte) bool { return id.s != "" && Of(b) == id.d }
