package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

// hostCallGuard is the fence of a journal write (docs/DESIGN.md invariant
// 12), as a boolean SQL expression over refArgs ($1-$7): the delivery sent
// under every field of the ref, the activation live at that key, epoch,
// revision and current event with its lease unexpired by the database
// clock, and the event open in that session — CommitTurn's checks, none of
// its writes.
const hostCallGuard = `EXISTS (SELECT 1 FROM deliveries WHERE ` + deliveryWhere + ` AND state = 'sent')
	AND EXISTS (SELECT 1 FROM activations WHERE ` + activationWhere + ` AND lease_expires_at > clock_timestamp())
	AND EXISTS (SELECT 1 FROM actor_events
		WHERE event_id = $6 AND (agent_uid = $2 AND session_id = $3 AND status = 'open') IS TRUE)` // byID

// journalUsageSQL sums the tokens of an event's journal rows not set
// aside (a turn's usage: CommitTurn, and CancelEvent's cancelled turn):
// one row of columns input_tokens, output_tokens. Parameters: $1 agent
// uid, $2 session id, $3 event id.
const journalUsageSQL = `SELECT coalesce(sum(input_tokens), 0)::bigint AS input_tokens,
		coalesce(sum(output_tokens), 0)::bigint AS output_tokens
	FROM host_calls WHERE event_id = $3 AND agent_uid = $1 AND session_id = $2 AND NOT set_aside`

// hostCallCols are the columns scanHostCall reads, in its order.
const hostCallCols = `id, event_id, seq, actor_epoch, kind, destination, request_digest, result, error_code, status,
	started_at, duration_ms, input_tokens, output_tokens, replays, replayed_epoch, set_aside, created_at`

func scanHostCall(row pgx.Row) (store.HostCall, error) {
	var c store.HostCall
	err := row.Scan(&c.ID, &c.EventID, &c.Seq, &c.ActorEpoch, &c.Kind, &c.Destination, &c.RequestDigest, &c.Result,
		&c.ErrorCode, &c.Status, &c.StartedAt, &c.DurationMS, &c.InputTokens, &c.OutputTokens, &c.Replays,
		&c.ReplayedEpoch, &c.SetAside, &c.CreatedAt)
	c.StartedAt, c.CreatedAt = utc(c.StartedAt), utc(c.CreatedAt)
	return c, err
}

// lockActivationSQL locks the activation a turn_ref names ($1), first, as
// CommitTurn does: a journal write and the watchdog, a commit, a steer or a
// cancel of that activation serialise.
const lockActivationSQL = `SELECT 1 FROM activations WHERE activation_uid = $1 FOR UPDATE`

// RecordHostCall appends a host call to its event's journal under the
// attempt's fences; see store.Store.
//
// One pipelined transaction, two round trips: BEGIN, the activation's row
// lock, the set-aside UPDATE (when p.SetAsideFrom > 0) and the INSERT, both
// guarded by hostCallGuard in the statement that writes; then COMMIT. An
// INSERT that matched nothing is explained by classify in the same
// transaction (as CommitTurn's refusal: FenceCommit) and rolled back.
func (s *Store) RecordHostCall(ctx context.Context, p store.RecordHostCallParams) (store.HostCall, error) {
	if err := store.CheckHostCall(p); err != nil {
		return store.HostCall{}, fmt.Errorf("store/postgres: record host call: %w", err)
	}
	ref, c := p.Ref, p.Call
	result := c.Result
	if result == nil {
		result = []byte{}
	}
	var started *time.Time
	if !c.StartedAt.IsZero() {
		started = &c.StartedAt
	}
	var out store.HostCall
	err := s.pipeTxDo(ctx, "record host call", func(ctx context.Context, tx txConn) error {
		out = store.HostCall{}
		inserted := false
		b := &pgx.Batch{}
		b.Queue(lockActivationSQL, ref.ActivationUID)
		if p.SetAsideFrom > 0 {
			b.Queue(`
				UPDATE host_calls SET set_aside = true
				WHERE event_id = $6 AND agent_uid = $2 AND session_id = $3 AND seq >= $8::integer AND NOT set_aside
				  AND `+hostCallGuard, refArgs(ref, p.SetAsideFrom)...)
		}
		b.Queue(`
			INSERT INTO host_calls (agent_uid, session_id, event_id, seq, actor_epoch, kind, destination,
				request_digest, result, error_code, status, started_at, duration_ms, input_tokens, output_tokens)
			SELECT $2, $3, $6, $8::integer, $5, $9::text, $10::text, $11::text, $12::bytea, $13::text, $14::integer,
				coalesce($15::timestamptz, clock_timestamp()), $16::bigint, $17::bigint, $18::bigint
			WHERE `+hostCallGuard+`
			RETURNING id, started_at, created_at`,
			refArgs(ref, c.Seq, c.Kind, c.Destination, c.RequestDigest, result, c.ErrorCode, c.Status, started,
				c.DurationMS, c.InputTokens, c.OutputTokens)...).QueryRow(func(row pgx.Row) error {
			err := row.Scan(&out.ID, &out.StartedAt, &out.CreatedAt)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil // the fence refused: classified below
			}
			inserted = err == nil
			return err
		})
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			if pgCode(err) == codeUniqueViolation {
				return store.HostCallTaken(ref.ActorEventID, c.Seq)
			}
			return err
		}
		if !inserted {
			return classify(ctx, tx, ref, store.FenceCommit, false)
		}
		return nil
	})
	if err != nil {
		return store.HostCall{}, err
	}
	c.ID, c.EventID, c.ActorEpoch, c.Result = out.ID, ref.ActorEventID, ref.ActorEpoch, result
	c.StartedAt, c.CreatedAt = utc(out.StartedAt), utc(out.CreatedAt)
	c.Replays, c.ReplayedEpoch, c.SetAside = 0, 0, false
	return c, nil
}

// ReplayHostCall records that the attempt of ref replayed the journal row
// (event, seq); see store.Store. The fence is computed once (CTE g) and
// both guards the UPDATE and tells a refusal (classified in the same
// transaction) from a missing row (store.ErrNotFound).
func (s *Store) ReplayHostCall(ctx context.Context, ref abi.TurnRef, seq int) error {
	if err := store.CheckHostCallSeq(seq); err != nil {
		return fmt.Errorf("store/postgres: replay host call: %w", err)
	}
	return s.pipeTxDo(ctx, "replay host call", func(ctx context.Context, tx txConn) error {
		var fenced, replayed bool
		b := &pgx.Batch{}
		b.Queue(lockActivationSQL, ref.ActivationUID)
		b.Queue(`
			WITH g AS (SELECT `+hostCallGuard+` AS ok),
			r AS (
				UPDATE host_calls SET replays = replays + 1, replayed_epoch = $5
				WHERE event_id = $6 AND agent_uid = $2 AND session_id = $3 AND seq = $8::integer AND NOT set_aside
				  AND (SELECT ok FROM g)
				RETURNING 1)
			SELECT (SELECT ok FROM g), EXISTS (SELECT 1 FROM r)`, refArgs(ref, seq)...).QueryRow(func(row pgx.Row) error {
			return row.Scan(&fenced, &replayed)
		})
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		switch {
		case !fenced:
			return classify(ctx, tx, ref, store.FenceCommit, false)
		case !replayed:
			return store.NoHostCall(ref.ActorEventID, seq)
		}
		return nil
	})
}

// HostCalls returns an event's journal, set-aside rows included, by seq
// then id; see store.Store. One snapshot: the session's existence and the
// rows.
func (s *Store) HostCalls(ctx context.Context, key store.ActorKey, eventID int64) ([]store.HostCall, error) {
	var out []store.HostCall
	err := s.readTx(ctx, "host calls", func(ctx context.Context, tx pgx.Tx) error {
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM sessions WHERE agent_uid = $1 AND session_id = $2)`,
			key.AgentUID, key.SessionID).Scan(&exists); err != nil {
			return err
		}
		if !exists {
			return fmt.Errorf("session %s: %w", key, store.ErrNotFound)
		}
		rows, err := tx.Query(ctx, `
			SELECT `+hostCallCols+` FROM host_calls
			WHERE event_id = $1 AND agent_uid = $2 AND session_id = $3
			ORDER BY seq, id`, eventID, key.AgentUID, key.SessionID)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.HostCall, error) { return scanHostCall(r) })
		return err
	})
	return out, err
}

// AgentTokensSince sums the input and output tokens of an agent's journal
// rows started at or after since; see store.Store.
func (s *Store) AgentTokensSince(ctx context.Context, agentUID string, since time.Time) (int64, error) {
	var n int64
	err := s.call(ctx, "agent tokens since", func(ctx context.Context) error {
		return s.pool.QueryRow(ctx, `
			SELECT coalesce(sum(input_tokens + output_tokens), 0)::bigint FROM host_calls
			WHERE agent_uid = $1 AND started_at >= $2`, agentUID, since).Scan(&n)
	})
	return n, err
}

// NamespaceTokensSince sums AgentTokensSince over the agents of namespace
// ns (index host_calls_agent_started per agent); see store.Store.
func (s *Store) NamespaceTokensSince(ctx context.Context, ns string, since time.Time) (int64, error) {
	var n int64
	err := s.call(ctx, "namespace tokens since", func(ctx context.Context) error {
		return s.pool.QueryRow(ctx, `
			SELECT coalesce(sum(h.input_tokens + h.output_tokens), 0)::bigint FROM agents a
			JOIN host_calls h ON h.agent_uid = a.agent_uid AND h.started_at >= $1
			WHERE a.namespace = $2`, since, ns).Scan(&n)
	})
	return n, err
}

// LiveSessionsUpTo counts up to limit sessions of namespace ns that are not
// destroyed; see store.Store.
func (s *Store) LiveSessionsUpTo(ctx context.Context, ns string, limit int64) (int64, error) {
	var n int64
	err := s.call(ctx, "live sessions", func(ctx context.Context) error {
		return s.pool.QueryRow(ctx, `
			SELECT count(*) FROM (SELECT 1 FROM agents a
				JOIN sessions s ON s.agent_uid = a.agent_uid AND s.status <> 'destroyed'
				WHERE a.namespace = $1 LIMIT $2) l`, ns, limit).Scan(&n)
	})
	return n, err
}

// PutSecret stores a secret's sealed value, creating or replacing it
// (created false; CreatedAt kept, UpdatedAt the database's now); see
// store.Store. One statement: an upsert, created when its two timestamps
// are the one now of the insert.
func (s *Store) PutSecret(ctx context.Context, ns, name string, sealed []byte) (store.Secret, bool, error) {
	ns = store.NamespaceOr(ns)
	if err := store.CheckSecret(name, sealed); err != nil {
		return store.Secret{}, false, fmt.Errorf("store/postgres: put secret: %w", err)
	}
	if err := store.CheckNamespace(ns); err != nil {
		return store.Secret{}, false, fmt.Errorf("store/postgres: put secret: %w", err)
	}
	sec := store.Secret{Namespace: ns, Name: name}
	var created bool
	err := s.call(ctx, "put secret", func(ctx context.Context) error {
		err := s.pool.QueryRow(ctx, `
			INSERT INTO secrets (namespace, name, sealed, created_at, updated_at)
			SELECT $1, $2, $3, t, t FROM (SELECT clock_timestamp() AS t) c
			ON CONFLICT (namespace, name) DO UPDATE SET sealed = excluded.sealed, updated_at = excluded.updated_at
			RETURNING created_at, updated_at, created_at = updated_at`, ns, name, sealed).Scan(
			&sec.CreatedAt, &sec.UpdatedAt, &created)
		sec.CreatedAt, sec.UpdatedAt = utc(sec.CreatedAt), utc(sec.UpdatedAt)
		return err
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
		return nil, fmt.Errorf("store/postgres: sealed secret: %w", err)
	}
	var sealed []byte
	err := s.call(ctx, "sealed secret", func(ctx context.Context) error {
		err := s.pool.QueryRow(ctx, `SELECT sealed FROM secrets WHERE namespace = $1 AND name = $2`,
			store.NamespaceOr(ns), name).Scan(&sealed)
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
	err := s.call(ctx, "list secrets", func(ctx context.Context) error {
		rows, err := s.pool.Query(ctx, `SELECT namespace, name, created_at, updated_at FROM secrets
			WHERE $1 = '' OR namespace = $1 ORDER BY namespace, name`, ns)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Secret, error) {
			var sec store.Secret
			err := r.Scan(&sec.Namespace, &sec.Name, &sec.CreatedAt, &sec.UpdatedAt)
			sec.CreatedAt, sec.UpdatedAt = utc(sec.CreatedAt), utc(sec.UpdatedAt)
			return sec, err
		})
		return err
	})
	return out, err
}

// DeleteSecret deletes a secret of namespace ns, or returns
// store.ErrNotFound.
func (s *Store) DeleteSecret(ctx context.Context, ns, name string) error {
	if err := store.CheckSecretName(name); err != nil {
		return fmt.Errorf("store/postgres: delete secret: %w", err)
	}
	return s.call(ctx, "delete secret", func(ctx context.Context) error {
		tag, err := s.pool.Exec(ctx, `DELETE FROM secrets WHERE namespace = $1 AND name = $2`, store.NamespaceOr(ns), name)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("secret %q: %w", name, store.ErrNotFound)
		}
		return nil
	})
}
