package token

import (
	"go/build"
	"strings"
	"testing"

	"github.com/syncular/caddy-syncular/internal/termsafe"
)

// TestStandardLibraryOnly: the package imports nothing outside the
// standard library, so a signer or verifier can copy it (or vendor it)
// alone. Only its non-test files count.
func TestStandardLibraryOnly(t *testing.T) {
	pkg, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range pkg.Imports {
		if first, _, _ := strings.Cut(path, "/"); strings.Contains(first, ".") {
			t.Errorf("token imports %s, which is not in the standard library", path)
		}
	}
}

// escapeInputs are the hostile and ordinary strings the copies are
// compared on; FuzzEscapeMatchesTermsafe adds more.
var escapeInputs = []string{
	"", "plain", "sha256:abc", "with space", `q"uote`, `back\slash`,
	"\x1b]0;title\x07\x1b[2J", "\u202e\u2066\u200f\u061c", "\x9b\xc2\x9b", "\xff\xfe", "a\xffb",
	"\U000e0001", "\U0001F600", "\ufffd", "line\nbreak", "{\"seg\":\"\u202e\",\"x\":\"\xff\"}",
}

// TestEscapeMatchesTermsafe: the private copies render every input
// exactly as internal/termsafe does.
func TestEscapeMatchesTermsafe(t *testing.T) {
	for _, s := range escapeInputs {
		checkEscape(t, s)
	}
}

func FuzzEscapeMatchesTermsafe(f *testing.F) {
	for _, s := range escapeInputs {
		f.Add(s)
	}
	f.Fuzz(checkEscape)
}

func checkEscape(t *testing.T, s string) {
	if got, want := escField(s), termsafe.Field(s); got != want {
		t.Errorf("escField(%q) = %q, termsafe.Field = %q", s, got, want)
	}
	if got, want := escJSON(s), termsafe.JSON(s); got != want {
		t.Errorf("escJSON(%q) = %q, termsafe.JSON = %q", s, got, want)
	}
	if got, want := escText(s), termsafe.Text(s, false); got != want {
		t.Errorf("escText(%q) = %q, termsafe.Text = %q", s, got, want)
	}
}
