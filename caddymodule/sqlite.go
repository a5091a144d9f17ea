package caddymodule

import (
	"fmt"
	"path/filepath"

	"github.com/caddyserver/caddy/v2"

	"github.com/syncular/caddy-syncular/store"
)

// sqlitePool shares one read-only handle per database file across config
// reloads: the new config loads it before the old one is cleaned up.
var sqlitePool = caddy.NewUsagePool()

type pooledSQLite struct{ *store.SQLite }

func (p pooledSQLite) Destruct() error { return p.SQLite.Close() }

// provisionSQLite opens (or shares) the handle of the sync server's
// database file.
func (h *Handler) provisionSQLite() error {
	abs, err := filepath.Abs(h.Store.Path)
	if err != nil {
		return fmt.Errorf("syncular_segments: store sqlite path: %v", err)
	}
	key := "sqlite:" + abs
	val, _, err := sqlitePool.LoadOrNew(key, func() (caddy.Destructor, error) {
		s, err := store.OpenSQLite(abs, store.SQLiteOptions{})
		if err != nil {
			return nil, err
		}
		return pooledSQLite{s}, nil
	})
	if err != nil {
		return fmt.Errorf("syncular_segments: opening sqlite store %s: %v", abs, err)
	}
	h.poolKey = key
	h.store = val.(pooledSQLite).SQLite
	return nil
}

// releaseSQLite drops this handler's reference to the shared handle.
func releaseSQLite(key string) error {
	_, err := sqlitePool.Delete(key)
	return err
}
