package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

// eventCols selects an event (unqualified columns of actor_events).
const eventCols = `event_id, agent_uid, session_id, seq, kind, payload, coalesce(idempotency_key, ''), status,
	attempts, next_attempt_at, coalesce(last_error, ''), coalesce(binding, ''), accepted_at, closed_at`

func scanEvent(row pgx.Row) (store.Event, error) {
	var e store.Event
	var payload string
	var closed *time.Time
	err := row.Scan(&e.ID, &e.AgentUID, &e.SessionID, &e.Seq, &e.Kind, &payload, &e.IdempotencyKey, &e.Status,
		&e.Attempts, &e.NextAttemptAt, &e.LastError, &e.Binding, &e.AcceptedAt, &closed)
	e.Payload = json.RawMessage(payload)
	e.NextAttemptAt, e.AcceptedAt, e.ClosedAt = utc(e.NextAttemptAt), utc(e.AcceptedAt), utcPtr(closed)
	return e, err
}

// sessionWritable locks the session row (FOR UPDATE: appends to one session
// serialise here, which is what makes seq and the idempotency check safe) and
// returns ErrNotFound or ErrSessionDestroyed.
func sessionWritable(ctx context.Context, tx pgx.Tx, key store.ActorKey) error {
	var status store.SessionStatus
	err := tx.QueryRow(ctx, `SELECT status FROM sessions WHERE agent_uid = $1 AND session_id = $2 FOR UPDATE`,
		key.AgentUID, key.SessionID).Scan(&status)
	switch {
	case err != nil:
		return fmt.Errorf("session %s: %w", key, notFound(err))
	case status == store.SessionDestroyed:
		return fmt.Errorf("session %s: %w", key, store.ErrSessionDestroyed)
	}
	return nil
}

// AppendEvent persists a signal as the session's next actor event and
// notifies listeners in the same transaction; see store.Store.
func (s *Store) AppendEvent(ctx context.Context, p store.AppendEventParams) (store.Event, bool, error) {
	key := p.Key
	var e store.Event
	var created bool
	err := s.tx(ctx, "append event", func(ctx context.Context, tx pgx.Tx) error {
		created = false
		if err := sessionWritable(ctx, tx, key); err != nil {
			return err
		}
		existing := func() error {
			var err error
			e, err = scanEvent(tx.QueryRow(ctx, `SELECT `+eventCols+` FROM actor_events
				WHERE agent_uid = $1 AND session_id = $2 AND idempotency_key = $3`,
				key.AgentUID, key.SessionID, p.IdempotencyKey))
			return err
		}
		// Invariant 7: a key already used returns the first event.
		if p.IdempotencyKey != "" {
			err := existing()
			if err == nil {
				return nil
			}
			if !errors.Is(err, pgx.ErrNoRows) {
				return err
			}
		}
		// One statement: next seq, the event (accepted and due at the same
		// database instant) and the notification, sent at commit.
		var err error
		e, err = scanEvent(tx.QueryRow(ctx, `
			WITH seq AS (
				UPDATE sessions SET last_event_seq = last_event_seq + 1
				WHERE agent_uid = $1 AND session_id = $2
				RETURNING last_event_seq),
			now AS (SELECT clock_timestamp() AS t),
			ins AS (
				INSERT INTO actor_events (agent_uid, session_id, seq, kind, payload, idempotency_key,
					next_attempt_at, accepted_at)
				SELECT $1, $2, seq.last_event_seq, $3, $4, $5, now.t, now.t FROM seq, now
				ON CONFLICT (agent_uid, session_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
				RETURNING *)
			SELECT `+eventCols+` FROM ins, LATERAL (SELECT pg_notify('`+notifyChannel+`', $1 || '/' || $2)) n`,
			key.AgentUID, key.SessionID, p.Kind, string(p.Payload), nullString(p.IdempotencyKey)))
		if errors.Is(err, pgx.ErrNoRows) && p.IdempotencyKey != "" {
			// Unreachable while the session lock serialises appends; the
			// unique index is the backstop. Returning an error rolls back
			// the seq bump, so report the first event through a sentinel.
			if err := existing(); err != nil {
				return err
			}
			return errIdempotentReplay
		}
		if err != nil {
			return err
		}
		created = true
		return nil
	})
	if errors.Is(err, errIdempotentReplay) {
		return e, false, nil
	}
	if err != nil {
		return store.Event{}, false, err
	}
	return e, created, nil
}

// errIdempotentReplay rolls back an append that lost an idempotency race.
var errIdempotentReplay = errors.New("idempotent replay")

// ListEvents pages a session's events by id, optionally by status.
func (s *Store) ListEvents(ctx context.Context, p store.ListEventsParams) ([]store.Event, error) {
	var out []store.Event
	err := s.call(ctx, "list events", func(ctx context.Context) error {
		rows, err := s.pool.Query(ctx, `SELECT `+eventCols+` FROM actor_events
			WHERE agent_uid = $1 AND session_id = $2 AND event_id > $3 AND ($4 = '' OR status = $4)
			ORDER BY event_id LIMIT $5`,
			p.Key.AgentUID, p.Key.SessionID, p.After, string(p.Status), pageLimit(p.Limit))
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Event, error) { return scanEvent(r) })
		return err
	})
	return out, err
}

// Transcript pages committed turns with their messages, by turn number.
func (s *Store) Transcript(ctx context.Context, p store.TranscriptParams) ([]store.Turn, error) {
	var turns []store.Turn
	err := s.call(ctx, "transcript", func(ctx context.Context) error {
		turns = nil
		rows, err := s.pool.Query(ctx, `
			SELECT turn_no, event_id, delivery_id, actor_epoch, outcome, committed_at FROM turns
			WHERE agent_uid = $1 AND session_id = $2 AND turn_no > $3
			ORDER BY turn_no LIMIT $4`, p.Key.AgentUID, p.Key.SessionID, p.AfterTurn, pageLimit(p.Limit))
		if err != nil {
			return err
		}
		turns, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Turn, error) {
			t := store.Turn{ActorKey: p.Key, Messages: []store.TranscriptMessage{}}
			err := r.Scan(&t.TurnNo, &t.EventID, &t.DeliveryID, &t.ActorEpoch, &t.Outcome, &t.CommittedAt)
			t.CommittedAt = utc(t.CommittedAt)
			return t, err
		})
		if err != nil || len(turns) == 0 {
			return err
		}
		// Turns are appended in order, so every turn up to the last one
		// read already existed: this range holds exactly their messages.
		byNo := make(map[int64]int, len(turns))
		for i, t := range turns {
			byNo[t.TurnNo] = i
		}
		rows, err = s.pool.Query(ctx, `
			SELECT turn_no, idx, role, content FROM messages
			WHERE agent_uid = $1 AND session_id = $2 AND turn_no > $3 AND turn_no <= $4
			ORDER BY turn_no, idx`, p.Key.AgentUID, p.Key.SessionID, p.AfterTurn, turns[len(turns)-1].TurnNo)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var no int64
			var m store.TranscriptMessage
			if err := rows.Scan(&no, &m.Index, &m.Role, &m.Content); err != nil {
				return err
			}
			if i, ok := byNo[no]; ok {
				turns[i].Messages = append(turns[i].Messages, m)
			}
		}
		return rows.Err()
	})
	return turns, err
}

// tail returns the session's last n transcript messages, oldest first.
func tail(ctx context.Context, q querier, key store.ActorKey, n int) ([]abi.Message, error) {
	if n <= 0 {
		return nil, nil
	}
	rows, err := q.Query(ctx, `
		SELECT role, content FROM (
			SELECT turn_no, idx, role, content FROM messages
			WHERE agent_uid = $1 AND session_id = $2
			ORDER BY turn_no DESC, idx DESC LIMIT $3) m
		ORDER BY turn_no, idx`, key.AgentUID, key.SessionID, n)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (abi.Message, error) {
		var m abi.Message
		err := r.Scan(&m.Role, &m.Content)
		return m, err
	})
}
