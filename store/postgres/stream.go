package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

// frameInsert is the statement that appends one frame to a session stream:
// it raises the session's stream_heads row (created with the first frame)
// and inserts the frame with the new Seq, returning seq and created_at.
// The head's row lock, held to commit, makes Seq gap-free and frames
// visible in Seq order; every transaction takes it last (migration 00007).
// Parameters: $1 agent uid, $2 session id, $3 kind, $4 event id, $5 actor
// epoch; attempt and body are SQL expressions (over those and further
// parameters) that must not be NULL.
func frameInsert(attempt, body string) string {
	return `
		WITH ` + frameHeadCTE(`VALUES ($1, $2, 1)`) + `
		` + frameRowInsert(`$1, $2`, `$3::text`, `$4::bigint`, `$5::bigint`, attempt, body, "h") + `
		RETURNING seq, created_at`
}

// frameHeadCTE is the CTE h of a frame's statement: the session's stream
// head raised by one, or created at 1 with the first frame, for each row
// of rows ((agent_uid, session_id, 1): VALUES or a query); it returns
// last_seq, the frame's Seq.
func frameHeadCTE(rows string) string {
	return `h AS (
			INSERT INTO stream_heads AS sh (agent_uid, session_id, last_seq) ` + rows + `
			ON CONFLICT (agent_uid, session_id) DO UPDATE SET last_seq = sh.last_seq + 1
			RETURNING last_seq)`
}

// frameRowInsert inserts the frame numbered h.last_seq; key is the
// (agent_uid, session_id) pair and the others the columns' SQL
// expressions over from (which includes h).
func frameRowInsert(key, kind, eventID, epoch, attempt, body, from string) string {
	return `INSERT INTO stream_frames (agent_uid, session_id, seq, kind, event_id, actor_epoch, attempt, body)
		SELECT ` + key + `, h.last_seq, ` + kind + `, ` + eventID + `, ` + epoch + `, ` + attempt + `, ` + body + ` FROM ` + from
}

// turnCommittedBody is store.TurnCommittedBody of the turns row t (an
// alias in scope) with messages msgs (an SQL expression of JSON text),
// encoded as Go does: the turn.committed frame's body (commitWritesSQL).
func turnCommittedBody(msgs string) string {
	return `'{"turn_no":' || t.turn_no || ',"outcome":' || to_json(t.outcome)::text || ',"messages":' || ` + msgs + `::text
			|| ',"usage":{"input_tokens":' || t.input_tokens || ',"output_tokens":' || t.output_tokens || '}}'`
}

// eventAttempt is the attempt of the turn of event $4: its attempts + 1.
const eventAttempt = `(SELECT attempts + 1 FROM actor_events WHERE event_id = $4::bigint)`

// turnStartedBody is store.TurnStartedBody of event ev (an SQL
// expression), encoded as Go does.
func turnStartedBody(ev string) string {
	return `(SELECT '{"event_kind":' || to_json(kind)::text || '}' FROM actor_events WHERE event_id = ` + ev + `)`
}

var (
	// frameSQL appends a frame with attempt $6 and body $7 (frameArgs).
	frameSQL = frameInsert(`$6::integer`, `$7::text`)
	// turnStartedSQL appends event $4's turn.started (frameArgs without
	// attempt and body).
	turnStartedSQL = frameInsert(eventAttempt, turnStartedBody(`$4::bigint`))
	// turnEndedSQL appends an attempt-ended frame (body $6) of event $4's
	// attempt in flight (its attempts unchanged by the caller).
	turnEndedSQL = frameInsert(eventAttempt, `$6::text`)
)

// frameArgs are frameSQL's parameters.
func frameArgs(key store.ActorKey, kind string, eventID, epoch int64, attempt int, body json.RawMessage) []any {
	return []any{key.AgentUID, key.SessionID, kind, eventID, epoch, attempt, string(body)}
}

// queueFrame queues frameSQL in a batch.
func queueFrame(b *pgx.Batch, key store.ActorKey, kind string, eventID, epoch int64, attempt int, body json.RawMessage) {
	b.Queue(frameSQL, frameArgs(key, kind, eventID, epoch, attempt, body)...)
}

// waitCols are the columns scanWait reads, in its order.
const waitCols = `id, agent_uid, session_id, wait_id, kind, event_id, wait_for, data, status, call_seq, call_digest,
	resolution, created_at, expires_at, closed_at`

func scanWait(row pgx.Row) (store.Wait, int64, error) {
	var w store.Wait
	var id int64
	var data, resolution *string
	err := row.Scan(&id, &w.AgentUID, &w.SessionID, &w.ID, &w.Kind, &w.EventID, &w.For, &data, &w.Status,
		&w.CallSeq, &w.CallDigest, &resolution, &w.CreatedAt, &w.ExpiresAt, &w.ClosedAt)
	if data != nil {
		w.Data = json.RawMessage(*data)
	}
	if resolution != nil {
		w.Resolution = json.RawMessage(*resolution)
	}
	w.CreatedAt, w.ExpiresAt, w.ClosedAt = utc(w.CreatedAt), utcPtr(w.ExpiresAt), utcPtr(w.ClosedAt)
	return w, id, err
}

// insertWaitSQL opens a wait; no row means the session used the id
// before. Parameters: see queueInsertWait.
const insertWaitSQL = `
	WITH now AS (SELECT clock_timestamp() AS t)
	INSERT INTO waits (agent_uid, session_id, wait_id, kind, event_id, wait_for, data, call_seq, call_digest,
		created_at, expires_at)
	SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, now.t,
		CASE WHEN $10::bigint > 0 THEN now.t + $10::bigint * interval '1 microsecond' END
	FROM now
	ON CONFLICT (agent_uid, session_id, wait_id) DO NOTHING
	RETURNING ` + waitCols

// queueInsertWait queues the insert of a wait of kind for an event; its
// callback stores the row in *w, or fails with store.ErrConflict when the
// session used the id before (the batch must not carry COMMIT).
func queueInsertWait(b *pgx.Batch, key store.ActorKey, kind store.WaitKind, eventID int64, p *store.WaitParams, w *store.Wait) {
	b.Queue(insertWaitSQL, key.AgentUID, key.SessionID, p.ID, string(kind), eventID, p.For, nullString(string(p.Data)),
		p.CallSeq, p.CallDigest, micros(p.Timeout)).QueryRow(func(row pgx.Row) (err error) {
		*w, _, err = scanWait(row)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("wait %q of %s: the session used this id before: %w", p.ID, key, store.ErrConflict)
		}
		return err
	})
}

// guardedFrameSQL appends a frame of kind under hostCallGuard (refArgs,
// then $8 attempt, $9 body): no row when the guard refuses, and then the
// head is not raised either.
func guardedFrameSQL(kind string) string {
	return `
	WITH h AS (
		INSERT INTO stream_heads AS sh (agent_uid, session_id, last_seq)
		SELECT $2, $3, 1 WHERE ` + hostCallGuard + `
		ON CONFLICT (agent_uid, session_id) DO UPDATE SET last_seq = sh.last_seq + 1
		RETURNING last_seq)
	INSERT INTO stream_frames (agent_uid, session_id, seq, kind, event_id, actor_epoch, attempt, body)
	SELECT $2, $3, h.last_seq, '` + kind + `', $6, $5, $8::integer, $9::text FROM h
	RETURNING seq, created_at`
}

var (
	// appendChunksSQL appends a chunk frame under hostCallGuard
	// (guardedFrameSQL).
	appendChunksSQL = guardedFrameSQL(store.FrameChunk)
	// restartRetryingSQL appends RestartStream's turn.retrying under
	// hostCallGuard (guardedFrameSQL).
	restartRetryingSQL = guardedFrameSQL(store.FrameTurnRetrying)
	// restartStartedSQL appends RestartStream's turn.started of event $4
	// with attempt $6 (frameArgs without body): store.TurnStartedBody,
	// encoded as Go does.
	restartStartedSQL = frameInsert(`$6::integer`,
		`(SELECT '{"event_kind":' || to_json(kind)::text || '}' FROM actor_events WHERE event_id = $4::bigint)`)
)

// AppendChunks appends one chunk frame under the attempt's fences (those
// of RecordHostCall); see store.Store. One pipelined transaction, two
// round trips as RecordHostCall: BEGIN, the activation's row lock and the
// guarded insert; then COMMIT, or, refused, the reads that explain it.
func (s *Store) AppendChunks(ctx context.Context, p store.AppendChunksParams) (store.Frame, error) {
	body, err := store.CheckChunks(p)
	if err != nil {
		return store.Frame{}, fmt.Errorf("store/postgres: append chunks: %w", err)
	}
	ref := p.Ref
	f := store.Frame{ActorKey: store.KeyOf(ref), Kind: store.FrameChunk, EventID: ref.ActorEventID,
		ActorEpoch: ref.ActorEpoch, Attempt: p.Attempt, Body: body}
	err = s.pipeTxDo(ctx, "append chunks", func(ctx context.Context, tx txConn) error {
		return insertGuardedFrame(ctx, tx, ref, appendChunksSQL, refArgs(ref, p.Attempt, string(body)), &f)
	})
	if err != nil {
		return store.Frame{}, err
	}
	f.CreatedAt = utc(f.CreatedAt)
	return f, nil
}

// insertGuardedFrame runs, in tx, the activation's row lock and sql (an
// INSERT of one frame guarded by the fences of a commit, returning its seq
// and created_at into f) in one round trip; a frame the guard refused is
// explained by classify (*store.FenceError).
func insertGuardedFrame(ctx context.Context, tx txConn, ref abi.TurnRef, sql string, args []any, f *store.Frame) error {
	inserted := false
	b := &pgx.Batch{}
	b.Queue(lockActivationSQL, ref.ActivationUID)
	b.Queue(sql, args...).QueryRow(func(row pgx.Row) error {
		err := row.Scan(&f.Seq, &f.CreatedAt)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil // the fence refused: classified below
		}
		inserted = err == nil
		return err
	})
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return err
	}
	if !inserted {
		return classify(ctx, tx, ref, store.FenceCommit, false)
	}
	return nil
}

// RestartStream appends turn.retrying and turn.started of the attempt
// under the fences of AppendChunks, in one transaction; see store.Store.
// Two round trips: BEGIN, the activation's row lock and the guarded
// turn.retrying; then turn.started with COMMIT, or, refused, the reads
// that explain it.
func (s *Store) RestartStream(ctx context.Context, p store.RestartStreamParams) ([]store.Frame, error) {
	body, err := store.CheckRestart(p)
	if err != nil {
		return nil, fmt.Errorf("store/postgres: restart stream: %w", err)
	}
	ref := p.Ref
	key := store.KeyOf(ref)
	var retrying, started store.Frame
	err = s.pipeTxDo(ctx, "restart stream", func(ctx context.Context, tx txConn) error {
		retrying = store.Frame{ActorKey: key, Kind: store.FrameTurnRetrying, EventID: ref.ActorEventID,
			ActorEpoch: ref.ActorEpoch, Attempt: p.Attempt, Body: body}
		started = store.Frame{ActorKey: key, Kind: store.FrameTurnStarted, EventID: ref.ActorEventID,
			ActorEpoch: ref.ActorEpoch, Attempt: p.Attempt}
		if err := insertGuardedFrame(ctx, tx, ref, restartRetryingSQL, refArgs(ref, p.Attempt, string(body)), &retrying); err != nil {
			return err
		}
		b := &pgx.Batch{}
		b.Queue(restartStartedSQL, key.AgentUID, key.SessionID, store.FrameTurnStarted, ref.ActorEventID, ref.ActorEpoch,
			p.Attempt).QueryRow(func(row pgx.Row) error {
			return row.Scan(&started.Seq, &started.CreatedAt)
		})
		b.Queue(`SELECT kind FROM actor_events WHERE event_id = $1`, ref.ActorEventID).QueryRow(func(row pgx.Row) error {
			var kind string
			if err := row.Scan(&kind); err != nil {
				return err
			}
			started.Body = store.MustBody(store.TurnStartedBody{EventKind: kind})
			return nil
		})
		return tx.(*pipeTx).SendBatchCommit(ctx, b).Close()
	})
	if err != nil {
		return nil, err
	}
	retrying.CreatedAt, started.CreatedAt = utc(retrying.CreatedAt), utc(started.CreatedAt)
	return []store.Frame{retrying, started}, nil
}

// StreamFrames pages a session's stream by Seq, head, oldest and frames
// from one statement (one snapshot); see store.Store.
func (s *Store) StreamFrames(ctx context.Context, p store.StreamFramesParams) (store.StreamPage, error) {
	var pg store.StreamPage
	err := s.call(ctx, "stream frames", func(ctx context.Context) error {
		pg = store.StreamPage{}
		rows, err := s.pool.Query(ctx, `
			WITH hd AS (
				SELECT (SELECT last_seq FROM stream_heads WHERE agent_uid = $1 AND session_id = $2) AS head,
					(SELECT min(seq) FROM stream_frames WHERE agent_uid = $1 AND session_id = $2) AS oldest
				FROM sessions WHERE agent_uid = $1 AND session_id = $2)
			SELECT coalesce(hd.head, 0), hd.oldest, f.seq, f.kind, f.event_id, f.actor_epoch, f.attempt, f.body, f.created_at
			FROM hd LEFT JOIN LATERAL (
				SELECT seq, kind, event_id, actor_epoch, attempt, body, created_at FROM stream_frames
				WHERE agent_uid = $1 AND session_id = $2 AND seq > $3
				ORDER BY seq LIMIT $4) f ON true
			ORDER BY f.seq`, p.Key.AgentUID, p.Key.SessionID, p.After, store.PageLimit(p.Limit))
		if err != nil {
			return err
		}
		defer rows.Close()
		found := false
		for rows.Next() {
			found = true
			var oldest, seq, eventID, epoch *int64
			var kind, body *string
			var attempt *int
			var created *time.Time
			if err := rows.Scan(&pg.Head, &oldest, &seq, &kind, &eventID, &epoch, &attempt, &body, &created); err != nil {
				return err
			}
			pg.Oldest = pg.Head + 1
			if oldest != nil {
				pg.Oldest = *oldest
			}
			if seq == nil {
				continue // no frame after p.After
			}
			pg.Frames = append(pg.Frames, store.Frame{ActorKey: p.Key, Seq: *seq, Kind: *kind, EventID: *eventID,
				ActorEpoch: *epoch, Attempt: *attempt, Body: json.RawMessage(*body), CreatedAt: utc(*created)})
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if !found {
			return fmt.Errorf("session %s: %w", p.Key, store.ErrNotFound)
		}
		return nil
	})
	return pg, err
}

// StreamHeads returns the last frame Seq of each key that has one, in one
// statement; see store.Store.
func (s *Store) StreamHeads(ctx context.Context, keys []store.ActorKey) (map[store.ActorKey]int64, error) {
	out := make(map[store.ActorKey]int64, len(keys))
	if len(keys) == 0 {
		return out, nil
	}
	agents, sessions := make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		agents[i], sessions[i] = k.AgentUID, k.SessionID
	}
	err := s.call(ctx, "stream heads", func(ctx context.Context) error {
		rows, err := s.pool.Query(ctx, `
			SELECT h.agent_uid, h.session_id, h.last_seq FROM stream_heads h
			WHERE (h.agent_uid, h.session_id) IN (SELECT * FROM unnest($1::text[], $2::text[]))`, agents, sessions)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var k store.ActorKey
			var head int64
			if err := rows.Scan(&k.AgentUID, &k.SessionID, &head); err != nil {
				return err
			}
			out[k] = head
		}
		return rows.Err()
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// CompactStream deletes up to p.Limit frames created before p.Before whose
// event is not open, in one statement; see store.Store.
func (s *Store) CompactStream(ctx context.Context, p store.CompactStreamParams) (int, error) {
	var n int64
	err := s.call(ctx, "compact stream", func(ctx context.Context) error {
		tag, err := s.pool.Exec(ctx, `
			DELETE FROM stream_frames
			WHERE (agent_uid, session_id, seq) IN (
				SELECT f.agent_uid, f.session_id, f.seq FROM stream_frames f
				WHERE f.created_at < $1
				  AND NOT EXISTS (SELECT 1 FROM actor_events e WHERE e.event_id = f.event_id AND e.status = 'open')
				LIMIT $2
				FOR UPDATE SKIP LOCKED)`, p.Before, store.PageLimit(p.Limit))
		n = tag.RowsAffected()
		return err
	})
	return int(n), err
}

// closeWait closes the open wait w (read under its session's row lock,
// which the caller holds) as status — resolved with resolution, or expired
// — by compare-and-set, and does what its kind does: a wait appends its
// event (wait.resolved or wait.expired, which wakes the session and
// notifies), an approval releases its held event (due now), wakes the
// session and notifies; then the wait.resolved frame (last: the lock
// order). ok is false when the wait was no longer open. Two round trips.
func closeWait(ctx context.Context, tx pgx.Tx, w store.Wait, status store.WaitStatus, resolution json.RawMessage, traceparent string) (store.Wait, bool, error) {
	var res *string
	if status == store.WaitResolved {
		r := string(resolution)
		res = &r
	}
	closed, _, err := scanWait(tx.QueryRow(ctx, `
		UPDATE waits SET status = $1, resolution = $2, closed_at = clock_timestamp()
		WHERE agent_uid = $3 AND session_id = $4 AND wait_id = $5 AND status = 'open'
		RETURNING `+waitCols, string(status), res, w.AgentUID, w.SessionID, w.ID))
	if errors.Is(err, pgx.ErrNoRows) {
		return w, false, nil
	}
	if err != nil {
		return w, false, err
	}
	key := closed.ActorKey
	b := &pgx.Batch{}
	switch closed.Kind {
	case store.WaitKindWait:
		ne := newEvent{kind: store.WaitResolvedEventKind(status), payload: string(store.WaitEventPayload(closed)),
			idempotencyKey: store.WaitIdempotencyKey(closed.ID), traceparent: traceparent}
		b.Queue(insertEventSQL, insertEventArgs(key, ne)...).QueryRow(func(row pgx.Row) error {
			// The key is the wait's own (ids are unique per session); should
			// a client have sent an event with it, that event stands for
			// this one (nothing is appended) and the session is woken below.
			_, _, err := insertResult(scanEvent(row))
			return err
		})
		queueWake(b, key)
		queueNotify(b, key)
	case store.WaitKindApproval:
		b.Queue(`UPDATE actor_events SET next_attempt_at = clock_timestamp()
			WHERE `+byID("", "$1", "agent_uid = $2 AND session_id = $3 AND status = 'open'"),
			closed.EventID, key.AgentUID, key.SessionID)
		queueWake(b, key)
		queueNotify(b, key)
	}
	queueFrame(b, key, store.FrameWaitResolved, 0, 0, 0, store.MustBody(closed))
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return closed, false, err
	}
	return closed, true, nil
}

// queueWake queues the wake of a sleeping session (a no-op otherwise).
func queueWake(b *pgx.Batch, key store.ActorKey) {
	b.Queue(`UPDATE sessions SET status = 'active', sleep_ts = NULL, sleep_reason = NULL
		WHERE agent_uid = $1 AND session_id = $2 AND status = 'sleeping'`, key.AgentUID, key.SessionID)
}

// ResolveWait resolves an open wait in one transaction; see store.Store.
// Lock order: the session row, then the wait's (as DestroySession).
func (s *Store) ResolveWait(ctx context.Context, p store.ResolveWaitParams) (store.Wait, error) {
	var w store.Wait
	err := s.tx(ctx, "resolve wait", func(ctx context.Context, tx pgx.Tx) error {
		if err := sessionWritable(ctx, tx, p.Key); err != nil {
			return err
		}
		var err error
		w, _, err = scanWait(tx.QueryRow(ctx, `SELECT `+waitCols+` FROM waits
			WHERE agent_uid = $1 AND session_id = $2 AND wait_id = $3 FOR UPDATE`, p.Key.AgentUID, p.Key.SessionID, p.WaitID))
		if err != nil {
			return fmt.Errorf("wait %q of %s: %w", p.WaitID, p.Key, notFound(err))
		}
		if w.Status != store.WaitOpen {
			return &store.WaitClosedError{WaitID: w.ID, Status: w.Status}
		}
		resolution, err := store.CheckResolution(w.Kind, p.Resolution)
		if err != nil {
			return err
		}
		var ok bool
		if w, ok, err = closeWait(ctx, tx, w, store.WaitResolved, resolution, p.Traceparent); err != nil {
			return err
		} else if !ok {
			return fmt.Errorf("wait %q of %s closed under its row lock: %w", p.WaitID, p.Key, errLockRace)
		}
		return nil
	})
	if err != nil {
		return store.Wait{}, err
	}
	return w, nil
}

// GetWait returns one wait, or store.ErrNotFound.
func (s *Store) GetWait(ctx context.Context, key store.ActorKey, waitID string) (store.Wait, error) {
	var w store.Wait
	err := s.call(ctx, "get wait", func(ctx context.Context) error {
		var err error
		w, _, err = scanWait(s.pool.QueryRow(ctx, `SELECT `+waitCols+` FROM waits
			WHERE agent_uid = $1 AND session_id = $2 AND wait_id = $3`, key.AgentUID, key.SessionID, waitID))
		if err != nil {
			return fmt.Errorf("wait %q of %s: %w", waitID, key, notFound(err))
		}
		return nil
	})
	return w, err
}

// ListWaits pages an agent's or a session's waits by row id; see
// store.Store.
func (s *Store) ListWaits(ctx context.Context, p store.ListWaitsParams) (store.WaitPage, error) {
	pg := store.WaitPage{NextAfter: p.After}
	err := s.call(ctx, "list waits", func(ctx context.Context) error {
		pg = store.WaitPage{NextAfter: p.After}
		rows, err := s.pool.Query(ctx, `SELECT `+waitCols+` FROM waits
			WHERE agent_uid = $1 AND ($2 = '' OR session_id = $2) AND ($3 = '' OR status = $3) AND id > $4
			ORDER BY id LIMIT $5`, p.AgentUID, p.SessionID, string(p.Status), p.After, store.PageLimit(p.Limit))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			w, id, err := scanWait(rows)
			if err != nil {
				return err
			}
			pg.Waits = append(pg.Waits, w)
			pg.NextAfter = id
		}
		return rows.Err()
	})
	return pg, err
}

// ExpireDueWaits expires up to limit due open waits (DB clock) in one
// transaction; see store.Store. It locks the sessions of the due waits
// first (sorted by key; SKIP LOCKED: a session another transaction holds
// is left to the next call), then expires each wait by compare-and-set
// (closeWait), so that a racing ResolveWait or expiry on another host
// either came first (the CAS matches nothing) or waits.
func (s *Store) ExpireDueWaits(ctx context.Context, limit int) ([]store.ActorKey, error) {
	var out []store.ActorKey
	err := s.tx(ctx, "expire due waits", func(ctx context.Context, tx pgx.Tx) error {
		out = nil
		rows, err := tx.Query(ctx, `
			WITH w AS (
				SELECT `+waitCols+` FROM waits
				WHERE status = 'open' AND expires_at <= clock_timestamp()
				ORDER BY expires_at, id LIMIT $1)
			SELECT w.* FROM w JOIN sessions s ON s.agent_uid = w.agent_uid AND s.session_id = w.session_id
			WHERE s.status <> 'destroyed'
			ORDER BY w.agent_uid, w.session_id, w.id
			FOR NO KEY UPDATE OF s SKIP LOCKED`, store.PageLimit(limit))
		if err != nil {
			return err
		}
		due, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Wait, error) {
			w, _, err := scanWait(r)
			return w, err
		})
		if err != nil {
			return err
		}
		for _, w := range due {
			_, ok, err := closeWait(ctx, tx, w, store.WaitExpired, nil, "")
			if err != nil {
				return err
			}
			if ok && (len(out) == 0 || out[len(out)-1] != w.ActorKey) {
				out = append(out, w.ActorKey)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// holdEvent ends an attempt, after FailAttempt's fences passed (the
// activation's row lock held), as a wait of kind approval: the event stays
// open, held (next_attempt_at = store.HeldUntil) with its attempts
// unchanged, the session sleeps (SleepReasonApproval), the wait is opened,
// and the frames turn.retrying (reason approval) and wait.opened are
// appended — in the driver's lock order (the event, the session, the wait,
// the stream head). Two round trips.
func holdEvent(ctx context.Context, tx pgx.Tx, ref abi.TurnRef, hold *store.WaitParams) (store.FailResult, error) {
	key := store.KeyOf(ref)
	fr := store.FailResult{EventID: ref.ActorEventID, NextAttemptAt: store.HeldUntil}
	var w store.Wait
	b := &pgx.Batch{}
	b.Queue(`UPDATE actor_events SET next_attempt_at = $1
		WHERE `+byID("", "$2", "agent_uid = $3 AND session_id = $4 AND status = 'open'")+`
		RETURNING attempts`, store.HeldUntil, ref.ActorEventID, ref.AgentUID, ref.SessionID).QueryRow(func(row pgx.Row) error {
		err := row.Scan(&fr.Attempts)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("event %d changed under the activation lock: %w", ref.ActorEventID, errLockRace)
		}
		return err
	})
	b.Queue(`
		UPDATE sessions SET status = 'sleeping',
			sleep_ts = CASE WHEN status = 'active' THEN clock_timestamp() ELSE sleep_ts END,
			sleep_reason = $3, pending_since = NULL
		WHERE agent_uid = $1 AND session_id = $2 AND status <> 'destroyed'
		RETURNING status`, key.AgentUID, key.SessionID, store.SleepReasonApproval).QueryRow(func(row pgx.Row) error {
		return row.Scan(&fr.SessionStatus)
	})
	queueInsertWait(b, key, store.WaitKindApproval, ref.ActorEventID, hold, &w)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fr, err
	}
	attempt := fr.Attempts + 1
	kind, body := store.HoldFrame()
	b = &pgx.Batch{}
	queueFrame(b, key, kind, ref.ActorEventID, ref.ActorEpoch, attempt, store.MustBody(body))
	queueFrame(b, key, store.FrameWaitOpened, ref.ActorEventID, ref.ActorEpoch, attempt, store.MustBody(w))
	return fr, tx.SendBatch(ctx, b).Close()
}
