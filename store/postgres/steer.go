package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

// Steer persists a steer signal (kind abi.EventSteer) like AppendEvent and,
// with a turn in flight, attaches it to that turn; see store.Store.
//
// "In flight" is decided under the live activation's row lock (lockKey):
// the activation has a current event whose delivery at the activation's
// revision is sent. Then, compare-and-set on that revision, the revision is
// raised, that delivery superseded and a new sent one created with the new
// revision (p.DeliveryID), and the steer's steer_of names the current
// event. A reply echoing the older ref then fails the fences with
// stale_revision; CommitTurn and CancelEvent take the same row lock, so a
// steer is attached either before a commit (which then needs the new ref
// and closes the steer with the turn) or after it (and is queued).
func (s *Store) Steer(ctx context.Context, p store.SteerParams) (store.SteerResult, error) {
	key := p.Key
	payload, err := store.EventPayload(p.Payload)
	if err != nil {
		return store.SteerResult{}, fmt.Errorf("store/postgres: steer: %w", err)
	}
	var res store.SteerResult
	err = s.tx(ctx, "steer", func(ctx context.Context, tx pgx.Tx) error {
		res = store.SteerResult{}
		status, act, err := lockKey(ctx, tx, key, false)
		if err != nil {
			return err
		}
		if err := writable(key, status); err != nil {
			return err
		}
		// The turn in flight: the delivery the worker holds now.
		var sent *store.Delivery
		if act != nil && act.current != 0 {
			d := store.Delivery{ActorKey: key, ActivationUID: act.uid, EventID: act.current}
			err := tx.QueryRow(ctx, `
				SELECT delivery_id, actor_epoch, binding FROM deliveries
				WHERE activation_uid = $1 AND agent_uid = $2 AND session_id = $3 AND event_id = $4
				  AND revision = $5 AND state = 'sent'`,
				act.uid, key.AgentUID, key.SessionID, act.current, act.revision).Scan(&d.ID, &d.ActorEpoch, &d.Binding)
			switch {
			case err == nil:
				sent = &d
			case !errors.Is(err, pgx.ErrNoRows):
				return err
			}
		}
		ne := newEvent{kind: abi.EventSteer, payload: payload, idempotencyKey: p.IdempotencyKey, traceparent: p.Traceparent, origin: s.origin}
		if sent != nil {
			ne.steerOf = act.current
		}
		res.Event, res.Created, err = insertEvent(ctx, tx, key, ne)
		if err != nil {
			return err
		}
		if !res.Created {
			// A re-send: the first event, nothing written.
			res.Event, err = eventByIdempotencyKey(ctx, tx, key, p.IdempotencyKey)
			return err
		}
		if sent == nil {
			return nil
		}
		if p.DeliveryID == "" {
			return errors.New("a turn is in flight and no delivery id was given")
		}
		nd := store.Delivery{ID: p.DeliveryID, ActorKey: key, ActivationUID: act.uid, ActorEpoch: sent.ActorEpoch,
			EventID: act.current, State: store.DeliverySent, Binding: sent.Binding}
		b := &pgx.Batch{}
		b.Queue(`
			UPDATE activations SET revision = revision + 1
			WHERE activation_uid = $1 AND revision = $2 AND current_event_id = $3 AND state IN `+liveStates+`
			RETURNING revision`, act.uid, act.revision, act.current).QueryRow(func(row pgx.Row) error {
			err := row.Scan(&nd.Revision)
			if errors.Is(err, pgx.ErrNoRows) { // unreachable under the row lock
				return fmt.Errorf("activation %s changed: %w", act.uid, errLockRace)
			}
			return err
		})
		b.Queue(`
			UPDATE deliveries SET state = 'superseded', closed_at = clock_timestamp(), error = 'steered'
			WHERE delivery_id = $1 AND state = 'sent'`, sent.ID)
		b.Queue(`
			INSERT INTO deliveries (delivery_id, agent_uid, session_id, activation_uid, actor_epoch, event_id,
				revision, state, binding, sent_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7 + 1, 'sent', $8, clock_timestamp())`,
			nd.ID, key.AgentUID, key.SessionID, act.uid, nd.ActorEpoch, act.current, act.revision, nd.Binding)
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			if pgCode(err) == codeUniqueViolation {
				return fmt.Errorf("delivery %s: %w", p.DeliveryID, store.ErrConflict)
			}
			return err
		}
		res.InFlight, res.Ref = true, nd.TurnRef()
		return nil
	})
	if err != nil {
		return store.SteerResult{}, err
	}
	return res, nil
}

// CancelEvent cancels an event; see store.Store. Under the live
// activation's row lock and the session's (lockKey), then the event's:
//
//   - the event in flight (the live activation's current event; p.EventID 0
//     names it): cancelled (last_error = reason), its live deliveries
//     superseded, the activation's current event cleared and revision
//     raised (so the aborted worker's reply is fenced off), a transcript turn
//     with outcome cancelled recorded, its attached steers cancelled;
//   - another open event: cancelled with its attached steers;
//   - a closed event: ErrConflict.
//
// Listeners are notified, so that the owning host's controller notices.
func (s *Store) CancelEvent(ctx context.Context, p store.CancelEventParams) (store.CancelResult, error) {
	key := p.Key
	var res store.CancelResult
	err := s.tx(ctx, "cancel event", func(ctx context.Context, tx pgx.Tx) error {
		res = store.CancelResult{}
		_, act, err := lockKey(ctx, tx, key, false)
		if err != nil {
			return err
		}
		id := p.EventID
		if id == 0 {
			if act == nil || act.current == 0 {
				return fmt.Errorf("session %s has no turn in flight: %w", key, store.ErrNotFound)
			}
			id = act.current
		}
		var status store.EventStatus
		var payload string
		err = tx.QueryRow(ctx, `
			SELECT status, payload FROM actor_events WHERE event_id = $1 AND agent_uid = $2 AND session_id = $3
			FOR UPDATE`, id, key.AgentUID, key.SessionID).Scan(&status, &payload)
		if err != nil {
			return fmt.Errorf("event %d of %s: %w", id, key, notFound(err))
		}
		if status != store.EventOpen {
			return fmt.Errorf("event %d of %s is %s: %w", id, key, status, store.ErrConflict)
		}
		res.InFlight = act != nil && act.current == id
		b := &pgx.Batch{}
		b.Queue(`
			UPDATE actor_events SET status = 'cancelled', closed_at = clock_timestamp(), last_error = $2
			WHERE event_id = $1
			RETURNING `+eventCols, id, nullString(p.Reason)).QueryRow(func(row pgx.Row) (err error) {
			res.Event, err = scanEvent(row)
			return err
		})
		b.Queue(`
			UPDATE actor_events SET status = 'cancelled', closed_at = clock_timestamp(), last_error = $4
			WHERE agent_uid = $1 AND session_id = $2 AND steer_of = $3 AND status = 'open'`,
			key.AgentUID, key.SessionID, id, nullString(p.Reason))
		var deliveryID string
		if res.InFlight {
			b.Queue(`
				WITH sup AS (
					UPDATE deliveries SET state = 'superseded', closed_at = clock_timestamp(), error = 'cancelled'
					WHERE activation_uid = $1 AND agent_uid = $2 AND session_id = $3 AND event_id = $4
					  AND state IN ('created', 'sent')
					RETURNING delivery_id, revision)
				SELECT delivery_id FROM sup ORDER BY revision DESC LIMIT 1`,
				act.uid, key.AgentUID, key.SessionID, id).QueryRow(ignoreNoRows(func(row pgx.Row) error {
				return row.Scan(&deliveryID)
			}))
			b.Queue(`UPDATE activations SET current_event_id = NULL, revision = revision + 1 WHERE activation_uid = $1`,
				act.uid)
		}
		if !res.InFlight {
			// Queued: an approval it was held for is moot; a session asleep
			// for it wakes.
			b.Queue(`
				WITH c AS (
					UPDATE waits SET status = 'cancelled', closed_at = clock_timestamp()
					WHERE agent_uid = $1 AND session_id = $2 AND event_id = $3 AND kind = 'approval' AND status = 'open'
					RETURNING 1)
				UPDATE sessions SET status = 'active', sleep_ts = NULL, sleep_reason = NULL
				WHERE agent_uid = $1 AND session_id = $2 AND status = 'sleeping' AND sleep_reason = $4
				  AND EXISTS (SELECT 1 FROM c)`, key.AgentUID, key.SessionID, id, store.SleepReasonApproval)
		}
		queueNotify(b, key)
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		if !res.InFlight {
			return nil
		}
		// The transcript records the cancellation: the event's message,
		// then a system message with the reason; its usage is the event's
		// journal, as a commit's.
		var roles, contents []string
		if m, ok := store.PayloadMessage(payload); ok {
			roles, contents = append(roles, abi.RoleUser), append(contents, m)
		}
		note := "cancelled"
		if p.Reason != "" {
			note += ": " + p.Reason
		}
		roles, contents = append(roles, abi.RoleSystem), append(contents, note)
		// The turn and the turn.failed frame (last: the lock order), in
		// one round trip.
		b = &pgx.Batch{}
		b.Queue(`
			WITH turn AS (
				UPDATE sessions SET turn_count = turn_count + 1 WHERE agent_uid = $1 AND session_id = $2
				RETURNING turn_count),
			usage AS (`+journalUsageSQL+`),
			t AS (
				INSERT INTO turns (agent_uid, session_id, turn_no, event_id, delivery_id, actor_epoch, outcome,
					committed_at, input_tokens, output_tokens)
				SELECT $1, $2, turn.turn_count, $3, $4, $5, $6, clock_timestamp(), usage.input_tokens,
					usage.output_tokens
				FROM turn, usage
				RETURNING turn_no)
			INSERT INTO messages (agent_uid, session_id, turn_no, idx, role, content)
			SELECT $1, $2, t.turn_no, m.idx - 1, m.role, m.content
			FROM t, unnest($7::text[], $8::text[]) WITH ORDINALITY AS m(role, content, idx)`,
			key.AgentUID, key.SessionID, id, deliveryID, act.epoch, string(store.OutcomeCancelled), roles, contents)
		queueFrame(b, key, store.FrameTurnFailed, id, act.epoch, res.Event.Attempts+1,
			store.MustBody(store.AttemptEndedBody{Reason: store.EndReasonCancelled, Error: p.Reason}))
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return store.CancelResult{}, err
	}
	return res, nil
}

// InFlight returns, for a live activation with a current event, the newest
// delivery of that event under the activation, the event and its attached
// open steers, from one snapshot; otherwise ErrNotLive. Session, State and
// Tail are left empty.
func (s *Store) InFlight(ctx context.Context, ref store.ActivationRef) (store.Dispatch, error) {
	// Fast path: the three reads in one round trip, without a snapshot
	// transaction; when a commit slipped in between them (the event read is
	// not the delivery's), the snapshot path below decides.
	if d, ok, err := s.inFlightBatch(ctx, ref); ok || err != nil {
		return d, err
	}
	return s.inFlightSnapshot(ctx, ref)
}

// inFlightSQL reads the newest delivery of a live activation's current
// event (parameters: the activation ref).
const inFlightSQL = `
			SELECT d.delivery_id, d.actor_epoch, d.event_id, d.revision, d.state, d.binding
			FROM activations a
			JOIN LATERAL (SELECT * FROM deliveries
				WHERE activation_uid = a.activation_uid AND event_id = a.current_event_id
				ORDER BY revision DESC LIMIT 1) d ON true
			WHERE a.activation_uid = $1 AND a.agent_uid = $2 AND a.session_id = $3 AND a.actor_epoch = $4
			  AND a.lease_id = $5 AND a.state IN ` + liveStates + ` AND a.current_event_id IS NOT NULL`

func inFlightNotLive(ref store.ActivationRef) error {
	return fmt.Errorf("activation %s of %s at epoch %d (or it has no current event): %w",
		ref.UID, ref.ActorKey, ref.ActorEpoch, store.ErrNotLive)
}

func scanInFlight(row pgx.Row, d *store.Dispatch) error {
	return row.Scan(&d.Delivery.ID, &d.Delivery.ActorEpoch, &d.Delivery.EventID, &d.Delivery.Revision, &d.Delivery.State,
		&d.Delivery.Binding)
}

// inFlightBatch is InFlight in one batch; ok is false when its reads did
// not see the same current event.
func (s *Store) inFlightBatch(ctx context.Context, ref store.ActivationRef) (d store.Dispatch, ok bool, err error) {
	err = s.call(ctx, "in flight", func(ctx context.Context) error {
		d = store.Dispatch{Delivery: store.Delivery{ActorKey: ref.ActorKey, ActivationUID: ref.UID}}
		var found, eventFound bool
		b := &pgx.Batch{}
		b.Queue(inFlightSQL, ref.UID, ref.AgentUID, ref.SessionID, ref.ActorEpoch, ref.LeaseID).QueryRow(func(row pgx.Row) error {
			err := scanInFlight(row, &d)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			found = err == nil
			return err
		})
		cur := `(SELECT current_event_id FROM activations WHERE activation_uid = $1)`
		b.Queue(`SELECT `+eventCols+` FROM actor_events WHERE event_id = `+cur, ref.UID).QueryRow(func(row pgx.Row) (err error) {
			d.Event, err = scanEvent(row)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			eventFound = err == nil
			return err
		})
		b.Queue(`SELECT `+eventCols+` FROM actor_events
			WHERE agent_uid = $2 AND session_id = $3 AND steer_of = `+cur+` AND status = 'open'
			ORDER BY seq`, ref.UID, ref.AgentUID, ref.SessionID).Query(func(rows pgx.Rows) (err error) {
			d.Steers, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Event, error) { return scanEvent(r) })
			return err
		})
		if err := s.pool.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		switch {
		case !found:
			return inFlightNotLive(ref)
		case eventFound && d.Event.ID == d.Delivery.EventID:
			ok = true
			d.Attempt = d.Event.Attempts + 1
		}
		return nil
	})
	if err != nil {
		return store.Dispatch{}, false, err
	}
	return d, ok, nil
}

// inFlightSnapshot is InFlight in one read-only snapshot.
func (s *Store) inFlightSnapshot(ctx context.Context, ref store.ActivationRef) (store.Dispatch, error) {
	var d store.Dispatch
	err := s.readTx(ctx, "in flight", func(ctx context.Context, tx pgx.Tx) error {
		d = store.Dispatch{Delivery: store.Delivery{ActorKey: ref.ActorKey, ActivationUID: ref.UID}}
		err := scanInFlight(tx.QueryRow(ctx, inFlightSQL, ref.UID, ref.AgentUID, ref.SessionID, ref.ActorEpoch, ref.LeaseID), &d)
		if errors.Is(err, pgx.ErrNoRows) {
			return inFlightNotLive(ref)
		}
		if err != nil {
			return err
		}
		b := &pgx.Batch{}
		b.Queue(`SELECT `+eventCols+` FROM actor_events WHERE event_id = $1`, d.Delivery.EventID).QueryRow(
			func(row pgx.Row) (err error) {
				d.Event, err = scanEvent(row)
				return err
			})
		b.Queue(`SELECT `+eventCols+` FROM actor_events
			WHERE agent_uid = $1 AND session_id = $2 AND steer_of = $3 AND status = 'open'
			ORDER BY seq`, ref.AgentUID, ref.SessionID, d.Delivery.EventID).Query(func(rows pgx.Rows) (err error) {
			d.Steers, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Event, error) { return scanEvent(r) })
			return err
		})
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		d.Attempt = d.Event.Attempts + 1
		return nil
	})
	if err != nil {
		return store.Dispatch{}, err
	}
	return d, nil
}
