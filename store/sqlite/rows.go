package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"github.com/syncular/caddy-syncular/store"
)

// lookupRow is one result row of lookupSQL.
type lookupRow struct {
	kind                             int64
	key, partition, epoch, table     sql.NullString
	schemaVersion                    sql.NullInt64
	media, digest                    sql.NullString
	asOf, rowCount                   sql.NullInt64
	rowCursor, nextRowCursor         sql.NullString
	byteLength, createdAt, expiresAt sql.NullInt64
	registryEpoch                    sql.NullString
	schemaVer                        sql.NullInt64
	checkpoint                       sql.NullInt64 // max schema_version of the partition's checkpoints
}

// lookup runs the record statement. rec is nil when there is no
// sync_segments row; ver is the schema_version the statement ran under.
func (h *sqliteHandle) lookup(ctx context.Context, f shapeFlags, id string) (rec *store.Record, ver int64, err error) {
	st, err := h.lookupStmt(ctx, f)
	if err != nil {
		return nil, 0, err
	}
	return scanLookup(ctx, st, f, id)
}

// scanLookup runs st, the record statement of shape f (on the pool or in
// a transaction), for id.
func scanLookup(ctx context.Context, st *sql.Stmt, f shapeFlags, id string) (rec *store.Record, ver int64, err error) {
	rows, err := st.QueryContext(ctx, id)
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()

	var (
		top     *store.Publication
		topReg  sql.NullString
		topCkpt sql.NullInt64
		pubs    []store.Publication
		regs    []sql.NullString
		ckpts   []sql.NullInt64
		digests []string
		r       lookupRow
	)
	for rows.Next() {
		if err := rows.Scan(&r.kind, &r.key, &r.partition, &r.epoch, &r.table, &r.schemaVersion,
			&r.media, &r.digest, &r.asOf, &r.rowCount, &r.rowCursor, &r.nextRowCursor,
			&r.byteLength, &r.createdAt, &r.expiresAt, &r.registryEpoch, &r.schemaVer, &r.checkpoint); err != nil {
			// database/sql's scan errors quote the stored value, which
			// may be a partition id: never pass them on.
			return nil, 0, errors.New("a stored value has an unexpected type")
		}
		switch r.kind {
		case 0:
			p, err := r.publication("sync_segments")
			if err != nil {
				return nil, 0, err
			}
			top, topReg, topCkpt, ver = &p, r.registryEpoch, r.checkpoint, r.schemaVer.Int64
		case 1:
			p, err := r.publication("sync_segment_publications")
			if err != nil {
				return nil, 0, err
			}
			pubs = append(pubs, p)
			regs = append(regs, r.registryEpoch)
			ckpts = append(ckpts, r.checkpoint)
		case 2:
			if !r.key.Valid {
				return nil, 0, errors.New("NULL scope_digest in sync_segment_scopes")
			}
			digests = append(digests, r.key.String)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, 0, err
	}
	if top == nil {
		return nil, 0, nil
	}

	rec = &store.Record{
		SegmentID:  id,
		ByteLength: top.ByteLength,
		MediaType:  top.MediaType,
	}
	if len(pubs) == 0 {
		// Derived (§4): the row's own fields once per digest in the union
		// of its scope_digest and its sync_segment_scopes rows.
		pubs = make([]store.Publication, 0, 1+len(digests))
		pubs = append(pubs, *top)
		regs = append(regs, topReg)
		ckpts = append(ckpts, topCkpt)
		for _, d := range digests {
			if d == top.ScopeDigest {
				continue
			}
			p := *top
			p.ScopeDigest = d
			pubs = append(pubs, p)
			regs = append(regs, topReg)
			ckpts = append(ckpts, topCkpt)
		}
	}
	rec.Publications = pubs
	if f.registry {
		rec.Fenced = true
		rec.Epochs = make(map[string]string, len(pubs))
		for i, reg := range regs {
			if reg.Valid {
				rec.Epochs[pubs[i].Partition] = reg.String
			}
		}
	}
	if f.ckpts {
		rec.Checkpoints = make(map[string]int64)
		for i, c := range ckpts {
			if c.Valid {
				rec.Checkpoints[pubs[i].Partition] = c.Int64
			}
		}
	}
	return rec, ver, nil
}

// publication converts a kind 0 or 1 row. A NULL where the DDL says NOT
// NULL is a fault: when in doubt, refuse.
func (r *lookupRow) publication(table string) (store.Publication, error) {
	if !r.partition.Valid || !r.epoch.Valid || !r.table.Valid || !r.schemaVersion.Valid ||
		!r.media.Valid || !r.digest.Valid || !r.asOf.Valid || !r.rowCount.Valid ||
		!r.byteLength.Valid || !r.createdAt.Valid || !r.expiresAt.Valid {
		return store.Publication{}, fmt.Errorf("NULL in a NOT NULL column of %s", table)
	}
	p := store.Publication{
		Partition:     r.partition.String,
		LogEpoch:      r.epoch.String,
		Table:         r.table.String,
		SchemaVersion: r.schemaVersion.Int64,
		MediaType:     mediaType(r.media.String),
		ScopeDigest:   r.digest.String,
		AsOfCommitSeq: r.asOf.Int64,
		RowCount:      r.rowCount.Int64,
		ByteLength:    r.byteLength.Int64,
		CreatedAtMs:   r.createdAt.Int64,
		ExpiresAtMs:   r.expiresAt.Int64,
	}
	if r.rowCursor.Valid {
		c := r.rowCursor.String
		p.RowCursor = &c
	}
	if r.nextRowCursor.Valid {
		c := r.nextRowCursor.String
		p.NextRowCursor = &c
	}
	return p, nil
}

// mediaType maps the stored text the way the reference get() does.
func mediaType(s string) string {
	if s == store.MediaSQLite {
		return store.MediaSQLite
	}
	return store.MediaRows
}
