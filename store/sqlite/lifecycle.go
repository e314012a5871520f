package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

// DestroySession destroys a session (idempotent); see store.Store.
func (s *Store) DestroySession(ctx context.Context, key store.ActorKey) (store.Session, error) {
	var ss store.Session
	var destroyed bool
	err := s.write(ctx, "destroy session", func(tx *txn) error {
		_, err := sessionStatus(tx, key)
		switch {
		case errors.Is(err, store.ErrSessionDestroyed):
		case err != nil:
			return err
		default:
			if err := destroySession(tx, key); err != nil {
				return err
			}
			destroyed = true
		}
		ss, err = getSession(tx, key)
		return err
	})
	if err == nil && destroyed {
		s.publish(key) // the owning controller notices its activation failed
	}
	return ss, err
}

// WakeSession moves a sleeping session to active; see store.Store.
func (s *Store) WakeSession(ctx context.Context, key store.ActorKey) (store.Session, error) {
	var ss store.Session
	var woke bool
	err := s.write(ctx, "wake session", func(tx *txn) error {
		status, err := sessionStatus(tx, key)
		if err != nil {
			return err
		}
		if status == store.SessionSleeping {
			if _, err := tx.exec(`
				UPDATE sessions SET status = 'active', sleep_ts = NULL, sleep_reason = NULL
				WHERE agent_uid = ? AND session_id = ? AND status = 'sleeping'`,
				key.AgentUID, key.SessionID); err != nil {
				return err
			}
			woke = true
		}
		ss, err = getSession(tx, key)
		return err
	})
	if err == nil && woke {
		s.publish(key)
	}
	return ss, err
}

// SleepSession parks an active session with no live activation; see
// store.Store. A sleeping session is returned unchanged.
func (s *Store) SleepSession(ctx context.Context, p store.SleepSessionParams) (store.Session, error) {
	var ss store.Session
	err := s.write(ctx, "sleep session", func(tx *txn) error {
		status, err := sessionStatus(tx, p.Key)
		if err != nil {
			return err
		}
		if status == store.SessionActive {
			res, err := tx.exec(`
				UPDATE sessions SET status = 'sleeping', sleep_ts = `+nowMS+`, sleep_reason = nullif(?3, ''),
					pending_since = NULL
				WHERE agent_uid = ?1 AND session_id = ?2 AND status = 'active'
				  AND NOT EXISTS (SELECT 1 FROM activations
				                  WHERE agent_uid = ?1 AND session_id = ?2 AND state IN `+liveStates+`)`,
				p.Key.AgentUID, p.Key.SessionID, p.Reason)
			if err != nil {
				return err
			}
			if n, err := res.RowsAffected(); err != nil {
				return err
			} else if n == 0 {
				return fmt.Errorf("session %s: %w", p.Key, store.ErrActivationLive)
			}
		}
		ss, err = getSession(tx, p.Key)
		return err
	})
	return ss, err
}

// SetPending records (pending) or clears the session's wait for capacity;
// see store.Store. The first wait's time is kept.
func (s *Store) SetPending(ctx context.Context, key store.ActorKey, pending bool) error {
	return s.write(ctx, "set pending", func(tx *txn) error {
		if _, err := sessionStatus(tx, key); err != nil && (pending || !errors.Is(err, store.ErrSessionDestroyed)) {
			return err
		}
		q := `UPDATE sessions SET pending_since = NULL WHERE agent_uid = ? AND session_id = ?`
		if pending {
			q = `UPDATE sessions SET pending_since = coalesce(pending_since, ` + nowMS + `)
			     WHERE agent_uid = ? AND session_id = ?`
		}
		_, err := tx.exec(q, key.AgentUID, key.SessionID)
		return err
	})
}

// ListDeadLetters pages dead-lettered events by event id with their error
// chains; see store.Store.
func (s *Store) ListDeadLetters(ctx context.Context, p store.ListDeadLettersParams) ([]store.DeadLetter, error) {
	var out []store.DeadLetter
	err := s.read(ctx, "list dead letters", func(tx *txn) error {
		rows, err := tx.query(`
			SELECT `+eventCols+` FROM actor_events e
			WHERE e.agent_uid = ?1 AND (?2 = '' OR e.session_id = ?2) AND e.status = 'dead_letter' AND e.event_id > ?3
			ORDER BY e.event_id LIMIT ?4`,
			p.AgentUID, p.SessionID, p.After, store.PageLimit(p.Limit))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			ev, err := scanEvent(rows)
			if err != nil {
				return err
			}
			out = append(out, store.DeadLetter{Event: ev})
		}
		if err := rows.Err(); err != nil {
			return err
		}
		for i := range out {
			if out[i].Errors, err = eventErrors(tx, out[i].Event.ActorKey, out[i].Event.ID); err != nil {
				return err
			}
		}
		return nil
	})
	return out, err
}

// EventErrors returns an event's error chain, oldest first; ErrNotFound
// when the session has no such event.
func (s *Store) EventErrors(ctx context.Context, key store.ActorKey, eventID int64) ([]store.AttemptError, error) {
	var out []store.AttemptError
	err := s.read(ctx, "event errors", func(tx *txn) error {
		if _, err := getEvent(tx, key, eventID); err != nil {
			return err
		}
		var err error
		out, err = eventErrors(tx, key, eventID)
		return err
	})
	return out, err
}

func eventErrors(tx *txn, key store.ActorKey, eventID int64) ([]store.AttemptError, error) {
	rows, err := tx.query(`
		SELECT attempt, actor_epoch, counted, error, failed_at FROM event_errors
		WHERE agent_uid = ? AND session_id = ? AND event_id = ?
		ORDER BY attempt_seq`, key.AgentUID, key.SessionID, eventID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []store.AttemptError{}
	for rows.Next() {
		e := store.AttemptError{EventID: eventID}
		var at int64
		if err := rows.Scan(&e.Attempt, &e.ActorEpoch, &e.Counted, &e.Error, &at); err != nil {
			return nil, err
		}
		e.FailedAt = msTime(at)
		out = append(out, e)
	}
	return out, rows.Err()
}

// getEvent reads one event of a session, or ErrNotFound.
func getEvent(tx *txn, key store.ActorKey, eventID int64) (store.Event, error) {
	ev, err := scanEvent(tx.queryRow(`
		SELECT `+eventCols+` FROM actor_events e WHERE e.event_id = ? AND e.agent_uid = ? AND e.session_id = ?`,
		eventID, key.AgentUID, key.SessionID))
	if err != nil {
		return ev, fmt.Errorf("event %d of %s: %w", eventID, key, notFound(err))
	}
	return ev, nil
}

// notDeadLetter explains a 0-row dead_letter compare-and-set: ErrNotFound
// or a *store.NotDeadLetterError (an ErrConflict naming the event's
// status).
func notDeadLetter(tx *txn, key store.ActorKey, eventID int64) error {
	ev, err := getEvent(tx, key, eventID)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return err
	}
	return store.NotDeadLetter(key, eventID, ev.Status)
}

// RedriveEvent re-opens a dead letter under a new epoch; see store.Store.
func (s *Store) RedriveEvent(ctx context.Context, key store.ActorKey, eventID int64) (store.Event, error) {
	var ev store.Event
	err := s.write(ctx, "redrive event", func(tx *txn) error {
		if _, err := sessionStatus(tx, key); err != nil {
			return err
		}
		var err error
		ev, err = scanEvent(tx.queryRow(`
			UPDATE actor_events SET status = 'open', attempts = 0, next_attempt_at = `+nowMS+`,
				redrives = redrives + 1, closed_at = NULL
			WHERE event_id = ? AND agent_uid = ? AND session_id = ? AND status = 'dead_letter'
			RETURNING `+eventReturning, eventID, key.AgentUID, key.SessionID))
		if errors.Is(err, sql.ErrNoRows) {
			return notDeadLetter(tx, key, eventID)
		}
		if err != nil {
			return err
		}
		_, err = tx.exec(`
			UPDATE sessions SET actor_epoch = actor_epoch + 1, status = 'active',
				sleep_ts = CASE WHEN status = 'sleeping' THEN NULL ELSE sleep_ts END,
				sleep_reason = CASE WHEN status = 'sleeping' THEN NULL ELSE sleep_reason END
			WHERE agent_uid = ? AND session_id = ? AND status <> 'destroyed'`, key.AgentUID, key.SessionID)
		return err
	})
	if err != nil {
		return store.Event{}, err
	}
	s.publish(key)
	return ev, nil
}

// DiscardEvent closes a dead letter as discarded; see store.Store.
func (s *Store) DiscardEvent(ctx context.Context, key store.ActorKey, eventID int64) (store.Event, error) {
	var ev store.Event
	err := s.write(ctx, "discard event", func(tx *txn) error {
		if _, err := sessionStatus(tx, key); err != nil && !errors.Is(err, store.ErrSessionDestroyed) {
			return err
		}
		var err error
		ev, err = scanEvent(tx.queryRow(`
			UPDATE actor_events SET status = 'discarded', closed_at = `+nowMS+`
			WHERE event_id = ? AND agent_uid = ? AND session_id = ? AND status = 'dead_letter'
			RETURNING `+eventReturning, eventID, key.AgentUID, key.SessionID))
		if errors.Is(err, sql.ErrNoRows) {
			return notDeadLetter(tx, key, eventID)
		}
		return err
	})
	if err != nil {
		return store.Event{}, err
	}
	return ev, nil
}

// inFlightTurn is the live activation of a session with the delivery of
// its turn in flight.
type inFlightTurn struct {
	uid        string
	epoch      int64
	revision   int64
	eventID    int64
	deliveryID string
	binding    string
}

// Steer persists a steer and, with a turn in flight, attaches it and
// supersedes the turn's delivery with a new revision; see store.Store.
func (s *Store) Steer(ctx context.Context, p store.SteerParams) (store.SteerResult, error) {
	payload, err := store.EventPayload(p.Payload)
	if err != nil {
		return store.SteerResult{}, fmt.Errorf("store/sqlite: steer: %w", err)
	}
	var r store.SteerResult
	err = s.write(ctx, "steer", func(tx *txn) error {
		var err error
		r.Event, r.Created, err = appendEvent(tx, p.Key, abi.EventSteer, payload, p.IdempotencyKey, p.Traceparent)
		if err != nil || !r.Created {
			return err
		}
		// A turn in flight: the live activation's current event with a
		// sent delivery at the activation's revision.
		var f inFlightTurn
		err = tx.queryRow(`
			SELECT a.activation_uid, a.actor_epoch, a.revision, a.current_event_id, d.delivery_id, d.binding
			FROM activations a
			JOIN deliveries d ON d.activation_uid = a.activation_uid AND d.event_id = a.current_event_id
			                 AND d.revision = a.revision AND d.state = 'sent'
			WHERE a.agent_uid = ? AND a.session_id = ? AND a.state IN `+liveStates+`
			  AND a.current_event_id IS NOT NULL`,
			p.Key.AgentUID, p.Key.SessionID).Scan(&f.uid, &f.epoch, &f.revision, &f.eventID, &f.deliveryID, &f.binding)
		if errors.Is(err, sql.ErrNoRows) {
			return nil // queued like a message
		}
		if err != nil {
			return err
		}
		// Compare-and-set on what was read.
		var revision int64
		err = tx.queryRow(`
			UPDATE activations SET revision = revision + 1
			WHERE activation_uid = ? AND agent_uid = ? AND session_id = ? AND actor_epoch = ? AND revision = ?
			  AND current_event_id = ? AND state IN `+liveStates+`
			RETURNING revision`,
			f.uid, p.Key.AgentUID, p.Key.SessionID, f.epoch, f.revision, f.eventID).Scan(&revision)
		if err != nil {
			return err // unreachable under the single writer
		}
		if _, err := tx.exec(`
			UPDATE deliveries SET state = 'superseded', closed_at = `+nowMS+`, error = 'steered'
			WHERE delivery_id = ? AND activation_uid = ? AND revision = ? AND state = 'sent'`,
			f.deliveryID, f.uid, f.revision); err != nil {
			return err
		}
		if _, err := tx.exec(`
			INSERT INTO deliveries (delivery_id, agent_uid, session_id, activation_uid, actor_epoch, event_id,
				revision, state, binding, created_at, sent_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, 'sent', ?, `+nowMS+`, `+nowMS+`)`,
			p.DeliveryID, p.Key.AgentUID, p.Key.SessionID, f.uid, f.epoch, f.eventID, revision, f.binding); err != nil {
			if isConstraint(err) {
				return fmt.Errorf("delivery %s: %w", p.DeliveryID, store.ErrConflict)
			}
			return err
		}
		r.Event, err = scanEvent(tx.queryRow(`
			UPDATE actor_events SET steer_of = ? WHERE event_id = ? RETURNING `+eventReturning,
			f.eventID, r.Event.ID))
		if err != nil {
			return err
		}
		r.InFlight = true
		r.Ref = store.Delivery{ID: p.DeliveryID, ActorKey: p.Key, ActivationUID: f.uid, ActorEpoch: f.epoch,
			EventID: f.eventID, Revision: revision}.TurnRef()
		return nil
	})
	if err != nil {
		return store.SteerResult{}, err
	}
	if r.Created {
		s.publishAppend(p.Key, r.Event.Seq)
	}
	return r, nil
}

// CancelEvent cancels the turn in flight or a queued event; see
// store.Store.
func (s *Store) CancelEvent(ctx context.Context, p store.CancelEventParams) (store.CancelResult, error) {
	key := p.Key
	var r store.CancelResult
	err := s.write(ctx, "cancel event", func(tx *txn) error {
		if _, err := sessionStatus(tx, key); err != nil && !errors.Is(err, store.ErrSessionDestroyed) {
			return err
		}
		var f inFlightTurn
		var current sql.NullInt64
		err := tx.queryRow(`
			SELECT activation_uid, actor_epoch, revision, current_event_id FROM activations
			WHERE agent_uid = ? AND session_id = ? AND state IN `+liveStates,
			key.AgentUID, key.SessionID).Scan(&f.uid, &f.epoch, &f.revision, &current)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		f.eventID = current.Int64
		target := p.EventID
		if target == 0 {
			if f.eventID == 0 {
				return fmt.Errorf("session %s has no turn in flight: %w", key, store.ErrNotFound)
			}
			target = f.eventID
		}
		ev, err := getEvent(tx, key, target)
		if err != nil {
			return err
		}
		if ev.Status != store.EventOpen {
			return fmt.Errorf("event %d of %s is %s: %w", target, key, ev.Status, store.ErrConflict)
		}
		reason := nullString(p.Reason)
		if r.Event, err = scanEvent(tx.queryRow(`
			UPDATE actor_events SET status = 'cancelled', closed_at = `+nowMS+`, last_error = ?
			WHERE event_id = ? AND agent_uid = ? AND session_id = ? AND status = 'open'
			RETURNING `+eventReturning, reason, target, key.AgentUID, key.SessionID)); err != nil {
			return err
		}
		if _, err := tx.exec(`
			UPDATE actor_events SET status = 'cancelled', closed_at = `+nowMS+`, last_error = ?
			WHERE agent_uid = ? AND session_id = ? AND steer_of = ? AND status = 'open'`,
			reason, key.AgentUID, key.SessionID, target); err != nil {
			return err
		}
		if f.eventID != target {
			// Queued: no turn ran. An approval it was held for is moot.
			return cancelHold(tx, key, target)
		}
		r.InFlight = true
		// The turn in flight: supersede its live deliveries (the newest
		// names the cancelled turn), clear the current event and raise
		// the revision so every outstanding ref is fenced off.
		var deliveryID string
		err = tx.queryRow(`
			SELECT delivery_id FROM deliveries
			WHERE activation_uid = ? AND agent_uid = ? AND session_id = ? AND event_id = ? AND state IN ('created', 'sent')
			ORDER BY revision DESC LIMIT 1`, f.uid, key.AgentUID, key.SessionID, target).Scan(&deliveryID)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		if _, err := tx.exec(`
			UPDATE deliveries SET state = 'superseded', closed_at = `+nowMS+`, error = 'cancelled'
			WHERE activation_uid = ? AND agent_uid = ? AND session_id = ? AND event_id = ? AND state IN ('created', 'sent')`,
			f.uid, key.AgentUID, key.SessionID, target); err != nil {
			return err
		}
		res, err := tx.exec(`
			UPDATE activations SET current_event_id = NULL, revision = revision + 1
			WHERE activation_uid = ? AND agent_uid = ? AND session_id = ? AND actor_epoch = ? AND revision = ?
			  AND current_event_id = ? AND state IN `+liveStates,
			f.uid, key.AgentUID, key.SessionID, f.epoch, f.revision, target)
		if err != nil {
			return err
		}
		if err := requireOne(res, store.ActivationRef{UID: f.uid, ActorKey: key, ActorEpoch: f.epoch}); err != nil {
			return err // unreachable under the single writer
		}
		note := "cancelled"
		if p.Reason != "" {
			note += ": " + p.Reason
		}
		t := store.Turn{ActorKey: key, EventID: target, DeliveryID: deliveryID, ActorEpoch: f.epoch,
			Outcome: store.OutcomeCancelled, CommittedAt: *r.Event.ClosedAt,
			Messages: store.TurnMessages([]string{string(ev.Payload)}, []abi.Message{{Role: abi.RoleSystem, Content: note}})}
		// Its usage is the event's journal, as a commit's.
		if t.Usage, err = journalUsage(tx, key, target); err != nil {
			return err
		}
		if _, err = insertTurn(tx, t); err != nil {
			return err
		}
		_, err = appendFrame(tx, key, store.FrameTurnFailed, target, f.epoch, ev.Attempts+1,
			store.MustBody(store.AttemptEndedBody{Reason: store.EndReasonCancelled, Error: p.Reason}))
		return err
	})
	if err != nil {
		return store.CancelResult{}, err
	}
	s.publish(key)
	return r, nil
}

// cancelHold cancels, inside tx, the open approval waits of a cancelled
// event (held by them) and wakes the session if it slept for an approval.
func cancelHold(tx *txn, key store.ActorKey, eventID int64) error {
	res, err := tx.exec(`
		UPDATE waits SET status = 'cancelled', closed_at = `+nowMS+`
		WHERE agent_uid = ? AND session_id = ? AND event_id = ? AND kind = 'approval' AND status = 'open'`,
		key.AgentUID, key.SessionID, eventID)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return err
	}
	_, err = tx.exec(`
		UPDATE sessions SET status = 'active', sleep_ts = NULL, sleep_reason = NULL
		WHERE agent_uid = ? AND session_id = ? AND status = 'sleeping' AND sleep_reason = ?`,
		key.AgentUID, key.SessionID, store.SleepReasonApproval)
	return err
}

// InFlight returns the newest delivery of a live activation's current event
// and its attached steers; see store.Store.
func (s *Store) InFlight(ctx context.Context, ref store.ActivationRef) (store.Dispatch, error) {
	var d store.Dispatch
	err := s.read(ctx, "in flight", func(tx *txn) error {
		var eventID int64
		err := tx.queryRow(`
			SELECT current_event_id FROM activations
			WHERE activation_uid = ? AND agent_uid = ? AND session_id = ? AND actor_epoch = ? AND lease_id = ?
			  AND state IN `+liveStates+` AND current_event_id IS NOT NULL`,
			ref.UID, ref.AgentUID, ref.SessionID, ref.ActorEpoch, ref.LeaseID).Scan(&eventID)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("activation %s of %s at epoch %d (or it has no current event): %w",
				ref.UID, ref.ActorKey, ref.ActorEpoch, store.ErrNotLive)
		}
		if err != nil {
			return err
		}
		dl := &d.Delivery
		err = tx.queryRow(`
			SELECT delivery_id, agent_uid, session_id, activation_uid, actor_epoch, event_id, revision, state, binding
			FROM deliveries WHERE activation_uid = ? AND event_id = ?
			ORDER BY revision DESC LIMIT 1`, ref.UID, eventID).Scan(
			&dl.ID, &dl.AgentUID, &dl.SessionID, &dl.ActivationUID, &dl.ActorEpoch, &dl.EventID, &dl.Revision,
			&dl.State, &dl.Binding)
		if err != nil {
			return err
		}
		if d.Event, err = getEvent(tx, ref.ActorKey, eventID); err != nil {
			return err
		}
		d.Attempt = d.Event.Attempts + 1
		d.Steers, err = attachedSteers(tx, ref.ActorKey, eventID)
		return err
	})
	return d, err
}
