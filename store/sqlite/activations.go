package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/paddock-dev/paddock/store"
)

const activationCols = `activation_uid, agent_uid, session_id, actor_epoch, lease_id, lease_expires_at,
	current_event_id, revision, state, host_id`

func scanActivation(sc scanner) (store.Activation, error) {
	var a store.Activation
	var expires int64
	var current sql.NullInt64
	err := sc.Scan(&a.UID, &a.AgentUID, &a.SessionID, &a.ActorEpoch, &a.LeaseID, &expires,
		&current, &a.Revision, &a.State, &a.HostID)
	a.LeaseExpiresAt = msTime(expires)
	a.CurrentEventID = current.Int64
	return a, err
}

// ClaimActivation starts a new activation for the key; see store.Store. The
// epoch bump and the insert are one transaction: when the partial unique
// index refuses the insert, both roll back.
func (s *Store) ClaimActivation(ctx context.Context, p store.ClaimActivationParams) (store.Activation, error) {
	if p.LeaseTTL <= 0 {
		return store.Activation{}, errors.New("store/sqlite: claim activation: lease TTL must be positive")
	}
	var a store.Activation
	err := s.write(ctx, "claim activation", func(tx *txn) error {
		if err := sessionStatus(tx, p.Key); err != nil {
			return err
		}
		var epoch int64
		if err := tx.queryRow(`
			UPDATE sessions SET actor_epoch = actor_epoch + 1
			WHERE agent_uid = ? AND session_id = ? AND status <> 'destroyed'
			RETURNING actor_epoch`, p.Key.AgentUID, p.Key.SessionID).Scan(&epoch); err != nil {
			return err
		}
		var err error
		a, err = scanActivation(tx.queryRow(`
			INSERT INTO activations (activation_uid, agent_uid, session_id, actor_epoch, lease_id, lease_expires_at,
				current_event_id, revision, state, host_id, created_at)
			VALUES (?, ?, ?, ?, ?, `+nowMS+` + ?, NULL, 0, 'active', ?, `+nowMS+`)
			ON CONFLICT (agent_uid, session_id) WHERE state IN `+liveStates+` DO NOTHING
			RETURNING `+activationCols,
			p.UID, p.Key.AgentUID, p.Key.SessionID, epoch, p.LeaseID, p.LeaseTTL.Milliseconds(), p.HostID))
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return fmt.Errorf("%s: %w", p.Key, store.ErrActivationLive)
		case isConstraint(err):
			return fmt.Errorf("activation uid %s: %w", p.UID, store.ErrConflict)
		}
		return err
	})
	return a, err
}

// renewRef is one ActivationRef as JSON for json_each.
type renewRef struct {
	UID       string `json:"u"`
	AgentUID  string `json:"a"`
	SessionID string `json:"s"`
	Epoch     int64  `json:"e"`
	LeaseID   string `json:"l"`
}

// RenewLeases extends, in one UPDATE, the leases of the live, unexpired
// activations matching refs and held by p.HostID; see store.Store.
func (s *Store) RenewLeases(ctx context.Context, p store.RenewLeasesParams) ([]store.ActivationRef, error) {
	if len(p.Refs) == 0 {
		return nil, nil
	}
	if p.LeaseTTL <= 0 {
		return nil, errors.New("store/sqlite: renew leases: lease TTL must be positive")
	}
	refs := make([]renewRef, len(p.Refs))
	for i, r := range p.Refs {
		refs[i] = renewRef{UID: r.UID, AgentUID: r.AgentUID, SessionID: r.SessionID, Epoch: r.ActorEpoch, LeaseID: r.LeaseID}
	}
	js, err := json.Marshal(refs)
	if err != nil {
		return nil, fmt.Errorf("store/sqlite: renew leases: %w", err)
	}
	var out []store.ActivationRef
	err = s.write(ctx, "renew leases", func(tx *txn) error {
		rows, err := tx.query(`
			UPDATE activations SET lease_expires_at = `+nowMS+` + ?1
			FROM (SELECT value ->> '$.u' AS uid, value ->> '$.a' AS agent_uid, value ->> '$.s' AS session_id,
			             value ->> '$.e' AS epoch, value ->> '$.l' AS lease_id
			      FROM json_each(?2)) AS r
			WHERE activations.activation_uid = r.uid
			  AND activations.agent_uid = r.agent_uid
			  AND activations.session_id = r.session_id
			  AND activations.actor_epoch = r.epoch
			  AND activations.lease_id = r.lease_id
			  AND activations.host_id = ?3
			  AND activations.state IN `+liveStates+`
			  AND activations.lease_expires_at > `+nowMS+`
			RETURNING activation_uid, agent_uid, session_id, actor_epoch, lease_id`,
			p.LeaseTTL.Milliseconds(), string(js), p.HostID)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var r store.ActivationRef
			if err := rows.Scan(&r.UID, &r.AgentUID, &r.SessionID, &r.ActorEpoch, &r.LeaseID); err != nil {
				return err
			}
			out = append(out, r)
		}
		return rows.Err()
	})
	return out, err
}

// StopActivation ends a live activation with no current event; see
// store.Store.
func (s *Store) StopActivation(ctx context.Context, ref store.ActivationRef) error {
	return s.write(ctx, "stop activation", func(tx *txn) error {
		res, err := tx.exec(`
			UPDATE activations SET state = 'stopped', ended_at = `+nowMS+`, end_reason = 'stopped'
			WHERE activation_uid = ? AND agent_uid = ? AND session_id = ? AND actor_epoch = ? AND lease_id = ?
			  AND state IN `+liveStates+` AND current_event_id IS NULL`,
			ref.UID, ref.AgentUID, ref.SessionID, ref.ActorEpoch, ref.LeaseID)
		if err != nil {
			return err
		}
		return requireOne(res, ref)
	})
}

// requireOne turns a 0-row compare-and-set into ErrNotLive.
func requireOne(res sql.Result, ref store.ActivationRef) error {
	n, err := res.RowsAffected()
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("activation %s of %s at epoch %d: %w", ref.UID, ref.ActorKey, ref.ActorEpoch, store.ErrNotLive)
	}
	return nil
}

// ExpiredActivations lists live activations whose lease expired by the
// database clock, longest expired first.
func (s *Store) ExpiredActivations(ctx context.Context, limit int) ([]store.ActivationRef, error) {
	var out []store.ActivationRef
	err := s.read(ctx, "expired activations", func(tx *txn) error {
		rows, err := tx.query(`
			SELECT activation_uid, agent_uid, session_id, actor_epoch, lease_id FROM activations
			WHERE state IN `+liveStates+` AND lease_expires_at <= `+nowMS+`
			ORDER BY lease_expires_at, activation_uid LIMIT ?`, pageLimit(limit))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var r store.ActivationRef
			if err := rows.Scan(&r.UID, &r.AgentUID, &r.SessionID, &r.ActorEpoch, &r.LeaseID); err != nil {
				return err
			}
			out = append(out, r)
		}
		return rows.Err()
	})
	return out, err
}

// Watchdog texts recorded on the event.
const (
	errLeaseLostSent    = "lease expired: host lost while the turn ran"
	errLeaseLostCreated = "lease expired: host lost before the turn was sent"
)

// ExpireActivation fails a live activation whose lease expired (compare-and-
// set on ref and the database clock); see store.Store.
func (s *Store) ExpireActivation(ctx context.Context, p store.ExpireActivationParams) (store.FailResult, error) {
	ref := p.Ref
	var fr store.FailResult
	err := s.write(ctx, "expire activation", func(tx *txn) error {
		var current sql.NullInt64
		err := tx.queryRow(`
			UPDATE activations SET state = 'failed', ended_at = `+nowMS+`, end_reason = 'lease expired'
			WHERE activation_uid = ? AND agent_uid = ? AND session_id = ? AND actor_epoch = ? AND lease_id = ?
			  AND state IN `+liveStates+` AND lease_expires_at <= `+nowMS+`
			RETURNING current_event_id`,
			ref.UID, ref.AgentUID, ref.SessionID, ref.ActorEpoch, ref.LeaseID).Scan(&current)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("activation %s of %s at epoch %d: %w", ref.UID, ref.ActorKey, ref.ActorEpoch, store.ErrNotLive)
		}
		if err != nil {
			return err
		}
		if !current.Valid {
			return nil
		}
		fr.EventID = current.Int64
		if _, err := tx.exec(`UPDATE activations SET current_event_id = NULL WHERE activation_uid = ?`,
			ref.UID); err != nil {
			return err
		}
		// The current event's delivery: sent means a worker had the turn.
		var state store.DeliveryState
		err = tx.queryRow(`
			UPDATE deliveries
			SET state = CASE state WHEN 'sent' THEN 'superseded' ELSE 'send_failed' END,
			    closed_at = `+nowMS+`, error = 'lease expired'
			WHERE activation_uid = ? AND agent_uid = ? AND session_id = ? AND event_id = ?
			  AND state IN ('created', 'sent')
			RETURNING state`, ref.UID, ref.AgentUID, ref.SessionID, current.Int64).Scan(&state)
		if errors.Is(err, sql.ErrNoRows) {
			return nil // no delivery in flight: nothing to count
		}
		if err != nil {
			return err
		}
		counted := state == store.DeliverySuperseded
		backoff := p.Backoff
		msg := errLeaseLostSent
		if !counted {
			backoff, msg = 0, errLeaseLostCreated
		}
		fr, err = failEvent(tx, ref.ActorKey, current.Int64, counted, msg, backoff, p.MaxAttempts)
		return err
	})
	return fr, err
}

// failEvent records a failed attempt on an open event: attempts+1 when
// counted, last_error, next_attempt_at = DB now + backoff, and dead_letter
// once a counted attempt reaches maxAttempts (> 0).
func failEvent(tx *txn, key store.ActorKey, eventID int64, counted bool, msg string,
	backoff time.Duration, maxAttempts int) (store.FailResult, error) {
	fr := store.FailResult{EventID: eventID}
	var status store.EventStatus
	var next int64
	err := tx.queryRow(`
		UPDATE actor_events
		SET attempts = attempts + ?1,
		    last_error = ?2,
		    next_attempt_at = `+nowMS+` + ?3,
		    status = CASE WHEN ?1 = 1 AND ?4 > 0 AND attempts + 1 >= ?4 THEN 'dead_letter' ELSE status END,
		    closed_at = CASE WHEN ?1 = 1 AND ?4 > 0 AND attempts + 1 >= ?4 THEN `+nowMS+` ELSE closed_at END
		WHERE event_id = ?5 AND agent_uid = ?6 AND session_id = ?7 AND status = 'open'
		RETURNING attempts, status, next_attempt_at`,
		boolInt(counted), msg, max(backoff, 0).Milliseconds(), maxAttempts, eventID, key.AgentUID, key.SessionID,
	).Scan(&fr.Attempts, &status, &next)
	if errors.Is(err, sql.ErrNoRows) {
		return fr, nil // the event was closed meanwhile: nothing to retry
	}
	if err != nil {
		return fr, err
	}
	fr.DeadLettered = status == store.EventDeadLetter
	fr.NextAttemptAt = msTime(next)
	return fr, nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// RunnableSessions lists active sessions whose oldest open event is due (DB
// clock) and that have no live activation, oldest due first.
func (s *Store) RunnableSessions(ctx context.Context, limit int) ([]store.ActorKey, error) {
	var out []store.ActorKey
	err := s.read(ctx, "runnable sessions", func(tx *txn) error {
		rows, err := tx.query(`
			SELECT e.agent_uid, e.session_id
			FROM actor_events e
			JOIN sessions s ON s.agent_uid = e.agent_uid AND s.session_id = e.session_id
			WHERE e.status = 'open'
			  AND s.status = 'active'
			  AND e.seq = (SELECT min(o.seq) FROM actor_events o
			               WHERE o.agent_uid = e.agent_uid AND o.session_id = e.session_id AND o.status = 'open')
			  AND e.next_attempt_at <= `+nowMS+`
			  AND NOT EXISTS (SELECT 1 FROM activations a
			                  WHERE a.agent_uid = e.agent_uid AND a.session_id = e.session_id
			                    AND a.state IN `+liveStates+`)
			ORDER BY e.next_attempt_at, e.event_id
			LIMIT ?`, pageLimit(limit))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var k store.ActorKey
			if err := rows.Scan(&k.AgentUID, &k.SessionID); err != nil {
				return err
			}
			out = append(out, k)
		}
		return rows.Err()
	})
	return out, err
}
