package caddymodule

import (
	"fmt"
	"path/filepath"
	"sync/atomic"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/syncular/caddy-syncular/store/sqlite"
)

// sqlitePool shares one read-only handle per database file across config
// reloads: the new config loads it before the old one is cleaned up.
var sqlitePool = caddy.NewUsagePool()

// pooledSQLite is a shared handle. Its journal-mode warning goes to the
// logger of the config that provisioned it last (an older config's logger
// may be closed by a reload).
type pooledSQLite struct {
	*sqlite.Store
	logger *atomic.Pointer[zap.Logger]
}

func (p pooledSQLite) Destruct() error { return p.Store.Close() }

// rollbackJournalWarning is logged once each time the handle opens a file
// (at provision, and when a file replaced at the path is reopened) whose
// journal mode is not WAL.
const rollbackJournalWarning = "sqlite store: the sync server's database is in a rollback-journal mode, not WAL: " +
	"a reader's lock can make its writes fail with \"database is locked\" when it sets no busy timeout; " +
	"open the sync server's database with PRAGMA journal_mode=WAL (it persists in the file)"

// journalModeLogger returns the store's JournalMode callback: one warning
// per open of a file that is not in WAL mode.
func journalModeLogger(logger *atomic.Pointer[zap.Logger]) func(path, mode string) {
	return func(path, mode string) {
		if mode == sqlite.JournalWAL {
			return
		}
		if l := logger.Load(); l != nil {
			l.Warn(rollbackJournalWarning, zap.String("path", path), zap.String("journal_mode", mode))
		}
	}
}

// provisionSQLite opens (or shares) the handle of the sync server's
// database file.
func (h *Handler) provisionSQLite() error {
	abs, err := filepath.Abs(h.Store.Path)
	if err != nil {
		return fmt.Errorf("store sqlite path: %w", err)
	}
	key := "sqlite:" + abs
	val, _, err := sqlitePool.LoadOrNew(key, func() (caddy.Destructor, error) {
		lp := new(atomic.Pointer[zap.Logger])
		lp.Store(h.logger)
		s, err := sqlite.Open(abs, sqlite.Options{JournalMode: journalModeLogger(lp)})
		if err != nil {
			return nil, err
		}
		return pooledSQLite{Store: s, logger: lp}, nil
	})
	if err != nil {
		return fmt.Errorf("opening sqlite store %s: %w", abs, err)
	}
	p := val.(pooledSQLite)
	p.logger.Store(h.logger)
	h.poolKey = key
	h.backend = p.Store
	return nil
}

// releaseSQLite drops this handler's reference to the shared handle.
func releaseSQLite(key string) error {
	_, err := sqlitePool.Delete(key)
	return err
}
