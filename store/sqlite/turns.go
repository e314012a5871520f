package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

// activationLiveWhere guards a write on the activation named by an
// ActivationRef (parameters: uid, agent_uid, session_id, epoch, lease_id)
// being live, idle and unexpired by the database clock.
const activationLiveWhere = `activation_uid = ? AND agent_uid = ? AND session_id = ? AND actor_epoch = ? AND lease_id = ?
	AND state IN ` + liveStates + ` AND current_event_id IS NULL AND lease_expires_at > ` + nowMS

// NextDelivery takes the session's oldest open event if it is due and
// creates its delivery; see store.Store.
//
// With p.Defer (and p.Expect) the dispatch is first read on the reader
// pool, without the writer (nextDelivery with read set: the same choice,
// nothing written); it is deferred (Dispatch.Deferred) when
// store.Deferrable allows and the agent is what the caller expects — the
// caller asked for a deferred dispatch knowing what that runs, as
// PostgreSQL's read does. Otherwise it is taken as usual.
func (s *Store) NextDelivery(ctx context.Context, p store.NextDeliveryParams) (store.Dispatch, error) {
	if err := store.CheckNextDelivery(p); err != nil {
		return store.Dispatch{}, fmt.Errorf("store/sqlite: next delivery: %w", err)
	}
	var d store.Dispatch
	if p.Defer && p.Expect != nil {
		deferred := false
		var nd *store.NoDueEventError
		err := s.read(ctx, "next delivery", func(tx *txn) (err error) {
			d, deferred, err = deferredDispatch(tx, p)
			if errors.As(err, &nd) {
				return err
			}
			return nil // any other answer is the writer's to give
		})
		switch {
		case nd != nil:
			// Nothing due, as of a snapshot: safe to act on (an event
			// appended since wakes the caller, which asks again).
			return store.Dispatch{}, nd
		case err != nil:
			return store.Dispatch{}, err
		case deferred:
			return d, nil // marked Deferred by deferredDispatch
		}
	}
	err := s.write(ctx, "next delivery", func(tx *txn) (err error) {
		d, _, err = nextDelivery(tx, p)
		return err
	})
	return d, err
}

// deferredDispatch is the read of a deferred dispatch (p.Defer, p.Expect
// set) in tx: ok when store.Deferrable allows and the agent is what the
// caller expects; then d is marked Deferred. Nothing is written.
func deferredDispatch(tx *txn, p store.NextDeliveryParams) (d store.Dispatch, ok bool, err error) {
	d, recorded, err := nextDeliveryOf(tx, p, true)
	ok = err == nil && d.Agent == p.Expect.Agent && d.Delivery.Binding == p.Expect.Binding &&
		store.Deferrable(d.Event.Attempts, recorded, len(d.Steers))
	d.Deferred = ok
	return d, ok, err
}

// Promote writes a deferred dispatch under its checks; see store.Store.
// It is NextDelivery again, in a savepoint that is rolled back unless it
// took the same event at the same revision with the same binding, the
// agent unchanged.
func (s *Store) Promote(ctx context.Context, p store.PromoteParams) error {
	return s.write(ctx, "promote", func(tx *txn) error { return promote(tx, p) })
}

// promote is Promote's work in tx.
func promote(tx *txn, p store.PromoteParams) error {
	if _, err := tx.tx.ExecContext(tx.ctx, `SAVEPOINT promote`); err != nil {
		return err
	}
	want := p.Delivery
	// The event first: one closed or attempted since (a deferred commit
	// that did happen, whose answer was lost) is refused as superseded,
	// not taken for the next candidate under the same delivery id.
	var fresh bool
	if err := tx.queryRow(`SELECT status = 'open' AND attempts = 0 AND coalesce(binding, '') = '' FROM actor_events
		WHERE event_id = ? AND agent_uid = ? AND session_id = ?`, want.EventID, p.Activation.AgentUID, p.Activation.SessionID).Scan(&fresh); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return err
	}
	if !fresh {
		if _, err := tx.tx.ExecContext(tx.ctx, `RELEASE promote`); err != nil {
			return err
		}
		return classify(tx, want.TurnRef(), store.FencePromote)
	}
	d, _, err := nextDelivery(tx, store.NextDeliveryParams{Activation: p.Activation, DeliveryID: want.ID,
		Binding: want.Binding, BlockOnDeadLetter: p.BlockOnDeadLetter, MarkSent: true})
	same := err == nil && d.Event.ID == want.EventID && d.Delivery.Revision == want.Revision &&
		d.Delivery.ActorEpoch == want.ActorEpoch && d.Delivery.Binding == want.Binding && d.Agent == p.Agent &&
		d.Attempt == 1 && len(d.Steers) == 0
	if same {
		_, err = tx.tx.ExecContext(tx.ctx, `RELEASE promote`)
		return err
	}
	if errors.Is(err, store.ErrConflict) {
		return err
	}
	var nd *store.NoDueEventError
	if err != nil && !errors.Is(err, store.ErrNotLive) && !errors.As(err, &nd) {
		return err
	}
	if _, err := tx.tx.ExecContext(tx.ctx, `ROLLBACK TO promote`); err != nil {
		return err
	}
	if _, err := tx.tx.ExecContext(tx.ctx, `RELEASE promote`); err != nil {
		return err
	}
	return classify(tx, want.TurnRef(), store.FencePromote)
}

// nextDelivery is NextDelivery's transaction, in tx. recorded is the
// event's binding as stored before it.
func nextDelivery(tx *txn, p store.NextDeliveryParams) (d store.Dispatch, recorded string, err error) {
	return nextDeliveryOf(tx, p, false)
}

// nextDeliveryOf is nextDelivery; with read, it writes nothing (a
// deferred dispatch's read, in a read-only transaction): each write's
// guard is read instead and the delivery and its frame are left out.
func nextDeliveryOf(tx *txn, p store.NextDeliveryParams, read bool) (d store.Dispatch, recorded string, err error) {
	ref := p.Activation
	refArgs := []any{ref.UID, ref.AgentUID, ref.SessionID, ref.ActorEpoch, ref.LeaseID}
	err = func() error {
		// The activation, and what its agent runs now (for an event's first
		// attempt below).
		var ab store.AgentBinding
		err := tx.queryRow(`
			SELECT ag.namespace, ag.kind, coalesce(ag.module_digest, ''), coalesce(ag.plugin, ''), coalesce(pw.sha256, '')
			FROM activations a
			JOIN agents ag ON ag.agent_uid = a.agent_uid
			LEFT JOIN plugin_workers pw ON pw.namespace = ag.namespace AND pw.name = ag.plugin
			WHERE a.activation_uid = ? AND a.agent_uid = ? AND a.session_id = ? AND a.actor_epoch = ? AND a.lease_id = ?
			  AND a.state IN `+liveStates+` AND a.current_event_id IS NULL AND a.lease_expires_at > `+nowMS, refArgs...).Scan(
			&ab.Namespace, &ab.Kind, &ab.ModuleDigest, &ab.Plugin, &ab.PluginSHA256)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("activation %s of %s at epoch %d (or it has a current event, or its lease expired): %w",
				ref.UID, ref.ActorKey, ref.ActorEpoch, store.ErrNotLive)
		}
		if err != nil {
			return err
		}
		// Invariant 5: only the oldest open event may run; if it is not due,
		// nothing is. Steers attached to a turn are not candidates: they run
		// with their event.
		var eventID, seq, nextAt int64
		var due bool
		err = tx.queryRow(`
			SELECT event_id, seq, next_attempt_at, next_attempt_at <= `+nowMS+`, coalesce(binding, '') FROM actor_events
			WHERE agent_uid = ? AND session_id = ? AND status = 'open' AND steer_of IS NULL
			ORDER BY seq LIMIT 1`, ref.AgentUID, ref.SessionID).Scan(&eventID, &seq, &nextAt, &due, &recorded)
		if errors.Is(err, sql.ErrNoRows) {
			return &store.NoDueEventError{}
		}
		if err != nil {
			return err
		}
		if p.BlockOnDeadLetter {
			// Dead-letter policy "block": an older dead letter holds the
			// session until it is redriven or discarded.
			var blocked bool
			if err := tx.queryRow(`
				SELECT EXISTS (SELECT 1 FROM actor_events
				               WHERE agent_uid = ? AND session_id = ? AND status = 'dead_letter' AND seq < ?)`,
				ref.AgentUID, ref.SessionID, seq).Scan(&blocked); err != nil {
				return err
			}
			if blocked {
				return &store.NoDueEventError{}
			}
		}
		if !due {
			return &store.NoDueEventError{NextDueAt: msTime(nextAt)}
		}
		// Invariant 10: the binding is recorded at the first attempt only;
		// a first attempt takes what the agent runs now, so an update
		// reaches a live activation's next event.
		binding := ""
		if recorded == "" {
			if binding, err = p.Resolve(ab); err != nil {
				return err
			}
		}
		if read {
			d.Event, err = scanEvent(tx.queryRow(`
				SELECT `+eventReturning+` FROM actor_events
				WHERE event_id = ? AND status = 'open' AND next_attempt_at <= `+nowMS, eventID))
			if recorded == "" {
				d.Event.Binding = binding
			}
		} else {
			d.Event, err = scanEvent(tx.queryRow(`
				UPDATE actor_events SET binding = CASE WHEN coalesce(binding, '') = '' THEN nullif(?, '') ELSE binding END
				WHERE event_id = ? AND status = 'open' AND next_attempt_at <= `+nowMS+`
				RETURNING `+eventReturning, binding, eventID))
		}
		if errors.Is(err, sql.ErrNoRows) {
			return &store.NoDueEventError{NextDueAt: msTime(nextAt)}
		}
		if err != nil {
			return err
		}
		var epoch, revision int64
		if read {
			err = tx.queryRow(`SELECT actor_epoch, revision FROM activations WHERE `+activationLiveWhere,
				refArgs...).Scan(&epoch, &revision)
		} else {
			err = tx.queryRow(`
				UPDATE activations SET current_event_id = ?
				WHERE `+activationLiveWhere+`
				RETURNING actor_epoch, revision`, append([]any{eventID}, refArgs...)...).Scan(&epoch, &revision)
		}
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("activation %s: %w", ref.UID, store.ErrNotLive)
		}
		if err != nil {
			return err
		}
		state := store.DeliveryCreated
		if p.MarkSent {
			state = store.DeliverySent
		}
		d.Delivery = store.Delivery{
			ID: p.DeliveryID, ActorKey: ref.ActorKey, ActivationUID: ref.UID, ActorEpoch: epoch,
			EventID: eventID, Revision: revision, State: state, Binding: d.Event.Binding,
		}
		d.Attempt = d.Event.Attempts + 1
		d.Agent = ab
		if read {
			return readSessionOf(tx, p, &d)
		}
		if _, err := tx.exec(`
			INSERT INTO deliveries (delivery_id, agent_uid, session_id, activation_uid, actor_epoch, event_id,
				revision, state, binding, created_at, sent_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, `+nowMS+`, CASE WHEN ? THEN `+nowMS+` END)`,
			p.DeliveryID, ref.AgentUID, ref.SessionID, ref.UID, epoch, eventID, revision, state,
			d.Event.Binding, p.MarkSent); err != nil {
			if isConstraint(err) {
				return fmt.Errorf("delivery %s: %w", p.DeliveryID, store.ErrConflict)
			}
			return err
		}
		if _, err := appendFrame(tx, ref.ActorKey, store.FrameTurnStarted, eventID, epoch, d.Attempt,
			store.MustBody(store.TurnStartedBody{EventKind: d.Event.Kind})); err != nil {
			return err
		}
		return readSessionOf(tx, p, &d)
	}()
	return d, recorded, err
}

// readSessionOf reads a dispatch's session, state, tail and attached
// steers into d.
func readSessionOf(tx *txn, p store.NextDeliveryParams, d *store.Dispatch) (err error) {
	ref := p.Activation
	eventID := d.Event.ID
	if d.Session, err = scanSession(tx.queryRow(`SELECT `+sessionNoCounters+` FROM sessions s WHERE s.agent_uid = ? AND s.session_id = ?`,
		ref.AgentUID, ref.SessionID)); err != nil {
		return err
	}
	var notNull bool
	err = tx.queryRow(`SELECT state, state IS NOT NULL FROM session_state WHERE agent_uid = ? AND session_id = ?`,
		ref.AgentUID, ref.SessionID).Scan(&d.State, &notNull)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return err
	}
	d.State = store.StateFromColumn(d.State, notNull)
	if d.Tail, err = tail(tx, ref.ActorKey, p.TailMessages); err != nil {
		return err
	}
	d.Steers, err = attachedSteers(tx, ref.ActorKey, eventID)
	return err
}

// nextAfterCommit is CommitTurnParams.Next (and ClaimActivationParams.First):
// nextDelivery inside a savepoint of the commit's (the claim's)
// transaction, so that whatever it finds (nothing due, not live, an error
// of Bind) is undone alone and the commit stands. It
// returns nil when it took nothing; an error only when the savepoint
// itself failed.
func nextAfterCommit(tx *txn, p store.NextDeliveryParams) (*store.Dispatch, error) {
	if _, err := tx.tx.ExecContext(tx.ctx, `SAVEPOINT next_turn`); err != nil {
		return nil, err
	}
	d, _, err := nextDelivery(tx, p)
	if err != nil {
		if _, err := tx.tx.ExecContext(tx.ctx, `ROLLBACK TO next_turn`); err != nil {
			return nil, err
		}
	}
	if _, err := tx.tx.ExecContext(tx.ctx, `RELEASE next_turn`); err != nil {
		return nil, err
	}
	if err != nil {
		return nil, nil
	}
	return &d, nil
}

// attachedSteers returns the open steers attached to an event, by seq.
func attachedSteers(tx *txn, key store.ActorKey, eventID int64) ([]store.Event, error) {
	rows, err := tx.query(`
		SELECT `+eventCols+` FROM actor_events e
		WHERE e.agent_uid = ? AND e.session_id = ? AND e.steer_of = ? AND e.status = 'open'
		ORDER BY e.seq`, key.AgentUID, key.SessionID, eventID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []store.Event
	for rows.Next() {
		ev, err := scanEvent(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, ev)
	}
	return out, rows.Err()
}

// deliveryWhere guards a write on the delivery named by a turn_ref: every
// field of the ref by equality (parameters: see refArgs).
const deliveryWhere = `delivery_id = ? AND agent_uid = ? AND session_id = ? AND activation_uid = ?
	AND actor_epoch = ? AND event_id = ? AND revision = ?`

func deliveryArgs(r abi.TurnRef) []any {
	return []any{r.DeliveryID, r.AgentUID, r.SessionID, r.ActivationUID, r.ActorEpoch, r.ActorEventID, r.Revision}
}

// activationTurnWhere guards a write on the activation a turn_ref names:
// live, same key, epoch, revision and current event (parameters: see
// activationArgs). The lease is checked separately where it applies.
const activationTurnWhere = `activation_uid = ? AND agent_uid = ? AND session_id = ? AND actor_epoch = ?
	AND revision = ? AND current_event_id = ? AND state IN ` + liveStates

func activationArgs(r abi.TurnRef) []any {
	return []any{r.ActivationUID, r.AgentUID, r.SessionID, r.ActorEpoch, r.Revision, r.ActorEventID}
}

// MarkDeliverySent moves a delivery created → sent (invariant 9); a ref
// that does not match a created delivery returns *store.FenceError.
func (s *Store) MarkDeliverySent(ctx context.Context, ref abi.TurnRef) error {
	return s.write(ctx, "mark delivery sent", func(tx *txn) error {
		res, err := tx.exec(`
			UPDATE deliveries SET state = 'sent', sent_at = `+nowMS+`
			WHERE `+deliveryWhere+` AND state = 'created'`, deliveryArgs(ref)...)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n == 1 {
			return err
		}
		return classify(tx, ref, store.FenceMarkSent)
	})
}

// CommitTurn checks every fence by equality inside one transaction and
// appends the turn; see store.Store. A mismatch writes nothing and returns
// *store.FenceError (docs/DESIGN.md invariant 3).
func (s *Store) CommitTurn(ctx context.Context, p store.CommitTurnParams) (store.Turn, error) {
	ref := p.Ref
	key := store.KeyOf(ref)
	outcome := store.CommitOutcome(p)
	alarms, err := store.PlanAlarmOps(p.Alarms)
	if err != nil {
		return store.Turn{}, fmt.Errorf("store/sqlite: commit turn: %w", err)
	}
	if err := store.CheckCommitWait(p); err != nil {
		return store.Turn{}, fmt.Errorf("store/sqlite: commit turn: %w", err)
	}
	if err := store.CheckCommitNext(p); err != nil {
		return store.Turn{}, fmt.Errorf("store/sqlite: commit turn: %w", err)
	}
	if err := store.CheckCommitDeferred(p); err != nil {
		return store.Turn{}, fmt.Errorf("store/sqlite: commit turn: %w", err)
	}
	var t store.Turn
	err = s.write(ctx, "commit turn", func(tx *txn) error {
		if p.Deferred != nil {
			// A deferred turn: what Promote writes, then the commit.
			if err := promote(tx, *p.Deferred); err != nil {
				return err
			}
		}
		// BEGIN IMMEDIATE already holds the write lock: the activation row
		// cannot change under us (the watchdog serialises behind this).
		// The lease is renewed by p.LeaseTTL (0 leaves it: the guard says
		// it is still ahead of the clock).
		res, err := tx.exec(`
			UPDATE activations SET current_event_id = NULL, lease_expires_at = max(lease_expires_at, `+nowMS+` + ?)
			WHERE `+activationTurnWhere+` AND lease_expires_at > `+nowMS,
			append([]any{max(p.LeaseTTL, 0).Milliseconds()}, activationArgs(ref)...)...)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			return classify(tx, ref, store.FenceCommit)
		}
		res, err = tx.exec(`
			UPDATE deliveries SET state = 'accepted', closed_at = `+nowMS+`
			WHERE `+deliveryWhere+` AND state = 'sent'`, deliveryArgs(ref)...)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			return classify(tx, ref, store.FenceCommit)
		}
		// Invariant 4: the event closes once; turns.event_id is UNIQUE too.
		var payload string
		var closedAt int64
		var attempts int
		err = tx.queryRow(`
			UPDATE actor_events SET status = 'done', closed_at = `+nowMS+`
			WHERE event_id = ? AND agent_uid = ? AND session_id = ? AND status = 'open'
			RETURNING payload, closed_at, attempts`, ref.ActorEventID, ref.AgentUID, ref.SessionID).Scan(
			&payload, &closedAt, &attempts)
		if errors.Is(err, sql.ErrNoRows) {
			return &store.FenceError{Reason: store.FenceSupersededDelivery,
				Detail: fmt.Sprintf("event %d is no longer open", ref.ActorEventID)}
		}
		if err != nil {
			return err
		}
		// The steers attached to the turn close with it; their messages
		// follow the event's.
		steers, err := attachedSteers(tx, key, ref.ActorEventID)
		if err != nil {
			return err
		}
		if len(steers) > 0 {
			if _, err := tx.exec(`
				UPDATE actor_events SET status = 'done', closed_at = ?
				WHERE agent_uid = ? AND session_id = ? AND steer_of = ? AND status = 'open'`,
				closedAt, ref.AgentUID, ref.SessionID, ref.ActorEventID); err != nil {
				return err
			}
		}
		payloads := []string{payload}
		for _, st := range steers {
			payloads = append(payloads, string(st.Payload))
		}
		t = store.Turn{ActorKey: key, EventID: ref.ActorEventID, DeliveryID: ref.DeliveryID,
			ActorEpoch: ref.ActorEpoch, Outcome: outcome, CommittedAt: msTime(closedAt),
			Messages: store.TurnMessages(payloads, p.Messages)}
		// Turn.NextOpen, now that the event is closed: whether another
		// (not a steer) is open behind it.
		if err := tx.queryRow(`SELECT EXISTS (SELECT 1 FROM actor_events
			WHERE agent_uid = ? AND session_id = ? AND status = 'open' AND steer_of IS NULL)`,
			ref.AgentUID, ref.SessionID).Scan(&t.NextOpen); err != nil {
			return err
		}
		// The turn's usage: its event's journal, not set aside, as of now.
		if t.Usage, err = journalUsage(tx, key, ref.ActorEventID); err != nil {
			return err
		}
		if t.TurnNo, err = insertTurn(tx, t); err != nil {
			return err
		}
		if _, err := appendFrame(tx, key, store.FrameTurnCommitted, ref.ActorEventID, ref.ActorEpoch, attempts+1,
			store.MustBody(store.TurnCommittedBody{TurnNo: t.TurnNo, Outcome: outcome, Messages: t.Messages, Usage: t.Usage})); err != nil {
			return err
		}
		if p.Wait != nil {
			if err := openWait(tx, key, store.WaitKindWait, ref.ActorEventID, ref.ActorEpoch, attempts+1, p.Wait); err != nil {
				return err
			}
		}
		if err := applyAlarms(tx, key, alarms); err != nil {
			return err
		}
		if reason := store.OutcomeSleepReason(outcome); reason != "" {
			// The agent sleeps (or finished) until the next signal, unless
			// one is waiting: open events still run (invariant 11).
			if _, err := tx.exec(`
				UPDATE sessions SET status = 'sleeping', sleep_ts = `+nowMS+`, sleep_reason = ?3, pending_since = NULL
				WHERE agent_uid = ?1 AND session_id = ?2 AND status = 'active'
				  AND NOT EXISTS (SELECT 1 FROM actor_events
				                  WHERE agent_uid = ?1 AND session_id = ?2 AND status = 'open')`,
				ref.AgentUID, ref.SessionID, reason); err != nil {
				return err
			}
		}
		if !p.KeepState {
			if _, err := tx.exec(`
				INSERT INTO session_state (agent_uid, session_id, state, updated_at) VALUES (?, ?, ?, `+nowMS+`)
				ON CONFLICT (agent_uid, session_id) DO UPDATE SET state = excluded.state, updated_at = excluded.updated_at`,
				ref.AgentUID, ref.SessionID, nullBytes(store.StateColumn(p.State))); err != nil {
				return err
			}
		}
		if p.Next != nil {
			// The next turn, in this transaction (CommitTurnParams.Next).
			if t.Next, err = nextAfterCommit(tx, *p.Next); err != nil {
				return err
			}
		}
		return nil
	})
	return t, err
}

// insertTurn appends t (with its messages and Usage) as the session's next
// turn and returns its turn number.
func insertTurn(tx *txn, t store.Turn) (int64, error) {
	var turnNo int64
	if err := tx.queryRow(`
		UPDATE sessions SET turn_count = turn_count + 1 WHERE agent_uid = ? AND session_id = ?
		RETURNING turn_count`, t.AgentUID, t.SessionID).Scan(&turnNo); err != nil {
		return 0, err
	}
	if _, err := tx.exec(`
		INSERT INTO turns (agent_uid, session_id, turn_no, event_id, delivery_id, actor_epoch, outcome, committed_at,
			input_tokens, output_tokens)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		t.AgentUID, t.SessionID, turnNo, t.EventID, t.DeliveryID, t.ActorEpoch, t.Outcome,
		t.CommittedAt.UnixMilli(), t.Usage.InputTokens, t.Usage.OutputTokens); err != nil {
		return 0, err
	}
	for _, m := range t.Messages {
		if _, err := tx.exec(`
			INSERT INTO messages (agent_uid, session_id, turn_no, idx, role, content) VALUES (?, ?, ?, ?, ?, ?)`,
			t.AgentUID, t.SessionID, turnNo, m.Index, m.Role, m.Content); err != nil {
			return 0, err
		}
	}
	return turnNo, nil
}

// FailAttempt records a failed attempt under the same fences as a commit,
// the lease aside; see store.Store.
func (s *Store) FailAttempt(ctx context.Context, p store.FailAttemptParams) (store.FailResult, error) {
	ref := p.Ref
	if err := store.CheckHold(p); err != nil {
		return store.FailResult{}, fmt.Errorf("store/sqlite: fail attempt: %w", err)
	}
	var fr store.FailResult
	err := s.write(ctx, "fail attempt", func(tx *txn) error {
		res, err := tx.exec(`
			UPDATE activations SET state = 'failed', ended_at = `+nowMS+`, end_reason = ?, current_event_id = NULL
			WHERE `+activationTurnWhere, append([]any{p.Error}, activationArgs(ref)...)...)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			return classify(tx, ref, store.FenceFail)
		}
		// A delivery still created (never sent: no route, no capacity) may
		// be failed too; it can only be uncounted.
		newState := store.DeliverySendFailed
		if p.Counted {
			newState = store.DeliverySuperseded
		}
		res, err = tx.exec(`
			UPDATE deliveries SET state = ?, closed_at = `+nowMS+`, error = ?
			WHERE `+deliveryWhere+` AND state IN ('created', 'sent')`,
			append([]any{newState, p.Error}, deliveryArgs(ref)...)...)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			return classify(tx, ref, store.FenceFail)
		}
		if p.Hold != nil {
			fr, err = holdEvent(tx, ref, p.Hold)
			return err
		}
		fr, err = failEvent(tx, failure{key: store.KeyOf(ref), eventID: ref.ActorEventID, epoch: ref.ActorEpoch,
			counted: p.Counted, msg: p.Error, backoff: p.Backoff, maxAttempts: p.MaxAttempts,
			reason: store.EndReasonError})
		return err
	})
	return fr, err
}

// holdEvent ends an attempt, after FailAttempt's fences passed, as a wait
// of kind approval inside tx: the event stays open, held (next_attempt_at
// = store.HeldUntil) with its attempts unchanged, the wait is opened, the
// session sleeps (SleepReasonApproval), and the frames turn.retrying
// (reason approval) and wait.opened are appended.
func holdEvent(tx *txn, ref abi.TurnRef, hold *store.WaitParams) (store.FailResult, error) {
	key := store.KeyOf(ref)
	fr := store.FailResult{EventID: ref.ActorEventID}
	err := tx.queryRow(`
		UPDATE actor_events SET next_attempt_at = ?
		WHERE event_id = ? AND agent_uid = ? AND session_id = ? AND status = 'open'
		RETURNING attempts`, store.HeldUntil.UnixMilli(), ref.ActorEventID, ref.AgentUID, ref.SessionID).Scan(&fr.Attempts)
	if err != nil {
		return fr, err // no row is unreachable: the activation's current event is open
	}
	fr.NextAttemptAt = store.HeldUntil
	attempt := fr.Attempts + 1
	kind, body := store.HoldFrame()
	if _, err := appendFrame(tx, key, kind, ref.ActorEventID, ref.ActorEpoch, attempt, store.MustBody(body)); err != nil {
		return fr, err
	}
	if err := openWait(tx, key, store.WaitKindApproval, ref.ActorEventID, ref.ActorEpoch, attempt, hold); err != nil {
		return fr, err
	}
	if err := tx.queryRow(`
		UPDATE sessions SET status = CASE WHEN status = 'destroyed' THEN status ELSE 'sleeping' END,
			sleep_ts = CASE WHEN status = 'active' THEN `+nowMS+` ELSE sleep_ts END,
			sleep_reason = CASE WHEN status = 'destroyed' THEN sleep_reason ELSE ?3 END,
			pending_since = NULL
		WHERE agent_uid = ?1 AND session_id = ?2
		RETURNING status`, key.AgentUID, key.SessionID, store.SleepReasonApproval).Scan(&fr.SessionStatus); err != nil {
		return fr, err
	}
	return fr, nil
}

// classify reads, in the same transaction, the rows that explain why a
// guarded write matched no row, and lets store.ClassifyFence name the
// reason. It decides nothing: the guarded UPDATE already refused.
func classify(tx *txn, ref abi.TurnRef, op store.FenceOp) error {
	var rows store.FenceRows
	d := store.Delivery{ID: ref.DeliveryID}
	err := tx.queryRow(`
		SELECT agent_uid, session_id, activation_uid, actor_epoch, event_id, revision, state
		FROM deliveries WHERE delivery_id = ?`, ref.DeliveryID).Scan(
		&d.AgentUID, &d.SessionID, &d.ActivationUID, &d.ActorEpoch, &d.EventID, &d.Revision, &d.State)
	switch {
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		return err
	default:
		rows.Delivery = &d
	}
	if (rows.Delivery == nil && op != store.FencePromote) || op == store.FenceMarkSent {
		return store.ClassifyFence(ref, op, rows)
	}
	a := store.Activation{UID: ref.ActivationUID}
	var current sql.NullInt64
	err = tx.queryRow(`
		SELECT actor_epoch, revision, current_event_id, state, lease_expires_at <= `+nowMS+`
		FROM activations WHERE activation_uid = ?`, ref.ActivationUID).Scan(
		&a.ActorEpoch, &a.Revision, &current, &a.State, &rows.LeaseExpired)
	switch {
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		return err
	default:
		a.CurrentEventID = current.Int64
		rows.Activation = &a
	}
	return store.ClassifyFence(ref, op, rows)
}
