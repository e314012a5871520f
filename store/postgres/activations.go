package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paddock-dev/paddock/store"
)

// ClaimActivation starts a new activation for the key (epoch = session epoch
// + 1); a live one present returns ErrActivationLive. See store.Store.
//
// Invariant 1 is decided by the partial unique index activations_live: the
// INSERT names it as its ON CONFLICT arbiter, so a concurrent claim that
// lost waits for the winner's commit and then inserts nothing; the
// statement raises and the transaction, epoch bump included, is rolled
// back (claimActivationSQL).
//
// With p.First (and its Expect) the first turn's claim (claimDeliverySQL,
// then the session's and the tail's reads, which run only when it took an
// event) rides in the same round trip and implicit transaction, after the
// activation's statement. Should it refuse that transaction (a lock race,
// a delivery id in use), the claim runs again without it: the dispatch
// never undoes the claim.
//
// Concurrent claims of different sessions go out together in one batch
// (the group commit), as appends, commits and dispatches do; a batch that
// rolled back sends each claim alone.
func (s *Store) ClaimActivation(ctx context.Context, p store.ClaimActivationParams) (store.Activation, error) {
	if err := store.CheckLeaseTTL(p.LeaseTTL); err != nil {
		return store.Activation{}, fmt.Errorf("store/postgres: claim activation: %w", err)
	}
	if err := store.CheckClaimFirst(p); err != nil {
		return store.Activation{}, fmt.Errorf("store/postgres: claim activation: %w", err)
	}
	if p.First != nil && p.First.Expect == nil {
		p.First = nil
	}
	if s.groupCommit {
		r := s.activations.do(ctx, p)
		switch {
		case r.solo:
		case r.err != nil:
			return store.Activation{}, wrap("claim activation", r.err)
		case r.claimed:
			return r.a, nil
		default:
			// Not claimable, or it changed since (a lock race: claim
			// again alone).
			if err := s.claimRefusal(ctx, p); !retryable(err) {
				return store.Activation{}, wrap("claim activation", err)
			}
		}
	}
	if p.First != nil {
		a, err := s.claimActivation(ctx, p)
		var fe *firstRefusal
		if !errors.As(err, &fe) {
			return a, err
		}
		p.First = nil
	}
	return s.claimActivation(ctx, p)
}

// firstRefusal is the error of a claim whose first turn's claim refused
// the transaction (ClaimActivation then claims again without it).
type firstRefusal struct{ err error }

func (f *firstRefusal) Error() string { return "first turn: " + f.err.Error() }
func (f *firstRefusal) Unwrap() error { return f.err }

// claimActivation is ClaimActivation alone, with the claim of p.First in
// its transaction when set.
func (s *Store) claimActivation(ctx context.Context, p store.ClaimActivationParams) (store.Activation, error) {
	var q *queuedActivation
	err := s.rerun(ctx, "claim activation", func(ctx context.Context) error {
		b := &pgx.Batch{}
		q = queueActivation(b, p)
		err := s.pool.SendBatch(ctx, b).Close()
		switch {
		case err == nil && !q.claimed:
			return s.claimRefusal(ctx, p)
		case isCheck(err, checkActivationLive):
			return fmt.Errorf("session %s: %w", p.Key, store.ErrActivationLive)
		case err != nil && p.First != nil && q.claimed && !connectionEnded(err):
			// The activation's statement passed; the first turn's refused
			// (not the connection: the claim may have committed).
			return &firstRefusal{err: dispatchErr(p.First.DeliveryID, err)}
		case pgCode(err) == codeUniqueViolation:
			return fmt.Errorf("activation %s: %w", p.UID, store.ErrConflict)
		case err != nil:
			return checkErr(err)
		}
		return nil
	})
	if err != nil {
		return store.Activation{}, err
	}
	return q.activation(), nil
}

// queuedActivation is a claim of an activation queued in a batch
// (queueActivation); activation is its answer once the batch committed.
type queuedActivation struct {
	a       store.Activation
	claimed bool
	first   *claim
	// read is a deferred first turn's reads (First.Defer).
	read *deferredRead
}

// queueActivation queues p's claim, in one implicit transaction with the
// rest of its batch: the session row locked (lockSessionSQL), then
// claimActivationSQL — the session's epoch raised (and, for a wake, its
// sleep cleared: store.ClaimWake) when no activation of it is live, and
// the activation inserted. An activation inserted meanwhile by another
// claim (the partial unique index on live activations) refuses the
// statement, so that the epoch is not raised for nothing. Then p.First's
// claim, when set.
//
// The lock is a statement of its own so that the claim's statement reads
// with a snapshot taken once the row is held: it then sees every
// activation whose claim held the row before (a claim holds it until it
// commits), and inserts only when none is live. In one statement, a claim
// that waited for the row behind a rival claim read with the snapshot of
// before it, found no live activation, and its insert waited for the
// rival's activation row — which the rival's first turn, waiting for the
// session row in its commit, held: a deadlock, one second of
// deadlock_timeout for both lanes (found in review; the starts lane made
// it possible within one host, two hosts had it before).
func queueActivation(b *pgx.Batch, p store.ClaimActivationParams) *queuedActivation {
	key := p.Key
	q := &queuedActivation{a: store.Activation{UID: p.UID, ActorKey: key, LeaseID: p.LeaseID,
		State: store.ActivationActive, HostID: p.HostID}}
	b.Queue(lockSessionSQL, key.AgentUID, key.SessionID)
	b.Queue(claimActivationSQL, key.AgentUID, key.SessionID, p.WakeForCapacity,
		store.CapacitySleepReasons(), p.UID, p.LeaseID, micros(p.LeaseTTL), p.HostID, checkActivationLive,
	).QueryRow(func(row pgx.Row) error {
		var ok bool
		err := row.Scan(&q.a.ActorEpoch, &q.a.LeaseExpiresAt, &ok)
		q.claimed = err == nil
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		return err
	})
	switch {
	case p.First != nil && p.First.Defer && p.First.Expect != nil:
		// Deferred: read in the claim's transaction, after it (the read
		// sees the activation the claim inserted), nothing written.
		q.read = queueDeferredRead(b, *p.First)
	case p.First != nil:
		q.first = queueClaim(b, *p.First, true)
	}
	return q
}

// activation is the claimed activation, with the first turn its claim
// took.
func (q *queuedActivation) activation() store.Activation {
	a := q.a
	a.LeaseExpiresAt = utc(a.LeaseExpiresAt)
	if q.first != nil {
		if d, taken := q.first.dispatch(); taken {
			a.First = &d
		}
	}
	if q.read != nil && q.claimed {
		if d, ok := q.read.dispatch(); ok {
			a.First = &d
		}
	}
	return a
}

// lockSessionSQL locks a session's row, $1 agent uid, $2 session id, for
// the claim that follows it in its transaction (queueActivation).
const lockSessionSQL = `SELECT 1 FROM sessions WHERE agent_uid = $1 AND session_id = $2 FOR NO KEY UPDATE`

// claimActivationSQL is ClaimActivation's statement: parameters $1 agent
// uid, $2 session id, $3 wake for capacity, $4 the capacity sleep reasons,
// $5 activation uid, $6 lease id, $7 lease ttl in µs, $8 host id, $9 the
// check's message when a live activation appeared meanwhile. It returns
// the new epoch and the lease's end, or no row when the session was not
// claimable (claimRefusal says why).
const claimActivationSQL = `
	WITH up AS (
		UPDATE sessions SET actor_epoch = actor_epoch + 1, status = 'active',
			sleep_ts = CASE WHEN status = 'sleeping' THEN NULL ELSE sleep_ts END,
			sleep_reason = CASE WHEN status = 'sleeping' THEN NULL ELSE sleep_reason END
		WHERE agent_uid = $1 AND session_id = $2
		  AND (status = 'active' OR ($3 AND status = 'sleeping' AND sleep_reason = ANY($4::text[])))
		  AND NOT EXISTS (SELECT 1 FROM activations a
			WHERE a.agent_uid = $1 AND a.session_id = $2 AND a.state IN ` + liveStates + `)
		RETURNING actor_epoch),
	ins AS (
		INSERT INTO activations (activation_uid, agent_uid, session_id, actor_epoch, lease_id,
			lease_expires_at, revision, state, host_id)
		SELECT $5, $1, $2, up.actor_epoch, $6, clock_timestamp() + $7 * interval '1 microsecond', 0, 'active', $8
		FROM up
		ON CONFLICT (agent_uid, session_id) WHERE state IN ` + liveStates + ` DO NOTHING
		RETURNING lease_expires_at)
	SELECT up.actor_epoch, ins.lease_expires_at, paddock_check(ins.lease_expires_at IS NOT NULL, $9)
	FROM up LEFT JOIN ins ON true`

// checkActivationLive is claimActivationSQL's check: a live activation of
// the session was inserted while the claim waited for the session's row.
const checkActivationLive = "a live activation appeared"

// claimRefusal explains a claim that wrote nothing: the session is not
// found, asleep, destroyed (store.ClaimWake) or has a live activation. A
// session found claimable after all changed since the claim's statement:
// a lock race, so the claim runs again.
func (s *Store) claimRefusal(ctx context.Context, p store.ClaimActivationParams) error {
	key := p.Key
	var status store.SessionStatus
	var reason string
	var live bool
	err := s.pool.QueryRow(ctx, `
		SELECT s.status, coalesce(s.sleep_reason, ''), EXISTS (SELECT 1 FROM activations a
			WHERE a.agent_uid = s.agent_uid AND a.session_id = s.session_id AND a.state IN `+liveStates+`)
		FROM sessions s WHERE s.agent_uid = $1 AND s.session_id = $2`,
		key.AgentUID, key.SessionID).Scan(&status, &reason, &live)
	if err != nil {
		return fmt.Errorf("session %s: %w", key, notFound(err))
	}
	if _, err := store.ClaimWake(key, status, reason, p.WakeForCapacity); err != nil {
		return err
	}
	if live {
		return fmt.Errorf("session %s: %w", key, store.ErrActivationLive)
	}
	return fmt.Errorf("session %s changed while it was claimed: %w", key, errLockRace)
}

// RenewLeases extends, in one statement, the leases of the given live,
// unexpired activations held by p.HostID; see store.Store.
func (s *Store) RenewLeases(ctx context.Context, p store.RenewLeasesParams) ([]store.ActivationRef, error) {
	if len(p.Refs) == 0 {
		return nil, nil
	}
	if err := store.CheckLeaseTTL(p.LeaseTTL); err != nil {
		return nil, fmt.Errorf("store/postgres: renew leases: %w", err)
	}
	n := len(p.Refs)
	uids, agents, sessions, leases := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	epochs := make([]int64, n)
	for i, r := range p.Refs {
		uids[i], agents[i], sessions[i], epochs[i], leases[i] = r.UID, r.AgentUID, r.SessionID, r.ActorEpoch, r.LeaseID
	}
	var out []store.ActivationRef
	// One statement, autocommit. It renews the rows it can lock at once
	// and skips those a turn transaction holds (NextDelivery, CommitTurn,
	// FailAttempt lock their activation row first): waiting for them, while
	// holding the rows already renewed, queued every turn of this host
	// behind the slowest one. A skipped row still matches the ref and
	// is unexpired; it is returned as held and renewed on the next round,
	// ttl/3 later. Were it skipped until it expired, the fences would
	// refuse its commit by the database clock, as for any lost lease.
	err := s.call(ctx, "renew leases", func(ctx context.Context) error {
		rows, err := s.leases.Query(ctx, `
			WITH r AS (
				SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[]) WITH ORDINALITY
					AS r(activation_uid, agent_uid, session_id, actor_epoch, lease_id, n)),
			held AS (
				SELECT r.n, a.activation_uid, a.lease_expires_at FROM activations a JOIN r USING (activation_uid, agent_uid, session_id, actor_epoch, lease_id)
				WHERE a.host_id = $7 AND a.state IN `+liveStates+` AND a.lease_expires_at > clock_timestamp()),
			locked AS (
				SELECT a.activation_uid FROM activations a
				WHERE a.activation_uid IN (SELECT activation_uid FROM held)
				FOR UPDATE OF a SKIP LOCKED),
			renewed AS (
				UPDATE activations a SET lease_expires_at = clock_timestamp() + $6 * interval '1 microsecond'
				FROM locked WHERE a.activation_uid = locked.activation_uid
				  AND a.host_id = $7 AND a.state IN `+liveStates+` AND a.lease_expires_at > clock_timestamp()
				RETURNING a.activation_uid)
			SELECT r.activation_uid, r.agent_uid, r.session_id, r.actor_epoch, r.lease_id,
				held.activation_uid NOT IN (SELECT activation_uid FROM renewed)
				  AND held.lease_expires_at < clock_timestamp() + $6 / 2 * interval '1 microsecond'
			FROM r JOIN held USING (n)
			WHERE held.activation_uid IN (SELECT activation_uid FROM renewed)
			   OR held.activation_uid NOT IN (SELECT activation_uid FROM locked)`,
			uids, agents, sessions, epochs, leases, micros(p.LeaseTTL), p.HostID)
		if err != nil {
			return err
		}
		var urgent []store.ActivationRef
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.ActivationRef, error) {
			var ref store.ActivationRef
			var late bool
			err := r.Scan(&ref.UID, &ref.AgentUID, &ref.SessionID, &ref.ActorEpoch, &ref.LeaseID, &late)
			if late {
				urgent = append(urgent, ref)
			}
			return ref, err
		})
		if err != nil {
			return err
		}
		// A row skipped with less than half its lease left was skipped at
		// the round before too (a busy session's turn transactions held
		// it both times): renew it now, waiting for its lock (a turn
		// transaction's, milliseconds), or a busy session could lose its
		// lease to bad luck. One statement per row, so that this wait
		// holds no other row and cannot deadlock with a batch that locks
		// several sessions' rows in its own order.
		for _, ref := range urgent {
			tag, err := s.leases.Exec(ctx, `
				UPDATE activations SET lease_expires_at = clock_timestamp() + $6 * interval '1 microsecond'
				WHERE activation_uid = $1 AND agent_uid = $2 AND session_id = $3 AND actor_epoch = $4 AND lease_id = $5
				  AND host_id = $7 AND state IN `+liveStates+` AND lease_expires_at > clock_timestamp()`,
				ref.UID, ref.AgentUID, ref.SessionID, ref.ActorEpoch, ref.LeaseID, micros(p.LeaseTTL), p.HostID)
			if err != nil {
				return err
			}
			if tag.RowsAffected() == 0 {
				out = slices.DeleteFunc(out, func(r store.ActivationRef) bool { return r == ref })
			}
		}
		return nil
	})
	return out, err
}

func scanRef(r pgx.CollectableRow) (store.ActivationRef, error) {
	var ref store.ActivationRef
	err := r.Scan(&ref.UID, &ref.AgentUID, &ref.SessionID, &ref.ActorEpoch, &ref.LeaseID)
	return ref, err
}

// StopActivation ends a live activation that has no current event
// (compare-and-set), or returns ErrNotLive.
func (s *Store) StopActivation(ctx context.Context, ref store.ActivationRef) error {
	return s.call(ctx, "stop activation", func(ctx context.Context) error {
		tag, err := s.pool.Exec(ctx, `
			UPDATE activations SET state = 'stopped', ended_at = clock_timestamp(), end_reason = 'stopped'
			WHERE activation_uid = $1 AND agent_uid = $2 AND session_id = $3 AND actor_epoch = $4
			  AND lease_id = $5 AND state IN `+liveStates+` AND current_event_id IS NULL`,
			ref.UID, ref.AgentUID, ref.SessionID, ref.ActorEpoch, ref.LeaseID)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("activation %s of %s at epoch %d: %w", ref.UID, ref.ActorKey, ref.ActorEpoch, store.ErrNotLive)
		}
		return nil
	})
}

// ExpiredActivations lists live activations whose lease expired by the
// database clock, longest expired first.
func (s *Store) ExpiredActivations(ctx context.Context, limit int) ([]store.ActivationRef, error) {
	var out []store.ActivationRef
	err := s.call(ctx, "expired activations", func(ctx context.Context) error {
		// Through activations_live (one entry per live activation): no
		// index covers the lease, so that its renewal is a HOT update
		// (migration 00012).
		rows, err := s.leases.Query(ctx, `
			SELECT activation_uid, agent_uid, session_id, actor_epoch, lease_id FROM activations
			WHERE state IN `+liveStates+` AND lease_expires_at <= clock_timestamp()
			ORDER BY lease_expires_at LIMIT $1`, store.PageLimit(limit))
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, scanRef)
		return err
	})
	return out, err
}

// ExpireActivation is the watchdog's write: compare-and-set on ref with the
// lease expired; see store.Store. The UPDATE takes the activation's row
// lock, so it serialises with a commit of the same activation: whichever
// comes second sees the other's outcome.
//
// It does not wait for that lock (SKIP LOCKED): an activation whose row a
// transaction holds is not expired now (ErrNotLive; the next watchdog scan
// looks again, once that transaction decided). The holder may be a host
// stalled inside a turn transaction — a GC pause, SIGSTOP, a partition that
// leaves its connection open — whose lease runs out meanwhile; waiting for
// it would stop every host's watchdog, which walks all expired activations
// in one loop, behind one session (found by cmd/paddock-chaos).
func (s *Store) ExpireActivation(ctx context.Context, p store.ExpireActivationParams) (store.FailResult, error) {
	ref := p.Ref
	var fr store.FailResult
	err := s.tx(ctx, "expire activation", func(ctx context.Context, tx pgx.Tx) error {
		fr = store.FailResult{}
		var current *int64
		err := tx.QueryRow(ctx, `
			UPDATE activations a SET state = 'failed', ended_at = clock_timestamp(), end_reason = 'lease expired',
				current_event_id = NULL
			FROM (SELECT activation_uid, current_event_id FROM activations
				WHERE activation_uid = $1 AND agent_uid = $2 AND session_id = $3 AND actor_epoch = $4
				  AND lease_id = $5 AND state IN `+liveStates+` AND lease_expires_at <= clock_timestamp()
				FOR UPDATE SKIP LOCKED) old
			WHERE a.activation_uid = old.activation_uid
			RETURNING old.current_event_id`,
			ref.UID, ref.AgentUID, ref.SessionID, ref.ActorEpoch, ref.LeaseID).Scan(&current)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("activation %s of %s at epoch %d: %w", ref.UID, ref.ActorKey, ref.ActorEpoch, store.ErrNotLive)
		}
		if err != nil {
			return err
		}
		if current == nil {
			return sessionStatus(ctx, tx, ref.ActorKey, &fr.SessionStatus)
		}
		fr.EventID = *current
		// The current event's delivery: sent means a worker had the turn.
		// The same statement reads what store.PlanFailure decides on (the
		// activation's row lock, taken above, serialises every failure of
		// the event).
		var state store.DeliveryState
		f := failure{key: ref.ActorKey, eventID: *current, epoch: ref.ActorEpoch, maxAttempts: p.MaxAttempts,
			reason: store.EndReasonLeaseExpired}
		err = tx.QueryRow(ctx, `
			WITH d AS (
				UPDATE deliveries
				SET state = CASE state WHEN 'sent' THEN 'superseded' ELSE 'send_failed' END,
				    closed_at = clock_timestamp(), error = 'lease expired'
				WHERE activation_uid = $1 AND agent_uid = $2 AND session_id = $3 AND event_id = $4
				  AND state IN ('created', 'sent')
				RETURNING state)
			SELECT d.state, `+failFactsCols+`
			FROM d, `+failFactsFrom(2, 3, 4),
			ref.UID, ref.AgentUID, ref.SessionID, *current).Scan(append([]any{&state}, f.factsDest()...)...)
		if errors.Is(err, pgx.ErrNoRows) {
			// No delivery in flight: nothing to count.
			return sessionStatus(ctx, tx, ref.ActorKey, &fr.SessionStatus)
		}
		if err != nil {
			return err
		}
		f.counted, f.backoff, f.msg = store.LeaseLost(state, p.Backoff)
		fr, err = failEvent(ctx, tx, f)
		return err
	})
	if err != nil {
		return store.FailResult{}, err
	}
	return fr, nil
}

// failure is one failed attempt of an event, for failEvent, with the rows
// store.PlanFailure decides on (read by failFactsCols under the failed
// activation's row lock).
type failure struct {
	key     store.ActorKey
	eventID int64
	// epoch is the failed attempt's actor epoch, for the error chain.
	epoch       int64
	counted     bool
	msg         string
	backoff     time.Duration
	maxAttempts int
	// reason is the frame's: store.EndReasonError or EndReasonLeaseExpired.
	reason string

	policy        store.CrashPolicy
	sessionStatus store.SessionStatus
	attempts      int
	eventStatus   store.EventStatus
}

// failFactsCols are the columns failure.factsDest scans, from failFactsFrom.
const failFactsCols = `s.crash_policy, s.status, coalesce(e.attempts, 0), coalesce(e.status, '')`

// failFactsFrom is the FROM tail (no WHERE before it) that failFactsCols
// read: the session ($agent, $session) and its event ($event), if any.
func failFactsFrom(agent, session, event int) string {
	return fmt.Sprintf(`sessions s LEFT JOIN actor_events e
		ON e.event_id = $%d AND e.agent_uid = s.agent_uid AND e.session_id = s.session_id
		WHERE s.agent_uid = $%d AND s.session_id = $%d`, event, agent, session)
}

// factsDest are the scan destinations of failFactsCols.
func (f *failure) factsDest() []any {
	return []any{&f.policy, &f.sessionStatus, &f.attempts, &f.eventStatus}
}

// failEvent writes what store.PlanFailure decides for a failed attempt on an
// open event: attempts, last_error, next_attempt_at = DB now + the plan's
// delay and the status (dead_letter closes it), compare-and-set on the
// attempts read; an event_errors row; then, in one more round trip when
// the plan asks for it, the steers detached and the session parked or
// destroyed. An event no longer open is left alone.
//
// The caller holds the failed activation's row lock, which serialises every
// failure of the event (only the live activation's fences pass), so the
// chain's next attempt_seq can be read in the same statement.
func failEvent(ctx context.Context, tx pgx.Tx, f failure) (store.FailResult, error) {
	fr := store.FailResult{EventID: f.eventID, SessionStatus: f.sessionStatus}
	if f.eventStatus != store.EventOpen {
		return fr, nil // closed meanwhile: nothing to retry
	}
	plan := store.PlanFailure(store.FailureInput{Policy: f.policy, Counted: f.counted, AttemptsBefore: f.attempts,
		MaxAttempts: f.maxAttempts, Backoff: f.backoff, SessionStatus: f.sessionStatus})
	err := tx.QueryRow(ctx, `
		WITH now AS (SELECT clock_timestamp() AS t),
		upd AS (
			UPDATE actor_events e
			SET attempts = $1, last_error = $2, next_attempt_at = now.t + $3 * interval '1 microsecond',
			    status = $4::text, closed_at = CASE WHEN $4::text = 'open' THEN e.closed_at ELSE now.t END
			FROM now
			WHERE `+byID("e.", "$5", "e.agent_uid = $6 AND e.session_id = $7 AND e.status = 'open'")+`
			  AND e.attempts = $9
			RETURNING e.attempts, e.next_attempt_at, now.t AS failed_at),
		chain AS (
			INSERT INTO event_errors (agent_uid, session_id, event_id, attempt_seq, attempt, actor_epoch, counted,
				error, failed_at)
			SELECT $6, $7, $5, coalesce((SELECT max(attempt_seq) FROM event_errors
				WHERE agent_uid = $6 AND session_id = $7 AND event_id = $5), 0) + 1,
				upd.attempts, $8, $10, $2, upd.failed_at
			FROM upd)
		SELECT upd.next_attempt_at FROM upd`,
		plan.Attempts, f.msg, micros(plan.Delay), string(plan.Status), f.eventID, f.key.AgentUID, f.key.SessionID,
		f.epoch, f.attempts, f.counted,
	).Scan(&fr.NextAttemptAt)
	if errors.Is(err, pgx.ErrNoRows) {
		// Read open with f.attempts under the row lock; anything else is
		// a writer that skipped the lock: run the transaction again.
		return fr, fmt.Errorf("event %d changed under the activation lock: %w", f.eventID, errLockRace)
	}
	if err != nil {
		return fr, err
	}
	fr.Attempts = plan.Attempts
	fr.DeadLettered = plan.Status == store.EventDeadLetter
	fr.NextAttemptAt = utc(fr.NextAttemptAt)
	b := &pgx.Batch{}
	if plan.DetachSteers {
		detachSteers(b, f.key, f.eventID)
	}
	queueSessionAction(b, f.key, plan.Session, &fr)
	// The frame store.AttemptEndedFrame names, last (the stream head's
	// lock is the transaction's last); the session's status it depends on
	// is the plan's.
	ended := fr
	if plan.Session == store.SessionDestroy {
		ended.SessionStatus = store.SessionDestroyed
	}
	kind, body := store.AttemptEndedFrame(f.reason, f.msg, ended)
	queueFrame(b, f.key, kind, f.eventID, f.epoch, f.attempts+1, store.MustBody(body))
	return fr, tx.SendBatch(ctx, b).Close()
}

// detachSteers queues the detaching of the steers attached to an event that
// left open for a terminal status other than done: they are handled later
// like queued messages.
func detachSteers(b *pgx.Batch, key store.ActorKey, eventID int64) {
	b.Queue(`UPDATE actor_events SET steer_of = NULL
		WHERE agent_uid = $1 AND session_id = $2 AND steer_of = $3 AND status = 'open'`,
		key.AgentUID, key.SessionID, eventID)
}

// queueSessionAction queues a failure plan's session action and records
// the session's resulting status in fr: sleep parks an active session
// (guarded by status = 'active'); destroy destroys it, discards its open
// events (a dead-lettered one stays dead_letter) and deletes its alarms.
// Lock order: alarms before the session row (as CommitTurn and
// FireDueAlarms).
func queueSessionAction(b *pgx.Batch, key store.ActorKey, action store.SessionAction, fr *store.FailResult) {
	scanStatus := func(row pgx.Row) error { return row.Scan(&fr.SessionStatus) }
	switch action {
	case store.SessionSleep:
		b.Queue(`
			UPDATE sessions SET status = 'sleeping', sleep_ts = clock_timestamp(), sleep_reason = $3,
				pending_since = NULL
			WHERE agent_uid = $1 AND session_id = $2 AND status = 'active'
			RETURNING status`, key.AgentUID, key.SessionID, store.SleepReasonCrash).QueryRow(ignoreNoRows(scanStatus))
	case store.SessionDestroy:
		b.Queue(`DELETE FROM alarms WHERE agent_uid = $1 AND session_id = $2`, key.AgentUID, key.SessionID)
		b.Queue(`
			UPDATE sessions SET status = 'destroyed', destroy_ts = clock_timestamp(), pending_since = NULL
			WHERE agent_uid = $1 AND session_id = $2 AND status <> 'destroyed'
			RETURNING status`, key.AgentUID, key.SessionID).QueryRow(ignoreNoRows(scanStatus))
		b.Queue(`UPDATE actor_events SET status = 'discarded', closed_at = clock_timestamp()
			WHERE agent_uid = $1 AND session_id = $2 AND status = 'open'`, key.AgentUID, key.SessionID)
		queueCancelWaits(b, key)
	}
}

// queueCancelWaits queues the cancellation of a destroyed session's open
// waits.
func queueCancelWaits(b *pgx.Batch, key store.ActorKey) {
	b.Queue(`UPDATE waits SET status = 'cancelled', closed_at = clock_timestamp()
		WHERE agent_uid = $1 AND session_id = $2 AND status = 'open'`, key.AgentUID, key.SessionID)
}

// sessionStatus reads the session's status into dst.
func sessionStatus(ctx context.Context, q querier, key store.ActorKey, dst *store.SessionStatus) error {
	err := q.QueryRow(ctx, `SELECT status FROM sessions WHERE agent_uid = $1 AND session_id = $2`,
		key.AgentUID, key.SessionID).Scan(dst)
	if err != nil {
		return fmt.Errorf("session %s: %w", key, notFound(err))
	}
	return nil
}

// ignoreNoRows makes a QueryRow callback accept no row (nothing changed).
func ignoreNoRows(fn func(pgx.Row) error) func(pgx.Row) error {
	return func(row pgx.Row) error {
		if err := fn(row); !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		return nil
	}
}

// runnableSessionsSQL is RunnableSessions' query. Parameters: $1 the
// limit, $2 the blocked agents, $3 the capacity sleep reasons, $4 the
// agents to skip.
//
// It walks the sessions that have open events, not the sessions: k is a
// loose index scan of actor_events_open, one probe per such session (the
// next key after the last one found), however many events wait behind
// each and however many sessions are idle. An idle session (awake, its
// activation stopped, nothing open) is most of a long-lived deployment's
// sessions, and every host runs this query each ScanInterval; driven by
// sessions, it had probed each awake session's oldest open event
// (TestRunnableSessionsCostNothingForIdleSessions: 20,000 rows read for
// three busy sessions). Each session found then costs its row, its oldest
// open event that is not a steer, and a look for a live activation.
const runnableSessionsSQL = `
	WITH RECURSIVE k AS (
		(SELECT agent_uid, session_id FROM actor_events WHERE status = 'open'
		 ORDER BY agent_uid, session_id LIMIT 1)
		UNION ALL
		SELECT n.agent_uid, n.session_id FROM k CROSS JOIN LATERAL (
			SELECT agent_uid, session_id FROM actor_events
			WHERE status = 'open' AND (agent_uid, session_id) > (k.agent_uid, k.session_id)
			ORDER BY agent_uid, session_id LIMIT 1) n)
	SELECT s.agent_uid, s.session_id
	FROM k
	JOIN sessions s ON s.agent_uid = k.agent_uid AND s.session_id = k.session_id
	CROSS JOIN LATERAL (SELECT event_id, seq, next_attempt_at FROM actor_events
		WHERE agent_uid = s.agent_uid AND session_id = s.session_id AND status = 'open' AND steer_of IS NULL
		ORDER BY seq LIMIT 1) o
	WHERE (s.status = 'active' OR (s.status = 'sleeping' AND s.sleep_reason = ANY($3::text[])))
	  AND o.next_attempt_at <= clock_timestamp()
	  AND NOT EXISTS (SELECT 1 FROM activations a
		WHERE a.agent_uid = s.agent_uid AND a.session_id = s.session_id AND a.state IN ` + liveStates + `)
	  AND NOT (s.agent_uid = ANY($2::text[]) AND EXISTS (SELECT 1 FROM actor_events d
		WHERE d.agent_uid = s.agent_uid AND d.session_id = s.session_id AND d.status = 'dead_letter'
		  AND d.seq < o.seq))
	  AND NOT s.agent_uid = ANY($4::text[])
	ORDER BY o.next_attempt_at, o.event_id
	LIMIT $1`

// RunnableSessions lists active sessions, and sessions asleep for lack of
// capacity (store.CapacitySleepReasons), whose oldest open event (steers
// attached to a turn do not count) is due (DB clock) and that have no live
// activation, oldest due first; a session of p.BlockedAgents whose
// candidate follows one of its dead letters is left out. It walks the
// open-events index session by session (runnableSessionsSQL), so idle
// sessions cost nothing.
func (s *Store) RunnableSessions(ctx context.Context, p store.RunnableSessionsParams) ([]store.ActorKey, error) {
	blocked := p.BlockedAgents
	if blocked == nil {
		blocked = []string{} // = ANY(NULL) would be NULL
	}
	skip := p.SkipAgents
	if skip == nil {
		skip = []string{}
	}
	var out []store.ActorKey
	err := s.call(ctx, "runnable sessions", func(ctx context.Context) error {
		rows, err := s.pool.Query(ctx, runnableSessionsSQL, store.PageLimit(p.Limit), blocked, store.CapacitySleepReasons(), skip)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.ActorKey, error) {
			var k store.ActorKey
			err := r.Scan(&k.AgentUID, &k.SessionID)
			return k, err
		})
		return err
	})
	return out, err
}
