package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/syncular/caddy-syncular/segid"
)

// This file is read-only introspection for an operator's tool: what a
// store holds and in which layout, and the standing of each publication
// of a segment. Nothing here is on the request path. Its results name
// partition ids (the operator's own data); a caller that answers clients
// must not pass them on.

// SQLiteDescription is the layout of a SQLite segment store and the
// counts that are cheap to take (protocol §5.1).
type SQLiteDescription struct {
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
func (s *SQLite) Describe(ctx context.Context) (*SQLiteDescription, error) {
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

	d := &SQLiteDescription{Path: s.path, Publications: -1, RegistryPartitions: -1, CheckpointRows: -1}
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

// S3Description is where an S3 store reads, and for one segment which of
// its objects exist (protocol §5.2).
type S3Description struct {
	Bucket string
	Prefix string

	// Set when a segment id was given.
	SegmentID string
	ObjectKey string // {prefix}seg/sha256/<hex>
	RecordKey string // {prefix}rec/sha256/<hex>.json

	BytesObject  bool  // the bytes object exists
	BytesLength  int64 // its Content-Length
	LegacyHeader bool  // it carries x-amz-meta-syncular-record
	RecordObject bool  // the record object exists
	RecordLength int64 // its Content-Length
}

// Layout names where the segment's record comes from, the way Lookup
// chooses it: the record object when it exists, else the legacy header.
func (d *S3Description) Layout() string {
	switch {
	case !d.BytesObject:
		return "no bytes object (the edge answers not found)"
	case d.RecordObject && d.LegacyHeader:
		return "record object (the bytes object also carries a legacy x-amz-meta-syncular-record header, which is not read)"
	case d.RecordObject:
		return "record object"
	case d.LegacyHeader:
		return "legacy x-amz-meta-syncular-record header only (no record object)"
	default:
		return "bytes without a record (the edge answers not found)"
	}
}

// Describe returns the bucket and prefix, and for a segment id (not
// empty) a HEAD of its bytes object and of its record object, under the
// store's timeout. Nothing is read but object headers.
func (s *S3) Describe(ctx context.Context, segmentID string) (*S3Description, error) {
	d := &S3Description{Bucket: s.bucket, Prefix: s.prefix}
	if segmentID == "" {
		return d, nil
	}
	if !segid.Valid(segmentID) {
		return nil, errors.New("store: s3 describe: not a segment id")
	}
	d.SegmentID, d.ObjectKey, d.RecordKey = segmentID, s.ObjectKey(segmentID), s.RecordKey(segmentID)
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	head := func(key string) (*s3.HeadObjectOutput, error) {
		out, err := s.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &s.bucket, Key: &key})
		if err != nil {
			err = s3MapError("HeadObject", key, err)
			if errors.Is(err, ErrNotFound) {
				return nil, nil
			}
			return nil, err
		}
		return out, nil
	}
	out, err := head(d.ObjectKey)
	if err != nil {
		return nil, err
	}
	if out != nil {
		d.BytesObject = true
		if out.ContentLength != nil {
			d.BytesLength = *out.ContentLength
		}
		_, d.LegacyHeader = out.Metadata[S3RecordMetaKey]
	}
	if out, err = head(d.RecordKey); err != nil {
		return nil, err
	}
	if out != nil {
		d.RecordObject = true
		if out.ContentLength != nil {
			d.RecordLength = *out.ContentLength
		}
	}
	return d, nil
}

// Publication states, as Grant decides them for a token that matches the
// publication's scope digest and audience.
const (
	StateLive      = "live"
	StateExpired   = "expired"
	StateFenced    = "fenced"
	StateOvertaken = "overtaken"
)

// PublicationState is one publication of a record and its standing.
type PublicationState struct {
	Publication
	// State is StateLive, StateExpired, StateFenced or StateOvertaken.
	State string
	// With a partition registry (rec.Fenced): the partition's current
	// epoch, and whether the registry lists the partition at all.
	CurrentEpoch string
	Registered   bool
	// Checkpoint is the partition's highest backfill checkpoint
	// schema_version, when it has one.
	Checkpoint    int64
	HasCheckpoint bool
}

// PublicationStates gives each publication of rec its state at nowMs,
// decided by Grant itself: each publication alone in a record with rec's
// registry epochs and checkpoints, asked for with its own scope digest
// and its partition as the audience.
func PublicationStates(rec *Record, nowMs int64) []PublicationState {
	if rec == nil {
		return nil
	}
	identity := func(p string) string { return p }
	out := make([]PublicationState, 0, len(rec.Publications))
	for _, p := range rec.Publications {
		one := &Record{
			SegmentID:    rec.SegmentID,
			ByteLength:   rec.ByteLength,
			MediaType:    rec.MediaType,
			Publications: []Publication{p},
			Fenced:       rec.Fenced,
			Epochs:       rec.Epochs,
			Checkpoints:  rec.Checkpoints,
		}
		st := PublicationState{Publication: p}
		switch res := Grant(one, p.ScopeDigest, p.Partition, identity, nowMs); {
		case res.Outcome == Granted:
			st.State = StateLive
		case res.Reason == ReasonFenced:
			st.State = StateFenced
		case res.Reason == ReasonOvertaken:
			st.State = StateOvertaken
		default:
			st.State = StateExpired
		}
		if rec.Fenced {
			st.CurrentEpoch, st.Registered = rec.Epochs[p.Partition]
		}
		st.Checkpoint, st.HasCheckpoint = rec.Checkpoints[p.Partition]
		out = append(out, st)
	}
	return out
}
