// Package busywriter stands in for a sync server writing its SQLite file
// beside the edge: one connection with no busy timeout (as the reference
// server ships) committing a small transaction on a fixed interval, so a
// commit that meets another process's lock fails at once with "database
// is locked" and is counted. A Probe measures, without taking any lock,
// the share of time another process holds a read lock on the file.
// Test and bench support only.
package busywriter

import (
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"time"

	_ "modernc.org/sqlite" // database/sql driver "sqlite"
)

// Result is what a writer did.
type Result struct {
	Commits  int            // attempted
	Failed   int            // failed
	Errors   map[string]int // failure messages and how often each came
	FailedAt []time.Time    // when each failed commit started
}

// String is e.g. "3 of 600 commits failed (database is locked: 3)".
func (r Result) String() string {
	var parts []string
	for m, n := range r.Errors {
		parts = append(parts, fmt.Sprintf("%s: %d", m, n))
	}
	s := fmt.Sprintf("%d of %d commits failed", r.Failed, r.Commits)
	if len(parts) > 0 {
		s += " (" + strings.Join(parts, "; ") + ")"
	}
	return s
}

// Writer commits on its own goroutine until Stop.
type Writer struct {
	db   *sql.DB
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	res  Result
}

// Prepare creates the writer's table. Call it before the edge opens the
// file: a schema change while the edge reads is a different test.
func Prepare(path string) error {
	db, err := open(path)
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = db.Exec("CREATE TABLE IF NOT EXISTS busywriter_ticks (n INTEGER PRIMARY KEY, at_ms INTEGER NOT NULL, note TEXT NOT NULL)")
	return err
}

func open(path string) (*sql.DB, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	// No busy_timeout: SQLite's default of none, the reference's.
	db, err := sql.Open("sqlite", "file:"+filepath.ToSlash(abs))
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	if err := db.Ping(); err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}

// Start begins committing one small transaction every interval (after
// Prepare). The journal mode is the file's, as the writer finds it.
func Start(path string, interval time.Duration) (*Writer, error) {
	db, err := open(path)
	if err != nil {
		return nil, err
	}
	w := &Writer{db: db, stop: make(chan struct{}), done: make(chan struct{}), res: Result{Errors: map[string]int{}}}
	go w.run(interval)
	return w, nil
}

func (w *Writer) run(interval time.Duration) {
	defer close(w.done)
	t := time.NewTicker(interval)
	defer t.Stop()
	note := strings.Repeat("x", 200)
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
		}
		// One statement in autocommit: a failed commit is rolled back by
		// SQLite itself, as a sync server's failed write would be.
		at := time.Now()
		_, err := w.db.Exec("INSERT INTO busywriter_ticks (at_ms, note) VALUES (?, ?)", time.Now().UnixMilli(), note)
		w.mu.Lock()
		w.res.Commits++
		if err != nil {
			w.res.Failed++
			w.res.FailedAt = append(w.res.FailedAt, at)
			msg := err.Error()
			if strings.Contains(msg, "database is locked") {
				msg = "database is locked"
			}
			w.res.Errors[msg]++
		}
		w.mu.Unlock()
	}
}

// Stop ends the writer and returns its result.
func (w *Writer) Stop() Result {
	close(w.stop)
	<-w.done
	w.db.Close()
	w.mu.Lock()
	defer w.mu.Unlock()
	r := w.res
	r.FailedAt = append([]time.Time(nil), w.res.FailedAt...)
	r.Errors = make(map[string]int, len(w.res.Errors))
	for k, v := range w.res.Errors {
		r.Errors[k] = v
	}
	return r
}

// ErrUnsupported is Probe's answer where fcntl lock queries are unknown.
var ErrUnsupported = errors.New("busywriter: lock probe needs fcntl(2) F_GETLK (Linux)")
