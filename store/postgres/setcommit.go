package postgres

import (
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paddock-dev/paddock/store"
)

// The set commit: the deferred commits of one turns-lane batch in one
// statement. At full load the turns lane's batches are almost only
// deferred commits (deferredCommitSQL, one per turn), and the backend's
// executor start-up — building the plan state of a statement of a dozen
// CTEs — was a third of its CPU, paid once per turn (`perf record -a -g`).
// The set commit pays it once per batch: deferredCommitSQL's checks and
// writes over arrays, one row per turn.
//
// A turn whose checks fail writes nothing and answers solo: the caller
// commits it on its own path, where the refusal is explained (CommitTurn),
// while the batch's other turns commit. Nothing raises, so one session's
// refusal never undoes another's write and costs the others nothing.
//
// Lock order. deferredCommitSQL takes, within a session, the activation,
// the event, the delivery, the session row and the stream head. The set
// commit takes them phase by phase: every turn's activation (locked, its
// lease renewed only once its turn's event is closed, so that a refused
// turn writes nothing), then every event, then the session rows in byte
// order of their keys (COLLATE "C": live's sort), then the stream heads. Within each session that is the same order, so no cycle
// forms with a single-session transaction; the session rows in key order
// are the acceptance lane's order. Another statement of the same batch
// that locks rows session by session would break this (it would hold a
// later session's row while the set commit waits for an earlier one), so
// the set commit only goes out in a batch whose other requests lock
// nothing (deferred reads). A batch with enough deferred commits and other
// locking requests too is split (splitSet): the set commit and the reads
// now, the rest, statement by statement, as the next batch — its own
// transaction. Otherwise the batch is queued statement by statement as
// before (queueSet reports false).
//
// Its plan must not depend on statistics taken when the tables were small,
// nor on the planner's guess of ten rows for an array: the activations are
// found by primary key (= ANY, the rest of the guard inside IS TRUE, which
// keeps the planner off the partial index of live activations), and the
// turns whose activations passed are materialized (ai) before the
// per-turn lookups, which then run once per turn. Joined in one CTE, a
// generic plan built with one agent in the table's statistics ran the
// oldest-open-event lookup for every pair of activation and turn: n²
// index probes for a batch of n (found in review;
// TestSetCommitIndexScansStayLinear).

// setCommitMin is the fewest deferred commits a batch sends as a set
// commit; one goes as deferredCommitSQL.
const setCommitMin = 2

// setCommitSQL is deferredCommitSQL over arrays. Parameters, one element
// per turn: $1 agent uid, $2 session id, $3 event id, $4 delivery id, $5
// epoch, $6 outcome, $7 the messages' JSON (turn.committed), $8 state, $9
// whether to write it, $10 activation uid, $11 lease id, $12 revision, $14
// binding, $15 block on dead letter, $16-$20 the
// agent as the dispatch read it (kind, digest, plugin, sha256, namespace);
// $13 the lease renewal in µs, the same for every turn (settable); one
// element per message: $21 its turn's ordinal (1-based, as $1's), $22
// index, $23 role, $24 content; then $25 turn.started and $26
// turn.committed. One row per turn, in $1's order: its ordinal, whether it
// committed, then (when it did) whether another event is open, the turn
// number, committed_at and the usage.
var setCommitSQL = `
	WITH i AS (
		SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::bigint[], $6::text[], $7::text[],
			$8::bytea[], $9::boolean[], $10::text[], $11::text[], $12::bigint[], $14::text[],
			$15::boolean[], $16::text[], $17::text[], $18::text[], $19::text[], $20::text[])
			WITH ORDINALITY AS i(agent_uid, session_id, event_id, delivery_id, epoch, outcome, msgs, state, set_state,
				activation_uid, lease_id, revision, binding, block_dead, kind, digest, plugin, sha, namespace, n)),
	a AS (
		SELECT a.activation_uid FROM activations a
		WHERE a.activation_uid = ANY ($10::text[])
		  AND ((a.agent_uid, a.session_id, a.actor_epoch, a.lease_id, a.revision)
			= (SELECT i.agent_uid, i.session_id, i.epoch, i.lease_id, i.revision FROM i
			   WHERE i.activation_uid = a.activation_uid)
		  AND a.state IN ` + liveStates + ` AND a.current_event_id IS NULL
		  AND a.lease_expires_at > clock_timestamp()) IS TRUE
		FOR NO KEY UPDATE OF a),
	ai AS MATERIALIZED (SELECT i.* FROM a JOIN i ON i.activation_uid = a.activation_uid),
	c AS (
		SELECT a.n FROM ai a
		` + agentJoins + `
		JOIN LATERAL ` + oldestOpenEvent + `
		WHERE e.event_id = a.event_id AND e.next_attempt_at <= clock_timestamp() AND coalesce(e.binding, '') = ''
		  AND NOT (a.block_dead AND ` + deadLetterBefore + `)
		  AND NOT ` + steersAttached + `
		  AND ((ag.kind, coalesce(ag.module_digest, ''), coalesce(ag.plugin, ''), coalesce(pw.sha256, ''), ag.namespace)
			= (a.kind, a.digest, a.plugin, a.sha, a.namespace)) IS TRUE),
	closed AS (
		UPDATE actor_events ev SET status = 'done', closed_at = clock_timestamp(), binding = nullif(i.binding, '')
		FROM c JOIN i ON i.n = c.n
		WHERE ` + byID("ev.", "i.event_id",
	"ev.agent_uid = i.agent_uid AND ev.session_id = i.session_id AND ev.status = 'open' AND ev.attempts = 0") + `
		RETURNING i.n, ev.kind),
	renew AS (
		UPDATE activations a SET lease_expires_at = greatest(a.lease_expires_at,
			clock_timestamp() + $13 * interval '1 microsecond')
		FROM closed JOIN i ON i.n = closed.n
		WHERE a.activation_uid = i.activation_uid),
	del AS (
		INSERT INTO deliveries (delivery_id, agent_uid, session_id, activation_uid, actor_epoch, event_id,
			revision, state, binding, sent_at, closed_at)
		SELECT i.delivery_id, i.agent_uid, i.session_id, i.activation_uid, i.epoch, i.event_id, i.revision, 'accepted',
			i.binding, clock_timestamp(), clock_timestamp()
		FROM closed JOIN i ON i.n = closed.n
		RETURNING delivery_id),
	sl AS (
		SELECT s.agent_uid, s.session_id FROM sessions s
		WHERE (s.agent_uid, s.session_id) IN (SELECT i.agent_uid, i.session_id FROM i JOIN del USING (delivery_id))
		ORDER BY s.agent_uid COLLATE "C", s.session_id COLLATE "C"
		FOR NO KEY UPDATE OF s),
	turn AS (
		UPDATE sessions s SET turn_count = s.turn_count + 1
		FROM sl JOIN i ON i.agent_uid = sl.agent_uid AND i.session_id = sl.session_id
		WHERE s.agent_uid = sl.agent_uid AND s.session_id = sl.session_id
		RETURNING i.n, s.turn_count),
	t AS (
		INSERT INTO turns (agent_uid, session_id, turn_no, event_id, delivery_id, actor_epoch, outcome, committed_at,
			input_tokens, output_tokens)
		SELECT i.agent_uid, i.session_id, turn.turn_count, i.event_id, i.delivery_id, i.epoch, i.outcome,
			clock_timestamp(), 0, 0
		FROM turn JOIN i ON i.n = turn.n
		RETURNING agent_uid, session_id, delivery_id, turn_no, committed_at, input_tokens, output_tokens, outcome),
	m AS (
		INSERT INTO messages (agent_uid, session_id, turn_no, idx, role, content)
		SELECT i.agent_uid, i.session_id, turn.turn_count, u.idx, u.role, u.content
		FROM turn JOIN i ON i.n = turn.n
		JOIN unnest($21::bigint[], $22::int[], $23::text[], $24::text[]) AS u(n, idx, role, content) ON u.n = turn.n),
	st AS (
		INSERT INTO session_state (agent_uid, session_id, state, updated_at)
		SELECT i.agent_uid, i.session_id, i.state, clock_timestamp() FROM turn JOIN i ON i.n = turn.n
		WHERE i.set_state
		ON CONFLICT (agent_uid, session_id) DO UPDATE SET state = excluded.state, updated_at = excluded.updated_at),
	h AS (
		INSERT INTO stream_heads AS sh (agent_uid, session_id, last_seq)
		SELECT t.agent_uid, t.session_id, 2 FROM t
		ON CONFLICT (agent_uid, session_id) DO UPDATE SET last_seq = sh.last_seq + 2
		RETURNING agent_uid, session_id, last_seq),
	f AS (
		INSERT INTO stream_frames (agent_uid, session_id, seq, kind, event_id, actor_epoch, attempt, body)
		SELECT h.agent_uid, h.session_id, h.last_seq - 1, $25::text, i.event_id, i.epoch, 1,
			'{"event_kind":' || to_json(closed.kind)::text || '}'
		FROM h JOIN i ON i.agent_uid = h.agent_uid AND i.session_id = h.session_id JOIN closed ON closed.n = i.n
		UNION ALL
		SELECT h.agent_uid, h.session_id, h.last_seq, $26::text, i.event_id, i.epoch, 1, ` + turnCommittedBody(`i.msgs`) + `
		FROM h JOIN t ON t.agent_uid = h.agent_uid AND t.session_id = h.session_id
		JOIN i ON i.delivery_id = t.delivery_id
		RETURNING 1)
	SELECT i.n, t.turn_no IS NOT NULL,
		t.turn_no IS NOT NULL AND (SELECT seq FROM actor_events
			WHERE agent_uid = i.agent_uid AND session_id = i.session_id AND status = 'open' AND steer_of IS NULL
			  AND event_id <> i.event_id
			ORDER BY seq LIMIT 1) IS NOT NULL,
		coalesce(t.turn_no, 0), coalesce(t.committed_at, clock_timestamp()), coalesce(t.input_tokens, 0),
		coalesce(t.output_tokens, 0)
	FROM i LEFT JOIN t ON t.delivery_id = i.delivery_id
	ORDER BY i.n`

// settable reports whether r is a deferred commit the set commit takes:
// deferredInOne, no sleep to write and no next turn to claim.
func settable(r groupItem) (*groupReq[commitIn, commitRes], bool) {
	c, ok := r.(*groupReq[commitIn, commitRes])
	if !ok || c.in.next != nil || !deferredInOne(c.in.p, c.in.alarms) {
		return nil, false
	}
	return c, store.OutcomeSleepReason(store.CommitOutcome(c.in.p)) == ""
}

// queueSet queues reqs (sorted by session: live) with their deferred
// commits as one set commit, first, and reports true; it queues nothing
// and reports false when the batch does not qualify: fewer than
// setCommitMin settable commits, a session with two of them, two lease
// renewals (CommitTurnParams.LeaseTTL) that differ, or another
// request that is not a deferred read (see the lock order above).
func queueSet(b *pgx.Batch, reqs []groupItem) bool {
	var commits []*groupReq[commitIn, commitRes]
	var rest []groupItem
	for _, r := range reqs {
		if c, ok := settable(r); ok {
			if n := len(commits); n > 0 && (store.KeyOf(commits[n-1].in.p.Ref) == store.KeyOf(c.in.p.Ref) ||
				commits[0].in.p.LeaseTTL != c.in.p.LeaseTTL) {
				return false
			}
			commits = append(commits, c)
			continue
		}
		if _, read := r.(*groupReq[store.NextDeliveryParams, readRes]); !read {
			return false
		}
		rest = append(rest, r)
	}
	if len(commits) < setCommitMin {
		return false
	}
	queueSetCommit(b, commits)
	for _, r := range rest {
		r.queue(b)
	}
	return true
}

// splitSetMin is the fewest settable commits for which splitSet takes a
// batch apart: the rest then costs a transaction of its own.
const splitSetMin = 4

// splitSet divides a batch that queueSet refused only for its requests
// that lock rows session by session (claims, written commits, promotions;
// activation claims, which a burst of cold starts mixed with deferred
// commits in every batch, have had a lane of their own since: starts) into
// the set — its settable commits, at least splitSetMin, one
// per session and all of one lease renewal, and its deferred reads — and
// the rest, which the flusher sends as the next batch. Each part keeps the
// lock order of a batch of its own kind. ok is false when the batch does
// not qualify or a request of the rest is of a session in the set: within
// a session, requests go out in arrival order.
func splitSet(reqs []groupItem) (set, rest []groupItem, ok bool) {
	inSet := map[store.ActorKey]bool{}
	commits := 0
	var ttl time.Duration
	for _, r := range reqs {
		c, settled := settable(r)
		if settled {
			k := store.KeyOf(c.in.p.Ref)
			if commits > 0 && (c.in.p.LeaseTTL != ttl || inSet[k]) {
				return nil, nil, false
			}
			ttl = c.in.p.LeaseTTL
			commits++
			inSet[k] = true
			set = append(set, r)
			continue
		}
		if _, read := r.(*groupReq[store.NextDeliveryParams, readRes]); read {
			inSet[r.key()] = true
			set = append(set, r)
			continue
		}
		rest = append(rest, r)
	}
	if commits < splitSetMin || len(rest) == 0 {
		return nil, nil, false
	}
	for _, r := range rest {
		if inSet[r.key()] {
			return nil, nil, false
		}
	}
	return set, rest, true
}

// queueSetCommit queues setCommitSQL for commits and sets each one's
// answer: its turn, or solo when its checks refused it.
func queueSetCommit(b *pgx.Batch, commits []*groupReq[commitIn, commitRes]) {
	n := len(commits)
	agents, sessions, deliveries, outcomes, msgs := make([]string, n), make([]string, n), make([]string, n),
		make([]string, n), make([]string, n)
	events, epochs, revisions := make([]int64, n), make([]int64, n), make([]int64, n)
	states, setState := make([][]byte, n), make([]bool, n)
	acts, leases, bindings := make([]string, n), make([]string, n), make([]string, n)
	blocks := make([]bool, n)
	kinds, digests, plugins, shas, namespaces := make([]string, n), make([]string, n), make([]string, n),
		make([]string, n), make([]string, n)
	var mOrd []int64
	var mIdx []int32
	var mRoles, mContents []string
	turns := make([]store.Turn, n)
	for k, c := range commits {
		p := c.in.p
		ref, dp := p.Ref, p.Deferred
		outcome := store.CommitOutcome(p)
		t := turnOf(ref, outcome)
		t.Messages = store.TurnMessages(p.Payloads, p.Messages)
		turns[k] = t
		for _, m := range t.Messages {
			mOrd, mIdx = append(mOrd, int64(k+1)), append(mIdx, int32(m.Index))
			mRoles, mContents = append(mRoles, m.Role), append(mContents, m.Content)
		}
		agents[k], sessions[k], events[k], deliveries[k] = ref.AgentUID, ref.SessionID, ref.ActorEventID, ref.DeliveryID
		epochs[k], outcomes[k], msgs[k] = ref.ActorEpoch, string(outcome), string(store.MustBody(t.Messages))
		if !p.KeepState {
			setState[k], states[k] = true, store.StateColumn(p.State)
		}
		acts[k], leases[k], revisions[k] = ref.ActivationUID, dp.Activation.LeaseID, ref.Revision
		bindings[k], blocks[k] = dp.Delivery.Binding, dp.BlockOnDeadLetter
		ag := dp.Agent
		kinds[k], digests[k], plugins[k], shas[k], namespaces[k] = ag.Kind, ag.ModuleDigest, ag.Plugin, ag.PluginSHA256, ag.Namespace
	}
	committed := make([]bool, n)
	b.Queue(setCommitSQL, agents, sessions, events, deliveries, epochs, outcomes, msgs, states, setState,
		acts, leases, revisions, micros(commits[0].in.p.LeaseTTL), bindings, blocks, kinds, digests, plugins, shas, namespaces,
		mOrd, mIdx, mRoles, mContents, store.FrameTurnStarted, store.FrameTurnCommitted).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			var ord int64
			var ok bool
			var t store.Turn
			var at time.Time
			if err := rows.Scan(&ord, &ok, &t.NextOpen, &t.TurnNo, &at, &t.Usage.InputTokens, &t.Usage.OutputTokens); err != nil {
				return err
			}
			k := int(ord - 1)
			if k < 0 || k >= n {
				continue
			}
			if committed[k] = ok; ok {
				turns[k].NextOpen, turns[k].TurnNo, turns[k].CommittedAt, turns[k].Usage = t.NextOpen, t.TurnNo, utc(at), t.Usage
			}
		}
		return rows.Err()
	})
	for k, c := range commits {
		c.answer = func() commitRes {
			if !committed[k] {
				return commitRes{solo: true}
			}
			return commitRes{t: turns[k]}
		}
	}
}
