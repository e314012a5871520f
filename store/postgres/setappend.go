package postgres

import (
	"github.com/jackc/pgx/v5"

	"github.com/paddock-dev/paddock/store"
)

// The set append: the appends of one acceptance-lane batch in one
// statement. Under load every signal's acceptance is one appendEventSQL,
// and each paid the executor's start-up and the statement's per-call
// overhead on the acceptance backend. The set append pays it once per
// batch: appendEventSQL's checks and writes over arrays, one row per
// append, in the batch's order (the order of the appends to one session is
// their arrival order: live sorts stably).
//
// Several appends to one session take consecutive seqs from one update of
// its row, in batch order. An append whose session is missing or
// destroyed, or whose idempotency key the session already holds, writes
// nothing and answers solo: AppendEvent then decides it on its locked path
// (ErrNotFound, ErrSessionDestroyed, or the first event returned), as when
// appendEventSQL returns no row. So does an append that repeats the key of
// an earlier append of the same batch to the same session, left out of
// the statement: the locked path finds the first one committed. Nothing
// refuses by raising; a statement that fails (a key inserted by another
// transaction while this one waited for the session row: the unique index
// raises) fails the batch, whose requests all run on their own paths, as
// before.
//
// Lock order: the session rows, in byte order of their keys (COLLATE "C",
// live's sort), before any write: the order of every acceptance batch sent
// statement by statement, and of the set commit's session phase. An audit
// row locks nothing, so a batch may hold audit rows beside the set append;
// the set append takes every append of its batch.

// setAppendMin is the fewest appends a batch sends as a set append;
// fewer go statement by statement (appendEventSQL). Measured
// (BenchmarkAppendEventParallel, six pairs on 2 cores): with 64 callers
// the set append took 6 to 52 % more appends/s (median 15 %); with 8
// callers, whose batches hold three or four appends, no gain showed, and
// in paddock bench (8 producers) pg_stat_statements gave the set append
// more executor time per append than the single statements (about 78
// against 65 µs): its plan's fixed costs (CTEs, the window, the joins)
// are paid back only by larger batches.
const setAppendMin = 8

// setAppendSQL is appendEventSQL (with appendEventAuditSQL's audit row)
// over arrays. Parameters, one element per append: $1 agent uid, $2
// session id, $3 kind, $4 payload, $5 idempotency key (NULL: none), $6
// steer_of (NULL: none), $7 traceparent (NULL: none), $8 the notification's
// origin tag ("" none), $9 whether to insert an audit row, $10-$15 its
// token id, namespace, action, object, result and status (auditArgs). One
// row per appended event: eventCols, then its ordinal (1-based, as $1's).
var setAppendSQL = `
	WITH na AS (
		SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bigint[], $7::text[],
			$8::text[], $9::boolean[], $10::text[], $11::text[], $12::text[], $13::text[], $14::text[], $15::bigint[])
			WITH ORDINALITY AS na(agent_uid, session_id, kind, payload, idem, steer_of, traceparent, origin,
				audited, token_id, namespace, action, object, result, status, n)),
	sl AS (
		SELECT s.* FROM (SELECT na.agent_uid, na.session_id FROM na GROUP BY na.agent_uid, na.session_id
			ORDER BY na.agent_uid COLLATE "C", na.session_id COLLATE "C") k
		CROSS JOIN LATERAL (SELECT s.agent_uid, s.session_id, s.last_event_seq FROM sessions s
			WHERE s.agent_uid = k.agent_uid AND s.session_id = k.session_id AND s.status <> 'destroyed'
			FOR NO KEY UPDATE OF s) s),
	ok AS MATERIALIZED (
		SELECT na.*, sl.last_event_seq + row_number() OVER (PARTITION BY na.agent_uid, na.session_id ORDER BY na.n) AS seq
		FROM na JOIN sl ON sl.agent_uid = na.agent_uid AND sl.session_id = na.session_id
		WHERE na.idem IS NULL OR (SELECT 1 FROM actor_events e
			WHERE e.agent_uid = na.agent_uid AND e.session_id = na.session_id AND e.idempotency_key = na.idem LIMIT 1) IS NULL),
	up AS (
		UPDATE sessions s SET last_event_seq = c.seq,
			status = CASE s.status WHEN 'sleeping' THEN 'active' ELSE s.status END,
			sleep_ts = CASE s.status WHEN 'sleeping' THEN NULL ELSE s.sleep_ts END,
			sleep_reason = CASE s.status WHEN 'sleeping' THEN NULL ELSE s.sleep_reason END
		FROM (SELECT agent_uid, session_id, max(seq) AS seq FROM ok GROUP BY agent_uid, session_id) c
		WHERE s.agent_uid = c.agent_uid AND s.session_id = c.session_id),
	now AS (SELECT clock_timestamp() AS t),
	ins AS (
		INSERT INTO actor_events (agent_uid, session_id, seq, kind, payload, idempotency_key,
			next_attempt_at, accepted_at, steer_of, traceparent)
		SELECT ok.agent_uid, ok.session_id, ok.seq, ok.kind, ok.payload, ok.idem, now.t, now.t, ok.steer_of, ok.traceparent
		FROM ok, now
		RETURNING *),
	aud AS (
		INSERT INTO audit_log (token_id, namespace, action, object, result, status)
		SELECT ok.token_id, ok.namespace, ok.action, ok.object, ok.result, ok.status FROM ok WHERE ok.audited)
	SELECT ` + eventCols + `, ord FROM (SELECT ins.*, ok.n AS ord, ok.origin AS origin_tag FROM ins
		JOIN ok ON ok.agent_uid = ins.agent_uid AND ok.session_id = ins.session_id AND ok.seq = ins.seq) x,
	LATERAL (SELECT pg_notify('` + notifyChannel + `', CASE WHEN x.origin_tag = '' THEN ''
		ELSE x.origin_tag || ':' || x.seq || ':' END || x.agent_uid || '/' || x.session_id)) n
	ORDER BY ord`

// queueSetAppends queues reqs (an acceptance batch, sorted by session:
// live) with their appends as one set append and its audit rows as their
// own statements, and reports true; it queues nothing and reports false
// when the batch holds fewer than setAppendMin appends to send. An append
// that repeats an idempotency key of an earlier one of the batch, in the
// same session, is answered solo without being sent.
func queueSetAppends(b *pgx.Batch, reqs []groupItem) bool {
	var appends, rest []*groupReq[appendIn, appendRes]
	type idemKey struct {
		key  store.ActorKey
		idem string
	}
	seen := map[idemKey]bool{}
	for _, r := range reqs {
		a, ok := r.(*groupReq[appendIn, appendRes])
		if !ok {
			return false
		}
		if a.in.audit != nil {
			rest = append(rest, a)
			continue
		}
		if k := (idemKey{a.in.key, a.in.ne.idempotencyKey}); k.idem != "" {
			if seen[k] {
				rest = append(rest, a) // answered solo below
				continue
			}
			seen[k] = true
		}
		appends = append(appends, a)
	}
	if len(appends) < setAppendMin {
		return false
	}
	queueSetAppend(b, appends)
	for _, r := range rest {
		if r.in.audit != nil {
			r.queue(b)
		} else {
			r.answer = func() appendRes { return appendRes{solo: true} }
		}
	}
	return true
}

// queueSetAppend queues setAppendSQL for appends and sets each one's
// answer: its event, or solo when the statement appended nothing for it.
func queueSetAppend(b *pgx.Batch, appends []*groupReq[appendIn, appendRes]) {
	n := len(appends)
	agents, sessions, kinds, payloads := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	idems, traceparents := make([]*string, n), make([]*string, n)
	steerOf := make([]*int64, n)
	origins := make([]string, n)
	audited := make([]bool, n)
	tokens, namespaces, actions, objects, results := make([]string, n), make([]string, n), make([]string, n),
		make([]string, n), make([]string, n)
	statuses := make([]int64, n) // as auditArgs: one out of integer's range fails the statement, not wraps
	for k, a := range appends {
		in := a.in
		agents[k], sessions[k], kinds[k], payloads[k] = in.key.AgentUID, in.key.SessionID, in.ne.kind, in.ne.payload
		idems[k], traceparents[k] = nullString(in.ne.idempotencyKey), nullString(in.ne.traceparent)
		if in.ne.steerOf != 0 {
			steerOf[k] = &in.ne.steerOf
		}
		origins[k] = in.ne.origin
		if au := in.eventAudit; au != nil {
			audited[k] = true
			tokens[k], namespaces[k], actions[k], objects[k], results[k] = au.TokenID, au.Namespace, au.Action, au.Object, au.Result
			statuses[k] = int64(au.Status)
		}
	}
	events := make([]*store.Event, n)
	b.Queue(setAppendSQL, agents, sessions, kinds, payloads, idems, steerOf, traceparents, origins,
		audited, tokens, namespaces, actions, objects, results, statuses).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			var ord int64
			e, err := scanEvent(rows, &ord)
			if err != nil {
				return err
			}
			if k := int(ord - 1); k >= 0 && k < n {
				events[k] = &e
			}
		}
		return rows.Err()
	})
	for k, a := range appends {
		a.answer = func() appendRes {
			if events[k] == nil {
				return appendRes{solo: true}
			}
			return appendRes{e: *events[k], created: true}
		}
	}
}
