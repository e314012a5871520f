package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

// eventCols selects an event; the table alias is e.
const eventCols = `e.event_id, e.agent_uid, e.session_id, e.seq, e.kind, e.payload, e.idempotency_key, e.status,
	e.attempts, e.next_attempt_at, e.last_error, e.binding, e.accepted_at, e.closed_at, e.steer_of, e.redrives,
	e.traceparent`

// eventReturning is eventCols for RETURNING, which takes no table alias.
const eventReturning = `event_id, agent_uid, session_id, seq, kind, payload, idempotency_key, status,
	attempts, next_attempt_at, last_error, binding, accepted_at, closed_at, steer_of, redrives, traceparent`

func scanEvent(sc scanner) (store.Event, error) {
	var ev store.Event
	var payload string
	var idem, lastErr, binding, tp sql.NullString
	var next, accepted int64
	var closed, steerOf sql.NullInt64
	err := sc.Scan(&ev.ID, &ev.AgentUID, &ev.SessionID, &ev.Seq, &ev.Kind, &payload, &idem, &ev.Status,
		&ev.Attempts, &next, &lastErr, &binding, &accepted, &closed, &steerOf, &ev.Redrives, &tp)
	if err != nil {
		return ev, err
	}
	ev.SteerOf = steerOf.Int64
	ev.Payload = json.RawMessage(payload)
	ev.IdempotencyKey, ev.LastError, ev.Binding, ev.Traceparent = idem.String, lastErr.String, binding.String, tp.String
	ev.NextAttemptAt, ev.AcceptedAt, ev.ClosedAt = msTime(next), msTime(accepted), msPtr(closed)
	return ev, nil
}

// sessionStatus reads a session's status for the write paths that refuse
// unknown (ErrNotFound) and destroyed (ErrSessionDestroyed) sessions.
func sessionStatus(tx *txn, key store.ActorKey) (store.SessionStatus, error) {
	var status store.SessionStatus
	err := tx.queryRow(`SELECT status FROM sessions WHERE agent_uid = ? AND session_id = ?`,
		key.AgentUID, key.SessionID).Scan(&status)
	if err != nil {
		return "", fmt.Errorf("session %s: %w", key, notFound(err))
	}
	if status == store.SessionDestroyed {
		return status, fmt.Errorf("session %s: %w", key, store.ErrSessionDestroyed)
	}
	return status, nil
}

// AppendEvent persists a signal as the session's next actor event and wakes
// a sleeping session; see store.Store. The payload is stored verbatim; it
// must be JSON (empty means {}).
func (s *Store) AppendEvent(ctx context.Context, p store.AppendEventParams) (store.Event, bool, error) {
	payload, err := store.EventPayload(p.Payload)
	if err != nil {
		return store.Event{}, false, fmt.Errorf("store/sqlite: append event: %w", err)
	}
	if p.Audit != nil {
		if err := store.CheckAudit(*p.Audit); err != nil {
			return store.Event{}, false, fmt.Errorf("store/sqlite: append event: %w", err)
		}
	}
	var ev store.Event
	var created bool
	err = s.write(ctx, "append event", func(tx *txn) (err error) {
		if p.RefuseIfInFlight {
			if err := refuseInFlight(tx, p); err != nil {
				// A re-send of an accepted key returns its first event.
				if p.IdempotencyKey != "" {
					if first, ferr := scanEvent(tx.queryRow(`
						SELECT `+eventCols+` FROM actor_events e
						WHERE e.agent_uid = ? AND e.session_id = ? AND e.idempotency_key = ?`,
						p.Key.AgentUID, p.Key.SessionID, p.IdempotencyKey)); ferr == nil {
						ev, created = first, false
						return nil
					} else if !errors.Is(ferr, sql.ErrNoRows) {
						return ferr
					}
				}
				return err
			}
		}
		ev, created, err = appendEvent(tx, p.Key, p.Kind, payload, p.IdempotencyKey, p.Traceparent)
		if err != nil || !created || p.Audit == nil {
			return err
		}
		_, err = insertAudit(tx, *p.Audit)
		return err
	})
	if err != nil {
		return store.Event{}, false, err
	}
	if created {
		s.publishAppend(p.Key, ev.Seq)
	}
	return ev, created, nil
}

// refuseInFlight returns store.RefuseInFlight's refusal for the session's
// live activation's current event, inside tx (the single writer makes it
// atomic with the append); the session must exist and not be destroyed.
func refuseInFlight(tx *txn, p store.AppendEventParams) error {
	if _, err := sessionStatus(tx, p.Key); err != nil {
		return err
	}
	var current sql.NullInt64
	err := tx.queryRow(`
		SELECT current_event_id FROM activations
		WHERE agent_uid = ? AND session_id = ? AND state IN `+liveStates,
		p.Key.AgentUID, p.Key.SessionID).Scan(&current)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return err
	}
	return store.RefuseInFlight(p, current.Int64)
}

// appendEvent appends an open event with the session's next seq and wakes
// the session if it sleeps, inside tx. An idempotency key already used in
// the session returns the first event and created=false, writing nothing
// (invariant 7); the single writer makes the look-up race-free.
func appendEvent(tx *txn, key store.ActorKey, kind, payload, idem, traceparent string) (store.Event, bool, error) {
	if _, err := sessionStatus(tx, key); err != nil {
		return store.Event{}, false, err
	}
	return insertTracedEvent(tx, key, kind, payload, idem, traceparent)
}

// insertEvent is appendEvent for a caller that has checked, in tx, that
// the session exists and is not destroyed; the event has no traceparent.
func insertEvent(tx *txn, key store.ActorKey, kind, payload, idem string) (store.Event, bool, error) {
	return insertTracedEvent(tx, key, kind, payload, idem, "")
}

// insertTracedEvent is insertEvent with the event's traceparent ("" stores
// NULL).
func insertTracedEvent(tx *txn, key store.ActorKey, kind, payload, idem, traceparent string) (store.Event, bool, error) {
	if idem != "" {
		ev, err := scanEvent(tx.queryRow(`
			SELECT `+eventCols+` FROM actor_events e
			WHERE e.agent_uid = ? AND e.session_id = ? AND e.idempotency_key = ?`,
			key.AgentUID, key.SessionID, idem))
		if err == nil {
			return ev, false, nil // invariant 7: the first event, not a second
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return ev, false, err
		}
	}
	var seq int64
	if err := tx.queryRow(`
		UPDATE sessions SET last_event_seq = last_event_seq + 1,
			status = 'active',
			sleep_ts = CASE WHEN status = 'sleeping' THEN NULL ELSE sleep_ts END,
			sleep_reason = CASE WHEN status = 'sleeping' THEN NULL ELSE sleep_reason END
		WHERE agent_uid = ? AND session_id = ? AND status <> 'destroyed'
		RETURNING last_event_seq`, key.AgentUID, key.SessionID).Scan(&seq); err != nil {
		return store.Event{}, false, err
	}
	ev, err := scanEvent(tx.queryRow(`
		INSERT INTO actor_events (agent_uid, session_id, seq, kind, payload, idempotency_key,
			status, attempts, next_attempt_at, accepted_at, traceparent)
		VALUES (?, ?, ?, ?, ?, ?, 'open', 0, `+nowMS+`, `+nowMS+`, ?)
		RETURNING `+eventReturning,
		key.AgentUID, key.SessionID, seq, kind, payload, nullString(idem), nullString(traceparent)))
	return ev, err == nil, err
}

// ListEvents pages a session's events by id, optionally by status.
func (s *Store) ListEvents(ctx context.Context, p store.ListEventsParams) ([]store.Event, error) {
	var out []store.Event
	err := s.read(ctx, "list events", func(tx *txn) error {
		rows, err := tx.query(`
			SELECT `+eventCols+` FROM actor_events e
			WHERE e.agent_uid = ? AND e.session_id = ? AND e.event_id > ? AND (?4 = '' OR e.status = ?4)
			ORDER BY e.event_id LIMIT ?`,
			p.Key.AgentUID, p.Key.SessionID, p.After, string(p.Status), store.PageLimit(p.Limit))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			ev, err := scanEvent(rows)
			if err != nil {
				return err
			}
			out = append(out, ev)
		}
		return rows.Err()
	})
	return out, err
}

// Transcript pages committed turns with their messages, by turn number.
func (s *Store) Transcript(ctx context.Context, p store.TranscriptParams) ([]store.Turn, error) {
	var out []store.Turn
	err := s.read(ctx, "transcript", func(tx *txn) error {
		rows, err := tx.query(`
			SELECT turn_no, event_id, delivery_id, actor_epoch, outcome, committed_at, input_tokens, output_tokens FROM turns
			WHERE agent_uid = ? AND session_id = ? AND turn_no > ?
			ORDER BY turn_no LIMIT ?`,
			p.Key.AgentUID, p.Key.SessionID, p.AfterTurn, store.PageLimit(p.Limit))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			t := store.Turn{ActorKey: p.Key, Messages: []store.TranscriptMessage{}}
			var at int64
			if err := rows.Scan(&t.TurnNo, &t.EventID, &t.DeliveryID, &t.ActorEpoch, &t.Outcome, &at,
				&t.Usage.InputTokens, &t.Usage.OutputTokens); err != nil {
				return err
			}
			t.CommittedAt = msTime(at)
			out = append(out, t)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if len(out) == 0 {
			return nil
		}
		mrows, err := tx.query(`
			SELECT turn_no, idx, role, content FROM messages
			WHERE agent_uid = ? AND session_id = ? AND turn_no BETWEEN ? AND ?
			ORDER BY turn_no, idx`,
			p.Key.AgentUID, p.Key.SessionID, out[0].TurnNo, out[len(out)-1].TurnNo)
		if err != nil {
			return err
		}
		defer mrows.Close()
		i := 0
		for mrows.Next() {
			var turnNo int64
			var m store.TranscriptMessage
			if err := mrows.Scan(&turnNo, &m.Index, &m.Role, &m.Content); err != nil {
				return err
			}
			for i < len(out) && out[i].TurnNo < turnNo {
				i++
			}
			if i < len(out) && out[i].TurnNo == turnNo {
				out[i].Messages = append(out[i].Messages, m)
			}
		}
		return mrows.Err()
	})
	return out, err
}

// tail returns the last n transcript messages of a session, oldest first.
func tail(tx *txn, key store.ActorKey, n int) ([]abi.Message, error) {
	if n <= 0 {
		return nil, nil
	}
	rows, err := tx.query(`
		SELECT role, content FROM messages
		WHERE agent_uid = ? AND session_id = ?
		ORDER BY turn_no DESC, idx DESC LIMIT ?`, key.AgentUID, key.SessionID, n)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []abi.Message
	for rows.Next() {
		var m abi.Message
		if err := rows.Scan(&m.Role, &m.Content); err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out, nil
}
