package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/paddock-dev/paddock/store"
)

// PutModule stores a module by digest and makes it visible in
// p.Namespace; created is false when it was visible there already.
func (s *Store) PutModule(ctx context.Context, p store.PutModuleParams) (store.Module, bool, error) {
	p.Namespace = store.NamespaceOr(p.Namespace)
	if err := store.CheckModule(p); err != nil {
		return store.Module{}, false, fmt.Errorf("store/sqlite: put module: %w", err)
	}
	var m store.Module
	var created bool
	err := s.write(ctx, "put module", func(tx *txn) error {
		// Content-addressed: a digest stored already holds these bytes.
		if _, err := tx.exec(`
			INSERT INTO modules (digest, abi_version, size, bytes, created_at)
			VALUES (?, ?, ?, ?, `+nowMS+`)
			ON CONFLICT (digest) DO NOTHING`,
			p.Digest, p.ABIVersion, len(p.Bytes), p.Bytes); err != nil {
			return err
		}
		res, err := tx.exec(`
			INSERT INTO module_namespaces (namespace, digest, created_at) VALUES (?, ?, `+nowMS+`)
			ON CONFLICT (namespace, digest) DO NOTHING`, p.Namespace, p.Digest)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		created = n == 1
		m, err = getModule(tx, p.Namespace, p.Digest, true)
		return err
	})
	return m, created, err
}

// GetModule returns the module with its bytes if it is visible in
// namespace ns (store.AnyNamespace: any module), or ErrNotFound.
func (s *Store) GetModule(ctx context.Context, ns, digest string) (store.Module, error) {
	var m store.Module
	err := s.read(ctx, "get module", func(tx *txn) (err error) {
		m, err = getModule(tx, ns, digest, true)
		return err
	})
	return m, err
}

func getModule(tx *txn, ns, digest string, withBytes bool) (store.Module, error) {
	var m store.Module
	var at int64
	// The first upload's time: to ns, or to any namespace.
	cols, from := "m.digest, m.abi_version, m.size, m.created_at", "modules m"
	if ns != store.AnyNamespace {
		cols = "m.digest, m.abi_version, m.size, v.created_at"
		from = "modules m JOIN module_namespaces v ON v.digest = m.digest AND v.namespace = ?2"
	}
	dest := []any{&m.Digest, &m.ABIVersion, &m.Size, &at}
	if withBytes {
		cols += ", m.bytes"
		dest = append(dest, &m.Bytes)
	}
	q := `SELECT ` + cols + ` FROM ` + from + ` WHERE m.digest = ?1`
	args := []any{digest}
	if ns != store.AnyNamespace {
		args = append(args, ns)
	}
	err := tx.queryRow(q, args...).Scan(dest...)
	if err != nil {
		return m, fmt.Errorf("module %s: %w", digest, notFound(err))
	}
	m.Namespace = ns
	m.CreatedAt = msTime(at)
	return m, nil
}

// ListModules returns the modules visible in namespace ns
// (store.AnyNamespace: every module) without bytes, newest first.
func (s *Store) ListModules(ctx context.Context, ns string) ([]store.Module, error) {
	var out []store.Module
	err := s.read(ctx, "list modules", func(tx *txn) error {
		q := `SELECT digest, abi_version, size, created_at FROM modules ORDER BY created_at DESC, rowid DESC`
		if ns != store.AnyNamespace {
			q = `SELECT m.digest, m.abi_version, m.size, v.created_at
				FROM module_namespaces v JOIN modules m ON m.digest = v.digest
				WHERE v.namespace = ?1 ORDER BY v.created_at DESC, v.rowid DESC`
		}
		var args []any
		if ns != store.AnyNamespace {
			args = append(args, ns)
		}
		rows, err := tx.query(q, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			m := store.Module{Namespace: ns}
			var at int64
			if err := rows.Scan(&m.Digest, &m.ABIVersion, &m.Size, &at); err != nil {
				return err
			}
			m.CreatedAt = msTime(at)
			out = append(out, m)
		}
		return rows.Err()
	})
	return out, err
}

const agentCols = "agent_uid, namespace, name, kind, coalesce(module_digest, ''), coalesce(plugin, ''), crash_policy, created_at, updated_at"

func scanAgent(sc scanner) (store.Agent, error) {
	var a store.Agent
	var created, updated int64
	if err := sc.Scan(&a.UID, &a.Namespace, &a.Name, &a.Kind, &a.ModuleDigest, &a.Plugin, &a.CrashPolicy, &created, &updated); err != nil {
		return a, err
	}
	a.CreatedAt, a.UpdatedAt = msTime(created), msTime(updated)
	return a, nil
}

// CreateAgent registers an agent; see store.Store. A wasm agent's module and
// a plugin agent's plugin worker must exist (else ErrNotFound); an upsert
// replaces kind, binding and crash policy.
func (s *Store) CreateAgent(ctx context.Context, p store.CreateAgentParams) (store.Agent, error) {
	kind, err := store.AgentKind(p)
	if err != nil {
		return store.Agent{}, fmt.Errorf("store/sqlite: create agent: %w", err)
	}
	ns := store.NamespaceOr(p.Namespace)
	var a store.Agent
	// One write transaction: the agent row and, when store.NewAgentVersion
	// says so, its next version (agent_versions), compared with the row
	// read first.
	err = s.write(ctx, "create agent", func(tx *txn) error {
		prev, err := agentByName(tx, ns, p.Name)
		if err != nil {
			return err
		}
		var one int
		if kind == store.KindWasm {
			if err := tx.queryRow(`SELECT 1 FROM module_namespaces WHERE namespace = ? AND digest = ?`, ns, p.ModuleDigest).Scan(&one); err != nil {
				return fmt.Errorf("module %q: %w", p.ModuleDigest, notFound(err))
			}
		} else {
			if err := tx.queryRow(`SELECT 1 FROM plugin_workers WHERE namespace = ? AND name = ?`, ns, p.Plugin).Scan(&one); err != nil {
				return fmt.Errorf("plugin worker %q: %w", p.Plugin, notFound(err))
			}
		}
		digest, plugin := nullString(p.ModuleDigest), nullString(p.Plugin)
		a, err = scanAgent(tx.queryRow(`
			INSERT INTO agents (agent_uid, namespace, name, kind, module_digest, plugin, crash_policy, created_at, updated_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, `+nowMS+`, `+nowMS+`)
			ON CONFLICT (namespace, name) DO NOTHING
			RETURNING `+agentCols,
			p.UID, ns, p.Name, kind, digest, plugin, p.CrashPolicy))
		switch {
		case err == nil:
			return appendAgentVersion(tx, prev, a)
		case isConstraint(err):
			return fmt.Errorf("agent uid %s: %w", p.UID, store.ErrConflict)
		case !errors.Is(err, sql.ErrNoRows):
			return err
		case !p.Upsert:
			return fmt.Errorf("agent name %q: %w", p.Name, store.ErrConflict)
		}
		a, err = scanAgent(tx.queryRow(`
			UPDATE agents SET kind = ?, module_digest = ?, plugin = ?, crash_policy = ?, updated_at = `+nowMS+`
			WHERE namespace = ? AND name = ?
			RETURNING `+agentCols,
			kind, digest, plugin, p.CrashPolicy, ns, p.Name))
		if err != nil {
			return err
		}
		return appendAgentVersion(tx, prev, a)
	})
	return a, err
}

// GetAgent finds an agent of namespace ns by uid or name (a uid match
// wins), or returns ErrNotFound; store.AnyNamespace finds any agent by
// uid.
func (s *Store) GetAgent(ctx context.Context, ns, nameOrUID string) (store.Agent, error) {
	var a store.Agent
	err := s.read(ctx, "get agent", func(tx *txn) (err error) {
		if ns == store.AnyNamespace {
			a, err = scanAgent(tx.queryRow(`SELECT `+agentCols+` FROM agents WHERE agent_uid = ?`, nameOrUID))
		} else {
			// Two index probes: the primary key, then (namespace, name).
			a, err = scanAgent(tx.queryRow(`
				SELECT `+agentCols+` FROM agents WHERE namespace = ?2 AND (agent_uid = ?1 OR name = ?1)
				ORDER BY agent_uid = ?1 DESC LIMIT 1`, nameOrUID, ns))
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
	err := s.read(ctx, "list agents", func(tx *txn) error {
		rows, err := tx.query(`SELECT `+agentCols+` FROM agents WHERE ?1 = '' OR namespace = ?1 ORDER BY name, namespace`, ns)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			a, err := scanAgent(rows)
			if err != nil {
				return err
			}
			out = append(out, a)
		}
		return rows.Err()
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
	sessionHead = `s.agent_uid, s.session_id, s.key, s.input, s.status, s.crash_policy, s.actor_epoch,
	s.created_at, s.sleep_ts, s.destroy_ts, s.turn_count, s.last_event_seq,
	`
	sessionTail = `s.pending_since, s.sleep_reason`
)

func scanSession(sc scanner) (store.Session, error) {
	var ss store.Session
	var key sql.NullString
	var created int64
	var sleepTS, destroyTS, pending sql.NullInt64
	var sleepReason sql.NullString
	err := sc.Scan(&ss.AgentUID, &ss.SessionID, &key, &ss.Input, &ss.Status, &ss.CrashPolicy, &ss.ActorEpoch,
		&created, &sleepTS, &destroyTS, &ss.TurnCount, &ss.EventCount, &ss.OpenEvents,
		&ss.DeadLetters, &pending, &sleepReason)
	if err != nil {
		return ss, err
	}
	ss.PendingSince, ss.SleepReason = msPtr(pending), sleepReason.String
	ss.Key = key.String
	ss.CreatedAt = msTime(created)
	ss.SleepTS, ss.DestroyTS = msPtr(sleepTS), msPtr(destroyTS)
	if len(ss.Input) == 0 {
		ss.Input = nil
	}
	return ss, nil
}

func getSession(tx *txn, key store.ActorKey) (store.Session, error) {
	ss, err := scanSession(tx.queryRow(`
		SELECT `+sessionCols+` FROM sessions s WHERE s.agent_uid = ? AND s.session_id = ?`,
		key.AgentUID, key.SessionID))
	if err != nil {
		return ss, fmt.Errorf("session %s: %w", key, notFound(err))
	}
	return ss, nil
}

// CreateSession creates a session; see store.Store. An empty CrashPolicy
// takes the agent's.
func (s *Store) CreateSession(ctx context.Context, p store.CreateSessionParams) (store.Session, bool, error) {
	if err := store.CheckSession(p); err != nil {
		return store.Session{}, false, fmt.Errorf("store/sqlite: create session: %w", err)
	}
	key := store.ActorKey{AgentUID: p.AgentUID, SessionID: p.SessionID}
	var ss store.Session
	var created bool
	err := s.write(ctx, "create session", func(tx *txn) error {
		res, err := tx.exec(`
			INSERT INTO sessions (agent_uid, session_id, key, input, status, crash_policy, created_at)
			SELECT a.agent_uid, ?, ?, ?, 'active', coalesce(nullif(?, ''), a.crash_policy), `+nowMS+`
			FROM agents a WHERE a.agent_uid = ?
			ON CONFLICT (agent_uid, key) WHERE key IS NOT NULL AND status <> 'destroyed' DO NOTHING`,
			p.SessionID, nullString(p.Key), nullBytes(p.Input), store.NewSessionCrashPolicy(p), p.AgentUID)
		if isConstraint(err) {
			return fmt.Errorf("session %s: %w", key, store.ErrConflict)
		}
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		if n == 1 {
			created = true
			ss, err = getSession(tx, key)
			return err
		}
		// Nothing inserted: an unknown agent, or the key is taken.
		var one int
		if err := tx.queryRow(`SELECT 1 FROM agents WHERE agent_uid = ?`, p.AgentUID).Scan(&one); err != nil {
			return fmt.Errorf("agent %s: %w", p.AgentUID, notFound(err))
		}
		// The single writer holds the lock since the insert: the holder
		// is there.
		ss, err = scanSession(tx.queryRow(`
			SELECT `+sessionCols+` FROM sessions s WHERE s.agent_uid = ? AND s.key = ? AND s.status <> 'destroyed'`,
			p.AgentUID, p.Key))
		if err != nil {
			return err
		}
		return store.CheckExistingSession(ss, p)
	})
	return ss, created, err
}

// GetSession returns the session with its counters, or ErrNotFound.
func (s *Store) GetSession(ctx context.Context, key store.ActorKey) (store.Session, error) {
	var ss store.Session
	err := s.read(ctx, "get session", func(tx *txn) (err error) {
		ss, err = getSession(tx, key)
		return err
	})
	return ss, err
}

// PeekSession returns the session without counters, whether any event is
// open and the session's agent; see store.Store.
func (s *Store) PeekSession(ctx context.Context, key store.ActorKey) (store.SessionPeek, error) {
	var p store.SessionPeek
	err := s.read(ctx, "peek session", func(tx *txn) (err error) {
		p = store.SessionPeek{}
		p.Session, err = scanSession(prefixRow{tx.queryRow(`SELECT (SELECT seq FROM actor_events
				 WHERE agent_uid = s.agent_uid AND session_id = s.session_id AND status = 'open'
				 ORDER BY seq LIMIT 1) IS NOT NULL, `+sessionNoCounters+`
			FROM sessions s WHERE s.agent_uid = ? AND s.session_id = ?`, key.AgentUID, key.SessionID), []any{&p.AnyOpen}})
		if err != nil {
			return fmt.Errorf("session %s: %w", key, notFound(err))
		}
		p.Agent, err = scanAgent(tx.queryRow(`SELECT `+agentCols+` FROM agents WHERE agent_uid = ?`, key.AgentUID))
		if err != nil {
			return fmt.Errorf("agent %s: %w", key.AgentUID, notFound(err))
		}
		return nil
	})
	return p, err
}

// ListSessions pages an agent's sessions by session id.
func (s *Store) ListSessions(ctx context.Context, p store.ListSessionsParams) ([]store.Session, error) {
	var out []store.Session
	err := s.read(ctx, "list sessions", func(tx *txn) error {
		rows, err := tx.query(`
			SELECT `+sessionCols+` FROM sessions s
			WHERE s.agent_uid = ? AND s.session_id > ?
			ORDER BY s.session_id LIMIT ?`, p.AgentUID, p.After, store.PageLimit(p.Limit))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			ss, err := scanSession(rows)
			if err != nil {
				return err
			}
			out = append(out, ss)
		}
		return rows.Err()
	})
	return out, err
}

// SessionState returns the committed session state, nil before the first
// turn that set one; an unknown session is store.ErrNotFound.
func (s *Store) SessionState(ctx context.Context, key store.ActorKey) ([]byte, error) {
	var state []byte
	err := s.read(ctx, "session state", func(tx *txn) error {
		if _, err := getSession(tx, key); err != nil {
			return err
		}
		var notNull bool
		err := tx.queryRow(`SELECT state, state IS NOT NULL FROM session_state WHERE agent_uid = ? AND session_id = ?`,
			key.AgentUID, key.SessionID).Scan(&state, &notNull)
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		state = store.StateFromColumn(state, notNull)
		return err
	})
	return state, err
}
