// Package testkit holds what the test suites of several packages share:
// where the protocol vectors live, the gen-3 segment vectors' shape, and
// a free loopback port. It is imported by tests only.
package testkit

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"testing"
)

// VectorsDir is $SYNCULAR_VECTORS, or testdata/vectors under the module
// root (committed with the repository), as an absolute path. Missing
// vectors fail the test: they are the contract, and silently skipping
// them would let the code drift from the reference.
func VectorsDir(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("SYNCULAR_VECTORS")
	if dir == "" {
		dir = filepath.Join(ModuleRoot(t), "testdata", "vectors")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(abs, "segments-gen3.json")); err != nil {
		t.Fatalf("protocol vectors not found at %s (set SYNCULAR_VECTORS): %v", abs, err)
	}
	return abs
}

// ModuleRoot is the directory holding go.mod, found upwards from the
// test's working directory (its package directory).
func ModuleRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for d := dir; ; {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
		parent := filepath.Dir(d)
		if parent == d {
			t.Fatalf("no go.mod above %s", dir)
		}
		d = parent
	}
}

// ReadVector unmarshals the vector file name into v.
func ReadVector(t testing.TB, name string, v any) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(VectorsDir(t), name))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

// Gen3 is testdata/vectors/segments-gen3.json: a gen-3 store's segments and
// the requests the reference answered against it at NowMs.
type Gen3 struct {
	NowMs int64 `json:"nowMs"`
	Keys  struct {
		Current  string `json:"current"`
		Previous string `json:"previous"`
	} `json:"keys"`
	Audience struct {
		Kind string `json:"kind"`
		Key  string `json:"key"`
	} `json:"audience"`
	Partitions   []string          `json:"partitions"`
	Registry     map[string]string `json:"registry"`
	ScopeDigests map[string]string `json:"scopeDigests"`
	Segments     map[string]struct {
		SegmentID   string `json:"segmentId"`
		BytesSha256 string `json:"bytesSha256"`
		ByteLength  int    `json:"byteLength"`
		MediaType   string `json:"mediaType"`
	} `json:"segments"`
	Cases []struct {
		Name   string  `json:"name"`
		Path   string  `json:"path"`
		Token  *string `json:"token"`
		Expect struct {
			Status  any    `json:"status"`
			Segment string `json:"segment"`
			Code    string `json:"code"`
		} `json:"expect"`
	} `json:"cases"`
}

// LoadGen3 reads segments-gen3.json; a file without cases fails the test.
func LoadGen3(t testing.TB) Gen3 {
	t.Helper()
	var v Gen3
	ReadVector(t, "segments-gen3.json", &v)
	if len(v.Cases) == 0 {
		t.Fatal("segments-gen3.json has no cases")
	}
	return v
}

// FreePort reserves a loopback port and releases it for the caller.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
