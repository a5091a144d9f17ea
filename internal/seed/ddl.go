package seed

// DDL, verbatim from the vectors' sqlite_master (after "CREATE TABLE ").
// SQLite stores a CREATE TABLE IF NOT EXISTS as "CREATE TABLE <rest>", so
// sqlite_master of a seeded file matches the vector files byte for byte.
const (
	// vectors/segments-pre-logepoch.sqlite
	ddlSegmentsGen1 = `sync_segments(
        segment_id TEXT PRIMARY KEY, partition TEXT NOT NULL,
        tbl TEXT NOT NULL, schema_version INTEGER NOT NULL,
        media_type TEXT NOT NULL, scope_digest TEXT NOT NULL,
        as_of_commit_seq INTEGER NOT NULL, row_count INTEGER NOT NULL,
        row_cursor TEXT, next_row_cursor TEXT,
        byte_length INTEGER NOT NULL, created_at_ms INTEGER NOT NULL,
        expires_at_ms INTEGER NOT NULL, bytes BLOB NOT NULL
      )`
	// vectors/segments-legacy.sqlite
	ddlSegmentsGen2 = `sync_segments(
        segment_id TEXT PRIMARY KEY, partition TEXT NOT NULL,
        log_epoch TEXT NOT NULL,
        tbl TEXT NOT NULL, schema_version INTEGER NOT NULL,
        media_type TEXT NOT NULL, scope_digest TEXT NOT NULL,
        as_of_commit_seq INTEGER NOT NULL, row_count INTEGER NOT NULL,
        row_cursor TEXT, next_row_cursor TEXT,
        byte_length INTEGER NOT NULL, created_at_ms INTEGER NOT NULL,
        expires_at_ms INTEGER NOT NULL, bytes BLOB NOT NULL
      )`
	// vectors/segments-gen3.sqlite
	ddlSegmentsGen3 = `sync_segments(
  segment_id TEXT PRIMARY KEY, partition TEXT NOT NULL,
  log_epoch TEXT NOT NULL,
  tbl TEXT NOT NULL, schema_version INTEGER NOT NULL,
  media_type TEXT NOT NULL, scope_digest TEXT NOT NULL,
  as_of_commit_seq INTEGER NOT NULL, row_count INTEGER NOT NULL,
  row_cursor TEXT, next_row_cursor TEXT,
  byte_length INTEGER NOT NULL, created_at_ms INTEGER NOT NULL,
  expires_at_ms INTEGER NOT NULL, bytes BLOB NOT NULL
)`
	ddlScopes = `sync_segment_scopes(
  segment_id TEXT NOT NULL, scope_digest TEXT NOT NULL,
  PRIMARY KEY (segment_id, scope_digest)
)`
	ddlPublications = `sync_segment_publications(
  segment_id TEXT NOT NULL, pub_key TEXT NOT NULL,
  partition TEXT NOT NULL, log_epoch TEXT NOT NULL,
  tbl TEXT NOT NULL, schema_version INTEGER NOT NULL,
  media_type TEXT NOT NULL, scope_digest TEXT NOT NULL,
  as_of_commit_seq INTEGER NOT NULL, row_count INTEGER NOT NULL,
  row_cursor TEXT, next_row_cursor TEXT,
  byte_length INTEGER NOT NULL, created_at_ms INTEGER NOT NULL,
  expires_at_ms INTEGER NOT NULL,
  PRIMARY KEY (segment_id, pub_key)
)`
	ddlRegistry = `sync_partition_registry(
          partition TEXT PRIMARY KEY, log_epoch TEXT NOT NULL,
          epoch_required INTEGER NOT NULL DEFAULT 0,
          last_authenticated_at_ms INTEGER NOT NULL)`
	// No vector file holds this table: the columns are protocol §4's,
	// in the reference's order (its INSERT lists them so), and the
	// primary key is the reference's upsert conflict target
	// (ON CONFLICT(partition, name)).
	ddlCheckpoints = `sync_backfill_checkpoints(
  partition TEXT NOT NULL, name TEXT NOT NULL,
  schema_version INTEGER NOT NULL, state TEXT NOT NULL,
  watermark INTEGER NOT NULL, owner_epoch INTEGER NOT NULL,
  observed_rows INTEGER NOT NULL, updated_at_ms INTEGER NOT NULL,
  PRIMARY KEY (partition, name)
)`

	// The HEAD reference's migration of a gen-1 table (headOpen in
	// vectors/segments-pre-logepoch.json): the column is appended last.
	alterLogEpoch = `ALTER TABLE sync_segments ADD COLUMN log_epoch TEXT NOT NULL DEFAULT ''`
)

func createTable(ddl string) string { return "CREATE TABLE IF NOT EXISTS " + ddl }
