package doccheck

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/syncular/caddy-syncular/internal/testkit"
)

// TestRepositoryComments: every comment of the module follows the rules.
func TestRepositoryComments(t *testing.T) {
	root := testkit.ModuleRoot(t)
	probs, err := Check(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range probs {
		t.Error(p)
	}
	if len(probs) > 0 {
		t.Logf("scripts/cite-protocol.sh rewrites the old citation forms; fix the rest by hand")
	}
}

// TestSectionsOfProtocol: the headings this package reads are those the
// code cites most; an empty or misparsed set would pass every citation.
func TestSectionsOfProtocol(t *testing.T) {
	s, err := Sections(filepath.Join(testkit.ModuleRoot(t), "docs", "protocol.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"1", "2", "3", "4", "5", "5.1", "5.2", "6"} {
		if !s[n] {
			t.Errorf("docs/protocol.md has no section %s (headings read: %v)", n, s)
		}
	}
	if s["9.9"] {
		t.Errorf("section 9.9 read from docs/protocol.md")
	}
}

var testSections = map[string]bool{"1": true, "4": true, "5": true, "5.1": true, "5.2": true, "6": true}

func TestCheckText(t *testing.T) {
	for _, c := range []struct {
		text string
		want []string // substrings, one per expected message; none: clean
	}{
		{"reads the record (protocol §5.2) with two requests", nil},
		{"the error catalog (docs/protocol.md §6).", nil},
		{"the grant (§4, §6) and §5.1's fencing", nil},
		{"§4 steps 1–5", nil},
		{"per RFC 9110 §12.5.3 and is", nil},
		{"a Range header (RFC 9110\n §14). Only", nil},
		{"RFC 9110 §13.2.1, §14 say so", nil},
		{"No double compression (SPEC §5.8)", nil},
		{"rotation (issue-free text, see the 5th case)", nil},
		{"upstream golang/go#75804 is fixed in Go 1.27", nil},
		{"RSA 2048 (PKCS #1 or PKCS #8) and ECDSA", nil},
		{"PKCS #8, as issue #8 said", []string{"issue number"}},
		{"the catalog (protocol §7)", []string{"§7"}},
		{"see §5.3 for the layouts", []string{"§5.3"}},
		{"the catalog (PROTOCOL.md §6)", []string{`"PROTOCOL.md"`}},
		{"authorize decides the grant (PROTOCOL §4)", []string{`"PROTOCOL"`}},
		{"vectors in ../shared/vectors", []string{"outside the repository"}},
		{"vectors in shared/vectors/tokens.json", []string{"outside the repository"}},
		{"The disk tier (issue 14): segments", []string{"issue number"}},
		{"target: 0.95, // Issues 11 and 12", []string{"issue number"}},
		{"fixed in #13, then", []string{"issue number"}},
		{"(see #7)", []string{"issue number"}},
		{"PROTOCOL.md §9 and issue 3", []string{`"PROTOCOL.md"`, "issue number", "§9"}},
	} {
		got := CheckText(c.text, testSections)
		if len(got) != len(c.want) {
			t.Errorf("%q: %d messages %q, want %d (%q)", c.text, len(got), got, len(c.want), c.want)
			continue
		}
		for _, w := range c.want {
			found := false
			for _, g := range got {
				found = found || strings.Contains(g, w)
			}
			if !found {
				t.Errorf("%q: no message names %q: %q", c.text, w, got)
			}
		}
	}
}

// TestCheckPlantedComments: a module with a planted bad comment fails,
// with the file and line of the comment; strings are not comments.
func TestCheckPlantedComments(t *testing.T) {
	root := t.TempDir()
	write := func(rel, text string) {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("docs/protocol.md", "# Contract\n\n## 4. Publications\n\n```\n## 9. not a heading\n```\n\n### 5.2 S3\n\n## 6. Responses\n")
	write("good/good.go", "// Package good cites protocol §4 and docs/protocol.md §5.2.\npackage good\n\n// X holds a bad citation, but in a string:\nvar X = \"PROTOCOL.md §9, issue 4\"\n")
	write("bad/bad.go", "package bad\n\n// F answers\n// (protocol §9).\nfunc F() {}\n\n/* G reads ../shared/vectors. */\nfunc G() {}\n")
	write("testdata/skip.go", "// PROTOCOL.md §9: testdata is not code\npackage skip\n")
	write(".hidden/skip.go", "// PROTOCOL.md §9\npackage skip\n")
	probs, err := Check(root)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range probs {
		got = append(got, p.String())
	}
	if len(probs) != 2 {
		t.Fatalf("problems %q, want 2 (the string and the skipped directories are not comments to check)", got)
	}
	if probs[0].File != filepath.Join("bad", "bad.go") || probs[0].Line != 4 || !strings.Contains(probs[0].Msg, "§9") {
		t.Errorf("first problem %s, want bad/bad.go:4 citing §9", probs[0])
	}
	if probs[1].Line != 7 || !strings.Contains(probs[1].Msg, "outside the repository") {
		t.Errorf("second problem %s, want bad/bad.go:7, a path outside", probs[1])
	}
}

// TestLibraryFilesShort: no library file of the module is over
// MaxLibraryLines.
func TestLibraryFilesShort(t *testing.T) {
	probs, err := LongFiles(testkit.ModuleRoot(t), MaxLibraryLines)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range probs {
		t.Error(p)
	}
}

// TestLongFilesPlanted: LongFiles finds a long library file and passes
// over tests, tools and files at the limit.
func TestLongFilesPlanted(t *testing.T) {
	root := t.TempDir()
	lines := func(n int) []byte { return []byte(strings.Repeat("// x\n", n)) }
	files := map[string]int{
		"store/long.go":         11,
		"store/atlimit.go":      10,
		"store/long_test.go":    50,
		"internal/tool/long.go": 50,
		"bench/load/long.go":    50,
		"cmd/demo/long.go":      50,
	}
	for rel, n := range files {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, lines(n), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	probs, err := LongFiles(root, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(probs) != 1 || probs[0].File != filepath.Join("store", "long.go") || probs[0].Line != 11 {
		t.Fatalf("LongFiles = %v, want only store/long.go at 11 lines", probs)
	}
}
