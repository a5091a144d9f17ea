package segdata

import (
	"bytes"
	"database/sql"
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

func TestSQLiteImageHoldsRows(t *testing.T) {
	const n = 2000
	img, err := SQLiteImage(t.TempDir(), n)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(img, []byte("SQLite format 3\x00")) {
		t.Fatalf("image starts %q", img[:16])
	}
	path := filepath.Join(t.TempDir(), "copy.db")
	if err := os.WriteFile(path, img, 0o600); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var count int
	if err := db.QueryRow(`SELECT count(*) FROM tasks`).Scan(&count); err != nil {
		t.Fatal(err)
	}
	if count != n {
		t.Fatalf("image has %d rows, want %d", count, n)
	}
	again, err := SQLiteImage(t.TempDir(), n)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(img, again) {
		t.Error("two images of the same rows differ")
	}
}

func TestRowsSegmentParses(t *testing.T) {
	const n = 500
	seg := RowsSegment(n)
	if string(seg[:8]) != "SSG2\x01\x00\x00\x00" {
		t.Fatalf("header %q", seg[:8])
	}
	want := Rows(n)
	rest := seg[8:]
	i := 0
	for ; len(rest) > 0; i++ {
		l := binary.LittleEndian.Uint32(rest)
		var r Row
		if err := json.Unmarshal(rest[4:4+l], &r); err != nil {
			t.Fatalf("row %d: %v", i, err)
		}
		if i >= n || r != want[i] {
			t.Fatalf("row %d differs", i)
		}
		rest = rest[4+l:]
	}
	if i != n {
		t.Fatalf("segment has %d rows, want %d", i, n)
	}
	if !bytes.Equal(seg, RowsSegment(n)) {
		t.Error("two segments of the same rows differ")
	}
}
