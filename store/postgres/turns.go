package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

// NextDelivery takes the session's oldest open event if it is due and
// creates its delivery; see store.Store.
func (s *Store) NextDelivery(ctx context.Context, p store.NextDeliveryParams) (store.Dispatch, error) {
	if err := store.CheckNextDelivery(p); err != nil {
		return store.Dispatch{}, fmt.Errorf("store/postgres: next delivery: %w", err)
	}
	ref := p.Activation
	if !p.ExpectDue {
		if nd, err := s.probeNoDue(ctx, p); err != nil || nd != nil {
			if err != nil {
				return store.Dispatch{}, err
			}
			return store.Dispatch{}, nd
		}
	}
	if p.Defer && p.Expect != nil {
		d, ok, err := s.deferredDispatch(ctx, p)
		if err != nil || ok {
			return d, err
		}
		// Not deferrable (a retry, a steered or bound event, a changed
		// agent) or nothing to take: decided below, as without Defer.
	}
	if p.Expect != nil {
		d, taken, err := s.claimDelivery(ctx, p)
		if err != nil || taken {
			return d, err
		}
		// Not taken: nothing due, not live, or the agent changed; the
		// locked path below says which (and binds anew).
	}
	var d store.Dispatch
	err := s.pipeTxDo(ctx, "next delivery", func(ctx context.Context, tx txConn) error {
		d = store.Dispatch{}
		// Lock the activation under its ref (live, idle, lease unexpired)
		// and, in the same statement, find the session's oldest open event.
		// Invariant 5: only that one may run; if it is not due, nothing is.
		// The candidate is the oldest open event not attached as a steer;
		// with the "block" dead-letter policy, a dead letter before it
		// blocks it. The row lock makes the candidate stable: everything
		// that closes or attaches events of a live session takes it first.
		var epoch, revision int64
		var eventID *int64
		var nextAt *time.Time
		var due, blocked, steered *bool
		var recorded *string
		var ab store.AgentBinding
		err := tx.QueryRow(ctx, nextDeliverySQL+` FOR UPDATE OF a`, ref.UID, ref.AgentUID, ref.SessionID, ref.ActorEpoch, ref.LeaseID,
			p.BlockOnDeadLetter).Scan(&epoch, &revision, &eventID, &nextAt, &due, &blocked, &steered,
			&recorded, &ab.Kind, &ab.ModuleDigest, &ab.Plugin, &ab.PluginSHA256, &ab.Namespace)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("activation %s of %s at epoch %d (or it has a current event, or its lease expired): %w",
				ref.UID, ref.ActorKey, ref.ActorEpoch, store.ErrNotLive)
		}
		if err != nil {
			return err
		}
		if eventID == nil || (blocked != nil && *blocked) {
			return &store.NoDueEventError{}
		}
		if !*due {
			return &store.NoDueEventError{NextDueAt: utc(*nextAt)}
		}
		// Invariant 10: the binding is recorded at the first attempt only;
		// a first attempt takes what the agent runs now (its row was read
		// just above), so an update reaches a live activation's next event.
		binding := ""
		if recorded == nil || *recorded == "" {
			if binding, err = p.Resolve(ab); err != nil {
				return err
			}
		}
		state := store.DeliveryCreated
		if p.MarkSent {
			state = store.DeliverySent
		}
		// The rest in one round trip, COMMIT included.
		b := &pgx.Batch{}
		// The binding is recorded at the first attempt (invariant 10); the
		// event's row comes back. A closed event matches no row: see the
		// guard of the next statement.
		b.Queue(`
			UPDATE actor_events SET binding = CASE WHEN coalesce(binding, '') = '' THEN nullif($1, '') ELSE binding END
			WHERE `+byID("", "$2", "status = 'open'")+`
			RETURNING `+eventCols, binding, *eventID).QueryRow(func(row pgx.Row) (err error) {
			d.Event, err = scanEvent(row)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil // the guard below refuses the transaction
			}
			return err
		})
		// The delivery, and the activation's current event, in one
		// statement. The lock statement's snapshot predates its wait for the
		// row lock: the event may have been closed (cancelled) meanwhile.
		// This later statement sees it and refuses the transaction before
		// its COMMIT (it runs again); under the lock nothing closes it after
		// (every closer takes the activation row first).
		b.Queue(`
			WITH cur AS (
				UPDATE activations SET current_event_id = $6 WHERE activation_uid = $4
				RETURNING 1)
			INSERT INTO deliveries (delivery_id, agent_uid, session_id, activation_uid, actor_epoch, event_id,
				revision, state, binding, sent_at)
			SELECT $1, $2, $3, $4, $5, $6, $7, $8::text, coalesce(e.binding, ''),
				CASE WHEN $8::text = 'sent' THEN clock_timestamp() END
			FROM actor_events e, cur
			WHERE e.event_id = $6
			  AND paddock_check(EXISTS (SELECT 1 FROM actor_events WHERE `+byID("", "$6", "status = 'open'")+`), $9)`,
			p.DeliveryID, ref.AgentUID, ref.SessionID, ref.UID, epoch, *eventID, revision, string(state),
			fmt.Sprintf("%sevent %d closed concurrently", checkLockRace, *eventID))
		// The turn.started frame, in this round trip (the stream head's
		// lock is this transaction's last).
		b.Queue(turnStartedSQL, ref.AgentUID, ref.SessionID, store.FrameTurnStarted, *eventID, epoch)
		queueSession(b, ref.ActorKey, "", &d)
		if steered != nil && *steered {
			// Steers attached to an earlier attempt come back with the
			// retry (read only when there are some: the common turn has
			// none).
			b.Queue(`SELECT `+eventCols+` FROM actor_events
				WHERE agent_uid = $1 AND session_id = $2 AND steer_of = $3 AND status = 'open'
				ORDER BY seq`, ref.AgentUID, ref.SessionID, *eventID).Query(func(rows pgx.Rows) (err error) {
				d.Steers, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Event, error) { return scanEvent(r) })
				return err
			})
		}
		if p.TailMessages > 0 {
			queueTail(b, ref.ActorKey, p.TailMessages, "", &d.Tail)
		}
		if err := tx.(*pipeTx).SendBatchCommit(ctx, b).Close(); err != nil {
			return dispatchErr(p.DeliveryID, err)
		}
		d.Delivery = store.Delivery{
			ID: p.DeliveryID, ActorKey: ref.ActorKey, ActivationUID: ref.UID, ActorEpoch: epoch,
			EventID: *eventID, Revision: revision, State: state, Binding: d.Event.Binding,
		}
		d.Attempt = d.Event.Attempts + 1
		d.Agent = ab
		return nil
	})
	if err != nil {
		return store.Dispatch{}, err
	}
	return d, nil
}

// queueSession queues the read of the session (without its counters)
// and its state into d. With claimedBy (an activation uid) the row is read
// only when that activation has a current event — the claim queued before
// it in the same transaction took one — and d is left as it is otherwise.
func queueSession(b *pgx.Batch, key store.ActorKey, claimedBy string, d *store.Dispatch) {
	b.Queue(`SELECT `+sessionNoCounters+`, st.state, st.state IS NOT NULL FROM sessions s
		LEFT JOIN session_state st ON st.agent_uid = s.agent_uid AND st.session_id = s.session_id
		WHERE s.agent_uid = $1 AND s.session_id = $2`+claimedByWhere,
		key.AgentUID, key.SessionID, claimedBy).QueryRow(func(row pgx.Row) (err error) {
		var notNull bool
		d.Session, err = scanSession(row, &d.State, &notNull)
		if errors.Is(err, pgx.ErrNoRows) && claimedBy != "" {
			return nil
		}
		d.State = store.StateFromColumn(d.State, notNull)
		return err
	})
}

// claimedByWhere is queueSession's and queueTail's condition on their $3:
// "" (none), or an activation uid that must have a current event.
const claimedByWhere = ` AND ($3::text = '' OR EXISTS (SELECT 1 FROM activations
		WHERE activation_uid = $3::text AND current_event_id IS NOT NULL))`

// dispatchErr maps a dispatch batch's error: a delivery id already used is
// ErrConflict, a paddock_check refusal its typed error (checkErr).
func dispatchErr(deliveryID string, err error) error {
	if pgCode(err) == codeUniqueViolation {
		return fmt.Errorf("delivery %s: %w", deliveryID, store.ErrConflict)
	}
	return checkErr(err)
}

// queueTail queues the read of the session's last n transcript messages,
// oldest first, into out; claimedBy as for queueSession.
func queueTail(b *pgx.Batch, key store.ActorKey, n int, claimedBy string, out *[]abi.Message) {
	b.Queue(`
		SELECT role, content FROM (
			SELECT turn_no, idx, role, content FROM messages
			WHERE agent_uid = $1 AND session_id = $2`+claimedByWhere+`
			ORDER BY turn_no DESC, idx DESC LIMIT $4) m
		ORDER BY turn_no, idx`, key.AgentUID, key.SessionID, claimedBy, n).Query(func(rows pgx.Rows) (err error) {
		*out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (abi.Message, error) {
			var m abi.Message
			err := r.Scan(&m.Role, &m.Content)
			return m, err
		})
		return err
	})
}

// claimDeliverySQL is a dispatch in one statement. It takes the session's
// oldest open event for a live, idle activation when it is due, not blocked
// by a dead letter ($6), has no steers attached (a retry with steers takes
// the locked path, which reads them) and is either bound already or the
// agent still is what the caller expects ($10-$14: kind, module digest,
// plugin, plugin sha256, namespace); sets the activation's current event
// (up), records the binding $9 at a first attempt (ev), inserts the
// delivery ($7, state $8) and appends the turn.started frame ($15) — in
// the lock order of every turn transaction: the activation, the event, the
// delivery, the stream head last. It returns no row when it took nothing.
// The activation's guards are on the UPDATE's own row, so that a wait for
// its lock re-checks them on the row as it is then; the candidate's
// snapshot may predate that wait, and an event closed meanwhile fails ev's
// re-check, which refuses the statement ($16, a lock race: it runs again).
// With $17 (an event id; 0: any) it takes only that event, at its first
// attempt with no binding recorded, and only at activation revision $18:
// the promotion of a deferred dispatch (Promote).
var claimDeliverySQL = `
	WITH c AS (
		SELECT e.event_id, ag.kind, coalesce(ag.module_digest, '') AS digest, coalesce(ag.plugin, '') AS plugin,
			coalesce(pw.sha256, '') AS sha, ag.namespace
		FROM activations a
		` + agentJoins + `
		JOIN LATERAL ` + oldestOpenEvent + `
		WHERE a.activation_uid = $1 AND a.agent_uid = $2 AND a.session_id = $3
		  AND e.next_attempt_at <= clock_timestamp()
		  AND NOT ($6::boolean AND ` + deadLetterBefore + `)
		  AND NOT ` + steersAttached + `
		  AND ($17::bigint = 0 OR (e.event_id = $17 AND coalesce(e.binding, '') = ''
			AND (SELECT attempts FROM actor_events WHERE event_id = $17) = 0))
		  AND (coalesce(e.binding, '') <> ''
			OR (ag.kind, coalesce(ag.module_digest, ''), coalesce(ag.plugin, ''), coalesce(pw.sha256, ''), ag.namespace)
				= ($10::text, $11::text, $12::text, $13::text, $14::text))),
	up AS (
		UPDATE activations a SET current_event_id = c.event_id FROM c
		WHERE a.activation_uid = $1 AND a.agent_uid = $2 AND a.session_id = $3 AND a.actor_epoch = $4
		  AND a.lease_id = $5 AND a.state IN ` + liveStates + ` AND a.current_event_id IS NULL
		  AND a.lease_expires_at > clock_timestamp() AND ($17::bigint = 0 OR a.revision = $18)
		RETURNING a.actor_epoch AS up_epoch, a.revision AS up_revision, c.event_id AS up_event,
			c.kind AS ag_kind, c.digest AS ag_digest, c.plugin AS ag_plugin, c.sha AS ag_sha, c.namespace AS ag_namespace),
	ev AS (
		UPDATE actor_events e SET binding = CASE WHEN coalesce(e.binding, '') = '' THEN nullif($9::text, '') ELSE e.binding END
		WHERE ` + byID("e.", "(SELECT up_event FROM up)", "e.status = 'open'") + `
		RETURNING e.*),
	del AS (
		INSERT INTO deliveries (delivery_id, agent_uid, session_id, activation_uid, actor_epoch, event_id,
			revision, state, binding, sent_at)
		SELECT $7, $2, $3, $1, up.up_epoch, ev.event_id, up.up_revision, $8::text, coalesce(ev.binding, ''),
			CASE WHEN $8::text = 'sent' THEN clock_timestamp() END
		FROM up, ev
		RETURNING 1),
	` + frameHeadCTE(`SELECT $2, $3, 1 FROM del`) + `,
	f AS (
		` + frameRowInsert(`$2, $3`, `$15::text`, `ev.event_id`, `up.up_epoch`, `ev.attempts + 1`,
	turnStartedBody(`ev.event_id`), `h, ev, up`) + `
		RETURNING 1)
	SELECT ` + eventCols + `, up.up_epoch, up.up_revision, up.ag_kind, up.ag_digest, up.ag_plugin, up.ag_sha,
		up.ag_namespace, paddock_check(ev.event_id IS NOT NULL, $16)
	FROM up LEFT JOIN ev ON true`

// claimDelivery is NextDelivery in one round trip (p.Expect set):
// queueClaim in an implicit transaction, shared with the claims of other
// sessions (the group commit) or its own. taken is false when
// the claim took nothing (the locked path then answers).
func (s *Store) claimDelivery(ctx context.Context, p store.NextDeliveryParams) (d store.Dispatch, taken bool, err error) {
	if s.groupCommit {
		// With the claims of other sessions that arrived meanwhile
		// (the group commit); a batch that rolled back sends each alone.
		if r := s.claims.do(ctx, p); !r.solo {
			return r.d, r.taken, wrap("next delivery", dispatchErr(p.DeliveryID, r.err))
		}
	}
	c, err := s.claimAlone(ctx, "next delivery", p.DeliveryID, func(b *pgx.Batch) *claim { return queueClaim(b, p, false) })
	if err != nil {
		return store.Dispatch{}, false, err
	}
	d, taken = c.dispatch()
	return d, taken, nil
}

// claimAlone runs one claim (queue queues it) as its own implicit
// transaction on the pipe, in one round trip: the solo path of a
// dispatch or a promotion. id is the delivery's, for dispatchErr.
func (s *Store) claimAlone(ctx context.Context, what, id string, queue func(b *pgx.Batch) *claim) (*claim, error) {
	var c *claim
	err := s.pipeTxDo(ctx, what, func(ctx context.Context, tx txConn) error {
		b := &pgx.Batch{}
		c = queue(b)
		if err := tx.(*pipeTx).SendBatchAlone(ctx, b).Close(); err != nil {
			return dispatchErr(id, err)
		}
		return nil
	})
	return c, err
}

// claim is a queued claimDeliverySQL's answer (queueClaim).
type claim struct {
	p               store.NextDeliveryParams
	state           store.DeliveryState
	d               store.Dispatch
	taken           bool
	epoch, revision int64
}

// queueClaim queues claimDeliverySQL for p (p.Expect set), then the reads
// of the session with its state and of the tail; with onlyIfTaken (after a
// commit or an activation's claim in the same transaction), those reads
// run only when the claim took an event.
func queueClaim(b *pgx.Batch, p store.NextDeliveryParams, onlyIfTaken bool) *claim {
	ref := p.Activation
	c := queueClaimOf(b, p, nil)
	claimedBy := ""
	if onlyIfTaken {
		claimedBy = ref.UID
	}
	queueSession(b, ref.ActorKey, claimedBy, &c.d)
	if p.TailMessages > 0 {
		queueTail(b, ref.ActorKey, p.TailMessages, claimedBy, &c.d.Tail)
	}
	return c
}

// queueClaimOf queues claimDeliverySQL alone for p (p.Expect set); with
// want, only that delivery's event at its revision (a promotion).
func queueClaimOf(b *pgx.Batch, p store.NextDeliveryParams, want *store.Delivery) *claim {
	ref, x := p.Activation, p.Expect
	c := &claim{p: p, state: store.DeliveryCreated}
	if p.MarkSent {
		c.state = store.DeliverySent
	}
	var wantEvent, wantRevision int64
	if want != nil {
		wantEvent, wantRevision = want.EventID, want.Revision
	}
	b.Queue(claimDeliverySQL, ref.UID, ref.AgentUID, ref.SessionID, ref.ActorEpoch, ref.LeaseID, p.BlockOnDeadLetter,
		p.DeliveryID, string(c.state), x.Binding,
		x.Agent.Kind, x.Agent.ModuleDigest, x.Agent.Plugin, x.Agent.PluginSHA256, x.Agent.Namespace,
		store.FrameTurnStarted, checkLockRace+"event closed concurrently", wantEvent, wantRevision,
	).QueryRow(func(row pgx.Row) error {
		var ok bool
		var err error
		c.d.Event, err = scanEvent(row, &c.epoch, &c.revision, &c.d.Agent.Kind, &c.d.Agent.ModuleDigest,
			&c.d.Agent.Plugin, &c.d.Agent.PluginSHA256, &c.d.Agent.Namespace, &ok)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		c.taken = err == nil
		return err
	})
	return c
}

// dispatch is the claim's Dispatch once its batch ran; taken is false when
// it took nothing.
func (c *claim) dispatch() (d store.Dispatch, taken bool) {
	if !c.taken {
		return store.Dispatch{}, false
	}
	ref := c.p.Activation
	d = c.d
	d.Delivery = store.Delivery{
		ID: c.p.DeliveryID, ActorKey: ref.ActorKey, ActivationUID: ref.UID, ActorEpoch: c.epoch,
		EventID: d.Event.ID, Revision: c.revision, State: c.state, Binding: d.Event.Binding,
	}
	d.Attempt = d.Event.Attempts + 1
	return d, true
}

// The pieces of a dispatch's candidate, shared by nextDeliverySQL (the
// locked path) and claimDeliverySQL (one statement), over the activation
// a: the agent ag and its plugin worker pw; e, the session's oldest open
// event that is not a steer (LATERAL, the open-events index's first
// entries); whether a dead letter before e blocks it; whether steers are
// attached to e.
const (
	agentJoins = `JOIN agents ag ON ag.agent_uid = a.agent_uid
		LEFT JOIN plugin_workers pw ON pw.namespace = ag.namespace AND pw.name = ag.plugin`
	oldestOpenEvent = `(SELECT event_id, seq, next_attempt_at, binding FROM actor_events
			WHERE agent_uid = a.agent_uid AND session_id = a.session_id AND status = 'open' AND steer_of IS NULL
			ORDER BY seq LIMIT 1) e ON true`
	deadLetterBefore = `EXISTS (SELECT 1 FROM actor_events d
			WHERE d.agent_uid = a.agent_uid AND d.session_id = a.session_id AND d.status = 'dead_letter'
			  AND d.seq < e.seq)`
	steersAttached = `EXISTS (SELECT 1 FROM actor_events st
			WHERE st.agent_uid = a.agent_uid AND st.session_id = a.session_id AND st.steer_of = e.event_id
			  AND (st.status = 'open') IS TRUE)` // see byID
)

// byID is the WHERE condition of a statement that names one event by its
// primary key: "<alias>event_id = <id> AND (<rest>) IS TRUE", where rest
// is what else the row must satisfy (its session, status = 'open'). Inside
// IS TRUE, rest can neither prove a partial index's predicate nor serve
// as an index condition, so the planner has one index to choose: the
// primary key. With rest as plain conditions, statistics taken before a
// burst (a sleeping session woken by thousands of queued signals, analyzed
// before they came) make every index on (agent_uid, session_id, …) look as
// cheap as the primary key, and the planner took one: the statement then
// read every open event of the session instead of one row
// (TestTurnStatementsStayIndexBoundedUnderABurst: 3,000 rows read for a
// commit's close). id must be a parameter or a scalar subquery, never a
// join's column: "e.event_id = up.up_event" (the dispatch's event, from a
// CTE) was planned as a sequential scan of actor_events once the open
// index was out of reach, and the dispatch's statement went from 0.25 to
// 1.8 ms; "(SELECT up_event FROM up)" is an index condition on the
// primary key. Constants spell the same form out, marked "byID".
func byID(alias, id, rest string) string {
	return alias + "event_id = " + id + " AND (" + rest + ") IS TRUE"
}

// nextDeliverySQL reads a live activation (by its ref: parameters $1-$5)
// and its session's oldest open event that is not a steer: the event's id,
// next attempt time, whether it is due by the database clock, whether a
// dead letter blocks it ($6: the block policy) and whether steers are
// attached to it; then the event's recorded binding and what the agent
// runs now (store.AgentBinding's fields).
const nextDeliverySQL = `
			SELECT a.actor_epoch, a.revision, e.event_id, e.next_attempt_at, e.next_attempt_at <= clock_timestamp(),
				$6::boolean AND ` + deadLetterBefore + `,
				` + steersAttached + `,
				e.binding, ag.kind, coalesce(ag.module_digest, ''), coalesce(ag.plugin, ''), coalesce(pw.sha256, ''), ag.namespace
			FROM activations a
			` + agentJoins + `
			LEFT JOIN LATERAL ` + oldestOpenEvent + `
			WHERE a.activation_uid = $1 AND a.agent_uid = $2 AND a.session_id = $3 AND a.actor_epoch = $4
			  AND a.lease_id = $5 AND a.state IN ` + liveStates + ` AND a.current_event_id IS NULL
			  AND a.lease_expires_at > clock_timestamp()`

// probeNoDue answers NextDelivery's most common question — a live
// activation whose session has nothing due — with one read outside a
// transaction (one round trip instead of BEGIN, the locking read and
// ROLLBACK). It returns the *store.NoDueEventError, or nil when the locked
// path must decide (something is due, or the activation is not live). A
// snapshot that says "nothing due" is safe to act on: an event appended
// after it wakes the controller, which asks again.
func (s *Store) probeNoDue(ctx context.Context, p store.NextDeliveryParams) (*store.NoDueEventError, error) {
	ref := p.Activation
	var nd *store.NoDueEventError
	err := s.call(ctx, "next delivery", func(ctx context.Context) error {
		var epoch, revision int64
		var eventID *int64
		var nextAt *time.Time
		var due, blocked, steered *bool
		var recorded *string
		var ab store.AgentBinding
		err := s.pool.QueryRow(ctx, nextDeliverySQL, ref.UID, ref.AgentUID, ref.SessionID, ref.ActorEpoch, ref.LeaseID,
			p.BlockOnDeadLetter).Scan(&epoch, &revision, &eventID, &nextAt, &due, &blocked, &steered,
			&recorded, &ab.Kind, &ab.ModuleDigest, &ab.Plugin, &ab.PluginSHA256, &ab.Namespace)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return nil
		case err != nil:
			return err
		case eventID == nil || (blocked != nil && *blocked):
			nd = &store.NoDueEventError{}
		case !*due:
			nd = &store.NoDueEventError{NextDueAt: utc(*nextAt)}
		}
		return nil
	})
	return nd, err
}

// deliveryWhere guards a write on the delivery a turn_ref names: every field
// of the ref by equality (parameters $1-$7, see refArgs).
const deliveryWhere = `delivery_id = $1 AND agent_uid = $2 AND session_id = $3 AND activation_uid = $4
	AND actor_epoch = $5 AND event_id = $6 AND revision = $7`

// refArgs are the parameters of deliveryWhere, then extra ones from $8.
func refArgs(r abi.TurnRef, extra ...any) []any {
	return append([]any{r.DeliveryID, r.AgentUID, r.SessionID, r.ActivationUID, r.ActorEpoch, r.ActorEventID,
		r.Revision}, extra...)
}

// activationWhere guards a write on the activation a turn_ref names: same
// key, epoch, revision and current event, and live (parameters: refArgs).
// The lease is checked separately where it applies.
const activationWhere = `activation_uid = $4 AND agent_uid = $2 AND session_id = $3 AND actor_epoch = $5
	AND revision = $7 AND current_event_id = $6 AND state IN ` + liveStates

// The fence statements run both guarded UPDATEs of a turn_ref in one
// statement: the delivery's, then the activation's, the latter only when the
// former matched (EXISTS (SELECT 1 FROM d)), so that a refused delivery
// leaves both rows untouched for classify. They return whether each matched.
// Parameters: refArgs.
const (
	fenceHead = `
		WITH d AS (
			UPDATE deliveries SET `
	fenceMid = `
			RETURNING 1),
		a AS (
			UPDATE activations SET `
	fenceTail = ` AND EXISTS (SELECT 1 FROM d)
			RETURNING 1)
		SELECT EXISTS (SELECT 1 FROM d), EXISTS (SELECT 1 FROM a)`

	// failFence: the delivery (created or sent) superseded or send_failed
	// ($8) with the error ($9); the activation failed. No lease check.
	failFence = fenceHead + `state = $8, closed_at = clock_timestamp(), error = $9
			WHERE ` + deliveryWhere + ` AND state IN ('created', 'sent')` + fenceMid + `state = 'failed',
				ended_at = clock_timestamp(), end_reason = $9, current_event_id = NULL
			WHERE ` + activationWhere + fenceTail
)

// commitFenceRaising is CommitTurn's fence: the delivery sent → accepted;
// the activation's current event cleared, its lease unexpired by the
// database clock. Unlike failFence it raises instead of answering: a guard
// that matched no row refuses the transaction inside the database
// (paddock_check, parameters $8 and $9: fenceRefusedDelivery and
// fenceRefusedActivation), so that the writes after it can ride in the same
// round trip. It renews the lease by $10 µs (CommitTurnParams.LeaseTTL; 0
// leaves it: the guard says it is still ahead of the clock). checkErr turns the refusal into a *fenceRefusal, and
// explainRefusal classifies it after the rollback.
//
// commitFenceLocking is the same fence taking the activation's row lock
// itself, first (the lock order of every turn transaction: the activation,
// then its delivery): the delivery's guard reads the locking CTE, whose
// uncorrelated EXISTS runs before the UPDATE locks the delivery row. It
// saves the lock's own statement when nothing else must be read under the
// lock before the fence.
var commitFenceRaising, commitFenceLocking = commitFenceSQL(false), commitFenceSQL(true)

func commitFenceSQL(lock bool) string {
	head, locked := fenceHead, ""
	if lock {
		head = `
		WITH l AS (SELECT 1 FROM activations WHERE activation_uid = $4 FOR UPDATE),
		d AS (
			UPDATE deliveries SET `
		locked = ` AND EXISTS (SELECT 1 FROM l)`
	}
	return head + `state = 'accepted', closed_at = clock_timestamp()
			WHERE ` + deliveryWhere + ` AND state = 'sent'` + locked + fenceMid + `current_event_id = NULL,
				lease_expires_at = greatest(lease_expires_at, clock_timestamp() + $10 * interval '1 microsecond')
			WHERE ` + activationWhere + ` AND lease_expires_at > clock_timestamp()` + ` AND EXISTS (SELECT 1 FROM d)
			RETURNING 1)
		SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM d) THEN paddock_check(false, $8)
			WHEN NOT EXISTS (SELECT 1 FROM a) THEN paddock_check(false, $9) ELSE true END`
}

// fence sends the batch lock (which locks the activation row) with the
// fence statement queued after it, so that the lock is taken first and both
// cost one round trip, and classifies a refusal.
func fence(ctx context.Context, tx txConn, ref abi.TurnRef, op store.FenceOp, lock *pgx.Batch, fenceStmt string, args []any) error {
	var dOK, aOK bool
	lock.Queue(fenceStmt, args...).QueryRow(func(row pgx.Row) error { return row.Scan(&dOK, &aOK) })
	if err := tx.SendBatch(ctx, lock).Close(); err != nil {
		return err
	}
	switch {
	case !dOK:
		return classify(ctx, tx, ref, op, false)
	case !aOK:
		return classify(ctx, tx, ref, op, true)
	}
	return nil
}

// MarkDeliverySent moves a delivery created → sent (invariant 9); a ref
// that does not match a created delivery returns *store.FenceError.
//
// It is one statement, outside a transaction; on a refusal the reads that
// explain it follow (nothing was written).
func (s *Store) MarkDeliverySent(ctx context.Context, ref abi.TurnRef) error {
	return s.call(ctx, "mark delivery sent", func(ctx context.Context) error {
		tag, err := s.pool.Exec(ctx, `
			UPDATE deliveries SET state = 'sent', sent_at = clock_timestamp()
			WHERE `+deliveryWhere+` AND state = 'created'`, refArgs(ref)...)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 1 {
			return nil
		}
		return classify(ctx, s.pool, ref, store.FenceMarkSent, false)
	})
}

// CommitTurn checks every fence by equality inside one transaction and
// appends the turn; see store.Store. A mismatch writes nothing and returns
// *store.FenceError (docs/DESIGN.md invariant 3).
//
// Order: lock the activation row (FOR UPDATE, so that the watchdog and this
// commit serialise), then the guarded UPDATE of the delivery, then the
// guarded UPDATE of the activation with the lease against
// clock_timestamp(). Either matching no row raises inside the database
// (commitFenceRaising) and the transaction rolls back; the delivery goes
// first so that a failed guard is explained from rows the transaction did
// not write (the delivery's guard covers every delivery check of classify;
// when the activation's fails, classify is told the delivery matched),
// read after the rollback.
//
// With p.Payloads (the caller dispatched the turn and knows what it
// carried) the whole commit is one round trip, COMMIT included; without,
// the lock's statement reads the event's and its steers' payloads and the
// writes follow in a second round trip. A wait adds one more either way.
//
// With p.Next (and its Expect, and no Wait) the next turn's claim
// (claimDeliverySQL, then the session's and the tail's reads, which run
// only when it took an event) rides in the commit's last round trip and
// transaction. Should the claim refuse that transaction (a lock race, a
// delivery id in use), the commit runs again alone: the dispatch never
// undoes the commit.
func (s *Store) CommitTurn(ctx context.Context, p store.CommitTurnParams) (store.Turn, error) {
	alarms, err := store.PlanAlarmOps(p.Alarms)
	if err != nil {
		return store.Turn{}, fmt.Errorf("store/postgres: commit turn: %w", err)
	}
	if err := store.CheckCommitWait(p); err != nil {
		return store.Turn{}, fmt.Errorf("store/postgres: commit turn: %w", err)
	}
	if err := store.CheckCommitNext(p); err != nil {
		return store.Turn{}, fmt.Errorf("store/postgres: commit turn: %w", err)
	}
	if err := store.CheckCommitDeferred(p); err != nil {
		return store.Turn{}, fmt.Errorf("store/postgres: commit turn: %w", err)
	}
	next := p.Next
	if next != nil && (next.Expect == nil || p.Wait != nil) {
		next = nil
	}
	if s.groupCommit && p.Payloads != nil && p.Wait == nil {
		// With the commits of other sessions that arrived meanwhile
		// (the group commit); a batch that rolled back sends each alone.
		if r := s.commits.do(ctx, commitIn{p: p, alarms: alarms, next: next}); !r.solo {
			if r.err != nil {
				return store.Turn{}, wrap("commit turn", r.err)
			}
			return r.t, nil
		}
	}
	t, err := s.commitTurn(ctx, p, alarms, next)
	var fe *store.FenceError
	if err != nil && next != nil && !errors.As(err, &fe) && !connectionEnded(err) && ctx.Err() == nil {
		t, err = s.commitTurn(ctx, p, alarms, nil)
	}
	if p.Deferred != nil && errors.As(err, &fe) {
		// Refused before anything was written: explain it as a promotion.
		return store.Turn{}, s.explainPromote(ctx, *p.Deferred)
	}
	return t, err
}

// commitTurn is CommitTurn, with the claim of next in its transaction
// when next is set (CommitTurn leaves it nil with a wait).
func (s *Store) commitTurn(ctx context.Context, p store.CommitTurnParams, alarms store.AlarmWrites, next *store.NextDeliveryParams) (store.Turn, error) {
	ref := p.Ref
	var q *queuedCommit
	err := s.pipeTxDo(ctx, "commit turn", func(ctx context.Context, tx txConn) error {
		b := &pgx.Batch{}
		if deferredInOne(p, alarms) {
			q = queueDeferredCommit(b, p, next)
			if err := tx.(*pipeTx).SendBatchAlone(ctx, b).Close(); err != nil {
				return checkErr(err)
			}
			return nil
		}
		if p.Deferred != nil {
			// A deferred turn: its promotion first, in this transaction.
			queueClaimOf(b, promoteClaim(*p.Deferred), &p.Deferred.Delivery)
		}
		payloads := p.Payloads
		if payloads == nil {
			// Lock the activation row and read the event's payload and its
			// attached steers' in the same statement. Steer attaches under
			// this row lock and raises the revision, so once the fence has
			// passed no steer was attached after this statement's snapshot.
			var payload *string
			var steers []string
			b.Queue(`
				SELECT e.payload, (SELECT array_agg(st.payload ORDER BY st.seq) FROM actor_events st
					WHERE st.agent_uid = a.agent_uid AND st.session_id = a.session_id AND st.steer_of = $2
					  AND st.status = 'open')
				FROM activations a
				LEFT JOIN actor_events e ON e.event_id = $2 AND e.agent_uid = a.agent_uid AND e.session_id = a.session_id
				WHERE a.activation_uid = $1
				FOR UPDATE OF a`, ref.ActivationUID, ref.ActorEventID).QueryRow(func(row pgx.Row) error {
				err := row.Scan(&payload, &steers)
				if errors.Is(err, pgx.ErrNoRows) {
					return nil // no such activation: the fence refuses
				}
				return err
			})
			b.Queue(commitFenceRaising, refArgs(ref, fenceRefusedDelivery, fenceRefusedActivation, micros(p.LeaseTTL))...)
			if err := tx.SendBatch(ctx, b).Close(); err != nil {
				return checkErr(err)
			}
			if payload == nil { // unreachable: the delivery's event exists (foreign key)
				return fmt.Errorf("event %d of %s not found", ref.ActorEventID, store.KeyOf(ref))
			}
			payloads = append([]string{*payload}, steers...)
			b = &pgx.Batch{}
		}
		q = queueCommit(b, p, payloads, p.Payloads != nil, alarms, next)
		if p.Wait == nil {
			// COMMIT rides with the writes (with the payloads given, the
			// batch is the whole transaction: an implicit one). The guards
			// above refuse inside the database (paddock_check), before it.
			if err := tx.(*pipeTx).SendBatchAlone(ctx, b).Close(); err != nil {
				return checkErr(err)
			}
			return nil
		}
		// A wait: its insert may refuse (an id the session used), and its
		// frame's body is the row; one round trip more.
		var w store.Wait
		queueInsertWait(b, store.KeyOf(ref), store.WaitKindWait, ref.ActorEventID, p.Wait, &w)
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return checkErr(err)
		}
		b = &pgx.Batch{}
		b.Queue(turnEndedSQL, ref.AgentUID, ref.SessionID, store.FrameWaitOpened, ref.ActorEventID, ref.ActorEpoch,
			string(store.MustBody(w)))
		if err := tx.(*pipeTx).SendBatchCommit(ctx, b).Close(); err != nil {
			return checkErr(err)
		}
		return nil
	})
	if err != nil {
		return store.Turn{}, s.explainRefusal(ctx, ref, store.FenceCommit, err)
	}
	return q.turn(), nil
}

// queuedCommit is a commit queued in a batch (queueCommit); turn is its
// answer once the batch committed.
type queuedCommit struct {
	t store.Turn
	c *claim
}

// turnOf is the answer of ref's commit with outcome before its row is
// read: the turn's key, event, delivery and epoch.
func turnOf(ref abi.TurnRef, outcome abi.Outcome) store.Turn {
	return store.Turn{ActorKey: store.KeyOf(ref), EventID: ref.ActorEventID, DeliveryID: ref.DeliveryID,
		ActorEpoch: ref.ActorEpoch, Outcome: outcome}
}

// queueCommit queues the statements of p's commit after its fence's lock
// (with fence, the commit's fence itself first: commitFenceLocking):
// attached steers closed, the alarms, the writes (commitWritesSQL), a
// sleep, and the claim of next (with its reads) when set. payloads are the
// turn's (p.Payloads, or those the lock's statement read).
func queueCommit(b *pgx.Batch, p store.CommitTurnParams, payloads []string, fence bool, alarms store.AlarmWrites,
	next *store.NextDeliveryParams) *queuedCommit {
	ref := p.Ref
	outcome := store.CommitOutcome(p)
	q := &queuedCommit{t: turnOf(ref, outcome)}
	t := &q.t
	if fence {
		// The caller's payloads are those of the ref's revision: a steer
		// attached since raised it, and the fence refuses.
		b.Queue(commitFenceLocking, refArgs(ref, fenceRefusedDelivery, fenceRefusedActivation, micros(p.LeaseTTL))...)
	}
	t.Messages = store.TurnMessages(payloads, p.Messages)
	n := len(t.Messages)
	idx, roles, contents := make([]int32, n), make([]string, n), make([]string, n)
	for i, m := range t.Messages {
		idx[i], roles[i], contents[i] = int32(m.Index), m.Role, m.Content
	}
	if steers := len(payloads) - 1; steers > 0 {
		// The steers close with the event they were attached to.
		b.Queue(`
			WITH closed AS (
				UPDATE actor_events SET status = 'done', closed_at = clock_timestamp()
				WHERE agent_uid = $1 AND session_id = $2 AND steer_of = $3 AND status = 'open'
				RETURNING 1)
			SELECT paddock_check(count(*) = $4, $5) FROM closed`,
			ref.AgentUID, ref.SessionID, ref.ActorEventID, steers,
			fmt.Sprintf("%ssteers of event %d changed during the commit", checkLockRace, ref.ActorEventID))
	}
	// Alarms before the session row: the lock order of FireDueAlarms.
	queueAlarmOps(b, store.KeyOf(ref), alarms)
	// The event closed, the turn, its messages, the state and the
	// turn.committed frame: one statement (commitWritesSQL).
	args := []any{ref.AgentUID, ref.SessionID, ref.ActorEventID,
		fmt.Sprintf("%sevent %d is no longer open", checkSuperseded, ref.ActorEventID),
		ref.DeliveryID, ref.ActorEpoch, string(outcome), idx, roles, contents,
		store.FrameTurnCommitted, string(store.MustBody(t.Messages))}
	sql := commitWritesSQL
	if !p.KeepState {
		sql, args = commitWritesStateSQL, append(args, store.StateColumn(p.State))
	}
	b.Queue(sql, args...).QueryRow(func(row pgx.Row) error {
		var ok bool
		return row.Scan(&ok, &t.NextOpen, &t.TurnNo, &t.CommittedAt, &t.Usage.InputTokens, &t.Usage.OutputTokens)
	})
	queueSleep(b, ref, outcome)
	if next != nil {
		q.c = queueClaim(b, *next, true)
	}
	return q
}

// queueSleep queues the sleep of outcome sleep or finish (nothing for
// another outcome): the agent sleeps (or finished) until the next signal,
// unless one is already waiting: open events still run (invariant 11).
// The session row is the commit's transaction's already.
func queueSleep(b *pgx.Batch, ref abi.TurnRef, outcome abi.Outcome) {
	if reason := store.OutcomeSleepReason(outcome); reason != "" {
		b.Queue(`
			UPDATE sessions SET status = 'sleeping', sleep_ts = clock_timestamp(), sleep_reason = $3,
				pending_since = NULL
			WHERE agent_uid = $1 AND session_id = $2 AND status = 'active'
			  AND (SELECT seq FROM actor_events
				WHERE agent_uid = $1 AND session_id = $2 AND status = 'open'
				ORDER BY seq LIMIT 1) IS NULL`, ref.AgentUID, ref.SessionID, reason)
	}
}

// turn is the committed turn, with the next turn its claim took.
func (q *queuedCommit) turn() store.Turn {
	t := q.t
	t.CommittedAt = utc(t.CommittedAt)
	if q.c != nil {
		if d, taken := q.c.dispatch(); taken {
			t.Next, t.NextOpen = &d, true
		}
	}
	return t
}

// commitWritesSQL is a commit's writes after its fence (and after the
// steers' close and the alarms, which CommitTurn queues before it), in one
// statement of data-modifying CTEs in the lock order of the turn
// transaction — the event, the session, its messages (and state:
// commitWritesStateSQL, $13), the stream head last: the event closed (invariant 4: exactly once, else it
// raises $4 — superseded), the turn appended with its journal's usage,
// the transcript's messages ($8-$10), the turn.committed frame ($11, body
// messages $12). It returns the check, whether another event is open (the
// statement's snapshot predates the close, so the event is left out by
// id), and the turn's number, time and usage. Parameters: $1 agent uid, $2
// session id, $3 event id, $5 delivery id, $6 epoch, $7 outcome.
var commitWritesSQL, commitWritesStateSQL = commitWrites(false), commitWrites(true)

func commitWrites(state bool) string {
	st := ""
	if state {
		st = `
	st AS (
		INSERT INTO session_state (agent_uid, session_id, state, updated_at)
		SELECT $1, $2, $13, clock_timestamp() FROM turn
		ON CONFLICT (agent_uid, session_id) DO UPDATE SET state = excluded.state, updated_at = excluded.updated_at),`
	}
	return `
	WITH closed AS (
		UPDATE actor_events SET status = 'done', closed_at = clock_timestamp()
		WHERE ` + byID("", "$3", "agent_uid = $1 AND session_id = $2 AND status = 'open'") + `
		RETURNING 1),
	turn AS (
		UPDATE sessions SET turn_count = turn_count + 1
		WHERE agent_uid = $1 AND session_id = $2 AND EXISTS (SELECT 1 FROM closed)
		RETURNING turn_count),
	usage AS (` + journalUsageSQL + `),
	t AS (
		INSERT INTO turns (agent_uid, session_id, turn_no, event_id, delivery_id, actor_epoch, outcome, committed_at,
			input_tokens, output_tokens)
		SELECT $1, $2, turn.turn_count, $3, $5, $6, $7, clock_timestamp(), usage.input_tokens, usage.output_tokens
		FROM turn, usage
		RETURNING turn_no, committed_at, input_tokens, output_tokens, outcome),
	m AS (
		INSERT INTO messages (agent_uid, session_id, turn_no, idx, role, content)
		SELECT $1, $2, turn.turn_count, u.idx, u.role, u.content
		FROM turn, unnest($8::int[], $9::text[], $10::text[]) AS u(idx, role, content)),` + st + `
	` + frameHeadCTE(`SELECT $1, $2, 1 FROM t`) + `,
	f AS (
		` + frameRowInsert(`$1, $2`, `$11::text`, `$3::bigint`, `$6::bigint`,
		`(SELECT attempts + 1 FROM actor_events WHERE event_id = $3)`, turnCommittedBody(`$12`), `h, t`) + `
		RETURNING 1)
	SELECT paddock_check((SELECT count(*) FROM closed) = 1, $4),
		(SELECT seq FROM actor_events
		WHERE agent_uid = $1 AND session_id = $2 AND status = 'open' AND steer_of IS NULL AND event_id <> $3
		ORDER BY seq LIMIT 1) IS NOT NULL,
		t.turn_no, t.committed_at, t.input_tokens, t.output_tokens
	FROM (SELECT) one LEFT JOIN t ON true` // a row, so that the check runs when t is empty
}

// queueAlarmOps queues a commit's alarm writes (store.PlanAlarmOps):
// clears deleted, sets upserted (due_at = At, or DB now + InMs), each kind
// in one statement.
func queueAlarmOps(b *pgx.Batch, key store.ActorKey, w store.AlarmWrites) {
	if len(w.Clear) > 0 {
		b.Queue(`DELETE FROM alarms WHERE agent_uid = $1 AND session_id = $2 AND name = ANY($3::text[])`,
			key.AgentUID, key.SessionID, w.Clear)
	}
	if len(w.Set) == 0 {
		return
	}
	n := len(w.Set)
	names, ats, inMs, every, data := make([]string, n), make([]*time.Time, n), make([]int64, n), make([]int64, n), make([]*string, n)
	for i, op := range w.Set {
		names[i], ats[i], inMs[i], every[i], data[i] = op.Name, op.At, op.InMs, op.EveryMs, nullString(string(op.Data))
	}
	b.Queue(`
		INSERT INTO alarms (agent_uid, session_id, name, due_at, every_ms, data, set_at)
		SELECT $1, $2, u.name, coalesce(u.at, now.t + u.in_ms * interval '1 millisecond'), u.every_ms, u.data, now.t
		FROM unnest($3::text[], $4::timestamptz[], $5::bigint[], $6::bigint[], $7::text[])
			AS u(name, at, in_ms, every_ms, data),
			(SELECT clock_timestamp() AS t) now
		ON CONFLICT (agent_uid, session_id, name) DO UPDATE SET due_at = excluded.due_at,
			every_ms = excluded.every_ms, data = excluded.data, set_at = excluded.set_at`,
		key.AgentUID, key.SessionID, names, ats, inMs, every, data)
}

// FailAttempt records a failed attempt under the same fences as a commit,
// the lease aside (an expired lease may still be failed by its holder); see
// store.Store.
func (s *Store) FailAttempt(ctx context.Context, p store.FailAttemptParams) (store.FailResult, error) {
	ref := p.Ref
	if err := store.CheckHold(p); err != nil {
		return store.FailResult{}, fmt.Errorf("store/postgres: fail attempt: %w", err)
	}
	var fr store.FailResult
	err := s.tx(ctx, "fail attempt", func(ctx context.Context, tx pgx.Tx) error {
		fr = store.FailResult{}
		// A delivery still created (never sent: no route, no capacity) may
		// be failed too.
		newState := store.DeliverySendFailed
		if p.Counted {
			newState = store.DeliverySuperseded
		}
		f := failure{key: store.KeyOf(ref), eventID: ref.ActorEventID, epoch: ref.ActorEpoch,
			counted: p.Counted, msg: p.Error, backoff: p.Backoff, maxAttempts: p.MaxAttempts,
			reason: store.EndReasonError}
		b := &pgx.Batch{}
		b.Queue(`SELECT 1 FROM activations WHERE activation_uid = $1 FOR UPDATE`, ref.ActivationUID)
		// What store.PlanFailure decides on, read under the row lock in the
		// same round trip (a refused fence makes it moot; a ref naming no
		// session reads no row).
		b.Queue(`SELECT `+failFactsCols+` FROM `+failFactsFrom(1, 2, 3), ref.AgentUID, ref.SessionID, ref.ActorEventID).
			QueryRow(ignoreNoRows(func(row pgx.Row) error { return row.Scan(f.factsDest()...) }))
		if err := fence(ctx, tx, ref, store.FenceFail, b, failFence, refArgs(ref, string(newState), p.Error)); err != nil {
			return err
		}
		var err error
		if p.Hold != nil {
			fr, err = holdEvent(ctx, tx, ref, p.Hold)
			return err
		}
		fr, err = failEvent(ctx, tx, f)
		return err
	})
	if err != nil {
		return store.FailResult{}, err
	}
	return fr, nil
}

// classify reads, in the same transaction (the activation row is locked by
// the caller; MarkDeliverySent, which wrote nothing, reads outside one), the
// rows that explain why a guarded UPDATE matched no row, and lets
// store.ClassifyFence name the reason. It decides nothing: the guarded
// UPDATE already refused and the caller rolls back. deliveryMatched says
// the delivery's guard passed (and this transaction has since written the
// delivery), so the delivery is not read.
func classify(ctx context.Context, tx querier, ref abi.TurnRef, op store.FenceOp, deliveryMatched bool) error {
	rows := store.FenceRows{DeliveryMatched: deliveryMatched}
	if !deliveryMatched {
		d := store.Delivery{ID: ref.DeliveryID}
		err := tx.QueryRow(ctx, `
			SELECT agent_uid, session_id, activation_uid, actor_epoch, event_id, revision, state
			FROM deliveries WHERE delivery_id = $1`, ref.DeliveryID).Scan(
			&d.AgentUID, &d.SessionID, &d.ActivationUID, &d.ActorEpoch, &d.EventID, &d.Revision, &d.State)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return err
		default:
			rows.Delivery = &d
		}
		if rows.Delivery == nil || op == store.FenceMarkSent {
			return store.ClassifyFence(ref, op, rows)
		}
	}
	a := store.Activation{UID: ref.ActivationUID}
	var current *int64
	err := tx.QueryRow(ctx, `
		SELECT actor_epoch, revision, current_event_id, state, lease_expires_at <= clock_timestamp()
		FROM activations WHERE activation_uid = $1`, ref.ActivationUID).Scan(
		&a.ActorEpoch, &a.Revision, &current, &a.State, &rows.LeaseExpired)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return err
	default:
		if current != nil {
			a.CurrentEventID = *current
		}
		rows.Activation = &a
	}
	return store.ClassifyFence(ref, op, rows)
}
