package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/paddock-dev/paddock/store"
)

const pluginWorkerCols = "namespace, name, path, sha256, env, processes, created_at, updated_at"

func scanPluginWorker(sc scanner) (store.PluginWorker, error) {
	var w store.PluginWorker
	var env string
	var created, updated int64
	if err := sc.Scan(&w.Namespace, &w.Name, &w.Path, &w.SHA256, &env, &w.Processes, &created, &updated); err != nil {
		return w, err
	}
	var err error
	if w.Env, err = store.DecodePluginEnv(w.Name, env); err != nil {
		return w, err
	}
	w.CreatedAt, w.UpdatedAt = msTime(created), msTime(updated)
	return w, nil
}

// PutPluginWorker registers a plugin worker in p.Namespace or replaces the
// registration of that name there (created false; CreatedAt kept,
// UpdatedAt now).
func (s *Store) PutPluginWorker(ctx context.Context, p store.PluginWorker) (store.PluginWorker, bool, error) {
	p.Namespace = store.NamespaceOr(p.Namespace)
	env, err := store.PluginEnv(p)
	if err != nil {
		return store.PluginWorker{}, false, fmt.Errorf("store/sqlite: put plugin worker: %w", err)
	}
	var w store.PluginWorker
	var created bool
	err = s.write(ctx, "put plugin worker", func(tx *txn) error {
		var err error
		w, err = scanPluginWorker(tx.queryRow(`
			INSERT INTO plugin_workers (namespace, name, path, sha256, env, processes, created_at, updated_at)
			VALUES (?, ?, ?, ?, ?, ?, `+nowMS+`, `+nowMS+`)
			ON CONFLICT (namespace, name) DO NOTHING
			RETURNING `+pluginWorkerCols,
			p.Namespace, p.Name, p.Path, p.SHA256, env, p.Processes))
		if err == nil {
			created = true
			return nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		w, err = scanPluginWorker(tx.queryRow(`
			UPDATE plugin_workers SET path = ?, sha256 = ?, env = ?, processes = ?, updated_at = `+nowMS+`
			WHERE namespace = ? AND name = ?
			RETURNING `+pluginWorkerCols,
			p.Path, p.SHA256, env, p.Processes, p.Namespace, p.Name))
		return err
	})
	if err != nil {
		return store.PluginWorker{}, false, err
	}
	return w, created, nil
}

// GetPluginWorker returns a plugin worker of namespace ns by name, or
// ErrNotFound.
func (s *Store) GetPluginWorker(ctx context.Context, ns, name string) (store.PluginWorker, error) {
	var w store.PluginWorker
	err := s.read(ctx, "get plugin worker", func(tx *txn) error {
		var err error
		w, err = scanPluginWorker(tx.queryRow(`SELECT `+pluginWorkerCols+` FROM plugin_workers WHERE namespace = ? AND name = ?`,
			store.NamespaceOr(ns), name))
		if err != nil {
			return fmt.Errorf("plugin worker %q: %w", name, notFound(err))
		}
		return nil
	})
	return w, err
}

// ListPluginWorkers returns the plugin workers of namespace ns
// (store.AnyNamespace: of every namespace) by namespace and name.
func (s *Store) ListPluginWorkers(ctx context.Context, ns string) ([]store.PluginWorker, error) {
	var out []store.PluginWorker
	err := s.read(ctx, "list plugin workers", func(tx *txn) error {
		rows, err := tx.query(`SELECT `+pluginWorkerCols+` FROM plugin_workers
			WHERE ?1 = '' OR namespace = ?1 ORDER BY namespace, name`, ns)
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
