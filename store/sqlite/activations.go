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
// index refuses the insert, both roll back. With p.First the first turn is
// taken in the same transaction, inside a savepoint (nextAfterCommit), or
// read deferred (First.Defer: deferredDispatch).
func (s *Store) ClaimActivation(ctx context.Context, p store.ClaimActivationParams) (store.Activation, error) {
	if err := store.CheckLeaseTTL(p.LeaseTTL); err != nil {
		return store.Activation{}, fmt.Errorf("store/sqlite: claim activation: %w", err)
	}
	if err := store.CheckClaimFirst(p); err != nil {
		return store.Activation{}, fmt.Errorf("store/sqlite: claim activation: %w", err)
	}
	var a store.Activation
	err := s.write(ctx, "claim activation", func(tx *txn) error {
		var status store.SessionStatus
		var reason string
		if err := tx.queryRow(`SELECT status, coalesce(sleep_reason, '') FROM sessions WHERE agent_uid = ? AND session_id = ?`,
			p.Key.AgentUID, p.Key.SessionID).Scan(&status, &reason); err != nil {
			return fmt.Errorf("session %s: %w", p.Key, notFound(err))
		}
		wake, err := store.ClaimWake(p.Key, status, reason, p.WakeForCapacity)
		if err != nil {
			return err
		}
		// A session asleep only for capacity is woken in this transaction
		// (the write lock is held since the read above).
		var epoch int64
		if err := tx.queryRow(`
			UPDATE sessions SET actor_epoch = actor_epoch + 1, status = 'active',
				sleep_ts = CASE WHEN ?3 THEN NULL ELSE sleep_ts END,
				sleep_reason = CASE WHEN ?3 THEN NULL ELSE sleep_reason END
			WHERE agent_uid = ?1 AND session_id = ?2 AND (status = 'active' OR (?3 AND status = 'sleeping'))
			RETURNING actor_epoch`, p.Key.AgentUID, p.Key.SessionID, wake).Scan(&epoch); err != nil {
			return err
		}
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
		case err != nil:
			return err
		}
		if p.First != nil && p.First.Activation.ActorEpoch == 0 {
			// The claim's epoch, whatever it is (store.ClaimActivationParams.First).
			f := *p.First
			f.Activation.ActorEpoch = epoch
			p.First = &f
		}
		switch f := p.First; {
		case f != nil && f.Defer && f.Expect != nil:
			// The first turn read deferred, nothing written (as PostgreSQL:
			// none when it may not be deferred; the caller asks then).
			if d, ok, _ := deferredDispatch(tx, *f); ok {
				a.First = &d
			}
		case f != nil:
			// The first turn, in this transaction (ClaimActivationParams.First).
			a.First, err = nextAfterCommit(tx, *f)
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
	if err := store.CheckLeaseTTL(p.LeaseTTL); err != nil {
		return nil, fmt.Errorf("store/sqlite: renew leases: %w", err)
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
			ORDER BY lease_expires_at, activation_uid LIMIT ?`, store.PageLimit(limit))
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
			fr.SessionStatus, err = sessionStatus(tx, ref.ActorKey)
			if errors.Is(err, store.ErrSessionDestroyed) {
				err = nil
			}
			return err
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
			// No delivery in flight: nothing to count.
			fr.SessionStatus, err = sessionStatus(tx, ref.ActorKey)
			if errors.Is(err, store.ErrSessionDestroyed) {
				err = nil
			}
			return err
		}
		if err != nil {
			return err
		}
		counted, backoff, msg := store.LeaseLost(state, p.Backoff)
		fr, err = failEvent(tx, failure{key: ref.ActorKey, eventID: current.Int64, epoch: ref.ActorEpoch,
			counted: counted, msg: msg, backoff: backoff, maxAttempts: p.MaxAttempts,
			reason: store.EndReasonLeaseExpired})
		return err
	})
	return fr, err
}

// failure describes one failed attempt of an event.
type failure struct {
	key         store.ActorKey
	eventID     int64
	epoch       int64 // the failed activation's epoch
	counted     bool
	msg         string
	backoff     time.Duration
	maxAttempts int
	// reason is the frame's: store.EndReasonError or EndReasonLeaseExpired.
	reason string
}

// failEvent records a failed attempt on an open event, after the caller's
// fences passed, in its transaction: it reads the event's attempts and the
// session's policy and status, lets store.PlanFailure decide, and writes the
// plan — the event (attempts, last_error, next_attempt_at = DB now + delay,
// dead_letter), one event_errors row, the steers detached, the session
// parked or destroyed — and appends the frame store.AttemptEndedFrame
// names. An event no longer open is left alone.
func failEvent(tx *txn, f failure) (store.FailResult, error) {
	fr := store.FailResult{EventID: f.eventID}
	in := store.FailureInput{Counted: f.counted, MaxAttempts: f.maxAttempts, Backoff: f.backoff}
	var evStatus store.EventStatus
	err := tx.queryRow(`
		SELECT s.crash_policy, s.status, coalesce(e.attempts, 0), coalesce(e.status, '')
		FROM sessions s LEFT JOIN actor_events e
			ON e.event_id = ?3 AND e.agent_uid = s.agent_uid AND e.session_id = s.session_id
		WHERE s.agent_uid = ?1 AND s.session_id = ?2`,
		f.key.AgentUID, f.key.SessionID, f.eventID).Scan(&in.Policy, &in.SessionStatus, &in.AttemptsBefore, &evStatus)
	if err != nil {
		return fr, fmt.Errorf("session %s: %w", f.key, notFound(err))
	}
	fr.SessionStatus = in.SessionStatus
	if evStatus != store.EventOpen {
		return fr, nil // the event was closed meanwhile: nothing to retry
	}
	plan := store.PlanFailure(in)
	var next int64
	if err := tx.queryRow(`
		UPDATE actor_events
		SET attempts = ?1, last_error = ?2, next_attempt_at = `+nowMS+` + ?3, status = ?4,
		    closed_at = CASE WHEN ?4 = 'open' THEN closed_at ELSE `+nowMS+` END
		WHERE event_id = ?5 AND agent_uid = ?6 AND session_id = ?7 AND status = 'open' AND attempts = ?8
		RETURNING next_attempt_at`,
		plan.Attempts, f.msg, plan.Delay.Milliseconds(), string(plan.Status), f.eventID, f.key.AgentUID, f.key.SessionID,
		in.AttemptsBefore).Scan(&next); err != nil {
		return fr, err // no row is unreachable: the write transaction read it open just now
	}
	fr.Attempts = plan.Attempts
	fr.DeadLettered = plan.Status == store.EventDeadLetter
	fr.NextAttemptAt = msTime(next)
	if _, err := tx.exec(`
		INSERT INTO event_errors (agent_uid, session_id, event_id, attempt_seq, attempt, actor_epoch, counted, error, failed_at)
		VALUES (?1, ?2, ?3,
			(SELECT coalesce(max(attempt_seq), 0) + 1 FROM event_errors
			 WHERE agent_uid = ?1 AND session_id = ?2 AND event_id = ?3),
			?4, ?5, ?6, ?7, `+nowMS+`)`,
		f.key.AgentUID, f.key.SessionID, f.eventID, fr.Attempts, f.epoch, boolInt(f.counted), f.msg); err != nil {
		return fr, err
	}
	if plan.DetachSteers {
		if err := detachSteers(tx, f.key, f.eventID); err != nil {
			return fr, err
		}
	}
	switch plan.Session {
	case store.SessionSleep:
		res, err := tx.exec(`
			UPDATE sessions SET status = 'sleeping', sleep_ts = `+nowMS+`, sleep_reason = ?3, pending_since = NULL
			WHERE agent_uid = ?1 AND session_id = ?2 AND status = 'active'`,
			f.key.AgentUID, f.key.SessionID, store.SleepReasonCrash)
		if err != nil {
			return fr, err
		}
		if n, err := res.RowsAffected(); err != nil {
			return fr, err
		} else if n == 1 {
			fr.SessionStatus = store.SessionSleeping
		}
	case store.SessionDestroy:
		if err := destroySession(tx, f.key); err != nil {
			return fr, err
		}
		fr.SessionStatus = store.SessionDestroyed
	}
	kind, body := store.AttemptEndedFrame(f.reason, f.msg, fr)
	if _, err := appendFrame(tx, f.key, kind, f.eventID, f.epoch, in.AttemptsBefore+1, store.MustBody(body)); err != nil {
		return fr, err
	}
	return fr, nil
}

// detachSteers turns the open steers attached to an event that left open
// for dead_letter into queued events of their own.
func detachSteers(tx *txn, key store.ActorKey, eventID int64) error {
	_, err := tx.exec(`
		UPDATE actor_events SET steer_of = NULL
		WHERE agent_uid = ? AND session_id = ? AND steer_of = ? AND status = 'open'`,
		key.AgentUID, key.SessionID, eventID)
	return err
}

// destroySession destroys a session inside tx: status destroyed,
// destroy_ts, open events discarded, alarms deleted, live activations failed
// (their current event cleared) and their deliveries in flight superseded,
// so every reply in flight is fenced off. Authoritative: no CAS on a lease.
//
// Open waits are cancelled, and a turn in flight (a live activation's
// current event) gets its turn.failed frame (reason destroyed).
func destroySession(tx *txn, key store.ActorKey) error {
	args := []any{key.AgentUID, key.SessionID}
	var eventID, epoch int64
	var attempts int
	err := tx.queryRow(`
		SELECT a.current_event_id, a.actor_epoch, e.attempts FROM activations a
		JOIN actor_events e ON e.event_id = a.current_event_id
		WHERE a.agent_uid = ? AND a.session_id = ? AND a.state IN `+liveStates, args...).Scan(&eventID, &epoch, &attempts)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return err
	}
	for _, q := range []string{
		`UPDATE waits SET status = 'cancelled', closed_at = ` + nowMS + `
		 WHERE agent_uid = ? AND session_id = ? AND status = 'open'`,
		`UPDATE sessions SET status = 'destroyed', destroy_ts = ` + nowMS + `, pending_since = NULL
		 WHERE agent_uid = ? AND session_id = ? AND status <> 'destroyed'`,
		`UPDATE actor_events SET status = 'discarded', closed_at = ` + nowMS + `
		 WHERE agent_uid = ? AND session_id = ? AND status = 'open'`,
		`DELETE FROM alarms WHERE agent_uid = ? AND session_id = ?`,
		`UPDATE deliveries SET state = 'superseded', closed_at = ` + nowMS + `, error = 'session destroyed'
		 WHERE agent_uid = ?1 AND session_id = ?2 AND state IN ('created', 'sent')
		   AND activation_uid IN (SELECT activation_uid FROM activations
		                          WHERE agent_uid = ?1 AND session_id = ?2 AND state IN ` + liveStates + `)`,
		`UPDATE activations SET state = 'failed', ended_at = ` + nowMS + `, end_reason = 'destroyed', current_event_id = NULL
		 WHERE agent_uid = ? AND session_id = ? AND state IN ` + liveStates,
	} {
		if _, err := tx.exec(q, args...); err != nil {
			return err
		}
	}
	if eventID != 0 {
		if _, err := appendFrame(tx, key, store.FrameTurnFailed, eventID, epoch, attempts+1,
			store.MustBody(store.AttemptEndedBody{Reason: store.EndReasonDestroyed})); err != nil {
			return err
		}
	}
	return nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// runnableSessionsSQL is RunnableSessions' query. Parameters: ?1 the
// blocked agents, ?2 the limit, ?3 the capacity sleep reasons, ?4 the
// agents to skip (JSON arrays).
const runnableSessionsSQL = `
	WITH RECURSIVE k(event_id) AS (
		SELECT (SELECT event_id FROM actor_events WHERE status = 'open'
		        ORDER BY agent_uid, session_id LIMIT 1)
		UNION ALL
		SELECT coalesce(
			(SELECT n.event_id FROM actor_events n
			 WHERE n.status = 'open' AND n.agent_uid = c.agent_uid AND n.session_id > c.session_id
			 ORDER BY n.agent_uid, n.session_id LIMIT 1),
			(SELECT n.event_id FROM actor_events n
			 WHERE n.status = 'open' AND n.agent_uid > c.agent_uid
			 ORDER BY n.agent_uid, n.session_id LIMIT 1))
		FROM k JOIN actor_events c ON c.event_id = k.event_id)
	SELECT s.agent_uid, s.session_id
	FROM k
	CROSS JOIN actor_events c ON c.event_id = k.event_id
	CROSS JOIN sessions s ON s.agent_uid = c.agent_uid AND s.session_id = c.session_id
	JOIN actor_events e ON e.event_id = (SELECT o.event_id FROM actor_events o
		WHERE o.agent_uid = s.agent_uid AND o.session_id = s.session_id
		  AND o.status = 'open' AND o.steer_of IS NULL
		ORDER BY o.seq LIMIT 1)
	WHERE (s.status = 'active'
	       OR (s.status = 'sleeping' AND s.sleep_reason IN (SELECT value FROM json_each(?3))))
	  AND e.next_attempt_at <= ` + nowMS + `
	  AND NOT EXISTS (SELECT 1 FROM activations a
	                  WHERE a.agent_uid = s.agent_uid AND a.session_id = s.session_id
	                    AND a.state IN ` + liveStates + `)
	  AND NOT (s.agent_uid IN (SELECT value FROM json_each(?1))
	           AND EXISTS (SELECT 1 FROM actor_events dl
	                       WHERE dl.agent_uid = s.agent_uid AND dl.session_id = s.session_id
	                         AND dl.status = 'dead_letter' AND dl.seq < e.seq))
	  AND s.agent_uid NOT IN (SELECT value FROM json_each(?4))
	ORDER BY e.next_attempt_at, e.event_id
	LIMIT ?2`

// RunnableSessions lists active sessions, and sessions asleep for lack of
// capacity (store.CapacitySleepReasons), whose oldest open event (steers
// attached to a turn aside) is due (DB clock) and that have no live
// activation, oldest due first; sessions of p.BlockedAgents whose oldest
// open event has an older dead letter are left out.
func (s *Store) RunnableSessions(ctx context.Context, p store.RunnableSessionsParams) ([]store.ActorKey, error) {
	blocked, err := json.Marshal(append([]string{}, p.BlockedAgents...))
	if err != nil {
		return nil, fmt.Errorf("store/sqlite: runnable sessions: %w", err)
	}
	capacity, err := json.Marshal(store.CapacitySleepReasons())
	if err != nil {
		return nil, fmt.Errorf("store/sqlite: runnable sessions: %w", err)
	}
	skip, err := json.Marshal(append([]string{}, p.SkipAgents...))
	if err != nil {
		return nil, fmt.Errorf("store/sqlite: runnable sessions: %w", err)
	}
	var out []store.ActorKey
	err = s.read(ctx, "runnable sessions", func(tx *txn) error {
		// Driven by the sessions that have open events, not by the
		// sessions: k walks actor_events_open one session at a time (the
		// next key after the last one found), so idle sessions cost nothing
		// and a session's backlog costs one probe; each session found then
		// costs its oldest open event and a look for a live activation.
		// Driven by sessions, the scan had probed every awake session's
		// oldest open event, each ScanInterval
		// (TestRunnableSessionsReadsOnlySessionsWithOpenEvents).
		rows, err := tx.query(runnableSessionsSQL, string(blocked), store.PageLimit(p.Limit), string(capacity), string(skip))
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
