package segid

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/syncular/caddy-syncular/internal/testkit"
)

const hex64 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// definition is the protocol's rule written as a regular expression: the
// oracle the table and the fuzz test hold the parser to.
var definition = regexp.MustCompile(`\Asha256:[0-9a-f]{64}\z`)

func TestValidTable(t *testing.T) {
	for id, want := range map[string]bool{
		"sha256:" + hex64:                               true,
		"sha256:" + strings.Repeat("0", 64):             true,
		"sha256:" + strings.Repeat("f", 64):             true,
		"sha256:" + hex64[:63]:                          false, // short
		"sha256:" + hex64 + "0":                         false, // long
		"sha256:" + hex64 + "\n":                        false,
		"sha256:" + hex64[:63] + "A":                    false, // uppercase
		"sha256:" + strings.ToUpper(hex64):              false,
		"sha256:" + hex64[:63] + "g":                    false,
		"sha256:" + hex64[:63] + "/":                    false,
		"sha256:" + hex64[:63] + ":":                    false,
		"sha256:" + hex64[:63] + "`":                    false, // 'a'-1
		"sha256:" + hex64[:63] + "@":                    false, // '9'+7, 'A'-1
		"sha256:" + hex64[:62] + "\u00e9"[:2]:           false,
		"sha256:" + hex64[:63] + "\x00":                 false,
		"SHA256:" + hex64:                               false,
		"Sha256:" + hex64:                               false,
		"sha512:" + hex64:                               false,
		"sha-256:" + hex64[:63]:                         false,
		"sha1:" + hex64[:40]:                            false,
		"blake3:" + hex64:                               false,
		"sha256;" + hex64:                               false,
		"sha256/" + hex64:                               false,
		" sha256:" + hex64[:63]:                         false,
		"sha256:" + hex64 + hex64:                       false, // sha512-long
		hex64:                                           false, // no prefix
		"sha256:":                                       false,
		"":                                              false,
		"sha256:" + hex64[:32] + "%30" + hex64[35:]:     false, // escaped
		"sha256:" + strings.Repeat("0", 62) + "0\u0000": false,
	} {
		if definition.MatchString(id) != want {
			t.Fatalf("table row %q: the definition says %v", id, !want)
		}
		if got := Valid(id); got != want {
			t.Errorf("Valid(%q) = %v", id, got)
		}
		d, err := Parse(id)
		if (err == nil) != want {
			t.Errorf("Parse(%q) error %v, want valid=%v", id, err, want)
		}
		if err != nil {
			if !errors.Is(err, ErrInvalid) || d != (Digest{}) {
				t.Errorf("Parse(%q) = %x, %v; want the zero digest and ErrInvalid", id, d, err)
			}
		} else if d.String() != id {
			t.Errorf("Parse(%q).String() = %q", id, d.String())
		}
		hx, ok := Hex(id)
		if ok != want || (ok && hx != id[7:]) || (!ok && hx != "") {
			t.Errorf("Hex(%q) = %q, %v", id, hx, ok)
		}
		if len(id) >= 7 {
			if _, err := ParseHex(id[7:]); (err == nil) != want && id[:7] == "sha256:" {
				t.Errorf("ParseHex(%q) error %v, want valid=%v", id[7:], err, want)
			}
		}
	}
}

func TestConstants(t *testing.T) {
	if Len != 71 || HexLen != 64 || Prefix != "sha256:" || MaxEscapedLen != 3*71 {
		t.Fatalf("Len %d HexLen %d Prefix %q MaxEscapedLen %d", Len, HexLen, Prefix, MaxEscapedLen)
	}
}

func TestParseHexDigits(t *testing.T) {
	d, err := Parse("sha256:" + hex64)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := hex.DecodeString(hex64)
	if string(d[:]) != string(want) {
		t.Fatalf("Parse digest %x, want %x", d, want)
	}
	if d.Hex() != hex64 {
		t.Fatalf("Hex() = %q", d.Hex())
	}
	for _, bad := range []string{hex64[:63], hex64 + "0", strings.ToUpper(hex64), hex64[:63] + "g", ""} {
		if _, err := ParseHex(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseHex(%q) = %v, want ErrInvalid", bad, err)
		}
	}
	for i := 0; i < 64; i++ { // every digit position is read
		b := []byte(hex64)
		b[i] = 'G'
		if _, err := ParseHex(string(b)); err == nil {
			t.Fatalf("ParseHex accepted %q", b)
		}
		if ValidHex(string(b)) {
			t.Fatalf("ValidHex accepted %q", b)
		}
	}
}

// vectorIDs are the segment ids of the reference vectors with, where the
// vectors hold them, their bytes.
func vectorIDs(t *testing.T) map[string][]byte {
	t.Helper()
	dir := testkit.VectorsDir(t)
	read := func(name string, v any) {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	out := map[string][]byte{}
	add := func(id, bytesHex string) {
		if bytesHex == "" {
			if _, seen := out[id]; !seen {
				out[id] = nil
			}
			return
		}
		b, err := hex.DecodeString(bytesHex)
		if err != nil {
			t.Fatal(err)
		}
		out[id] = b
	}
	var tokens struct {
		Segments []struct{ BytesHex, SegmentID string } `json:"segments"`
	}
	read("tokens.json", &tokens)
	for _, s := range tokens.Segments {
		add(s.SegmentID, s.BytesHex)
	}
	var gen3 struct {
		Segments map[string]struct {
			SegmentID   string `json:"segmentId"`
			BytesSha256 string `json:"bytesSha256"`
		} `json:"segments"`
	}
	read("segments-gen3.json", &gen3)
	for name, s := range gen3.Segments {
		if "sha256:"+s.BytesSha256 != s.SegmentID {
			t.Fatalf("gen3 %s: id %q, bytes hash %q", name, s.SegmentID, s.BytesSha256)
		}
		add(s.SegmentID, "")
	}
	var s3 struct {
		Puts []struct {
			BytesHex string `json:"bytesHex"`
			Returned struct {
				SegmentID string `json:"segmentId"`
			} `json:"returned"`
		} `json:"puts"`
	}
	read("s3-objects.json", &s3)
	for _, p := range s3.Puts {
		add(p.Returned.SegmentID, p.BytesHex)
	}
	if len(out) < 10 {
		t.Fatalf("only %d segment ids read from the vectors", len(out))
	}
	return out
}

func TestVectorIDs(t *testing.T) {
	withBytes := 0
	for id, b := range vectorIDs(t) {
		if !Valid(id) {
			t.Errorf("vector id %q refused", id)
			continue
		}
		d, err := Parse(id)
		if err != nil || d.String() != id {
			t.Errorf("Parse(%q) = %v, %v", id, d, err)
		}
		if b == nil {
			continue
		}
		withBytes++
		if Of(b) != d || !Matches(id, b) {
			t.Errorf("the vector bytes of %s do not hash to it", id)
		}
		if len(b) > 0 {
			flipped := append([]byte(nil), b...)
			flipped[len(b)/2] ^= 1
			if Matches(id, flipped) {
				t.Errorf("%s matches its bytes with one bit flipped", id)
			}
		}
		if Matches(strings.ToUpper(id), b) || Matches("sha512:"+id[7:], b) {
			t.Errorf("an id that is not one matched the bytes of %s", id)
		}
	}
	if withBytes < 5 {
		t.Fatalf("only %d vector ids with their bytes", withBytes)
	}
}

// TestKeysVectors: the object keys the reference S3 store wrote.
func TestKeysVectors(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(testkit.VectorsDir(t), "s3-objects.json"))
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Stores map[string]struct {
			KeyPrefix *string `json:"keyPrefix"`
		} `json:"stores"`
		Puts []struct {
			Store     string `json:"store"`
			ObjectKey string `json:"objectKey"`
			Returned  struct {
				SegmentID string `json:"segmentId"`
			} `json:"returned"`
		} `json:"puts"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	prefixes := map[string]bool{}
	for _, p := range v.Puts {
		st, ok := v.Stores[p.Store]
		if !ok {
			t.Fatalf("put into unknown store %q", p.Store)
		}
		prefix := ""
		if st.KeyPrefix != nil {
			prefix = *st.KeyPrefix
		}
		prefixes[prefix] = true
		if got := ObjectKey(prefix, p.Returned.SegmentID); got != p.ObjectKey {
			t.Errorf("ObjectKey(%q, %s) = %q, the reference wrote %q", prefix, p.Returned.SegmentID, got, p.ObjectKey)
		}
	}
	if len(prefixes) < 3 {
		t.Fatalf("prefixes covered: %v", prefixes)
	}
}

func TestKeys(t *testing.T) {
	id := "sha256:" + hex64
	for _, tc := range []struct{ prefix, id, object, record string }{
		{"", id, "seg/sha256/" + hex64, "rec/sha256/" + hex64 + ".json"},
		{"syncular/", id, "syncular/seg/sha256/" + hex64, "syncular/rec/sha256/" + hex64 + ".json"},
		// Not ids: the first ":" becomes "/", as the reference writes.
		{"p/", "SHA256:AB:c", "p/seg/SHA256/AB:c", "p/rec/SHA256/AB:c.json"},
		{"", "nocolon", "seg/nocolon", "rec/nocolon.json"},
	} {
		if got := ObjectKey(tc.prefix, tc.id); got != tc.object {
			t.Errorf("ObjectKey(%q, %q) = %q, want %q", tc.prefix, tc.id, got, tc.object)
		}
		if got := RecordKey(tc.prefix, tc.id); got != tc.record {
			t.Errorf("RecordKey(%q, %q) = %q, want %q", tc.prefix, tc.id, got, tc.record)
		}
	}
}

// TestAllocs: the request path validates an id on every request.
func TestAllocs(t *testing.T) {
	id := "sha256:" + hex64
	bad := "sha256:" + hex64[:63] + "A"
	var sink bool
	if n := testing.AllocsPerRun(100, func() {
		_, err := Parse(id)
		_, err2 := Parse(bad)
		_, ok := Hex(id)
		sink = Valid(id) && !Valid(bad) && ValidHex(hex64) && err == nil && err2 != nil && ok
	}); n != 0 {
		t.Fatalf("%v allocations per validation", n)
	}
	if !sink {
		t.Fatal("validation answers wrong")
	}
	if n := testing.AllocsPerRun(100, func() { sink = ObjectKey("p/", id) == "" }); n != 1 {
		t.Fatalf("ObjectKey: %v allocations, want 1", n)
	}
}

// FuzzParse: every parser of the package agrees with the protocol's
// definition and round-trips.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"sha256:" + hex64, "sha256:" + strings.ToUpper(hex64), "sha512:" + hex64, "", "sha256:", "sha256:" + hex64 + "0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want := definition.MatchString(s)
		if Valid(s) != want {
			t.Fatalf("Valid(%q) = %v, definition %v", s, !want, want)
		}
		d, err := Parse(s)
		if (err == nil) != want {
			t.Fatalf("Parse(%q): %v, definition %v", s, err, want)
		}
		hx, ok := Hex(s)
		if ok != want {
			t.Fatalf("Hex(%q) ok %v", s, ok)
		}
		if strings.HasPrefix(s, "sha256:") {
			if ValidHex(s[7:]) != want {
				t.Fatalf("ValidHex(%q) disagrees", s[7:])
			}
			if d2, err := ParseHex(s[7:]); (err == nil) != want || d2 != d {
				t.Fatalf("ParseHex(%q) = %x, %v; Parse %x", s[7:], d2, err, d)
			}
		}
		if !want {
			return
		}
		if d.String() != s || hx != s[7:] || d.Hex() != hx {
			t.Fatalf("%q: String %q Hex %q %q", s, d.String(), hx, d.Hex())
		}
		if ref, _ := hex.DecodeString(hx); string(ref) != string(d[:]) {
			t.Fatalf("%q: digest %x", s, d)
		}
		if ObjectKey("x/", s) != "x/seg/"+strings.Replace(s, ":", "/", 1) {
			t.Fatalf("ObjectKey(%q) = %q", s, ObjectKey("x/", s))
		}
	})
}
