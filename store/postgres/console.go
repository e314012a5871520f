package postgres

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paddock-dev/paddock/store"
)

// The console's reads (store/console.go) and the agent-version write of
// CreateAgent. Migration 00008_console.sql holds their table and indexes.

// lockAgentByName reads the agent of namespace ns named name under a row
// lock (nil: none).
func lockAgentByName(ctx context.Context, tx pgx.Tx, ns, name string) (*store.Agent, error) {
	a, err := scanAgent(tx.QueryRow(ctx, `SELECT `+agentCols+` FROM agents WHERE namespace = $1 AND name = $2 FOR UPDATE`,
		ns, name))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &a, nil
}

// appendAgentVersion appends a's definition as its next version when
// store.NewAgentVersion says it is one, in CreateAgent's transaction (the
// agent row is locked by it, so max+1 is not raced).
func appendAgentVersion(ctx context.Context, tx pgx.Tx, prev *store.Agent, a store.Agent) error {
	if !store.NewAgentVersion(prev, a) {
		return nil
	}
	_, err := tx.Exec(ctx, `
		INSERT INTO agent_versions (agent_uid, version, kind, module_digest, plugin, crash_policy, created_at)
		SELECT $1, coalesce(max(version), 0) + 1, $2, $3, $4, $5, $6 FROM agent_versions WHERE agent_uid = $1`,
		a.UID, a.Kind, nullString(a.ModuleDigest), nullString(a.Plugin), a.CrashPolicy, a.UpdatedAt)
	if err != nil {
		return fmt.Errorf("agent version of %s: %w", a.Name, err)
	}
	return nil
}

// ListAgentVersions pages an agent's versions, newest first; see
// store.Store. The primary key (agent_uid, version) bounds it.
func (s *Store) ListAgentVersions(ctx context.Context, p store.ListAgentVersionsParams) ([]store.AgentVersion, error) {
	before := p.Before
	if before <= 0 {
		before = math.MaxInt64
	}
	var out []store.AgentVersion
	err := s.call(ctx, "list agent versions", func(ctx context.Context) error {
		rows, err := s.pool.Query(ctx, `
			SELECT agent_uid, version, kind, coalesce(module_digest, ''), coalesce(plugin, ''), crash_policy, created_at
			FROM agent_versions WHERE agent_uid = $1 AND version < $2
			ORDER BY version DESC LIMIT $3`, p.AgentUID, before, store.PageLimit(p.Limit))
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.AgentVersion, error) {
			var v store.AgentVersion
			err := r.Scan(&v.AgentUID, &v.Version, &v.Kind, &v.ModuleDigest, &v.Plugin, &v.CrashPolicy, &v.CreatedAt)
			v.CreatedAt = utc(v.CreatedAt)
			return v, err
		})
		return err
	})
	return out, err
}

// CurrentActivation returns the session's activation of the highest epoch
// (the live one when there is one: a claim takes the session's epoch + 1)
// with the database clock; see store.Store. Index activations_key_epoch.
func (s *Store) CurrentActivation(ctx context.Context, key store.ActorKey) (store.ActivationInfo, error) {
	var a store.ActivationInfo
	err := s.call(ctx, "current activation", func(ctx context.Context) error {
		var current *int64
		var ended *time.Time
		err := s.pool.QueryRow(ctx, `
			SELECT activation_uid, agent_uid, session_id, actor_epoch, lease_id, lease_expires_at, current_event_id,
				revision, state, host_id, created_at, ended_at, coalesce(end_reason, ''), clock_timestamp()
			FROM activations WHERE agent_uid = $1 AND session_id = $2
			ORDER BY actor_epoch DESC LIMIT 1`, key.AgentUID, key.SessionID).Scan(
			&a.UID, &a.AgentUID, &a.SessionID, &a.ActorEpoch, &a.LeaseID, &a.LeaseExpiresAt, &current,
			&a.Revision, &a.State, &a.HostID, &a.CreatedAt, &ended, &a.EndReason, &a.Now)
		if err != nil {
			return fmt.Errorf("activation of %s: %w", key, notFound(err))
		}
		if current != nil {
			a.CurrentEventID = *current
		}
		a.LeaseExpiresAt, a.CreatedAt, a.EndedAt, a.Now = utc(a.LeaseExpiresAt), utc(a.CreatedAt), utcPtr(ended), utc(a.Now)
		return nil
	})
	return a, err
}

// BrowseSessions pages filtered sessions in one statement; see
// store.Store. CTE c reads at most store.BrowseScan rows through the
// index the conditions pick (sessions_browse_*, or the primary key), m
// keeps those matching the text, l is the last row read (the cursor of a
// partial page); only m's and l's rows are read in full.
func (s *Store) BrowseSessions(ctx context.Context, p store.BrowseSessionsParams) (store.SessionPage, error) {
	if err := store.CheckBrowse(p); err != nil {
		return store.SessionPage{}, fmt.Errorf("store/postgres: browse sessions: %w", err)
	}
	q, args := browseQuery(p)
	var page store.SessionPage
	err := s.call(ctx, "browse sessions", func(ctx context.Context) error {
		rows, err := s.pool.Query(ctx, q, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		var hits []store.Session
		var last store.ActorKey
		var scanned int64
		for rows.Next() {
			var hit bool
			ss, err := scanSession(prefixRow{rows, []any{&hit, &scanned}})
			if err != nil {
				return err
			}
			if hit {
				hits = append(hits, ss)
			} else {
				last = ss.ActorKey
			}
		}
		if err := rows.Err(); err != nil {
			return err
		}
		page = store.BrowsePage(p, hits, int(scanned), last)
		return nil
	})
	return page, err
}

// browseQuery returns BrowseSessions' statement for p and its arguments.
func browseQuery(p store.BrowseSessionsParams) (string, []any) {
	where, args := store.BrowseWhere(p, "$")
	text := "true"
	if p.Text != "" {
		args = append(args, strings.ToLower(p.Text))
		n := "$" + strconv.Itoa(len(args))
		text = "(strpos(lower(c.session_id), " + n + ") > 0 OR strpos(lower(coalesce(c.key, '')), " + n + ") > 0)"
	}
	args = append(args, store.BrowseScan(p), store.PageLimit(p.Limit))
	scan, limit := "$"+strconv.Itoa(len(args)-1), "$"+strconv.Itoa(len(args))
	q := `
		WITH c AS (
			SELECT s.agent_uid, s.session_id, s.key FROM sessions s WHERE ` + where + `
			ORDER BY s.agent_uid, s.session_id LIMIT ` + scan + `),
		m AS (SELECT c.agent_uid, c.session_id FROM c WHERE ` + text + `
			ORDER BY c.agent_uid, c.session_id LIMIT ` + limit + `),
		l AS (SELECT c.agent_uid, c.session_id FROM c ORDER BY c.agent_uid DESC, c.session_id DESC LIMIT 1),
		x AS (SELECT m.agent_uid, m.session_id, true AS hit FROM m
			UNION ALL SELECT l.agent_uid, l.session_id, false FROM l)
		SELECT x.hit, (SELECT count(*) FROM c), ` + sessionCols + `
		FROM x JOIN sessions s ON s.agent_uid = x.agent_uid AND s.session_id = x.session_id
		ORDER BY x.hit DESC, s.agent_uid, s.session_id`
	return q, args
}

// prefixRow scans its leading columns into pre, the rest into a scan
// function's destinations.
type prefixRow struct {
	row pgx.Row
	pre []any
}

func (r prefixRow) Scan(dest ...any) error {
	return r.row.Scan(append(append([]any{}, r.pre...), dest...)...)
}

// ClusterFigures reads the overview's figures in one snapshot; see
// store.Store. Live activations through the partial index
// activations_live, pending sessions through sessions_browse_pending,
// the last minute's turns through turns_committed_at.
func (s *Store) ClusterFigures(ctx context.Context) (store.ClusterFigures, error) {
	f := store.ClusterFigures{Pending: map[string]int64{}}
	err := s.readTx(ctx, "cluster figures", func(ctx context.Context, tx pgx.Tx) error {
		f.Live, f.Pending = nil, map[string]int64{}
		if err := tx.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&f.Now); err != nil {
			return err
		}
		f.Now = utc(f.Now)
		rows, err := tx.Query(ctx, `
			SELECT host_id, agent_uid, count(*), count(current_event_id), min(lease_expires_at), max(lease_expires_at)
			FROM activations WHERE state IN `+liveStates+`
			GROUP BY host_id, agent_uid ORDER BY host_id, agent_uid`)
		if err != nil {
			return err
		}
		f.Live, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.LiveActivations, error) {
			var l store.LiveActivations
			err := r.Scan(&l.HostID, &l.AgentUID, &l.Live, &l.Busy, &l.FirstExpiry, &l.LastExpiry)
			l.FirstExpiry, l.LastExpiry = utc(l.FirstExpiry), utc(l.LastExpiry)
			return l, err
		})
		if err != nil {
			return err
		}
		rows, err = tx.Query(ctx, `
			SELECT s.agent_uid, count(*) FROM sessions s
			WHERE s.pending_since IS NOT NULL AND s.status <> 'destroyed' GROUP BY s.agent_uid`)
		if err != nil {
			return err
		}
		var agent string
		var n int64
		if _, err := pgx.ForEachRow(rows, []any{&agent, &n}, func() error { f.Pending[agent] = n; return nil }); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT count(*) FROM turns WHERE committed_at > $1::timestamptz - interval '1 minute'`,
			f.Now).Scan(&f.TurnsLastMinute)
	})
	return f, err
}
