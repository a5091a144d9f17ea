package segid

import (
	"errors"
	"strings"
	"testing"
)

func TestParseID(t *testing.T) {
	s := "sha256:" + hex64
	id, err := ParseID(s)
	if err != nil {
		t.Fatal(err)
	}
	d, _ := Parse(s)
	if id.String() != s || id.Hex() != hex64 || id.Digest() != d || id.IsZero() {
		t.Fatalf("ParseID(%q) = %q %q %x zero=%v", s, id.String(), id.Hex(), id.Digest(), id.IsZero())
	}
	if d.ID() != id {
		t.Fatalf("Digest.ID() = %v, want %v", d.ID(), id)
	}
	for _, bad := range []string{"", "sha256:", "sha256:" + strings.ToUpper(hex64), "sha256:" + hex64 + "0", hex64} {
		id, err := ParseID(bad)
		if !errors.Is(err, ErrInvalid) || id != (ID{}) || !id.IsZero() {
			t.Errorf("ParseID(%q) = %v, %v; want the zero ID and ErrInvalid", bad, id, err)
		}
	}
}

func TestIDZero(t *testing.T) {
	var id ID
	if !id.IsZero() || id.String() != "" || id.Hex() != "" || id.Digest() != (Digest{}) {
		t.Fatalf("zero ID: %q %q %x", id.String(), id.Hex(), id.Digest())
	}
	// The zero ID is not the id of the zero digest, and verifies nothing.
	if (Digest{}).ID() == id || (Digest{}).ID().IsZero() {
		t.Fatal("the zero digest's ID is the zero ID")
	}
	if id.Matches(nil) {
		t.Fatal("the zero ID matched")
	}
}

func TestIDMapKey(t *testing.T) {
	s := "sha256:" + hex64
	// Equal ids from different strings and from a digest are one key.
	a := MustParseID(s)
	b := MustParseID(strings.Clone(s))
	m := map[ID]int{a: 1}
	m[b]++
	m[a.Digest().ID()]++
	if len(m) != 1 || m[a] != 3 {
		t.Fatalf("map %v", m)
	}
	if MustParseID("sha256:"+strings.Repeat("0", 64)) == a {
		t.Fatal("different ids compare equal")
	}
}

func TestIDMatches(t *testing.T) {
	b := []byte("segment bytes")
	id := Of(b).ID()
	if !id.Matches(b) || id.Matches(b[1:]) {
		t.Fatal("Matches")
	}
	if !Valid(id.String()) {
		t.Fatalf("Digest.ID() = %q is not valid", id.String())
	}
}

func TestMustParseIDPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("MustParseID accepted a bad id")
		}
	}()
	MustParseID("sha256:nope")
}

func TestParseIDAllocs(t *testing.T) {
	s := "sha256:" + hex64
	var id ID
	if n := testing.AllocsPerRun(100, func() { id, _ = ParseID(s); _ = id.Hex() }); n != 0 {
		t.Fatalf("ParseID allocates %v times", n)
	}
}

func FuzzParseID(f *testing.F) {
	f.Add("sha256:" + hex64)
	f.Add("sha256:" + strings.ToUpper(hex64))
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		id, err := ParseID(s)
		if (err == nil) != definition.MatchString(s) {
			t.Fatalf("ParseID(%q): %v", s, err)
		}
		if err != nil {
			if !id.IsZero() {
				t.Fatalf("ParseID(%q) failed but returned %v", s, id)
			}
			return
		}
		if id.String() != s || id.Digest().ID() != id || id.Digest().String() != s {
			t.Fatalf("ParseID(%q) round trip: %q", s, id.Digest().String())
		}
	})
}
