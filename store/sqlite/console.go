package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/paddock-dev/paddock/store"
)

// The console's reads (store/console.go) and the agent-version write of
// CreateAgent. Migration 00007_console.sql holds their table and indexes.

// agentByName reads the agent of namespace ns named name in the write
// transaction (nil: none).
func agentByName(tx *txn, ns, name string) (*store.Agent, error) {
	a, err := scanAgent(tx.queryRow(`SELECT `+agentCols+` FROM agents WHERE namespace = ? AND name = ?`, ns, name))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &a, nil
}

// appendAgentVersion appends a's definition as its next version when
// store.NewAgentVersion says it is one, in CreateAgent's transaction.
func appendAgentVersion(tx *txn, prev *store.Agent, a store.Agent) error {
	if !store.NewAgentVersion(prev, a) {
		return nil
	}
	_, err := tx.exec(`
		INSERT INTO agent_versions (agent_uid, version, kind, module_digest, plugin, crash_policy, created_at)
		SELECT ?1, coalesce(max(version), 0) + 1, ?2, ?3, ?4, ?5, ?6 FROM agent_versions WHERE agent_uid = ?1`,
		a.UID, a.Kind, nullString(a.ModuleDigest), nullString(a.Plugin), a.CrashPolicy, a.UpdatedAt.UnixMilli())
	if err != nil {
		return fmt.Errorf("agent version of %s: %w", a.Name, err)
	}
	return nil
}

// ListAgentVersions pages an agent's versions, newest first; see
// store.Store.
func (s *Store) ListAgentVersions(ctx context.Context, p store.ListAgentVersionsParams) ([]store.AgentVersion, error) {
	before := p.Before
	if before <= 0 {
		before = math.MaxInt64
	}
	var out []store.AgentVersion
	err := s.read(ctx, "list agent versions", func(tx *txn) error {
		rows, err := tx.query(`
			SELECT agent_uid, version, kind, coalesce(module_digest, ''), coalesce(plugin, ''), crash_policy, created_at
			FROM agent_versions WHERE agent_uid = ? AND version < ?
			ORDER BY version DESC LIMIT ?`, p.AgentUID, before, store.PageLimit(p.Limit))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var v store.AgentVersion
			var at int64
			if err := rows.Scan(&v.AgentUID, &v.Version, &v.Kind, &v.ModuleDigest, &v.Plugin, &v.CrashPolicy, &at); err != nil {
				return err
			}
			v.CreatedAt = msTime(at)
			out = append(out, v)
		}
		return rows.Err()
	})
	return out, err
}

// CurrentActivation returns the session's activation of the highest epoch
// (the live one when there is one) with the database clock; see
// store.Store. Index activations_key_epoch.
func (s *Store) CurrentActivation(ctx context.Context, key store.ActorKey) (store.ActivationInfo, error) {
	var a store.ActivationInfo
	err := s.read(ctx, "current activation", func(tx *txn) error {
		var expires, created, now int64
		var current, ended sql.NullInt64
		err := tx.queryRow(`
			SELECT activation_uid, agent_uid, session_id, actor_epoch, lease_id, lease_expires_at, current_event_id,
				revision, state, host_id, created_at, ended_at, coalesce(end_reason, ''), `+nowMS+`
			FROM activations WHERE agent_uid = ? AND session_id = ?
			ORDER BY actor_epoch DESC LIMIT 1`, key.AgentUID, key.SessionID).Scan(
			&a.UID, &a.AgentUID, &a.SessionID, &a.ActorEpoch, &a.LeaseID, &expires, &current,
			&a.Revision, &a.State, &a.HostID, &created, &ended, &a.EndReason, &now)
		if err != nil {
			return fmt.Errorf("activation of %s: %w", key, notFound(err))
		}
		a.LeaseExpiresAt, a.CreatedAt, a.Now = msTime(expires), msTime(created), msTime(now)
		a.CurrentEventID, a.EndedAt = current.Int64, msPtr(ended)
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
		return store.SessionPage{}, fmt.Errorf("store/sqlite: browse sessions: %w", err)
	}
	q, args := browseQuery(p)
	var page store.SessionPage
	err := s.read(ctx, "browse sessions", func(tx *txn) error {
		rows, err := tx.query(q, args...)
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
	where, args := store.BrowseWhere(p, "?")
	text := "1"
	if p.Text != "" {
		args = append(args, strings.ToLower(p.Text))
		n := "?" + strconv.Itoa(len(args))
		text = "(instr(lower(c.session_id), " + n + ") > 0 OR instr(lower(coalesce(c.key, '')), " + n + ") > 0)"
	}
	args = append(args, store.BrowseScan(p), store.PageLimit(p.Limit))
	scan, limit := "?"+strconv.Itoa(len(args)-1), "?"+strconv.Itoa(len(args))
	q := `
		WITH c AS (
			SELECT s.agent_uid, s.session_id, s.key FROM sessions s WHERE ` + where + `
			ORDER BY s.agent_uid, s.session_id LIMIT ` + scan + `),
		m AS (SELECT c.agent_uid, c.session_id FROM c WHERE ` + text + `
			ORDER BY c.agent_uid, c.session_id LIMIT ` + limit + `),
		l AS (SELECT c.agent_uid, c.session_id FROM c ORDER BY c.agent_uid DESC, c.session_id DESC LIMIT 1),
		x AS (SELECT m.agent_uid, m.session_id, 1 AS hit FROM m
			UNION ALL SELECT l.agent_uid, l.session_id, 0 FROM l)
		SELECT x.hit, (SELECT count(*) FROM c), ` + sessionCols + `
		FROM x JOIN sessions s ON s.agent_uid = x.agent_uid AND s.session_id = x.session_id
		ORDER BY x.hit DESC, s.agent_uid, s.session_id`
	return q, args
}

// prefixRow scans its leading columns into pre, the rest into a scan
// function's destinations.
type prefixRow struct {
	row scanner
	pre []any
}

func (r prefixRow) Scan(dest ...any) error {
	return r.row.Scan(append(append([]any{}, r.pre...), dest...)...)
}

// ClusterFigures reads the overview's figures in one snapshot; see
// store.Store. Live activations through activations_lease, pending
// sessions through sessions_browse_pending, the last minute's turns
// through turns_committed_at.
func (s *Store) ClusterFigures(ctx context.Context) (store.ClusterFigures, error) {
	f := store.ClusterFigures{Pending: map[string]int64{}}
	err := s.read(ctx, "cluster figures", func(tx *txn) error {
		var now int64
		if err := tx.queryRow(`SELECT ` + nowMS).Scan(&now); err != nil {
			return err
		}
		f.Now = msTime(now)
		rows, err := tx.query(`
			SELECT host_id, agent_uid, count(*), count(current_event_id), min(lease_expires_at), max(lease_expires_at)
			FROM activations WHERE state IN ` + liveStates + `
			GROUP BY host_id, agent_uid ORDER BY host_id, agent_uid`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var l store.LiveActivations
			var first, last int64
			if err := rows.Scan(&l.HostID, &l.AgentUID, &l.Live, &l.Busy, &first, &last); err != nil {
				return err
			}
			l.FirstExpiry, l.LastExpiry = msTime(first), msTime(last)
			f.Live = append(f.Live, l)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		prow, err := tx.query(`
			SELECT s.agent_uid, count(*) FROM sessions s
			WHERE s.pending_since IS NOT NULL AND s.status <> 'destroyed' GROUP BY s.agent_uid`)
		if err != nil {
			return err
		}
		defer prow.Close()
		for prow.Next() {
			var agent string
			var n int64
			if err := prow.Scan(&agent, &n); err != nil {
				return err
			}
			f.Pending[agent] = n
		}
		if err := prow.Err(); err != nil {
			return err
		}
		return tx.queryRow(`SELECT count(*) FROM turns WHERE committed_at > ? - 60000`, now).Scan(&f.TurnsLastMinute)
	})
	return f, err
}
