package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/paddock-dev/paddock/store"
)

const pluginWorkerCols = `namespace, name, path, sha256, env, processes, created_at, updated_at`

func scanPluginWorker(row pgx.Row) (store.PluginWorker, error) {
	var w store.PluginWorker
	var env string
	if err := row.Scan(&w.Namespace, &w.Name, &w.Path, &w.SHA256, &env, &w.Processes, &w.CreatedAt, &w.UpdatedAt); err != nil {
		return w, err
	}
	var err error
	if w.Env, err = store.DecodePluginEnv(w.Name, env); err != nil {
		return w, err
	}
	w.CreatedAt, w.UpdatedAt = utc(w.CreatedAt), utc(w.UpdatedAt)
	return w, nil
}

// PutPluginWorker registers a plugin worker or replaces the registration of
// that name (created false; CreatedAt kept, UpdatedAt now). Two puts of a
// new name race safely: the second INSERT waits for the first and then
// updates its row.
func (s *Store) PutPluginWorker(ctx context.Context, p store.PluginWorker) (store.PluginWorker, bool, error) {
	p.Namespace = store.NamespaceOr(p.Namespace)
	env, err := store.PluginEnv(p)
	if err != nil {
		return store.PluginWorker{}, false, fmt.Errorf("store/postgres: put plugin worker: %w", err)
	}
	var w store.PluginWorker
	var created bool
	err = s.tx(ctx, "put plugin worker", func(ctx context.Context, tx pgx.Tx) error {
		created = false
		var err error
		w, err = scanPluginWorker(tx.QueryRow(ctx, `
			INSERT INTO plugin_workers (name, path, sha256, env, processes, created_at, updated_at, namespace)
			SELECT $1, $2, $3, $4, $5, t, t, $6 FROM (SELECT clock_timestamp() AS t) c
			ON CONFLICT (namespace, name) DO NOTHING
			RETURNING `+pluginWorkerCols,
			p.Name, p.Path, p.SHA256, env, p.Processes, p.Namespace))
		if err == nil {
			created = true
			return nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		w, err = scanPluginWorker(tx.QueryRow(ctx, `
			UPDATE plugin_workers SET path = $2, sha256 = $3, env = $4, processes = $5, updated_at = clock_timestamp()
			WHERE namespace = $6 AND name = $1
			RETURNING `+pluginWorkerCols,
			p.Name, p.Path, p.SHA256, env, p.Processes, p.Namespace))
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
	err := s.call(ctx, "get plugin worker", func(ctx context.Context) error {
		var err error
		w, err = scanPluginWorker(s.pool.QueryRow(ctx, `
			SELECT `+pluginWorkerCols+` FROM plugin_workers WHERE namespace = $1 AND name = $2`, store.NamespaceOr(ns), name))
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
	err := s.call(ctx, "list plugin workers", func(ctx context.Context) error {
		rows, err := s.pool.Query(ctx, `SELECT `+pluginWorkerCols+` FROM plugin_workers
			WHERE $1 = '' OR namespace = $1 ORDER BY namespace, name`, ns)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.PluginWorker, error) {
			return scanPluginWorker(r)
		})
		return err
	})
	return out, err
}
