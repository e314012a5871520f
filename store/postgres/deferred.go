package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/paddock-dev/paddock/store"
)

// Deferred dispatch (docs/DESIGN.md "Deferred dispatch"): the read that
// dispatches a turn without writing it, its promotion, and the commit
// that writes a never-promoted turn whole.

// deferredReadSQL is a deferred dispatch (NextDeliveryParams.Defer) as a
// read: claimDeliverySQL's choice — the oldest open event that is not a
// steer of a live, idle, unexpired activation, due, not held back by a
// dead letter ($6), no steers attached — without a lock or a write. It
// returns the event's row, then the activation's epoch and revision and
// what the agent runs now, or no row. Parameters $1-$5: the ActivationRef;
// an epoch ($4) of 0 matches the activation's own (a claim's first turn,
// whose epoch the claim gives in the same transaction: the UID names the
// activation alone — store.ClaimActivationParams.First).
var deferredReadSQL = `
	WITH c AS (
		SELECT e.event_id AS c_event, a.actor_epoch AS c_epoch, a.revision AS c_revision, ag.kind AS c_kind,
			coalesce(ag.module_digest, '') AS c_digest, coalesce(ag.plugin, '') AS c_plugin,
			coalesce(pw.sha256, '') AS c_sha, ag.namespace AS c_namespace
		FROM activations a
		` + agentJoins + `
		JOIN LATERAL ` + oldestOpenEvent + `
		WHERE a.activation_uid = $1 AND a.agent_uid = $2 AND a.session_id = $3 AND ($4::bigint = 0 OR a.actor_epoch = $4)
		  AND a.lease_id = $5 AND a.state IN ` + liveStates + ` AND a.current_event_id IS NULL
		  AND a.lease_expires_at > clock_timestamp()
		  AND e.next_attempt_at <= clock_timestamp()
		  AND NOT ($6::boolean AND ` + deadLetterBefore + `)
		  AND NOT ` + steersAttached + `)
	SELECT ` + eventCols + `, c_epoch, c_revision, c_kind, c_digest, c_plugin, c_sha, c_namespace
	FROM c, actor_events WHERE event_id = (SELECT c_event FROM c)`

// deferredDispatch is NextDelivery with p.Defer (and p.Expect): the
// candidate (deferredReadSQL), the session with its state and the tail,
// read in the group commit's batch (reads) — alone on the pool without
// the group commit, or when the batch rolled back — and nothing written. ok is false, and the caller takes the
// event as usual, when there is no candidate, store.Deferrable refuses it
// or the agent no longer is what p.Expect says (Bind must run). The
// statements' snapshots differ; the session's state is written only by
// this activation's commits, which returned before this dispatch.
func (s *Store) deferredDispatch(ctx context.Context, p store.NextDeliveryParams) (d store.Dispatch, ok bool, err error) {
	var r *deferredRead
	if s.groupCommit {
		// With the requests of other sessions that arrived meanwhile (the
		// group commit): a read costs the pipe a statement, not a round
		// trip and a transaction of its own.
		res := s.reads.do(ctx, p)
		if res.err != nil {
			return store.Dispatch{}, false, wrap("next delivery", res.err)
		}
		r = res.r
	}
	if r == nil {
		err = s.call(ctx, "next delivery", func(ctx context.Context) error {
			b := &pgx.Batch{}
			r = queueDeferredRead(b, p)
			return s.pool.SendBatch(ctx, b).Close()
		})
		if err != nil {
			return store.Dispatch{}, false, err
		}
	}
	d, ok = r.dispatch()
	return d, ok, nil
}

// deferredRead is a queued deferred dispatch's answer (queueDeferredRead).
type deferredRead struct {
	p               store.NextDeliveryParams
	d               store.Dispatch
	found           bool
	epoch, revision int64
}

// queueDeferredRead queues deferredReadSQL for p, then the reads of the
// session with its state and of the tail.
func queueDeferredRead(b *pgx.Batch, p store.NextDeliveryParams) *deferredRead {
	ref := p.Activation
	r := &deferredRead{p: p}
	b.Queue(deferredReadSQL, ref.UID, ref.AgentUID, ref.SessionID, ref.ActorEpoch, ref.LeaseID,
		p.BlockOnDeadLetter).QueryRow(func(row pgx.Row) (err error) {
		r.d.Event, err = scanEvent(row, &r.epoch, &r.revision, &r.d.Agent.Kind, &r.d.Agent.ModuleDigest, &r.d.Agent.Plugin,
			&r.d.Agent.PluginSHA256, &r.d.Agent.Namespace)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		r.found = err == nil
		return err
	})
	queueSession(b, ref.ActorKey, "", &r.d)
	if p.TailMessages > 0 {
		queueTail(b, ref.ActorKey, p.TailMessages, "", &r.d.Tail)
	}
	return r
}

// dispatch is the deferred dispatch once the reads ran; ok is false when
// there is none (see deferredDispatch).
func (r *deferredRead) dispatch() (d store.Dispatch, ok bool) {
	p := r.p
	ref, x := p.Activation, p.Expect
	if !r.found || !store.Deferrable(r.d.Event.Attempts, r.d.Event.Binding, 0) || r.d.Agent != x.Agent {
		return store.Dispatch{}, false
	}
	ref.ActorEpoch = r.epoch
	d = store.DeferredOf(ref, r.revision, p.DeliveryID, *x, r.d.Event)
	d.Session, d.State, d.Tail = r.d.Session, r.d.State, r.d.Tail
	return d, true
}

// Promote writes a deferred dispatch under its checks; see store.Store.
// It is claimDeliverySQL for that event at that revision, in one round
// trip and implicit transaction on the pipe.
func (s *Store) Promote(ctx context.Context, p store.PromoteParams) error {
	if s.groupCommit {
		// With the requests of other sessions that arrived meanwhile (the
		// group commit); a batch that rolled back sends it alone.
		if r := s.promotes.do(ctx, p); !r.solo {
			if r.err != nil {
				return wrap("promote", dispatchErr(p.Delivery.ID, r.err))
			}
			if !r.taken {
				return s.explainPromote(ctx, p)
			}
			return nil
		}
	}
	c, err := s.claimAlone(ctx, "promote", p.Delivery.ID, func(b *pgx.Batch) *claim {
		return queueClaimOf(b, promoteClaim(p), &p.Delivery)
	})
	if err != nil {
		return err
	}
	if !c.taken {
		return s.explainPromote(ctx, p)
	}
	return nil
}

// promoteClaim is the claim that promotes p: its activation, delivery id
// and binding, the agent as the dispatch read it, created sent.
func promoteClaim(p store.PromoteParams) store.NextDeliveryParams {
	return store.NextDeliveryParams{Activation: p.Activation, DeliveryID: p.Delivery.ID, MarkSent: true,
		BlockOnDeadLetter: p.BlockOnDeadLetter,
		Expect:            &store.ExpectedBinding{Agent: p.Agent, Binding: p.Delivery.Binding}}
}

// explainPromote classifies a promotion (or a deferred commit) that took
// nothing: the activation's row decides (store.ClassifyFence,
// FencePromote); when it passes, the event was no longer the candidate.
func (s *Store) explainPromote(ctx context.Context, p store.PromoteParams) error {
	return s.call(ctx, "explain fence refusal", func(ctx context.Context) error {
		return classify(ctx, s.pool, p.Delivery.TurnRef(), store.FencePromote, true)
	})
}

// deferredCommitSQL is the commit of a deferred turn never promoted
// (CommitTurnParams.Deferred, with payloads, no alarms and no wait), in one
// statement: what claimDeliverySQL checks and what the commit writes,
// without the rows a promotion would write only to change them again —
// the activation is locked and its lease renewed but its current event
// never set, the event is bound and closed in one write, the delivery is
// inserted accepted, and the stream head moves by two for turn.started and
// turn.committed. The lock order is every turn transaction's: the
// activation, the event, the delivery, the session, the stream head last.
// The activation's guard failing raises $18 (fenceRefusedActivation); the
// event no longer being the candidate raises $4 (superseded); CommitTurn
// then explains either as a promotion (explainPromote). Parameters: $1
// agent uid, $2 session id, $3 event id, $5 delivery id, $6 epoch, $7
// outcome, $8-$10 messages, $11 turn.committed, $12 its messages' JSON,
// ($13 state: deferredCommitStateSQL), $14 activation uid, $15 lease id,
// $16 revision, $17 lease renewal µs, $18 the activation's refusal, $19
// binding, $20 block on dead letter, $21-$25 the agent as the dispatch
// read it (kind, digest, plugin, sha256, namespace), $26 turn.started.
var deferredCommitSQL, deferredCommitStateSQL = deferredCommit(false), deferredCommit(true)

func deferredCommit(state bool) string {
	st := `
	st AS (SELECT $13::bytea),` // unused: $13 keeps its type, so both variants take the same parameters
	if state {
		st = `
	st AS (
		INSERT INTO session_state (agent_uid, session_id, state, updated_at)
		SELECT $1, $2, $13, clock_timestamp() FROM turn
		ON CONFLICT (agent_uid, session_id) DO UPDATE SET state = excluded.state, updated_at = excluded.updated_at),`
	}
	return `
	WITH a AS (
		UPDATE activations SET lease_expires_at = greatest(lease_expires_at, clock_timestamp() + $17 * interval '1 microsecond')
		WHERE activation_uid = $14 AND agent_uid = $1 AND session_id = $2 AND actor_epoch = $6 AND lease_id = $15
		  AND revision = $16 AND state IN ` + liveStates + ` AND current_event_id IS NULL
		  AND lease_expires_at > clock_timestamp()
		RETURNING agent_uid, session_id),
	c AS (
		SELECT 1 FROM a
		JOIN agents ag ON ag.agent_uid = a.agent_uid
		LEFT JOIN plugin_workers pw ON pw.namespace = ag.namespace AND pw.name = ag.plugin
		JOIN LATERAL ` + oldestOpenEvent + `
		WHERE e.event_id = $3 AND e.next_attempt_at <= clock_timestamp() AND coalesce(e.binding, '') = ''
		  AND NOT ($20::boolean AND ` + deadLetterBefore + `)
		  AND NOT ` + steersAttached + `
		  AND (ag.kind, coalesce(ag.module_digest, ''), coalesce(ag.plugin, ''), coalesce(pw.sha256, ''), ag.namespace)
			= ($21::text, $22::text, $23::text, $24::text, $25::text)),
	closed AS (
		UPDATE actor_events SET status = 'done', closed_at = clock_timestamp(), binding = nullif($19::text, '')
		WHERE ` + byID("", "$3", "agent_uid = $1 AND session_id = $2 AND status = 'open' AND attempts = 0") + `
		  AND EXISTS (SELECT 1 FROM c)
		RETURNING kind),
	del AS (
		INSERT INTO deliveries (delivery_id, agent_uid, session_id, activation_uid, actor_epoch, event_id,
			revision, state, binding, sent_at, closed_at)
		SELECT $5, $1, $2, $14, $6, $3, $16, 'accepted', $19, clock_timestamp(), clock_timestamp() FROM closed
		RETURNING 1),
	turn AS (
		UPDATE sessions SET turn_count = turn_count + 1
		WHERE agent_uid = $1 AND session_id = $2 AND EXISTS (SELECT 1 FROM del)
		RETURNING turn_count),
	t AS (
		INSERT INTO turns (agent_uid, session_id, turn_no, event_id, delivery_id, actor_epoch, outcome, committed_at,
			input_tokens, output_tokens)
		SELECT $1, $2, turn.turn_count, $3, $5, $6, $7, clock_timestamp(), 0, 0 FROM turn
		RETURNING turn_no, committed_at, input_tokens, output_tokens, outcome),
	m AS (
		INSERT INTO messages (agent_uid, session_id, turn_no, idx, role, content)
		SELECT $1, $2, turn.turn_count, u.idx, u.role, u.content
		FROM turn, unnest($8::int[], $9::text[], $10::text[]) AS u(idx, role, content)),` + st + `
	h AS (
		INSERT INTO stream_heads AS sh (agent_uid, session_id, last_seq) SELECT $1, $2, 2 FROM t
		ON CONFLICT (agent_uid, session_id) DO UPDATE SET last_seq = sh.last_seq + 2
		RETURNING last_seq),
	f AS (
		INSERT INTO stream_frames (agent_uid, session_id, seq, kind, event_id, actor_epoch, attempt, body)
		SELECT $1, $2, h.last_seq - 1, $26::text, $3, $6, 1, '{"event_kind":' || to_json(closed.kind)::text || '}'
		FROM h, closed
		UNION ALL
		SELECT $1, $2, h.last_seq, $11::text, $3, $6, 1, ` + turnCommittedBody(`$12`) + `
		FROM h, t
		RETURNING 1)
	SELECT paddock_check(EXISTS (SELECT 1 FROM a), $18), paddock_check((SELECT count(*) FROM closed) = 1, $4),
		(SELECT seq FROM actor_events
		WHERE agent_uid = $1 AND session_id = $2 AND status = 'open' AND steer_of IS NULL AND event_id <> $3
		ORDER BY seq LIMIT 1) IS NOT NULL,
		t.turn_no, t.committed_at, t.input_tokens, t.output_tokens
	FROM (SELECT) one LEFT JOIN t ON true`
}

// queueDeferredCommit queues p's commit as deferredCommitSQL (p.Deferred
// and p.Payloads set, no alarms, no wait), then a sleep and the claim of
// next (with its reads) as queueCommit does.
func queueDeferredCommit(b *pgx.Batch, p store.CommitTurnParams, next *store.NextDeliveryParams) *queuedCommit {
	ref, dp := p.Ref, p.Deferred
	outcome := store.CommitOutcome(p)
	q := &queuedCommit{t: turnOf(ref, outcome)}
	t := &q.t
	t.Messages = store.TurnMessages(p.Payloads, p.Messages)
	n := len(t.Messages)
	idx, roles, contents := make([]int32, n), make([]string, n), make([]string, n)
	for i, m := range t.Messages {
		idx[i], roles[i], contents[i] = int32(m.Index), m.Role, m.Content
	}
	var state any
	sql := deferredCommitSQL
	if !p.KeepState {
		sql, state = deferredCommitStateSQL, store.StateColumn(p.State)
	}
	ag := dp.Agent
	args := []any{ref.AgentUID, ref.SessionID, ref.ActorEventID,
		fmt.Sprintf("%sevent %d is no longer the session's next", checkSuperseded, ref.ActorEventID),
		ref.DeliveryID, ref.ActorEpoch, string(outcome), idx, roles, contents,
		store.FrameTurnCommitted, string(store.MustBody(t.Messages)), state,
		ref.ActivationUID, dp.Activation.LeaseID, ref.Revision, micros(p.LeaseTTL), fenceRefusedActivation,
		dp.Delivery.Binding, dp.BlockOnDeadLetter, ag.Kind, ag.ModuleDigest, ag.Plugin, ag.PluginSHA256, ag.Namespace,
		store.FrameTurnStarted}
	b.Queue(sql, args...).QueryRow(func(row pgx.Row) error {
		var ok, ok2 bool
		return row.Scan(&ok, &ok2, &t.NextOpen, &t.TurnNo, &t.CommittedAt, &t.Usage.InputTokens, &t.Usage.OutputTokens)
	})
	queueSleep(b, ref, outcome)
	if next != nil {
		q.c = queueClaim(b, *next, true)
	}
	return q
}

// deferredInOne says p's deferred commit is one statement
// (queueDeferredCommit): with its payloads, without alarms or a wait.
// Otherwise its promotion (claimDeliverySQL) goes first in its batch.
func deferredInOne(p store.CommitTurnParams, alarms store.AlarmWrites) bool {
	return p.Deferred != nil && p.Payloads != nil && p.Wait == nil && len(alarms.Clear) == 0 && len(alarms.Set) == 0
}
