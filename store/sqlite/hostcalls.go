package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

// hostCallGuard is the fence of a journal write (docs/DESIGN.md invariant
// 12), as a boolean SQL expression with numbered parameters ?1-?7 (the
// turn_ref: delivery id, agent uid, session id, activation uid, epoch,
// event id, revision; see hostCallRefArgs): the delivery sent under every
// field of the ref, the activation live at that key, epoch, revision and
// current event with its lease unexpired by the database clock, and the
// event open in that session — CommitTurn's checks, none of its writes.
const hostCallGuard = `EXISTS (SELECT 1 FROM deliveries WHERE delivery_id = ?1 AND agent_uid = ?2 AND session_id = ?3
		AND activation_uid = ?4 AND actor_epoch = ?5 AND event_id = ?6 AND revision = ?7 AND state = 'sent')
	AND EXISTS (SELECT 1 FROM activations WHERE activation_uid = ?4 AND agent_uid = ?2 AND session_id = ?3
		AND actor_epoch = ?5 AND revision = ?7 AND current_event_id = ?6 AND state IN ` + liveStates + `
		AND lease_expires_at > ` + nowMS + `)
	AND EXISTS (SELECT 1 FROM actor_events WHERE event_id = ?6 AND agent_uid = ?2 AND session_id = ?3 AND status = 'open')`

// hostCallRefArgs are hostCallGuard's parameters ?1-?7, then extra ones
// from ?8.
func hostCallRefArgs(r abi.TurnRef, extra ...any) []any {
	return append(deliveryArgs(r), extra...)
}

// journalUsage sums the tokens of an event's journal rows not set aside: a
// turn's usage (CommitTurn, and CancelEvent's cancelled turn).
func journalUsage(tx *txn, key store.ActorKey, eventID int64) (abi.Usage, error) {
	var u abi.Usage
	err := tx.queryRow(`
		SELECT coalesce(sum(input_tokens), 0), coalesce(sum(output_tokens), 0) FROM host_calls
		WHERE event_id = ? AND agent_uid = ? AND session_id = ? AND set_aside = 0`,
		eventID, key.AgentUID, key.SessionID).Scan(&u.InputTokens, &u.OutputTokens)
	return u, err
}

// hostCallCols are the columns scanHostCall reads, in its order.
const hostCallCols = `id, event_id, seq, actor_epoch, kind, destination, request_digest, result, error_code, status,
	started_at, duration_ms, input_tokens, output_tokens, replays, replayed_epoch, set_aside, created_at`

func scanHostCall(row scanner) (store.HostCall, error) {
	var c store.HostCall
	var started, created int64
	err := row.Scan(&c.ID, &c.EventID, &c.Seq, &c.ActorEpoch, &c.Kind, &c.Destination, &c.RequestDigest, &c.Result,
		&c.ErrorCode, &c.Status, &started, &c.DurationMS, &c.InputTokens, &c.OutputTokens, &c.Replays,
		&c.ReplayedEpoch, &c.SetAside, &created)
	c.StartedAt, c.CreatedAt = msTime(started), msTime(created)
	return c, err
}

// RecordHostCall appends a host call to its event's journal under the
// attempt's fences; see store.Store. One write transaction (BEGIN
// IMMEDIATE holds the write lock, so nothing changes the fenced rows
// under it): the set-aside UPDATE (when p.SetAsideFrom > 0) and the INSERT,
// each guarded by hostCallGuard; an INSERT that matched nothing is
// explained by classify (as CommitTurn's refusal: FenceCommit) and rolled
// back.
func (s *Store) RecordHostCall(ctx context.Context, p store.RecordHostCallParams) (store.HostCall, error) {
	if err := store.CheckHostCall(p); err != nil {
		return store.HostCall{}, fmt.Errorf("store/sqlite: record host call: %w", err)
	}
	ref, c := p.Ref, p.Call
	result := c.Result
	if result == nil {
		result = []byte{}
	}
	var started any // NULL: the database's now
	if !c.StartedAt.IsZero() {
		started = c.StartedAt.UnixMilli()
	}
	var id, startedMS, createdMS int64
	err := s.write(ctx, "record host call", func(tx *txn) error {
		if p.SetAsideFrom > 0 {
			if _, err := tx.exec(`
				UPDATE host_calls SET set_aside = 1
				WHERE event_id = ?6 AND agent_uid = ?2 AND session_id = ?3 AND seq >= ?8 AND set_aside = 0
				  AND `+hostCallGuard, hostCallRefArgs(ref, p.SetAsideFrom)...); err != nil {
				return err
			}
		}
		err := tx.queryRow(`
			INSERT INTO host_calls (agent_uid, session_id, event_id, seq, actor_epoch, kind, destination,
				request_digest, result, error_code, status, started_at, duration_ms, input_tokens, output_tokens,
				created_at)
			SELECT ?2, ?3, ?6, ?8, ?5, ?9, ?10, ?11, ?12, ?13, ?14, coalesce(?15, `+nowMS+`), ?16, ?17, ?18, `+nowMS+`
			WHERE `+hostCallGuard+`
			RETURNING id, started_at, created_at`,
			hostCallRefArgs(ref, c.Seq, c.Kind, c.Destination, c.RequestDigest, result, c.ErrorCode, c.Status, started,
				c.DurationMS, c.InputTokens, c.OutputTokens)...).Scan(&id, &startedMS, &createdMS)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return classify(tx, ref, store.FenceCommit)
		case isConstraint(err):
			return store.HostCallTaken(ref.ActorEventID, c.Seq)
		}
		return err
	})
	if err != nil {
		return store.HostCall{}, err
	}
	c.ID, c.EventID, c.ActorEpoch, c.Result = id, ref.ActorEventID, ref.ActorEpoch, result
	c.StartedAt, c.CreatedAt = msTime(startedMS), msTime(createdMS)
	c.Replays, c.ReplayedEpoch, c.SetAside = 0, 0, false
	return c, nil
}

// ReplayHostCall records that the attempt of ref replayed the journal row
// (event, seq); see store.Store. The fence is read once, in the write
// transaction: refused, classify explains it; passed, the UPDATE of the
// live row either matches or the row is missing (store.ErrNotFound).
func (s *Store) ReplayHostCall(ctx context.Context, ref abi.TurnRef, seq int) error {
	if err := store.CheckHostCallSeq(seq); err != nil {
		return fmt.Errorf("store/sqlite: replay host call: %w", err)
	}
	return s.write(ctx, "replay host call", func(tx *txn) error {
		res, err := tx.exec(`
			UPDATE host_calls SET replays = replays + 1, replayed_epoch = ?5
			WHERE event_id = ?6 AND agent_uid = ?2 AND session_id = ?3 AND seq = ?8 AND set_aside = 0
			  AND `+hostCallGuard, hostCallRefArgs(ref, seq)...)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n == 1 {
			return err
		}
		// Nothing matched: the fence (the write lock is held, so it reads
		// as the UPDATE saw it), or no live row.
		var ok bool
		if err := tx.queryRow(`SELECT `+hostCallGuard, hostCallRefArgs(ref)...).Scan(&ok); err != nil {
			return err
		}
		if !ok {
			return classify(tx, ref, store.FenceCommit)
		}
		return store.NoHostCall(ref.ActorEventID, seq)
	})
}

// HostCalls returns an event's journal, set-aside rows included, by seq
// then id; see store.Store.
func (s *Store) HostCalls(ctx context.Context, key store.ActorKey, eventID int64) ([]store.HostCall, error) {
	var out []store.HostCall
	err := s.read(ctx, "host calls", func(tx *txn) error {
		var exists bool
		if err := tx.queryRow(`SELECT EXISTS (SELECT 1 FROM sessions WHERE agent_uid = ? AND session_id = ?)`,
			key.AgentUID, key.SessionID).Scan(&exists); err != nil {
			return err
		}
		if !exists {
			return fmt.Errorf("session %s: %w", key, store.ErrNotFound)
		}
		rows, err := tx.query(`
			SELECT `+hostCallCols+` FROM host_calls
			WHERE event_id = ? AND agent_uid = ? AND session_id = ?
			ORDER BY seq, id`, eventID, key.AgentUID, key.SessionID)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			c, err := scanHostCall(rows)
			if err != nil {
				return err
			}
			out = append(out, c)
		}
		return rows.Err()
	})
	return out, err
}

// AgentTokensSince sums the input and output tokens of an agent's journal
// rows started at or after since (compared in milliseconds); see
// store.Store.
func (s *Store) AgentTokensSince(ctx context.Context, agentUID string, since time.Time) (int64, error) {
	var n int64
	err := s.read(ctx, "agent tokens since", func(tx *txn) error {
		return tx.queryRow(`
			SELECT coalesce(sum(input_tokens + output_tokens), 0) FROM host_calls
			WHERE agent_uid = ? AND started_at >= ?`, agentUID, since.UnixMilli()).Scan(&n)
	})
	return n, err
}

// NamespaceTokensSince sums AgentTokensSince over the agents of namespace
// ns (index host_calls_agent_started per agent); see store.Store.
func (s *Store) NamespaceTokensSince(ctx context.Context, ns string, since time.Time) (int64, error) {
	var n int64
	err := s.read(ctx, "namespace tokens since", func(tx *txn) error {
		return tx.queryRow(`
			SELECT coalesce(sum(h.input_tokens + h.output_tokens), 0) FROM agents a
			JOIN host_calls h ON h.agent_uid = a.agent_uid AND h.started_at >= ?
			WHERE a.namespace = ?`, since.UnixMilli(), ns).Scan(&n)
	})
	return n, err
}

// LiveSessionsUpTo counts up to limit sessions of namespace ns that are not
// destroyed; see store.Store.
func (s *Store) LiveSessionsUpTo(ctx context.Context, ns string, limit int64) (int64, error) {
	var n int64
	err := s.read(ctx, "live sessions", func(tx *txn) error {
		return tx.queryRow(`
			SELECT count(*) FROM (SELECT 1 FROM agents a
				JOIN sessions s ON s.agent_uid = a.agent_uid AND s.status <> 'destroyed'
				WHERE a.namespace = ? LIMIT ?)`, ns, limit).Scan(&n)
	})
	return n, err
}

// PutSecret stores a secret's sealed value, creating or replacing it
// (created false; CreatedAt kept, UpdatedAt the database's now); see
// store.Store.
func (s *Store) PutSecret(ctx context.Context, ns, name string, sealed []byte) (store.Secret, bool, error) {
	ns = store.NamespaceOr(ns)
	if err := store.CheckSecret(name, sealed); err != nil {
		return store.Secret{}, false, fmt.Errorf("store/sqlite: put secret: %w", err)
	}
	if err := store.CheckNamespace(ns); err != nil {
		return store.Secret{}, false, fmt.Errorf("store/sqlite: put secret: %w", err)
	}
	sec := store.Secret{Namespace: ns, Name: name}
	var created bool
	err := s.write(ctx, "put secret", func(tx *txn) error {
		var exists bool
		if err := tx.queryRow(`SELECT EXISTS (SELECT 1 FROM secrets WHERE namespace = ? AND name = ?)`, ns, name).Scan(&exists); err != nil {
			return err
		}
		created = !exists
		var c, u int64
		if err := tx.queryRow(`
			INSERT INTO secrets (namespace, name, sealed, created_at, updated_at) VALUES (?1, ?2, ?3, `+nowMS+`, `+nowMS+`)
			ON CONFLICT (namespace, name) DO UPDATE SET sealed = excluded.sealed, updated_at = excluded.updated_at
			RETURNING created_at, updated_at`, ns, name, sealed).Scan(&c, &u); err != nil {
			return err
		}
		sec.CreatedAt, sec.UpdatedAt = msTime(c), msTime(u)
		return nil
	})
	if err != nil {
		return store.Secret{}, false, err
	}
	return sec, created, nil
}

// SealedSecret returns the sealed value of a secret of namespace ns, or
// store.ErrNotFound.
func (s *Store) SealedSecret(ctx context.Context, ns, name string) ([]byte, error) {
	if err := store.CheckSecretName(name); err != nil {
		return nil, fmt.Errorf("store/sqlite: sealed secret: %w", err)
	}
	var sealed []byte
	err := s.read(ctx, "sealed secret", func(tx *txn) error {
		err := tx.queryRow(`SELECT sealed FROM secrets WHERE namespace = ? AND name = ?`, store.NamespaceOr(ns), name).Scan(&sealed)
		if err != nil {
			return fmt.Errorf("secret %q: %w", name, notFound(err))
		}
		return nil
	})
	return sealed, err
}

// ListSecrets returns the metadata (no values) of namespace ns's secrets
// (store.AnyNamespace: every namespace's) by namespace and name.
func (s *Store) ListSecrets(ctx context.Context, ns string) ([]store.Secret, error) {
	var out []store.Secret
	err := s.read(ctx, "list secrets", func(tx *txn) error {
		rows, err := tx.query(`SELECT namespace, name, created_at, updated_at FROM secrets
			WHERE ?1 = '' OR namespace = ?1 ORDER BY namespace, name`, ns)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var sec store.Secret
			var c, u int64
			if err := rows.Scan(&sec.Namespace, &sec.Name, &c, &u); err != nil {
				return err
			}
			sec.CreatedAt, sec.UpdatedAt = msTime(c), msTime(u)
			out = append(out, sec)
		}
		return rows.Err()
	})
	return out, err
}

// DeleteSecret deletes a secret of namespace ns, or returns
// store.ErrNotFound.
func (s *Store) DeleteSecret(ctx context.Context, ns, name string) error {
	if err := store.CheckSecretName(name); err != nil {
		return fmt.Errorf("store/sqlite: delete secret: %w", err)
	}
	return s.write(ctx, "delete secret", func(tx *txn) error {
		res, err := tx.exec(`DELETE FROM secrets WHERE namespace = ? AND name = ?`, store.NamespaceOr(ns), name)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			return fmt.Errorf("secret %q: %w", name, store.ErrNotFound)
		}
		return nil
	})
}
