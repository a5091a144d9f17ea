// Package seed writes Syncular SQLite segment stores the way the reference
// sync server does (protocol §5.1), for tests, integration tests and the
// demo. The DDL is copied verbatim from the cross-implementation vectors,
// so sqlite_master of a seeded file reads exactly like the reference's.
//
// Generations:
//
//	1  sync_segments without log_epoch (reference before d8f34180;
//	   vectors/segments-pre-logepoch.sqlite)
//	2  sync_segments with log_epoch as created fresh by the reference HEAD
//	   (vectors/segments-legacy.sqlite)
//	3  gen 2 plus sync_segment_scopes and sync_segment_publications
//	   (vectors/segments-gen3.sqlite)
//
// sync_partition_registry is created by SetEpoch, and
// sync_backfill_checkpoints by SetCheckpoint, in any generation.
// A Writer is not safe for concurrent use by several goroutines.
package seed

import (
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/syncular/caddy-syncular/store"

	_ "modernc.org/sqlite" // database/sql driver "sqlite"
)

// SegmentInput is one put. The segment id and byte length come from Bytes.
type SegmentInput struct {
	Bytes []byte
	// Publication carries the metadata: partition, logEpoch (ignored in
	// gen 1), table, schemaVersion, mediaType ("" means rows), scope
	// digest, asOfCommitSeq, rowCount, cursors and the two times.
	// ByteLength is ignored: it is len(Bytes).
	Publication store.Publication
	// PubKey names the gen-3 publication row; "" derives it (PubKey).
	PubKey string
	// RowOnly writes only the sync_segments row, as a writer from before
	// the gen-3 tables existed did: no scope row, no publication row.
	RowOnly bool
}

// Writer writes one store file read-write.
type Writer struct {
	db   *sql.DB
	path string

	logEpoch bool // sync_segments has log_epoch
	gen3     bool // scopes and publications tables exist
}

// Create makes a new store file of generation gen (1, 2 or 3) at path in
// WAL journal mode, as the live sync server runs it. The file must not
// exist.
func Create(path string, gen int) (*Writer, error) {
	if gen < 1 || gen > 3 {
		return nil, fmt.Errorf("seed: unknown schema generation %d (want 1, 2 or 3)", gen)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("seed: %w", err)
	}
	if _, err := os.Lstat(abs); err == nil {
		return nil, fmt.Errorf("seed: %s already exists", abs)
	}
	w, err := open(abs)
	if err != nil {
		return nil, err
	}
	stmts := []string{"PRAGMA journal_mode=WAL"}
	switch gen {
	case 1:
		stmts = append(stmts, createTable(ddlSegmentsGen1))
	case 2:
		stmts = append(stmts, createTable(ddlSegmentsGen2))
	case 3:
		stmts = append(stmts, createTable(ddlSegmentsGen3), createTable(ddlScopes), createTable(ddlPublications))
	}
	for _, q := range stmts {
		if _, err := w.db.Exec(q); err != nil {
			w.db.Close()
			return nil, fmt.Errorf("seed: create %s: %w", abs, err)
		}
	}
	if err := w.refresh(); err != nil {
		w.db.Close()
		return nil, err
	}
	return w, nil
}

// Open opens an existing store file (any generation, journal mode left as
// it is) for writing, e.g. to migrate a copy of a vector file.
func Open(path string) (*Writer, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("seed: %w", err)
	}
	if _, err := os.Stat(abs); err != nil {
		return nil, fmt.Errorf("seed: %w", err)
	}
	w, err := open(abs)
	if err != nil {
		return nil, err
	}
	if err := w.refresh(); err != nil {
		w.db.Close()
		return nil, err
	}
	return w, nil
}

func open(abs string) (*Writer, error) {
	// One connection: a single writer, like the sync server's.
	db, err := sql.Open("sqlite", "file:"+escapePath(filepath.ToSlash(abs))+"?_pragma=busy_timeout(5000)&_txlock=immediate")
	if err != nil {
		return nil, fmt.Errorf("seed: open %s: %w", abs, err)
	}
	db.SetMaxOpenConns(1)
	if err := db.Ping(); err != nil {
		db.Close()
		return nil, fmt.Errorf("seed: open %s: %w", abs, err)
	}
	return &Writer{db: db, path: abs}, nil
}

func escapePath(p string) string {
	out := make([]byte, 0, len(p))
	for i := 0; i < len(p); i++ {
		switch c := p[i]; c {
		case '%', '?', '#':
			out = append(out, fmt.Sprintf("%%%02X", c)...)
		default:
			out = append(out, c)
		}
	}
	return string(out)
}

// refresh re-reads which optional parts of the schema exist.
func (w *Writer) refresh() error {
	var segs, logEpoch, scopes, pubs int
	err := w.db.QueryRow(`SELECT
 (SELECT count(*) FROM sqlite_master WHERE type='table' AND name='sync_segments'),
 (SELECT count(*) FROM pragma_table_info('sync_segments') WHERE name='log_epoch'),
 (SELECT count(*) FROM sqlite_master WHERE type='table' AND name='sync_segment_scopes'),
 (SELECT count(*) FROM sqlite_master WHERE type='table' AND name='sync_segment_publications')`).
		Scan(&segs, &logEpoch, &scopes, &pubs)
	if err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	w.logEpoch = logEpoch > 0
	w.gen3 = scopes > 0 && pubs > 0
	if segs == 0 {
		return fmt.Errorf("seed: %s has no sync_segments table", w.path)
	}
	return nil
}

// Gen reports the schema generation the file has now.
func (w *Writer) Gen() int {
	switch {
	case w.gen3:
		return 3
	case w.logEpoch:
		return 2
	}
	return 1
}

// Path is the absolute path of the file.
func (w *Writer) Path() string { return w.path }

// SegmentID is "sha256:" + the lowercase hex SHA-256 of b.
func SegmentID(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// PubKey derives a publication key from the fields that make a
// publication distinct (the reference's own key formula is not in the
// vectors, which use k0, k1...): hex SHA-256 of the JSON array
// [partition, logEpoch, table, schemaVersion, mediaType, scopeDigest,
// asOfCommitSeq, rowCursor].
func PubKey(p store.Publication) string {
	b, _ := json.Marshal([]any{p.Partition, p.LogEpoch, p.Table, p.SchemaVersion,
		mediaTypeOrRows(p.MediaType), p.ScopeDigest, p.AsOfCommitSeq, p.RowCursor})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func mediaTypeOrRows(m string) string {
	if m == "" {
		return store.MediaRows
	}
	return m
}

// Put stores a segment like the reference put(): INSERT OR REPLACE of the
// content-addressed sync_segments row (same bytes: the last put's fields
// win), and in gen 3 also the scope row and the publication row, in one
// transaction. It returns the segment id.
func (w *Writer) Put(seg SegmentInput) (string, error) {
	if seg.Bytes == nil {
		seg.Bytes = []byte{} // bytes is NOT NULL; an empty segment is a zero-length blob
	}
	id := SegmentID(seg.Bytes)
	p := seg.Publication
	p.ByteLength = int64(len(seg.Bytes))
	p.MediaType = mediaTypeOrRows(p.MediaType)
	err := w.tx(func(tx *sql.Tx) error {
		var err error
		if w.logEpoch {
			_, err = tx.Exec(`INSERT OR REPLACE INTO sync_segments (segment_id, partition, log_epoch,
 tbl, schema_version, media_type, scope_digest, as_of_commit_seq, row_count, row_cursor,
 next_row_cursor, byte_length, created_at_ms, expires_at_ms, bytes)
 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
				id, p.Partition, p.LogEpoch, p.Table, p.SchemaVersion, p.MediaType, p.ScopeDigest,
				p.AsOfCommitSeq, p.RowCount, p.RowCursor, p.NextRowCursor, p.ByteLength,
				p.CreatedAtMs, p.ExpiresAtMs, seg.Bytes)
		} else {
			_, err = tx.Exec(`INSERT OR REPLACE INTO sync_segments (segment_id, partition,
 tbl, schema_version, media_type, scope_digest, as_of_commit_seq, row_count, row_cursor,
 next_row_cursor, byte_length, created_at_ms, expires_at_ms, bytes)
 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
				id, p.Partition, p.Table, p.SchemaVersion, p.MediaType, p.ScopeDigest,
				p.AsOfCommitSeq, p.RowCount, p.RowCursor, p.NextRowCursor, p.ByteLength,
				p.CreatedAtMs, p.ExpiresAtMs, seg.Bytes)
		}
		if err != nil || !w.gen3 || seg.RowOnly {
			return err
		}
		if err := addScope(tx, id, p.ScopeDigest); err != nil {
			return err
		}
		key := seg.PubKey
		if key == "" {
			key = PubKey(p)
		}
		return addPublication(tx, id, key, p)
	})
	if err != nil {
		return "", fmt.Errorf("seed: put: %w", err)
	}
	return id, nil
}

// AddScope records that segmentID was published under digest (gen 3).
func (w *Writer) AddScope(segmentID, digest string) error {
	if !w.gen3 {
		return errors.New("seed: add scope: the store has no gen-3 tables")
	}
	if err := w.tx(func(tx *sql.Tx) error { return addScope(tx, segmentID, digest) }); err != nil {
		return fmt.Errorf("seed: add scope: %w", err)
	}
	return nil
}

// AddPublication writes (or replaces) one publication row and its scope
// row (gen 3). p.MediaType "" means rows.
func (w *Writer) AddPublication(segmentID, pubKey string, p store.Publication) error {
	if !w.gen3 {
		return errors.New("seed: add publication: the store has no gen-3 tables")
	}
	if pubKey == "" {
		pubKey = PubKey(p)
	}
	p.MediaType = mediaTypeOrRows(p.MediaType)
	err := w.tx(func(tx *sql.Tx) error {
		if err := addScope(tx, segmentID, p.ScopeDigest); err != nil {
			return err
		}
		return addPublication(tx, segmentID, pubKey, p)
	})
	if err != nil {
		return fmt.Errorf("seed: add publication: %w", err)
	}
	return nil
}

func addScope(tx *sql.Tx, id, digest string) error {
	_, err := tx.Exec(`INSERT OR IGNORE INTO sync_segment_scopes (segment_id, scope_digest) VALUES (?, ?)`, id, digest)
	return err
}

func addPublication(tx *sql.Tx, id, key string, p store.Publication) error {
	_, err := tx.Exec(`INSERT OR REPLACE INTO sync_segment_publications (segment_id, pub_key,
 partition, log_epoch, tbl, schema_version, media_type, scope_digest, as_of_commit_seq,
 row_count, row_cursor, next_row_cursor, byte_length, created_at_ms, expires_at_ms)
 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		id, key, p.Partition, p.LogEpoch, p.Table, p.SchemaVersion, p.MediaType, p.ScopeDigest,
		p.AsOfCommitSeq, p.RowCount, p.RowCursor, p.NextRowCursor, p.ByteLength,
		p.CreatedAtMs, p.ExpiresAtMs)
	return err
}

// SetEpoch sets partition's current log epoch in sync_partition_registry,
// creating the table (exact reference DDL) when missing. A new row gets
// epoch_required 1, like the rows in vectors/segments-gen3.sqlite.
func (w *Writer) SetEpoch(partition, epoch string, nowMs int64) error {
	err := w.tx(func(tx *sql.Tx) error {
		if _, err := tx.Exec(createTable(ddlRegistry)); err != nil {
			return err
		}
		_, err := tx.Exec(`INSERT INTO sync_partition_registry
 (partition, log_epoch, epoch_required, last_authenticated_at_ms) VALUES (?, ?, 1, ?)
 ON CONFLICT (partition) DO UPDATE SET log_epoch = excluded.log_epoch,
 last_authenticated_at_ms = excluded.last_authenticated_at_ms`, partition, epoch, nowMs)
		return err
	})
	if err != nil {
		return fmt.Errorf("seed: set epoch: %w", err)
	}
	return nil
}

// Checkpoint is one row of sync_backfill_checkpoints (RFC 0007): a
// backfill of a partition declared at a schema version. A checkpoint whose
// SchemaVersion is above a publication's overtakes it (protocol §4).
type Checkpoint struct {
	Partition     string
	Name          string
	SchemaVersion int64
	State         string // "" means "declared", the state a new row starts in
	Watermark     int64
	OwnerEpoch    int64
	ObservedRows  int64
	UpdatedAtMs   int64
}

// SetCheckpoint writes c into sync_backfill_checkpoints, creating the table
// when missing. A row with the same partition and name is replaced.
func (w *Writer) SetCheckpoint(c Checkpoint) error {
	state := c.State
	if state == "" {
		state = "declared"
	}
	err := w.tx(func(tx *sql.Tx) error {
		if _, err := tx.Exec(createTable(ddlCheckpoints)); err != nil {
			return err
		}
		_, err := tx.Exec(`INSERT INTO sync_backfill_checkpoints(
 partition, name, schema_version, state, watermark, owner_epoch, observed_rows, updated_at_ms
) VALUES (?,?,?,?,?,?,?,?)
 ON CONFLICT (partition, name) DO UPDATE SET schema_version = excluded.schema_version,
 state = excluded.state, watermark = excluded.watermark, owner_epoch = excluded.owner_epoch,
 observed_rows = excluded.observed_rows, updated_at_ms = excluded.updated_at_ms`,
			c.Partition, c.Name, c.SchemaVersion, state, c.Watermark, c.OwnerEpoch, c.ObservedRows, c.UpdatedAtMs)
		return err
	})
	if err != nil {
		return fmt.Errorf("seed: set checkpoint: %w", err)
	}
	return nil
}

// DeleteSegment removes the segment row and, in gen 3, its scope and
// publication rows (what the server's expiry sweep does).
func (w *Writer) DeleteSegment(id string) error {
	err := w.tx(func(tx *sql.Tx) error {
		if _, err := tx.Exec(`DELETE FROM sync_segments WHERE segment_id = ?`, id); err != nil {
			return err
		}
		if !w.gen3 {
			return nil
		}
		if _, err := tx.Exec(`DELETE FROM sync_segment_scopes WHERE segment_id = ?`, id); err != nil {
			return err
		}
		_, err := tx.Exec(`DELETE FROM sync_segment_publications WHERE segment_id = ?`, id)
		return err
	})
	if err != nil {
		return fmt.Errorf("seed: delete: %w", err)
	}
	return nil
}

// MigrateLogEpoch adds log_epoch to a gen-1 table the way the reference
// HEAD store does on open: appended last, NOT NULL with an empty-string
// default. A no-op when the column exists.
func (w *Writer) MigrateLogEpoch() error {
	if w.logEpoch {
		return nil
	}
	if _, err := w.db.Exec(alterLogEpoch); err != nil {
		return fmt.Errorf("seed: migrate log_epoch: %w", err)
	}
	return w.refresh()
}

// MigrateGen3 brings the file to gen 3: log_epoch (MigrateLogEpoch) and
// the scopes and publications tables. Existing rows get no scope or
// publication rows, as after the reference's 0.23 upgrade.
func (w *Writer) MigrateGen3() error {
	if err := w.MigrateLogEpoch(); err != nil {
		return err
	}
	err := w.tx(func(tx *sql.Tx) error {
		for _, ddl := range []string{ddlScopes, ddlPublications} {
			if _, err := tx.Exec(createTable(ddl)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("seed: migrate gen 3: %w", err)
	}
	return w.refresh()
}

// Exec runs one statement on the writer's connection (tests, fault
// injection, e.g. dropping a table). The writer's view of which tables
// exist is refreshed afterwards.
func (w *Writer) Exec(query string, args ...any) error {
	if _, err := w.db.Exec(query, args...); err != nil {
		return fmt.Errorf("seed: exec: %w", err)
	}
	w.refresh() // may now lack sync_segments: that is the caller's business
	return nil
}

// Close closes the file.
func (w *Writer) Close() error { return w.db.Close() }

func (w *Writer) tx(f func(*sql.Tx) error) error {
	tx, err := w.db.Begin()
	if err != nil {
		return err
	}
	if err := f(tx); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}
