package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paddock-dev/paddock/store"
)

// querier is a pool or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// PutModule stores a module by digest and makes it visible in
// p.Namespace; created is false when it was visible there already.
func (s *Store) PutModule(ctx context.Context, p store.PutModuleParams) (store.Module, bool, error) {
	p.Namespace = store.NamespaceOr(p.Namespace)
	if err := store.CheckModule(p); err != nil {
		return store.Module{}, false, fmt.Errorf("store/postgres: put module: %w", err)
	}
	m := store.Module{Namespace: p.Namespace, Digest: p.Digest, ABIVersion: p.ABIVersion, Size: int64(len(p.Bytes)), Bytes: p.Bytes}
	created := false
	err := s.tx(ctx, "put module", func(ctx context.Context, tx pgx.Tx) error {
		// Content-addressed: a digest stored already holds these bytes.
		if _, err := tx.Exec(ctx, `
			INSERT INTO modules (digest, abi_version, size, bytes) VALUES ($1, $2, $3, $4)
			ON CONFLICT (digest) DO NOTHING`, p.Digest, p.ABIVersion, m.Size, p.Bytes); err != nil {
			return err
		}
		err := tx.QueryRow(ctx, `
			INSERT INTO module_namespaces (namespace, digest) VALUES ($1, $2)
			ON CONFLICT (namespace, digest) DO NOTHING
			RETURNING created_at`, p.Namespace, p.Digest).Scan(&m.CreatedAt)
		created = err == nil
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		err = tx.QueryRow(ctx, `
			SELECT m.abi_version, m.size, v.created_at FROM modules m
			JOIN module_namespaces v ON v.digest = m.digest AND v.namespace = $1
			WHERE m.digest = $2`, p.Namespace, p.Digest).Scan(&m.ABIVersion, &m.Size, &m.CreatedAt)
		m.CreatedAt = utc(m.CreatedAt)
		return err
	})
	if err != nil {
		return store.Module{}, false, err
	}
	return m, created, nil
}

// GetModule returns the module with its bytes if it is visible in
// namespace ns (store.AnyNamespace: any module), or ErrNotFound.
func (s *Store) GetModule(ctx context.Context, ns, digest string) (store.Module, error) {
	m := store.Module{Namespace: ns}
	err := s.call(ctx, "get module", func(ctx context.Context) error {
		// The first upload's time: to ns, or to any namespace.
		q, args := `SELECT digest, abi_version, size, bytes, created_at FROM modules WHERE digest = $1`, []any{digest}
		if ns != store.AnyNamespace {
			q = `SELECT m.digest, m.abi_version, m.size, m.bytes, v.created_at FROM modules m
				JOIN module_namespaces v ON v.digest = m.digest AND v.namespace = $2
				WHERE m.digest = $1`
			args = append(args, ns)
		}
		err := s.pool.QueryRow(ctx, q, args...).Scan(&m.Digest, &m.ABIVersion, &m.Size, &m.Bytes, &m.CreatedAt)
		if err != nil {
			return fmt.Errorf("module %s: %w", digest, notFound(err))
		}
		m.CreatedAt = utc(m.CreatedAt)
		return nil
	})
	return m, err
}

// ListModules returns the modules visible in namespace ns
// (store.AnyNamespace: every module) without bytes, newest first.
func (s *Store) ListModules(ctx context.Context, ns string) ([]store.Module, error) {
	var out []store.Module
	err := s.call(ctx, "list modules", func(ctx context.Context) error {
		var rows pgx.Rows
		var err error
		if ns == store.AnyNamespace {
			rows, err = s.pool.Query(ctx, `
				SELECT digest, abi_version, size, created_at FROM modules ORDER BY created_at DESC, digest`)
		} else {
			rows, err = s.pool.Query(ctx, `
				SELECT m.digest, m.abi_version, m.size, v.created_at
				FROM module_namespaces v JOIN modules m ON m.digest = v.digest
				WHERE v.namespace = $1 ORDER BY v.created_at DESC, v.digest`, ns)
		}
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Module, error) {
			m := store.Module{Namespace: ns}
			err := r.Scan(&m.Digest, &m.ABIVersion, &m.Size, &m.CreatedAt)
			m.CreatedAt = utc(m.CreatedAt)
			return m, err
		})
		return err
	})
	return out, err
}

const agentCols = `agent_uid, namespace, name, kind, coalesce(module_digest, ''), coalesce(plugin, ''), crash_policy,
	created_at, updated_at`

func scanAgent(row pgx.Row) (store.Agent, error) {
	var a store.Agent
	err := row.Scan(&a.UID, &a.Namespace, &a.Name, &a.Kind, &a.ModuleDigest, &a.Plugin, &a.CrashPolicy, &a.CreatedAt, &a.UpdatedAt)
	a.CreatedAt, a.UpdatedAt = utc(a.CreatedAt), utc(a.UpdatedAt)
	return a, err
}

// CreateAgent registers an agent; a taken name returns ErrConflict unless
// p.Upsert (then kind, binding and policy are updated). A wasm agent's
// module and a plugin agent's plugin worker must exist (else ErrNotFound).
func (s *Store) CreateAgent(ctx context.Context, p store.CreateAgentParams) (store.Agent, error) {
	kind, err := store.AgentKind(p)
	if err != nil {
		return store.Agent{}, fmt.Errorf("store/postgres: create agent: %w", err)
	}
	// What a foreign key violation means; "" names no module or plugin
	// worker (a NULL would fail the CHECK instead).
	missing, name := fmt.Errorf("module %q: %w", p.ModuleDigest, store.ErrNotFound), p.ModuleDigest
	if kind == store.KindPlugin {
		missing, name = fmt.Errorf("plugin worker %q: %w", p.Plugin, store.ErrNotFound), p.Plugin
	}
	if name == "" {
		return store.Agent{}, wrap("create agent", missing)
	}
	ns := store.NamespaceOr(p.Namespace)
	var a store.Agent
	// One transaction: the agent row and, when store.NewAgentVersion says
	// so, its next version (agent_versions). The row read under lock first
	// is the previous definition.
	err = s.tx(ctx, "create agent", func(ctx context.Context, tx pgx.Tx) error {
		prev, err := lockAgentByName(ctx, tx, ns, p.Name)
		if err != nil {
			return err
		}
		if prev != nil && !p.Upsert {
			return fmt.Errorf("agent name %q: %w", p.Name, store.ErrConflict)
		}
		conflict := `DO NOTHING`
		if p.Upsert {
			conflict = `DO UPDATE SET kind = excluded.kind, module_digest = excluded.module_digest,
				plugin = excluded.plugin, crash_policy = excluded.crash_policy, updated_at = clock_timestamp()`
		}
		// The foreign keys decide whether the module is visible, or the
		// plugin worker registered, in the agent's namespace.
		a, err = scanAgent(tx.QueryRow(ctx, `
			INSERT INTO agents (agent_uid, name, kind, module_digest, plugin, crash_policy, namespace)
			VALUES ($1, $2, $3, $4, $5, $6, $7)
			ON CONFLICT (namespace, name) `+conflict+`
			RETURNING `+agentCols,
			p.UID, p.Name, kind, nullString(p.ModuleDigest), nullString(p.Plugin), p.CrashPolicy, ns))
		switch {
		case err == nil && prev == nil && a.UID != p.UID:
			// Created by another transaction since the read under lock:
			// run again to compare with its definition.
			return fmt.Errorf("agent %q created meanwhile: %w", p.Name, errLockRace)
		case err == nil:
			return appendAgentVersion(ctx, tx, prev, a)
		case errors.Is(err, pgx.ErrNoRows):
			return fmt.Errorf("agent name %q: %w", p.Name, store.ErrConflict)
		case pgCode(err) == codeForeignKeyViolation:
			return missing
		case pgCode(err) == codeUniqueViolation:
			return fmt.Errorf("agent uid %s: %w", p.UID, store.ErrConflict)
		}
		return err
	})
	return a, err
}

// GetAgent finds an agent of namespace ns by uid or name (a uid match
// wins), or returns ErrNotFound; store.AnyNamespace finds any agent by
// uid.
func (s *Store) GetAgent(ctx context.Context, ns, nameOrUID string) (store.Agent, error) {
	var a store.Agent
	err := s.call(ctx, "get agent", func(ctx context.Context) error {
		var err error
		if ns == store.AnyNamespace {
			a, err = scanAgent(s.pool.QueryRow(ctx, `SELECT `+agentCols+` FROM agents WHERE agent_uid = $1`, nameOrUID))
		} else {
			a, err = scanAgent(s.pool.QueryRow(ctx, `
				SELECT `+agentCols+` FROM agents WHERE namespace = $2 AND (agent_uid = $1 OR name = $1)
				ORDER BY agent_uid = $1 DESC LIMIT 1`, nameOrUID, ns))
		}
		if err != nil {
			return fmt.Errorf("agent %q: %w", nameOrUID, notFound(err))
		}
		return nil
	})
	return a, err
}

// ListAgents returns the agents of namespace ns (store.AnyNamespace: of
// every namespace) by name.
func (s *Store) ListAgents(ctx context.Context, ns string) ([]store.Agent, error) {
	var out []store.Agent
	err := s.call(ctx, "list agents", func(ctx context.Context) error {
		rows, err := s.pool.Query(ctx, `SELECT `+agentCols+` FROM agents WHERE $1 = '' OR namespace = $1
			ORDER BY name, namespace`, ns)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Agent, error) { return scanAgent(r) })
		return err
	})
	return out, err
}

// sessionCols selects a session with its counters; the table alias is s.
// The counters cost O(the session's open events): a turn's path reads
// sessionNoCounters instead.
const sessionCols = sessionHead + `(SELECT count(*) FROM actor_events e
	  WHERE e.agent_uid = s.agent_uid AND e.session_id = s.session_id AND e.status = 'open'),
	(SELECT count(*) FROM actor_events e
	  WHERE e.agent_uid = s.agent_uid AND e.session_id = s.session_id AND e.status = 'dead_letter'),
	` + sessionTail

// sessionNoCounters selects a session like sessionCols with OpenEvents
// and DeadLetters zero: what NextDelivery reads, index-bounded however
// many events wait (Dispatch.Session).
const sessionNoCounters = sessionHead + `0, 0, ` + sessionTail

// sessionHead and sessionTail are the columns around the counters.
const (
	sessionHead = `s.agent_uid, s.session_id, coalesce(s.key, ''), s.input, s.status, s.crash_policy,
	s.actor_epoch, s.created_at, s.sleep_ts, s.destroy_ts, s.turn_count, s.last_event_seq,
	`
	sessionTail = `s.pending_since, coalesce(s.sleep_reason, '')`
)

// scanSession scans sessionCols (or sessionNoCounters), then extra
// columns after them into extra.
func scanSession(row pgx.Row, extra ...any) (store.Session, error) {
	var ss store.Session
	var sleepTS, destroyTS, pendingSince *time.Time
	err := row.Scan(append([]any{&ss.AgentUID, &ss.SessionID, &ss.Key, &ss.Input, &ss.Status, &ss.CrashPolicy,
		&ss.ActorEpoch, &ss.CreatedAt, &sleepTS, &destroyTS, &ss.TurnCount, &ss.EventCount, &ss.OpenEvents,
		&ss.DeadLetters, &pendingSince, &ss.SleepReason}, extra...)...)
	ss.CreatedAt = utc(ss.CreatedAt)
	ss.SleepTS, ss.DestroyTS, ss.PendingSince = utcPtr(sleepTS), utcPtr(destroyTS), utcPtr(pendingSince)
	ss.Input = nilIfEmpty(ss.Input)
	return ss, err
}

func getSession(ctx context.Context, q querier, key store.ActorKey) (store.Session, error) {
	ss, err := scanSession(q.QueryRow(ctx, `SELECT `+sessionCols+` FROM sessions s
		WHERE s.agent_uid = $1 AND s.session_id = $2`, key.AgentUID, key.SessionID))
	if err != nil {
		return ss, fmt.Errorf("session %s: %w", key, notFound(err))
	}
	return ss, nil
}

// CreateSession creates a session; see store.Store. An empty CrashPolicy
// takes the agent's. A taken key is decided by the partial unique index
// sessions_key over sessions that are not destroyed (ON CONFLICT ... WHERE
// key IS NOT NULL AND status <> 'destroyed' DO NOTHING), which makes
// get-or-create race-safe: the loser waits for the winner's commit and then
// reads its row, which store.CheckExistingSession judges. When the holder
// was destroyed between the two statements, the insert is tried again.
func (s *Store) CreateSession(ctx context.Context, p store.CreateSessionParams) (store.Session, bool, error) {
	if err := store.CheckSession(p); err != nil {
		return store.Session{}, false, fmt.Errorf("store/postgres: create session: %w", err)
	}
	var ss store.Session
	var created bool
	err := s.call(ctx, "create session", func(ctx context.Context) error {
		for range 3 {
			var err error
			ss, created, err = s.createSession(ctx, p)
			if !errors.Is(err, errKeyFreed) {
				return err
			}
		}
		return fmt.Errorf("session key %q: taken and freed again three times: %w", p.Key, store.ErrConflict)
	})
	if err != nil {
		return store.Session{}, false, err
	}
	return ss, created, nil
}

// errKeyFreed: the session holding a key was destroyed between the insert
// that conflicted and the read of the holder; the insert is tried again.
var errKeyFreed = errors.New("session key freed meanwhile")

// createSession is one attempt of CreateSession.
func (s *Store) createSession(ctx context.Context, p store.CreateSessionParams) (store.Session, bool, error) {
	key := store.ActorKey{AgentUID: p.AgentUID, SessionID: p.SessionID}
	{
		// Each statement runs on its own (no transaction): an INSERT that
		// fails must not abort what follows.
		ss, err := scanSession(s.pool.QueryRow(ctx, `
			WITH ins AS (
				INSERT INTO sessions (agent_uid, session_id, key, input, crash_policy)
				SELECT a.agent_uid, $2, $3, $4, coalesce(nullif($5, ''), a.crash_policy)
				FROM agents a WHERE a.agent_uid = $1
				ON CONFLICT (agent_uid, key) WHERE key IS NOT NULL AND status <> 'destroyed' DO NOTHING
				RETURNING *)
			SELECT s.agent_uid, s.session_id, coalesce(s.key, ''), s.input, s.status, s.crash_policy,
				s.actor_epoch, s.created_at, s.sleep_ts, s.destroy_ts, s.turn_count, s.last_event_seq, 0::bigint,
				0::bigint, s.pending_since, coalesce(s.sleep_reason, '')
			FROM ins s`,
			p.AgentUID, p.SessionID, nullString(p.Key), nilIfEmpty(p.Input), string(store.NewSessionCrashPolicy(p))))
		switch {
		case err == nil:
			return ss, true, nil
		case pgCode(err) == codeUniqueViolation:
			return ss, false, fmt.Errorf("session %s: %w", key, store.ErrConflict)
		case !errors.Is(err, pgx.ErrNoRows):
			return ss, false, err
		}
	}
	// Nothing inserted: an unknown agent, or the key is taken.
	var one int
	if err := s.pool.QueryRow(ctx, `SELECT 1 FROM agents WHERE agent_uid = $1`, p.AgentUID).Scan(&one); err != nil {
		return store.Session{}, false, fmt.Errorf("agent %s: %w", p.AgentUID, notFound(err))
	}
	ss, err := scanSession(s.pool.QueryRow(ctx, `SELECT `+sessionCols+` FROM sessions s
		WHERE s.agent_uid = $1 AND s.key = $2 AND s.status <> 'destroyed'`, p.AgentUID, p.Key))
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Session{}, false, errKeyFreed
	}
	if err != nil {
		return store.Session{}, false, err
	}
	if err := store.CheckExistingSession(ss, p); err != nil {
		return store.Session{}, false, err
	}
	return ss, false, nil
}

// GetSession returns the session with its counters, or ErrNotFound.
func (s *Store) GetSession(ctx context.Context, key store.ActorKey) (store.Session, error) {
	var ss store.Session
	err := s.call(ctx, "get session", func(ctx context.Context) (err error) {
		ss, err = getSession(ctx, s.pool, key)
		return err
	})
	return ss, err
}

// PeekSession returns the session without counters, whether any event is
// open and the session's agent; see store.Store.
func (s *Store) PeekSession(ctx context.Context, key store.ActorKey) (store.SessionPeek, error) {
	var p store.SessionPeek
	err := s.call(ctx, "peek session", func(ctx context.Context) (err error) {
		p = store.SessionPeek{}
		// The session and its agent: two statements, one round trip.
		b := &pgx.Batch{}
		b.Queue(`SELECT (SELECT seq FROM actor_events
				 WHERE agent_uid = s.agent_uid AND session_id = s.session_id AND status = 'open'
				 ORDER BY seq LIMIT 1) IS NOT NULL, `+sessionNoCounters+`
			FROM sessions s WHERE s.agent_uid = $1 AND s.session_id = $2`, key.AgentUID, key.SessionID).QueryRow(
			func(row pgx.Row) (err error) {
				if p.Session, err = scanSession(prefixRow{row, []any{&p.AnyOpen}}); err != nil {
					return fmt.Errorf("session %s: %w", key, notFound(err))
				}
				return nil
			})
		b.Queue(`SELECT `+agentCols+` FROM agents WHERE agent_uid = $1`, key.AgentUID).QueryRow(
			func(row pgx.Row) (err error) {
				if p.Agent, err = scanAgent(row); err != nil {
					return fmt.Errorf("agent %s: %w", key.AgentUID, notFound(err))
				}
				return nil
			})
		return s.pool.SendBatch(ctx, b).Close()
	})
	return p, err
}

// ListSessions pages an agent's sessions by session id.
func (s *Store) ListSessions(ctx context.Context, p store.ListSessionsParams) ([]store.Session, error) {
	var out []store.Session
	err := s.call(ctx, "list sessions", func(ctx context.Context) error {
		rows, err := s.pool.Query(ctx, `SELECT `+sessionCols+` FROM sessions s
			WHERE s.agent_uid = $1 AND s.session_id > $2
			ORDER BY s.session_id LIMIT $3`, p.AgentUID, p.After, store.PageLimit(p.Limit))
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Session, error) { return scanSession(r) })
		return err
	})
	return out, err
}

// SessionState returns the committed session state, nil before the first
// turn that set one; an unknown session is store.ErrNotFound.
func (s *Store) SessionState(ctx context.Context, key store.ActorKey) ([]byte, error) {
	var state []byte
	err := s.call(ctx, "session state", func(ctx context.Context) error {
		var notNull bool
		err := s.pool.QueryRow(ctx, `
			SELECT st.state, st.state IS NOT NULL
			FROM sessions s LEFT JOIN session_state st ON st.agent_uid = s.agent_uid AND st.session_id = s.session_id
			WHERE s.agent_uid = $1 AND s.session_id = $2`, key.AgentUID, key.SessionID).Scan(&state, &notNull)
		if errors.Is(err, pgx.ErrNoRows) {
			return store.ErrNotFound
		}
		state = store.StateFromColumn(state, notNull)
		return err
	})
	return state, err
}
