package caddymodule

import (
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/syncular/caddy-syncular/internal/seed"
)

// A database in a rollback-journal mode is warned about once, naming the
// fix; a second handler sharing the handle (a reload) adds no warning; a
// WAL database none.
func TestSQLiteJournalModeWarning(t *testing.T) {
	for _, mode := range []string{"delete", "wal"} {
		t.Run(mode, func(t *testing.T) {
			db := filepath.Join(t.TempDir(), "sync.db")
			w, err := seed.Create(db, 3)
			if err != nil {
				t.Fatal(err)
			}
			if err := w.Exec("PRAGMA journal_mode=" + mode); err != nil {
				t.Fatal(err)
			}
			w.Close()
			core, logs := observer.New(zap.InfoLevel)
			var hs []*Handler
			for range 2 {
				h := &Handler{Store: &StoreConfig{Backend: "sqlite", Path: db}, logger: zap.New(core)}
				if err := h.provisionSQLite(); err != nil {
					t.Fatal(err)
				}
				hs = append(hs, h)
			}
			for _, h := range hs {
				defer releaseSQLite(h.poolKey)
			}
			warns := logs.FilterMessageSnippet("journal_mode=WAL").All()
			want := map[string]int{"delete": 1, "wal": 0}[mode]
			if len(warns) != want || logs.Len() != want {
				t.Fatalf("%d warnings (%d lines), want %d: %v", len(warns), logs.Len(), want, logs.All())
			}
			if want == 1 {
				f := warns[0].ContextMap()
				if warns[0].Level != zap.WarnLevel || f["journal_mode"] != "delete" || f["path"] != db ||
					!strings.Contains(warns[0].Message, "database is locked") {
					t.Fatalf("warning %+v", warns[0])
				}
			}
		})
	}
}
