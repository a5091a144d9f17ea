// Package doccheck holds code comments to the repository's own documents:
// every protocol citation ("protocol §5.1", "docs/protocol.md §6", a bare
// "§4") names a numbered heading of docs/protocol.md, and no comment
// points outside the repository (the contract's old file name, which was
// never in it, or the sibling directory the vectors used to come from) or
// at an issue number; and no library file is longer than MaxLibraryLines
// (LongFiles). Its tests run both over the whole module in
// `make test`; scripts/cite-protocol.sh rewrites the old citation forms.
package doccheck

import (
	"bufio"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// Problem is one comment that breaks a rule, at file:line.
type Problem struct {
	File string
	Line int
	Msg  string
}

func (p Problem) String() string { return fmt.Sprintf("%s:%d: %s", p.File, p.Line, p.Msg) }

var heading = regexp.MustCompile(`^#{2,4}\s+(\d+(?:\.\d+)*)\.?\s`)

// Sections reads the numbered headings of a Markdown file ("## 6.
// Responses", "### 5.1 SQLite") as a set of section numbers.
func Sections(path string) (map[string]bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]bool{}
	sc := bufio.NewScanner(f)
	inFence := false
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inFence = !inFence
			continue
		}
		if m := heading.FindStringSubmatch(line); m != nil && !inFence {
			out[m[1]] = true
		}
	}
	return out, sc.Err()
}

var (
	// A section sign and its number: §6, § 5.1, §4's.
	sectionRef = regexp.MustCompile(`§\s*(\d+(?:\.\d+)*)`)
	// What may sit between chained citations: "§4, §6", "§4 and §6".
	chainSep = regexp.MustCompile(`^(?:\s*(?:,|and|or|/|–|-)?\s*)$`)
	// A citation of another document keeps its own numbering: RFC 9110
	// §12.5.3, SPEC §5.8.
	otherDoc     = regexp.MustCompile(`(?i)(?:\bRFC\s*\d+|\bSPEC|\bSSP2?|\bRFC\s*\d+\s+section)\s*$`)
	oldProtocol  = regexp.MustCompile(`\bPROTOCOL(?:\.md)?\b`)
	outsidePath  = regexp.MustCompile(`\.\./shared|\bshared/vectors\b|/work/`)
	issueWord    = regexp.MustCompile(`(?i)\bissues?\s+#?\d+`)
	issueHash    = regexp.MustCompile(`(?:^|[\s(\[,;])#\d+\b`)
	spaceRunning = regexp.MustCompile(`\s+`)
	// Standards numbered with a hash (PKCS #1, PKCS #8) are not issues.
	standardHash = regexp.MustCompile(`\bPKCS\s*#\d+`)
)

// CheckText applies the rules to one comment's text (its lines joined)
// and returns a message per violation. sections is the set of section
// numbers docs/protocol.md has.
func CheckText(text string, sections map[string]bool) []string {
	text = spaceRunning.ReplaceAllString(text, " ")
	var out []string
	if m := oldProtocol.FindString(text); m != "" {
		out = append(out, fmt.Sprintf("cites %q, which is not in the repository: write \"protocol §N\" (docs/protocol.md)", m))
	}
	if m := outsidePath.FindString(text); m != "" {
		out = append(out, fmt.Sprintf("names a path outside the repository (%q)", m))
	}
	if m := issueWord.FindString(text); m != "" {
		out = append(out, fmt.Sprintf("cites an issue number (%q): say what the code does and why instead", m))
	} else if m := issueHash.FindString(standardHash.ReplaceAllString(text, "PKCS")); m != "" {
		out = append(out, fmt.Sprintf("cites an issue number (%q): say what the code does and why instead", strings.TrimSpace(m)))
	}
	refs := sectionRef.FindAllStringSubmatchIndex(text, -1)
	external := false
	prevEnd := -1
	for _, r := range refs {
		before := text[:r[0]]
		chained := prevEnd >= 0 && chainSep.MatchString(text[prevEnd:r[0]])
		switch {
		case chained:
			// Same document as the citation it follows.
		default:
			external = otherDoc.MatchString(before)
		}
		prevEnd = r[1]
		if external {
			continue
		}
		n := text[r[2]:r[3]]
		if !sections[n] {
			out = append(out, fmt.Sprintf("cites protocol §%s, which is not a section heading of docs/protocol.md", n))
		}
	}
	return out
}

// CheckFile parses one Go file and checks each of its comments.
func CheckFile(path, display string, sections map[string]bool) ([]Problem, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.ParseComments|parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	var out []Problem
	for _, g := range f.Comments {
		// Check group by group, so a citation broken over two comment
		// lines (an RFC's number on one, its section on the next) is read
		// whole; report the line of the comment that holds the offending
		// text when it is on one.
		var parts []string
		for _, c := range g.List {
			parts = append(parts, commentText(c))
		}
		for _, msg := range CheckText(strings.Join(parts, "\n"), sections) {
			out = append(out, Problem{display, lineOf(fset, g, msg, sections), msg})
		}
	}
	return out, nil
}

// commentText strips the comment markers.
func commentText(c *ast.Comment) string {
	t := c.Text
	switch {
	case strings.HasPrefix(t, "//"):
		return t[2:]
	case strings.HasPrefix(t, "/*"):
		return strings.TrimSuffix(t[2:], "*/")
	}
	return t
}

// lineOf is the line of the first comment of g whose own text yields msg,
// or the group's first line.
func lineOf(fset *token.FileSet, g *ast.CommentGroup, msg string, sections map[string]bool) int {
	for _, c := range g.List {
		for _, m := range CheckText(commentText(c), sections) {
			if m == msg {
				return fset.Position(c.Slash).Line
			}
		}
	}
	return fset.Position(g.Pos()).Line
}

// Check walks every .go file under root (skipping hidden directories,
// bin/ and testdata/) and checks its comments against the sections of
// root/docs/protocol.md.
func Check(root string) ([]Problem, error) {
	sections, err := Sections(filepath.Join(root, "docs", "protocol.md"))
	if err != nil {
		return nil, err
	}
	if len(sections) == 0 {
		return nil, fmt.Errorf("docs/protocol.md has no numbered section headings")
	}
	var out []Problem
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if p != root && (strings.HasPrefix(name, ".") || name == "bin" || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		probs, err := CheckFile(p, rel, sections)
		if err != nil {
			return err
		}
		out = append(out, probs...)
		return nil
	})
	sort.Slice(out, func(i, j int) bool {
		if out[i].File != out[j].File {
			return out[i].File < out[j].File
		}
		return out[i].Line < out[j].Line
	})
	return out, err
}

// MaxLibraryLines is the most lines a library file may have: a file a
// reader can hold in mind at once. Longer ones are split along a seam
// (a type and its methods, one phase of a fill).
const MaxLibraryLines = 450

// LongFiles lists the library files under root longer than max lines:
// non-test .go files outside internal/, bench/, cmd/ and the directories
// Check skips. Tools, benchmarks and commands are not held to it.
func LongFiles(root string, max int) ([]Problem, error) {
	var out []Problem
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() {
			if p != root && (strings.HasPrefix(name, ".") || name == "bin" || name == "testdata" ||
				rel == "internal" || rel == "bench" || rel == "cmd") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if n := strings.Count(string(b), "\n"); n > max {
			out = append(out, Problem{File: rel, Line: n, Msg: fmt.Sprintf("%d lines, over %d: split it along a seam", n, max)})
		}
		return nil
	})
	sort.Slice(out, func(i, j int) bool { return out[i].File < out[j].File })
	return out, err
}
