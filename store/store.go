// Package store reads segment records and bytes from the stores a Syncular
// sync server writes (protocol §5). It never writes them and knows
// nothing of Caddy.
package store

import (
	"context"
	"errors"
	"io"
	"time"

	"github.com/syncular/caddy-syncular/segid"
)

// DefaultTimeout is the one default bound on a store call: the handler's
// store_timeout, the cache's shared calls (CacheOptions.Timeout) and the
// SQLite busy wait (sqlite.Options.BusyTimeout) all default to it. A store
// slower than this is a fault the client is asked to retry.
const DefaultTimeout = 5 * time.Second

// ErrNotFound means the store has no record of the segment id (§4 step 1,
// or an object removed by a lifecycle rule). Every other error a Store
// returns is a store fault (503 edge.store_unavailable).
var ErrNotFound = errors.New("segment not found")

// Media types a publication may carry.
const (
	MediaRows   = "rows"
	MediaSQLite = "sqlite"
)

// Publication is one grant under which a content address was published
// (protocol §4). Times are epoch milliseconds.
type Publication struct {
	// Partition the segment was built from; never logged or sent.
	Partition string `json:"partition"`
	// LogEpoch of the partition's commit log the segment belongs to.
	LogEpoch string `json:"logEpoch"`
	// Table the segment's rows come from.
	Table string `json:"table"`
	// SchemaVersion the rows were written under.
	SchemaVersion int64 `json:"schemaVersion"`
	// MediaType is MediaRows or MediaSQLite.
	MediaType string `json:"mediaType"`
	// ScopeDigest is the 64-hex SHA-256 of the effective scopes the
	// segment was built for; a token's sd must equal it.
	ScopeDigest string `json:"scopeDigest"`
	// AsOfCommitSeq is the commit the segment is a snapshot at.
	AsOfCommitSeq int64 `json:"asOfCommitSeq"`
	// RowCount is the number of rows in the segment.
	RowCount int64 `json:"rowCount"`
	// RowCursor and NextRowCursor bound the rows of a chunked snapshot
	// (nil: the first chunk, or the last).
	RowCursor     *string `json:"rowCursor"`
	NextRowCursor *string `json:"nextRowCursor"`
	// ByteLength is the segment's size in bytes.
	ByteLength int64 `json:"byteLength"`
	// CreatedAtMs is when the publication was written.
	CreatedAtMs int64 `json:"createdAtMs"`
	// ExpiresAtMs is when the grant ends (§4: live while now < it).
	ExpiresAtMs int64 `json:"expiresAtMs"`
}

// Record is what a store knows about one segment id: its size, its media
// type and every publication of it (explicit or derived, §4).
type Record struct {
	// SegmentID is the content address: "sha256:" + 64 lowercase hex.
	SegmentID string
	// ByteLength is the segment's size in bytes.
	ByteLength int64
	// MediaType is MediaRows or MediaSQLite.
	MediaType string
	// Publications are the grants the segment is published under.
	Publications []Publication

	// Fenced is true when the store knows each partition's current
	// logEpoch (§5.1 epoch fencing). Epochs then maps every partition
	// named in Publications that the registry lists to its current
	// epoch; a partition absent from the map is not servable.
	Fenced bool
	Epochs map[string]string

	// Checkpoints maps a partition named in Publications to the highest
	// schema_version of its backfill checkpoint rows (§4, RFC 0007), when
	// the store holds a checkpoint table and the partition has rows. A
	// publication whose schemaVersion is lower than its partition's entry
	// is overtaken: no longer granted. Nil or a missing partition: nothing
	// is overtaken.
	Checkpoints map[string]int64

	// LegacyHeader is true when the segment's S3 bytes object carries an
	// x-amz-meta-syncular-record header (an older writer's record,
	// protocol §5.2), whether or not that header is the record in use.
	// A presigned GET of such an object would hand the header, and the
	// partition id in it, to the client. Always false for other stores.
	LegacyHeader bool
}

// Store is a read-only segment store. Its ids are parsed (segid.ParseID,
// where the request entered); the zero ID names no segment: ErrNotFound,
// without a read.
type Store interface {
	// Lookup returns the record of id, ErrNotFound, or a fault.
	Lookup(ctx context.Context, id segid.ID) (*Record, error)
	// Open returns the segment's bytes from offset off, length n (n < 0:
	// to the end). The caller closes the reader. ErrNotFound or a fault.
	//
	// The range is cut at the segment's end, as io.SectionReader cuts it,
	// whatever the store: a range that runs past the end reads to the
	// end, and an offset at or past the end reads nothing (an empty
	// reader, no error). The 416 for a client's Range is the caller's,
	// decided from Record.ByteLength before Open is called (protocol §6),
	// so Open has none of its own; bytes shorter than their record then
	// show as a short read, which a verified whole read reports. A
	// negative offset is an error.
	Open(ctx context.Context, id segid.ID, off, n int64) (io.ReadCloser, error)
	// Close releases the store's resources.
	Close() error
}

// RecordGroupReader is a Store that can read other records in the same
// read as the one asked for (SQLite in a rollback journal: one SHARED
// lock for all of them, instead of one each). Cached uses it to refresh
// the records about to expire together with the one a miss reads.
type RecordGroupReader interface {
	// GroupSize is how many other ids LookupGroup reads now (0: none, and
	// the caller should call Lookup).
	GroupSize() int
	// LookupGroup is Lookup of id, reading also (at most
	// GroupSize of them, best effort) in the same read. group holds the
	// records of also that were read and decoded (and may hold others
	// read in the same transaction); an id that was not found, did not
	// decode or was not reached is absent. group may be set when err is
	// ErrNotFound; it is nil on any other error.
	LookupGroup(ctx context.Context, id segid.ID, also []string) (rec *Record, group map[string]*Record, err error)
}
