package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/paddock-dev/paddock/store"
)

// liveActivation is a session's live activation as lockKey read it under
// its row lock.
type liveActivation struct {
	uid      string
	epoch    int64
	revision int64
	// current is the current event's id, 0 for none.
	current int64
}

// lockKey locks, in the driver's lock order (activation, alarms, session;
// see the package doc), the key's live activation if there is one, with
// deleteAlarms the session's alarms (deleted), and then the session row. It
// returns the session's status and the live activation (nil for none), or
// ErrNotFound. One round trip.
//
// The activation is found and locked in one SELECT ... FOR UPDATE (a row
// that stops being live while it waits is skipped); a claim that commits
// between that statement and the session lock would go unseen, so the live
// activation is read again under the session lock (which every claim
// takes) and a difference reruns the transaction (errLockRace).
func lockKey(ctx context.Context, tx pgx.Tx, key store.ActorKey, deleteAlarms bool) (store.SessionStatus, *liveActivation, error) {
	var act *liveActivation
	var status store.SessionStatus
	var again *string
	b := &pgx.Batch{}
	b.Queue(`
		SELECT activation_uid, actor_epoch, revision, coalesce(current_event_id, 0) FROM activations
		WHERE agent_uid = $1 AND session_id = $2 AND state IN `+liveStates+`
		FOR UPDATE`, key.AgentUID, key.SessionID).QueryRow(func(row pgx.Row) error {
		var a liveActivation
		err := row.Scan(&a.uid, &a.epoch, &a.revision, &a.current)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		act = &a
		return err
	})
	if deleteAlarms {
		b.Queue(`DELETE FROM alarms WHERE agent_uid = $1 AND session_id = $2`, key.AgentUID, key.SessionID)
	}
	b.Queue(`SELECT status FROM sessions WHERE agent_uid = $1 AND session_id = $2 FOR NO KEY UPDATE`,
		key.AgentUID, key.SessionID).QueryRow(func(row pgx.Row) error {
		if err := row.Scan(&status); err != nil {
			return fmt.Errorf("session %s: %w", key, notFound(err))
		}
		return nil
	})
	b.Queue(`SELECT activation_uid FROM activations
		WHERE agent_uid = $1 AND session_id = $2 AND state IN `+liveStates,
		key.AgentUID, key.SessionID).QueryRow(ignoreNoRows(func(row pgx.Row) error { return row.Scan(&again) }))
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return "", nil, err
	}
	if (act == nil) != (again == nil) || (act != nil && act.uid != *again) {
		return "", nil, fmt.Errorf("live activation of %s changed: %w", key, errLockRace)
	}
	return status, act, nil
}

// DestroySession destroys a session, idempotently: status destroyed,
// destroy_ts, open events discarded, alarms deleted, the live activation
// failed (end_reason "destroyed") with its live deliveries superseded, so
// that a reply in flight is fenced off; see store.Store. It is an
// authoritative write: no compare-and-set on a lease. Listeners are
// notified, so that the owning host notices.
func (s *Store) DestroySession(ctx context.Context, key store.ActorKey) (store.Session, error) {
	var ss store.Session
	err := s.tx(ctx, "destroy session", func(ctx context.Context, tx pgx.Tx) error {
		status, act, err := lockKey(ctx, tx, key, true)
		if err != nil {
			return err
		}
		if status != store.SessionDestroyed {
			b := &pgx.Batch{}
			if act != nil {
				b.Queue(`
					UPDATE deliveries SET state = 'superseded', closed_at = clock_timestamp(), error = 'session destroyed'
					WHERE activation_uid = $1 AND agent_uid = $2 AND session_id = $3 AND state IN ('created', 'sent')`,
					act.uid, key.AgentUID, key.SessionID)
				b.Queue(`
					UPDATE activations SET state = 'failed', ended_at = clock_timestamp(), end_reason = 'destroyed',
						current_event_id = NULL
					WHERE activation_uid = $1`, act.uid)
			}
			b.Queue(`
				UPDATE sessions SET status = 'destroyed', destroy_ts = clock_timestamp(), pending_since = NULL
				WHERE agent_uid = $1 AND session_id = $2`, key.AgentUID, key.SessionID)
			b.Queue(`
				UPDATE actor_events SET status = 'discarded', closed_at = clock_timestamp()
				WHERE agent_uid = $1 AND session_id = $2 AND status = 'open'`, key.AgentUID, key.SessionID)
			queueCancelWaits(b, key)
			if act != nil && act.current != 0 {
				// The turn in flight ends: turn.failed (destroyed).
				b.Queue(turnEndedSQL, key.AgentUID, key.SessionID, store.FrameTurnFailed, act.current, act.epoch,
					string(store.MustBody(store.AttemptEndedBody{Reason: store.EndReasonDestroyed})))
			}
			queueNotify(b, key)
			if err := tx.SendBatch(ctx, b).Close(); err != nil {
				return err
			}
		}
		ss, err = getSession(ctx, tx, key)
		return err
	})
	if err != nil {
		return store.Session{}, err
	}
	return ss, nil
}

// notifySQL queues the key's wake-up notification, sent at commit.
const notifySQL = `SELECT pg_notify('` + notifyChannel + `', $1 || '/' || $2)`

// queueNotify queues notifySQL in a batch.
func queueNotify(b *pgx.Batch, key store.ActorKey) { b.Queue(notifySQL, key.AgentUID, key.SessionID) }

// notify runs notifySQL.
func notify(ctx context.Context, tx pgx.Tx, key store.ActorKey) error {
	_, err := tx.Exec(ctx, notifySQL, key.AgentUID, key.SessionID)
	return err
}

// WakeSession moves a sleeping session to active and notifies listeners;
// an active one is returned unchanged. Destroyed: ErrSessionDestroyed.
func (s *Store) WakeSession(ctx context.Context, key store.ActorKey) (store.Session, error) {
	var ss store.Session
	err := s.tx(ctx, "wake session", func(ctx context.Context, tx pgx.Tx) error {
		status, err := lockSession(ctx, tx, key)
		if err != nil {
			return err
		}
		if err := writable(key, status); err != nil {
			return err
		}
		if status == store.SessionSleeping {
			b := &pgx.Batch{}
			b.Queue(`
				UPDATE sessions SET status = 'active', sleep_ts = NULL, sleep_reason = NULL
				WHERE agent_uid = $1 AND session_id = $2`, key.AgentUID, key.SessionID)
			queueNotify(b, key)
			if err := tx.SendBatch(ctx, b).Close(); err != nil {
				return err
			}
		}
		ss, err = getSession(ctx, tx, key)
		return err
	})
	if err != nil {
		return store.Session{}, err
	}
	return ss, nil
}

// SleepSession parks an active session that has no live activation:
// sleeping, sleep_ts, sleep_reason = p.Reason, pending_since cleared. A
// sleeping one is returned unchanged. Destroyed: ErrSessionDestroyed; a
// live activation: ErrActivationLive (checked under its row lock and the
// session's, so a concurrent claim either precedes this or sees the session
// sleeping).
func (s *Store) SleepSession(ctx context.Context, p store.SleepSessionParams) (store.Session, error) {
	key := p.Key
	var ss store.Session
	err := s.tx(ctx, "sleep session", func(ctx context.Context, tx pgx.Tx) error {
		status, act, err := lockKey(ctx, tx, key, false)
		if err != nil {
			return err
		}
		if err := writable(key, status); err != nil {
			return err
		}
		if status == store.SessionActive {
			if act != nil {
				return fmt.Errorf("session %s: activation %s: %w", key, act.uid, store.ErrActivationLive)
			}
			if _, err := tx.Exec(ctx, `
				UPDATE sessions SET status = 'sleeping', sleep_ts = clock_timestamp(), sleep_reason = $3,
					pending_since = NULL
				WHERE agent_uid = $1 AND session_id = $2`, key.AgentUID, key.SessionID, nullString(p.Reason)); err != nil {
				return err
			}
		}
		ss, err = getSession(ctx, tx, key)
		return err
	})
	if err != nil {
		return store.Session{}, err
	}
	return ss, nil
}

// SetPending sets pending_since to the database's now (kept if already
// set), or clears it. Setting it on a destroyed session returns
// ErrSessionDestroyed (as the sqlite driver); clearing is always allowed.
func (s *Store) SetPending(ctx context.Context, key store.ActorKey, pending bool) error {
	return s.call(ctx, "set pending", func(ctx context.Context) error {
		var status store.SessionStatus
		err := s.pool.QueryRow(ctx, `
			UPDATE sessions SET pending_since = CASE WHEN $3 AND status <> 'destroyed'
				THEN coalesce(pending_since, clock_timestamp()) END
			WHERE agent_uid = $1 AND session_id = $2
			RETURNING status`, key.AgentUID, key.SessionID, pending).Scan(&status)
		if err != nil {
			return fmt.Errorf("session %s: %w", key, notFound(err))
		}
		if pending {
			return writable(key, status)
		}
		return nil
	})
}

// attemptErrorCols selects an error chain entry.
const attemptErrorCols = `event_id, attempt, actor_epoch, counted, error, failed_at`

func scanAttemptError(r pgx.CollectableRow) (store.AttemptError, error) {
	var ae store.AttemptError
	err := r.Scan(&ae.EventID, &ae.Attempt, &ae.ActorEpoch, &ae.Counted, &ae.Error, &ae.FailedAt)
	ae.FailedAt = utc(ae.FailedAt)
	return ae, err
}

// ListDeadLetters pages dead-lettered events of an agent (or of one
// session) by event id, each with its error chain, from one snapshot.
func (s *Store) ListDeadLetters(ctx context.Context, p store.ListDeadLettersParams) ([]store.DeadLetter, error) {
	var out []store.DeadLetter
	err := s.readTx(ctx, "list dead letters", func(ctx context.Context, tx pgx.Tx) error {
		out = nil
		rows, err := tx.Query(ctx, `SELECT `+eventCols+` FROM actor_events
			WHERE agent_uid = $1 AND ($2 = '' OR session_id = $2) AND status = 'dead_letter' AND event_id > $3
			ORDER BY event_id LIMIT $4`, p.AgentUID, p.SessionID, p.After, store.PageLimit(p.Limit))
		if err != nil {
			return err
		}
		events, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Event, error) { return scanEvent(r) })
		if err != nil || len(events) == 0 {
			return err
		}
		ids := make([]int64, len(events))
		byID := make(map[int64]int, len(events))
		out = make([]store.DeadLetter, len(events))
		for i, e := range events {
			ids[i], byID[e.ID] = e.ID, i
			out[i] = store.DeadLetter{Event: e, Errors: []store.AttemptError{}}
		}
		rows, err = tx.Query(ctx, `SELECT `+attemptErrorCols+` FROM event_errors
			WHERE agent_uid = $1 AND event_id = ANY($2::bigint[])
			ORDER BY event_id, attempt_seq`, p.AgentUID, ids)
		if err != nil {
			return err
		}
		chain, err := pgx.CollectRows(rows, scanAttemptError)
		for _, ae := range chain {
			i := byID[ae.EventID]
			out[i].Errors = append(out[i].Errors, ae)
		}
		return err
	})
	return out, err
}

// EventErrors returns an event's error chain, oldest first; ErrNotFound
// when the session has no such event.
func (s *Store) EventErrors(ctx context.Context, key store.ActorKey, eventID int64) ([]store.AttemptError, error) {
	var out []store.AttemptError
	err := s.readTx(ctx, "event errors", func(ctx context.Context, tx pgx.Tx) error {
		var one int
		err := tx.QueryRow(ctx, `SELECT 1 FROM actor_events WHERE event_id = $1 AND agent_uid = $2 AND session_id = $3`,
			eventID, key.AgentUID, key.SessionID).Scan(&one)
		if err != nil {
			return fmt.Errorf("event %d of %s: %w", eventID, key, notFound(err))
		}
		rows, err := tx.Query(ctx, `SELECT `+attemptErrorCols+` FROM event_errors
			WHERE agent_uid = $1 AND session_id = $2 AND event_id = $3
			ORDER BY attempt_seq`, key.AgentUID, key.SessionID, eventID)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, scanAttemptError)
		return err
	})
	return out, err
}

// deadLetterRefused explains why a redrive or discard matched no
// dead-lettered event: ErrNotFound or a *store.NotDeadLetterError (an
// ErrConflict naming the event's status).
func deadLetterRefused(ctx context.Context, tx pgx.Tx, key store.ActorKey, eventID int64) error {
	var status store.EventStatus
	err := tx.QueryRow(ctx, `SELECT status FROM actor_events WHERE event_id = $1 AND agent_uid = $2 AND session_id = $3`,
		eventID, key.AgentUID, key.SessionID).Scan(&status)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return err
	}
	return store.NotDeadLetter(key, eventID, status)
}

// RedriveEvent re-opens a dead-lettered event (compare-and-set on its
// status) for a new attempt: open, attempts 0, due now, redrives+1,
// last_error kept; the session's epoch is raised and a sleeping session
// woken; listeners are notified. Destroyed session: ErrSessionDestroyed.
func (s *Store) RedriveEvent(ctx context.Context, key store.ActorKey, eventID int64) (store.Event, error) {
	var e store.Event
	err := s.tx(ctx, "redrive event", func(ctx context.Context, tx pgx.Tx) error {
		status, err := lockSession(ctx, tx, key)
		if err != nil {
			return err
		}
		if err := writable(key, status); err != nil {
			return err
		}
		e, err = scanEvent(tx.QueryRow(ctx, `
			UPDATE actor_events SET status = 'open', attempts = 0, next_attempt_at = clock_timestamp(),
				redrives = redrives + 1, closed_at = NULL
			WHERE event_id = $1 AND agent_uid = $2 AND session_id = $3 AND status = 'dead_letter'
			RETURNING `+eventCols, eventID, key.AgentUID, key.SessionID))
		if errors.Is(err, pgx.ErrNoRows) {
			return deadLetterRefused(ctx, tx, key, eventID)
		}
		if err != nil {
			return err
		}
		b := &pgx.Batch{}
		b.Queue(`
			UPDATE sessions SET actor_epoch = actor_epoch + 1,
				status = 'active',
				sleep_ts = CASE status WHEN 'sleeping' THEN NULL ELSE sleep_ts END,
				sleep_reason = CASE status WHEN 'sleeping' THEN NULL ELSE sleep_reason END
			WHERE agent_uid = $1 AND session_id = $2`, key.AgentUID, key.SessionID)
		queueNotify(b, key)
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return store.Event{}, err
	}
	return e, nil
}

// DiscardEvent closes a dead-lettered event as discarded (compare-and-set
// on its status) and notifies listeners: a session blocked behind it may
// run again.
func (s *Store) DiscardEvent(ctx context.Context, key store.ActorKey, eventID int64) (store.Event, error) {
	var e store.Event
	err := s.tx(ctx, "discard event", func(ctx context.Context, tx pgx.Tx) error {
		var err error
		e, err = scanEvent(tx.QueryRow(ctx, `
			UPDATE actor_events SET status = 'discarded', closed_at = clock_timestamp()
			WHERE event_id = $1 AND agent_uid = $2 AND session_id = $3 AND status = 'dead_letter'
			RETURNING `+eventCols, eventID, key.AgentUID, key.SessionID))
		if errors.Is(err, pgx.ErrNoRows) {
			return deadLetterRefused(ctx, tx, key, eventID)
		}
		if err != nil {
			return err
		}
		return notify(ctx, tx, key)
	})
	if err != nil {
		return store.Event{}, err
	}
	return e, nil
}
