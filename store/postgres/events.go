package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paddock-dev/paddock/store"
)

// eventCols selects an event (unqualified columns of actor_events).
const eventCols = `event_id, agent_uid, session_id, seq, kind, payload, coalesce(idempotency_key, ''), status,
	attempts, next_attempt_at, coalesce(last_error, ''), coalesce(binding, ''), accepted_at, closed_at,
	coalesce(steer_of, 0), redrives, coalesce(traceparent, '')`

// scanEvent scans eventCols, then extra columns after them into extra.
func scanEvent(row pgx.Row, extra ...any) (store.Event, error) {
	var e store.Event
	var payload string
	var closed *time.Time
	err := row.Scan(append([]any{&e.ID, &e.AgentUID, &e.SessionID, &e.Seq, &e.Kind, &payload, &e.IdempotencyKey, &e.Status,
		&e.Attempts, &e.NextAttemptAt, &e.LastError, &e.Binding, &e.AcceptedAt, &closed, &e.SteerOf, &e.Redrives, &e.Traceparent},
		extra...)...)
	e.Payload = json.RawMessage(payload)
	e.NextAttemptAt, e.AcceptedAt, e.ClosedAt = utc(e.NextAttemptAt), utc(e.AcceptedAt), utcPtr(closed)
	return e, err
}

// lockSession locks the session row (appends to one session serialise
// here, which is what makes seq and the idempotency check safe) and returns
// its status, or ErrNotFound.
//
// Every session-row lock of the driver is FOR NO KEY UPDATE (what an UPDATE
// of a non-key column takes anyway), never FOR UPDATE: the foreign keys
// that reference sessions (events, alarms, event_errors, turns, ...) take
// FOR KEY SHARE on it when a child row is inserted, which FOR UPDATE would
// conflict with. A transaction that inserted an alarm (KEY SHARE on the
// session) while FireDueAlarms, holding that alarm, waited for FOR UPDATE
// on the session was a deadlock.
func lockSession(ctx context.Context, tx pgx.Tx, key store.ActorKey) (store.SessionStatus, error) {
	var status store.SessionStatus
	err := tx.QueryRow(ctx, `SELECT status FROM sessions WHERE agent_uid = $1 AND session_id = $2 FOR NO KEY UPDATE`,
		key.AgentUID, key.SessionID).Scan(&status)
	if err != nil {
		return "", fmt.Errorf("session %s: %w", key, notFound(err))
	}
	return status, nil
}

// sessionWritable locks the session row (see lockSession) and returns
// ErrNotFound or ErrSessionDestroyed.
func sessionWritable(ctx context.Context, tx pgx.Tx, key store.ActorKey) error {
	status, err := lockSession(ctx, tx, key)
	if err != nil {
		return err
	}
	return writable(key, status)
}

// writable returns ErrSessionDestroyed for a destroyed session.
func writable(key store.ActorKey, status store.SessionStatus) error {
	if status == store.SessionDestroyed {
		return fmt.Errorf("session %s: %w", key, store.ErrSessionDestroyed)
	}
	return nil
}

// eventByIdempotencyKey returns the session's event with that key, or
// pgx.ErrNoRows.
func eventByIdempotencyKey(ctx context.Context, tx pgx.Tx, key store.ActorKey, idem string) (store.Event, error) {
	return scanEvent(tx.QueryRow(ctx, `SELECT `+eventCols+` FROM actor_events
		WHERE agent_uid = $1 AND session_id = $2 AND idempotency_key = $3`, key.AgentUID, key.SessionID, idem))
}

// newEvent is an event to append.
type newEvent struct {
	kind           string
	payload        string
	idempotencyKey string
	// steerOf attaches a steer to the event in flight (0: none).
	steerOf int64
	// traceparent is stored as is ("" stores NULL).
	traceparent string
	// origin, when set, tags the notification with it and the event's seq
	// (Store.origin: the echo of this Store value's own append).
	origin string
}

// insertEventSQL appends the session's next event unless its idempotency
// key is already used in the session; see insertEvent. Parameters:
// insertEventArgs.
const insertEventSQL = `
	WITH seq AS (
		UPDATE sessions SET last_event_seq = last_event_seq + 1,
			status = CASE status WHEN 'sleeping' THEN 'active' ELSE status END,
			sleep_ts = CASE status WHEN 'sleeping' THEN NULL ELSE sleep_ts END,
			sleep_reason = CASE status WHEN 'sleeping' THEN NULL ELSE sleep_reason END
		WHERE agent_uid = $1 AND session_id = $2 /*writable*/
		  AND ($5::text IS NULL OR NOT EXISTS (SELECT 1 FROM actor_events
			WHERE agent_uid = $1 AND session_id = $2 AND idempotency_key = $5))
		RETURNING last_event_seq),
	now AS (SELECT clock_timestamp() AS t),
	ins AS (
		INSERT INTO actor_events (agent_uid, session_id, seq, kind, payload, idempotency_key,
			next_attempt_at, accepted_at, steer_of, traceparent)
		SELECT $1, $2, seq.last_event_seq, $3, $4, $5, now.t, now.t, $6, $7 FROM seq, now
		RETURNING *)
	SELECT ` + eventCols + ` FROM ins, LATERAL (SELECT pg_notify('` + notifyChannel + `',
		CASE WHEN $8::text = '' THEN '' ELSE $8 || ':' || ins.seq || ':' END || $1 || '/' || $2)) n`

// appendEventSQL is insertEventSQL for a caller that holds no lock: it
// also requires the session not to be destroyed, so that it can run alone,
// as one implicit transaction (AppendEvent's fast path). The UPDATE takes
// the session row lock that lockSession would; no row means "not found,
// destroyed or idempotency key used", which the locked path sorts out.
var appendEventSQL = strings.Replace(insertEventSQL, "/*writable*/", "AND status <> 'destroyed'", 1)

// appendEventAuditSQL is appendEventSQL that also inserts the call's
// audit row ($9-$14: auditArgs) when it inserts the event
// (store.AppendEventParams.Audit).
var appendEventAuditSQL = strings.Replace(appendEventSQL, "RETURNING *)", `RETURNING *),
	aud AS (
		INSERT INTO audit_log (token_id, namespace, action, object, result, status)
		SELECT $9, $10, $11, $12, $13, $14 FROM ins)`, 1)

// queueAppend queues the fast path's statement of an append (with its
// audit row when audit is set); read gets its answer when the batch runs.
func queueAppend(b *pgx.Batch, key store.ActorKey, ne newEvent, audit *store.AppendAuditParams, read func(e store.Event, created bool, err error)) {
	sql, args := appendEventSQL, insertEventArgs(key, ne)
	if audit != nil {
		sql, args = appendEventAuditSQL, append(args, auditArgs(*audit)...)
	}
	b.Queue(sql, args...).QueryRow(func(row pgx.Row) error {
		e, created, err := insertResult(scanEvent(row))
		read(e, created, err)
		return err
	})
}

func insertEventArgs(key store.ActorKey, ne newEvent) []any {
	var steerOf *int64
	if ne.steerOf != 0 {
		steerOf = &ne.steerOf
	}
	return []any{key.AgentUID, key.SessionID, ne.kind, ne.payload, nullString(ne.idempotencyKey), steerOf, nullString(ne.traceparent), ne.origin}
}

// insertEvent appends the session's next event; the caller holds the
// session row lock (lockSession). One statement: next seq, a sleeping
// session woken, the event (accepted and due at the same database instant)
// and the notification, sent at commit — or, when the idempotency key is
// already used in the session, nothing at all, and appended is false
// (invariant 7: the caller returns the first event). Under the session lock
// the key check cannot race; were it to, the unique index would refuse the
// insert (23505), which reruns the transaction (errLockRace).
func insertEvent(ctx context.Context, tx pgx.Tx, key store.ActorKey, ne newEvent) (e store.Event, appended bool, err error) {
	e, err = scanEvent(tx.QueryRow(ctx, insertEventSQL, insertEventArgs(key, ne)...))
	return insertResult(e, err)
}

// insertResult interprets the result of insertEventSQL.
func insertResult(e store.Event, err error) (store.Event, bool, error) {
	switch {
	case err == nil:
		return e, true, nil
	case errors.Is(err, pgx.ErrNoRows):
		return store.Event{}, false, nil
	case pgCode(err) == codeUniqueViolation:
		return store.Event{}, false, fmt.Errorf("idempotency key race: %w: %w", errLockRace, err)
	}
	return store.Event{}, false, err
}

// AppendEvent persists a signal as the session's next actor event, wakes a
// sleeping session and notifies listeners, in one transaction; see
// store.Store. An idempotency key already used returns the first event and
// writes nothing (invariant 7).
func (s *Store) AppendEvent(ctx context.Context, p store.AppendEventParams) (store.Event, bool, error) {
	key := p.Key
	payload, err := store.EventPayload(p.Payload)
	if err != nil {
		return store.Event{}, false, fmt.Errorf("store/postgres: append event: %w", err)
	}
	if p.Audit != nil {
		if err := store.CheckAudit(*p.Audit); err != nil {
			return store.Event{}, false, fmt.Errorf("store/postgres: append event: %w", err)
		}
	}
	// Fast path: one statement, one round trip, its own transaction.
	ne := newEvent{kind: p.Kind, payload: payload, idempotencyKey: p.IdempotencyKey, traceparent: p.Traceparent, origin: s.origin}
	var e store.Event
	var created bool
	if p.RefuseIfInFlight {
		err = errLockRace // decided under the locks below
	} else if s.groupCommit {
		// With the appends of other sessions that arrived meanwhile
		// (groupcommit.go); a batch that could not decide it says solo.
		r := s.appends.do(ctx, appendIn{key: key, ne: ne, eventAudit: p.Audit})
		e, created, err = r.e, r.created, r.err
		if r.solo {
			err = errLockRace // the locked path below decides
		}
	} else {
		err = s.call(ctx, "append event", func(ctx context.Context) error {
			b := &pgx.Batch{}
			queueAppend(b, key, ne, p.Audit, func(ev store.Event, c bool, _ error) { e, created = ev, c })
			return s.pool.SendBatch(ctx, b).Close()
		})
	}
	switch {
	case err == nil && created:
		return e, true, nil
	case err != nil && !errors.Is(err, errLockRace):
		// Not retried here: the statement may have committed before the
		// connection failed, and only the caller (with an idempotency key)
		// can retry without appending twice.
		return store.Event{}, false, err
	}
	// Not appended (a missing or destroyed session, a used idempotency
	// key) or an idempotency race: decide under the session lock.
	err = s.tx(ctx, "append event", func(ctx context.Context, tx pgx.Tx) error {
		if p.RefuseIfInFlight {
			// The live activation locked with the session, so that no
			// turn starts between the look and the insert.
			status, act, err := lockKey(ctx, tx, key, false)
			if err != nil {
				return err
			}
			if err := writable(key, status); err != nil {
				return err
			}
			var current int64
			if act != nil {
				current = act.current
			}
			if refuse := store.RefuseInFlight(p, current); refuse != nil {
				if p.IdempotencyKey == "" {
					return refuse
				}
				// A re-send of an accepted key returns its first event.
				e, err = eventByIdempotencyKey(ctx, tx, key, p.IdempotencyKey)
				if errors.Is(err, pgx.ErrNoRows) {
					return refuse
				}
				created = false
				return err
			}
		} else if err := sessionWritable(ctx, tx, key); err != nil {
			return err
		}
		var err error
		e, created, err = insertEvent(ctx, tx, key, ne)
		if err == nil && created && p.Audit != nil {
			_, err = tx.Exec(ctx, insertAuditSQL, auditArgs(*p.Audit)...)
		}
		if err != nil || created {
			return err
		}
		e, err = eventByIdempotencyKey(ctx, tx, key, p.IdempotencyKey)
		return err
	})
	if err != nil {
		return store.Event{}, false, err
	}
	return e, created, nil
}

// ListEvents pages a session's events by id, optionally by status.
func (s *Store) ListEvents(ctx context.Context, p store.ListEventsParams) ([]store.Event, error) {
	var out []store.Event
	err := s.call(ctx, "list events", func(ctx context.Context) error {
		rows, err := s.pool.Query(ctx, `SELECT `+eventCols+` FROM actor_events
			WHERE agent_uid = $1 AND session_id = $2 AND event_id > $3 AND ($4 = '' OR status = $4)
			ORDER BY event_id LIMIT $5`,
			p.Key.AgentUID, p.Key.SessionID, p.After, string(p.Status), store.PageLimit(p.Limit))
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
			SELECT turn_no, event_id, delivery_id, actor_epoch, outcome, committed_at, input_tokens, output_tokens FROM turns
			WHERE agent_uid = $1 AND session_id = $2 AND turn_no > $3
			ORDER BY turn_no LIMIT $4`, p.Key.AgentUID, p.Key.SessionID, p.AfterTurn, store.PageLimit(p.Limit))
		if err != nil {
			return err
		}
		turns, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Turn, error) {
			t := store.Turn{ActorKey: p.Key, Messages: []store.TranscriptMessage{}}
			err := r.Scan(&t.TurnNo, &t.EventID, &t.DeliveryID, &t.ActorEpoch, &t.Outcome, &t.CommittedAt,
				&t.Usage.InputTokens, &t.Usage.OutputTokens)
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
