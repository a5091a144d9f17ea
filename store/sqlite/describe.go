package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// This file is read-only introspection for an operator's tool: what a
// SQLite store holds and in which layout. Nothing here is on the request
// path. Its results name partition ids (the operator's own data); a caller that answers clients
// must not pass them on.

// Description is the layout of a SQLite segment store and the
// counts that are cheap to take (protocol §5.1).
type Description struct {
	Path string // absolute

	// Generation is the schema generation: 1 (sync_segments only), 2
	// (sync_segments.log_epoch) or 3 (sync_segment_publications and
	// sync_segment_scopes).
	Generation    int
	SchemaVersion int64 // PRAGMA schema_version
	JournalMode   string

	LogEpoch          bool // sync_segments.log_epoch
	ScopesTable       bool // sync_segment_scopes
	PublicationsTable bool // sync_segment_publications
	Registry          bool // sync_partition_registry: epoch fencing is on
	Checkpoints       bool // sync_backfill_checkpoints: overtaken publications

	Segments           int64 // rows of sync_segments
	Publications       int64 // rows of sync_segment_publications; -1 without the table
	RegistryPartitions int64 // rows of sync_partition_registry; -1 without the table
	CheckpointRows     int64 // rows of sync_backfill_checkpoints; -1 without the table
}

// Describe reads the store's layout and row counts in one read
// transaction, on a connection of its own (read-only, like every other).
// The counts walk each table's smallest index: cheap next to a lookup's
// cost for a file of ordinary size, but bound ctx for a huge one.
func (s *Store) Describe(ctx context.Context) (*Description, error) {
	db, err := sql.Open("sqlite", s.dsn)
	if err != nil {
		return nil, fmt.Errorf("store: sqlite describe: %w", err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("store: sqlite describe: %w", err)
	}
	defer tx.Rollback()

	d := &Description{Path: s.path, Publications: -1, RegistryPartitions: -1, CheckpointRows: -1}
	var segments bool
	// detectSQL is the lookup's own schema detection: the layout
	// reported is the one Lookup reads.
	if err := tx.QueryRowContext(ctx, detectSQL).Scan(&d.SchemaVersion, &segments, &d.LogEpoch,
		&d.ScopesTable, &d.PublicationsTable, &d.Registry, &d.Checkpoints); err != nil {
		return nil, fmt.Errorf("store: sqlite describe: %w", err)
	}
	if !segments {
		return nil, errors.New("store: sqlite describe: no sync_segments table: not a Syncular segment store")
	}
	switch {
	case d.PublicationsTable || d.ScopesTable:
		d.Generation = 3
	case d.LogEpoch:
		d.Generation = 2
	default:
		d.Generation = 1
	}
	if err := tx.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&d.JournalMode); err != nil {
		return nil, fmt.Errorf("store: sqlite describe: journal mode: %w", err)
	}
	for _, c := range []struct {
		table string
		have  bool
		dst   *int64
	}{
		{"sync_segments", true, &d.Segments},
		{"sync_segment_publications", d.PublicationsTable, &d.Publications},
		{"sync_partition_registry", d.Registry, &d.RegistryPartitions},
		{"sync_backfill_checkpoints", d.Checkpoints, &d.CheckpointRows},
	} {
		if !c.have {
			continue
		}
		if err := tx.QueryRowContext(ctx, "SELECT count(*) FROM "+c.table).Scan(c.dst); err != nil {
			return nil, fmt.Errorf("store: sqlite describe: counting %s: %w", c.table, err)
		}
	}
	return d, nil
}
