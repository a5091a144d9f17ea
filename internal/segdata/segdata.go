// Package segdata builds realistic segment bytes for the compress
// package's tests and benchmarks: a real SQLite image (the "sqlite" media
// type) and a rows segment (the "rows" media type). Both are
// deterministic for a given row count, so benchmark ratios repeat.
package segdata

import (
	"database/sql"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"

	_ "modernc.org/sqlite" // database/sql driver "sqlite"
)

// Row is one synthetic task row: ids, text, a JSON-ish payload and
// timestamps, in the proportions an app's synced table has them.
type Row struct {
	ID          string `json:"id"`      // random UUID: incompressible
	UserID      string `json:"user_id"` // one of a few hundred users
	ProjectID   int64  `json:"project_id"`
	Title       string `json:"title"`
	Body        string `json:"body"`
	Status      string `json:"status"`
	Priority    int    `json:"priority"`
	Payload     string `json:"payload"` // JSON text, as apps store it in a TEXT column
	CreatedAtMs int64  `json:"created_at_ms"`
	UpdatedAtMs int64  `json:"updated_at_ms"`
	Version     int64  `json:"version"`
}

var (
	words = strings.Fields(`the a of to and in for on with task project review update fix
add remove check call meeting email report draft plan design build test deploy release
customer invoice order payment ship deliver follow up schedule sync offline client server
database query index cache segment partition table row column migrate schema version
urgent later today tomorrow week month quarter budget cost team alice bob carol dave
erin frank grace heidi ivan judy mallory oscar peggy trent victor walter blue green red
new old open close pending blocked done cancel note idea bug feature chore docs ui api
mobile web desktop login signup settings profile search filter sort export import`)
	statuses = []string{"todo", "in_progress", "blocked", "done", "archived"}
	labels   = []string{"bug", "feature", "chore", "docs", "ux", "backend", "frontend", "ops", "p0", "p1", "p2"}
)

// Rows returns n deterministic rows (the same n gives the same rows).
func Rows(n int) []Row {
	r := rand.New(rand.NewPCG(uint64(n), 0x5e9d47a))
	zipf := rand.NewZipf(r, 1.3, 2, uint64(len(words)-1))
	text := func(min, max int) string {
		k := min + r.IntN(max-min+1)
		var b strings.Builder
		for i := 0; i < k; i++ {
			if i > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(words[zipf.Uint64()])
		}
		return b.String()
	}
	rows := make([]Row, n)
	t := int64(1750000000000)
	for i := range rows {
		t += int64(r.IntN(60_000))
		var id [16]byte
		for j := range id {
			id[j] = byte(r.Uint32())
		}
		id[6], id[8] = id[6]&0x0f|0x40, id[8]&0x3f|0x80
		tags := make([]string, r.IntN(4))
		for j := range tags {
			tags[j] = labels[r.IntN(len(labels))]
		}
		payload, _ := json.Marshal(map[string]any{
			"tags":      tags,
			"estimate":  r.IntN(40),
			"assignees": []string{fmt.Sprintf("user-%04d", r.IntN(300))},
			"checklist": []map[string]any{{"text": text(2, 6), "done": r.IntN(2) == 1}},
			"color":     fmt.Sprintf("#%06x", r.IntN(1<<24)),
		})
		rows[i] = Row{
			ID:          fmt.Sprintf("%x-%x-%x-%x-%x", id[0:4], id[4:6], id[6:8], id[8:10], id[10:16]),
			UserID:      fmt.Sprintf("user-%04d", r.IntN(300)),
			ProjectID:   int64(1 + r.IntN(50)),
			Title:       text(3, 10),
			Body:        text(0, 40),
			Status:      statuses[r.IntN(len(statuses))],
			Priority:    r.IntN(4),
			Payload:     string(payload),
			CreatedAtMs: t,
			UpdatedAtMs: t + int64(r.IntN(86_400_000)),
			Version:     int64(1 + r.IntN(20)),
		}
	}
	return rows
}

// RowsSegment returns a rows segment of n rows. The edge never parses rows
// segments (protocol §1); this is the project's stand-in format
// (cmd/syncular-demo, the vectors): the magic "SSG2", a little-endian
// uint32 version 1 as in vectors/segments-*.sqlite, then each row as a
// little-endian uint32 length and the row's JSON.
func RowsSegment(n int) []byte {
	out := []byte("SSG2\x01\x00\x00\x00")
	for _, row := range Rows(n) {
		b, _ := json.Marshal(row)
		out = binary.LittleEndian.AppendUint32(out, uint32(len(b)))
		out = append(out, b...)
	}
	return out
}

// SQLiteImage returns the bytes of a real SQLite database holding n rows
// in a "tasks" table with two indexes, written under dir and compacted
// with VACUUM INTO, as a server builds a "sqlite" segment.
func SQLiteImage(dir string, n int) ([]byte, error) {
	work := filepath.Join(dir, "build.db")
	out := filepath.Join(dir, "image.db")
	db, err := sql.Open("sqlite", "file:"+work)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	stmts := []string{
		`CREATE TABLE tasks (id TEXT PRIMARY KEY, user_id TEXT NOT NULL, project_id INTEGER NOT NULL,
 title TEXT NOT NULL, body TEXT NOT NULL, status TEXT NOT NULL, priority INTEGER NOT NULL,
 payload TEXT NOT NULL, created_at_ms INTEGER NOT NULL, updated_at_ms INTEGER NOT NULL,
 version INTEGER NOT NULL)`,
		`CREATE INDEX tasks_user ON tasks (user_id, updated_at_ms)`,
		`CREATE INDEX tasks_project ON tasks (project_id, status)`,
	}
	for _, q := range stmts {
		if _, err := db.Exec(q); err != nil {
			return nil, err
		}
	}
	tx, err := db.Begin()
	if err != nil {
		return nil, err
	}
	ins, err := tx.Prepare(`INSERT INTO tasks VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`)
	if err != nil {
		tx.Rollback()
		return nil, err
	}
	for _, r := range Rows(n) {
		if _, err := ins.Exec(r.ID, r.UserID, r.ProjectID, r.Title, r.Body, r.Status, r.Priority,
			r.Payload, r.CreatedAtMs, r.UpdatedAtMs, r.Version); err != nil {
			tx.Rollback()
			return nil, err
		}
	}
	ins.Close()
	if err := tx.Commit(); err != nil {
		return nil, err
	}
	if _, err := db.Exec(`VACUUM INTO ?`, out); err != nil {
		return nil, err
	}
	return os.ReadFile(out)
}
