package sqlite

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// shapeFlags is what the lookup query depends on.
type shapeFlags struct {
	logEpoch bool // sync_segments.log_epoch (gen 2+)
	scopes   bool // sync_segment_scopes (gen 3)
	pubs     bool // sync_segment_publications (gen 3)
	registry bool // sync_partition_registry (epoch fencing)
	ckpts    bool // sync_backfill_checkpoints (overtaken publications)
}

// sqliteShape is the schema as detected at one schema_version.
type sqliteShape struct {
	version int64
	flags   shapeFlags
}

// The schema facts the lookup query depends on, read in one statement so
// they belong to one schema_version. Identifiers are case-insensitive in
// SQLite, so the names are compared that way.
const detectSQL = `SELECT
 (SELECT schema_version FROM pragma_schema_version),
 EXISTS(SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'sync_segments' COLLATE NOCASE),
 EXISTS(SELECT 1 FROM pragma_table_info('sync_segments') WHERE name = 'log_epoch' COLLATE NOCASE),
 EXISTS(SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'sync_segment_scopes' COLLATE NOCASE),
 EXISTS(SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'sync_segment_publications' COLLATE NOCASE),
 EXISTS(SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'sync_partition_registry' COLLATE NOCASE),
 EXISTS(SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'sync_backfill_checkpoints' COLLATE NOCASE)`

// detect reads the schema shape and caches it.
func (h *sqliteHandle) detect(ctx context.Context) (*sqliteShape, error) {
	var sh sqliteShape
	var segments bool
	err := h.detectStmt.QueryRowContext(ctx).Scan(&sh.version, &segments,
		&sh.flags.logEpoch, &sh.flags.scopes, &sh.flags.pubs, &sh.flags.registry, &sh.flags.ckpts)
	if err != nil {
		return nil, err
	}
	if !segments {
		return nil, errors.New("no sync_segments table: not a Syncular segment store")
	}
	h.shape.Store(&sh)
	return &sh, nil
}

// lookupSQL builds the one statement that reads a segment's record. One
// statement is one read transaction, so the row, its publications, its
// scope digests, the registry epochs, the partitions' highest backfill
// checkpoint schema_version and the schema_version it ran under are one
// consistent snapshot even while the writer commits. Result rows: kind 0
// the sync_segments row, 1 a publication row, 2 a scope digest (in the
// key column).
func lookupSQL(f shapeFlags) string {
	var b strings.Builder
	epoch, reg, join := "''", "NULL", ""
	if f.logEpoch {
		epoch = "s.log_epoch"
	}
	if f.registry {
		reg, join = "r.log_epoch", " LEFT JOIN sync_partition_registry r ON r.partition = s.partition"
	}
	// The checkpoint table's primary key starts with partition, so this
	// is an index range scan per row.
	ckpt := func(alias string) string {
		if !f.ckpts {
			return "NULL"
		}
		return "(SELECT max(k.schema_version) FROM sync_backfill_checkpoints k WHERE k.partition = " + alias + ".partition)"
	}
	fmt.Fprintf(&b, "SELECT 0, NULL, s.partition, %s, s.tbl, s.schema_version, s.media_type,"+
		" s.scope_digest, s.as_of_commit_seq, s.row_count, s.row_cursor, s.next_row_cursor,"+
		" s.byte_length, s.created_at_ms, s.expires_at_ms, %s,"+
		" (SELECT schema_version FROM pragma_schema_version), %s"+
		" FROM sync_segments s%s WHERE s.segment_id = ?1", epoch, reg, ckpt("s"), join)
	if f.pubs {
		reg, join = "NULL", ""
		if f.registry {
			reg, join = "r.log_epoch", " LEFT JOIN sync_partition_registry r ON r.partition = p.partition"
		}
		fmt.Fprintf(&b, " UNION ALL SELECT 1, p.pub_key, p.partition, p.log_epoch, p.tbl,"+
			" p.schema_version, p.media_type, p.scope_digest, p.as_of_commit_seq, p.row_count,"+
			" p.row_cursor, p.next_row_cursor, p.byte_length, p.created_at_ms, p.expires_at_ms, %s, NULL, %s"+
			" FROM sync_segment_publications p%s WHERE p.segment_id = ?1", reg, ckpt("p"), join)
	}
	if f.scopes {
		// Scope rows only matter when there are no publication rows.
		b.WriteString(" UNION ALL SELECT 2, c.scope_digest" + strings.Repeat(", NULL", 16) +
			" FROM sync_segment_scopes c WHERE c.segment_id = ?1")
		if f.pubs {
			b.WriteString(" AND NOT EXISTS (SELECT 1 FROM sync_segment_publications x WHERE x.segment_id = ?1)")
		}
	}
	// No ORDER BY: nothing depends on the order of the arms, and each
	// arm walks its primary-key index, so publications come in pub_key
	// order and scope digests sorted.
	return b.String()
}

// openSQL reads a byte range. CAST keeps substr counting bytes even if a
// writer stored the bytes as TEXT. substr of an empty blob is NULL.
const openSQL = `SELECT substr(CAST(bytes AS BLOB), ?2, ?3) FROM sync_segments WHERE segment_id = ?1`
