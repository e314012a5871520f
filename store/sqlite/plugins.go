package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/paddock-dev/paddock/store"
)

const pluginWorkerCols = "name, path, sha256, env, processes, created_at, updated_at"

func scanPluginWorker(sc scanner) (store.PluginWorker, error) {
	var w store.PluginWorker
	var env string
	var created, updated int64
	if err := sc.Scan(&w.Name, &w.Path, &w.SHA256, &env, &w.Processes, &created, &updated); err != nil {
		return w, err
	}
	var err error
	if w.Env, err = store.DecodePluginEnv(w.Name, env); err != nil {
		return w, err
	}
	w.CreatedAt, w.UpdatedAt = msTime(created), msTime(updated)
	return w, nil
}

// PutPluginWorker registers a plugin worker or replaces the registration of
// that name (created false; CreatedAt kept, UpdatedAt now).
func (s *Store) PutPluginWorker(ctx context.Context, p store.PluginWorker) (store.PluginWorker, bool, error) {
	env, err := store.PluginEnv(p)
	if err != nil {
		return store.PluginWorker{}, false, fmt.Errorf("store/sqlite: put plugin worker: %w", err)
	}
	var w store.PluginWorker
	var created bool
	err = s.write(ctx, "put plugin worker", func(tx *txn) error {
		var err error
		w, err = scanPluginWorker(tx.queryRow(`
			INSERT INTO plugin_workers (name, path, sha256, env, processes, created_at, updated_at)
			VALUES (?, ?, ?, ?, ?, `+nowMS+`, `+nowMS+`)
			ON CONFLICT (name) DO NOTHING
			RETURNING `+pluginWorkerCols,
			p.Name, p.Path, p.SHA256, env, p.Processes))
		if err == nil {
			created = true
			return nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		w, err = scanPluginWorker(tx.queryRow(`
			UPDATE plugin_workers SET path = ?, sha256 = ?, env = ?, processes = ?, updated_at = `+nowMS+`
			WHERE name = ?
			RETURNING `+pluginWorkerCols,
			p.Path, p.SHA256, env, p.Processes, p.Name))
		return err
	})
	if err != nil {
		return store.PluginWorker{}, false, err
	}
	return w, created, nil
}

// GetPluginWorker returns a plugin worker by name, or ErrNotFound.
func (s *Store) GetPluginWorker(ctx context.Context, name string) (store.PluginWorker, error) {
	var w store.PluginWorker
	err := s.read(ctx, "get plugin worker", func(tx *txn) error {
		var err error
		w, err = scanPluginWorker(tx.queryRow(`SELECT `+pluginWorkerCols+` FROM plugin_workers WHERE name = ?`, name))
		if err != nil {
			return fmt.Errorf("plugin worker %q: %w", name, notFound(err))
		}
		return nil
	})
	return w, err
}

// ListPluginWorkers returns every plugin worker by name.
func (s *Store) ListPluginWorkers(ctx context.Context) ([]store.PluginWorker, error) {
	var out []store.PluginWorker
	err := s.read(ctx, "list plugin workers", func(tx *txn) error {
		rows, err := tx.query(`SELECT ` + pluginWorkerCols + ` FROM plugin_workers ORDER BY name`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			w, err := scanPluginWorker(rows)
			if err != nil {
				return err
			}
			out = append(out, w)
		}
		return rows.Err()
	})
	return out, err
}
