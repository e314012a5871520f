package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/paddock-dev/paddock/store"
)

// appendFrame appends a frame to the session stream inside tx: it raises
// sessions.last_frame_seq and inserts the frame with that Seq. The single
// writer makes Seq gap-free and frames visible in Seq order.
func appendFrame(tx *txn, key store.ActorKey, kind string, eventID, epoch int64, attempt int, body json.RawMessage) (store.Frame, error) {
	f := store.Frame{ActorKey: key, Kind: kind, EventID: eventID, ActorEpoch: epoch, Attempt: attempt, Body: body}
	if err := tx.queryRow(`
		UPDATE sessions SET last_frame_seq = last_frame_seq + 1 WHERE agent_uid = ? AND session_id = ?
		RETURNING last_frame_seq`, key.AgentUID, key.SessionID).Scan(&f.Seq); err != nil {
		return f, fmt.Errorf("frame counter of %s: %w", key, notFound(err))
	}
	var created int64
	if err := tx.queryRow(`
		INSERT INTO stream_frames (agent_uid, session_id, seq, kind, event_id, actor_epoch, attempt, body, created_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, `+nowMS+`)
		RETURNING created_at`,
		key.AgentUID, key.SessionID, f.Seq, kind, eventID, epoch, attempt, string(body)).Scan(&created); err != nil {
		return f, err
	}
	f.CreatedAt = msTime(created)
	return f, nil
}

// waitCols are the columns scanWait reads, in its order.
const waitCols = `id, agent_uid, session_id, wait_id, kind, event_id, wait_for, data, status, call_seq, call_digest,
	resolution, created_at, expires_at, closed_at`

func scanWait(sc scanner) (store.Wait, int64, error) {
	var w store.Wait
	var id, created int64
	var data, resolution sql.NullString
	var expires, closed sql.NullInt64
	err := sc.Scan(&id, &w.AgentUID, &w.SessionID, &w.ID, &w.Kind, &w.EventID, &w.For, &data, &w.Status,
		&w.CallSeq, &w.CallDigest, &resolution, &created, &expires, &closed)
	if data.Valid {
		w.Data = json.RawMessage(data.String)
	}
	if resolution.Valid {
		w.Resolution = json.RawMessage(resolution.String)
	}
	w.CreatedAt, w.ExpiresAt, w.ClosedAt = msTime(created), msPtr(expires), msPtr(closed)
	return w, id, err
}

// openWait inserts a wait of kind for an event inside tx and appends its
// wait.opened frame (body: the wait) under the turn's epoch and attempt. A
// wait id the session already used is store.ErrConflict.
func openWait(tx *txn, key store.ActorKey, kind store.WaitKind, eventID, epoch int64, attempt int, p *store.WaitParams) error {
	var expires sql.NullInt64
	if ms := p.TimeoutMillis(); ms > 0 {
		expires = sql.NullInt64{Int64: ms, Valid: true}
	}
	w, _, err := scanWait(tx.queryRow(`
		INSERT INTO waits (agent_uid, session_id, wait_id, kind, event_id, wait_for, data, status, call_seq, call_digest,
			created_at, expires_at)
		VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'open', ?8, ?9, `+nowMS+`, `+nowMS+` + ?10)
		ON CONFLICT (agent_uid, session_id, wait_id) DO NOTHING
		RETURNING `+waitCols,
		key.AgentUID, key.SessionID, p.ID, string(kind), eventID, p.For, nullString(string(p.Data)),
		p.CallSeq, p.CallDigest, expires))
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("wait %q of %s: the session used this id before: %w", p.ID, key, store.ErrConflict)
	}
	if err != nil {
		return err
	}
	_, err = appendFrame(tx, key, store.FrameWaitOpened, eventID, epoch, attempt, store.MustBody(w))
	return err
}

// wake moves a sleeping session to active inside tx (a no-op otherwise).
func wake(tx *txn, key store.ActorKey) error {
	_, err := tx.exec(`
		UPDATE sessions SET status = 'active', sleep_ts = NULL, sleep_reason = NULL
		WHERE agent_uid = ? AND session_id = ? AND status = 'sleeping'`, key.AgentUID, key.SessionID)
	return err
}

// closeWait closes the open wait w (read in tx) as status — resolved with
// resolution, or expired — by compare-and-set, appends its wait.resolved
// frame, and does what its kind does: a wait appends its event (kind
// wait.resolved or wait.expired), an approval releases its held event (due
// now); either wakes a sleeping session. ok is false when the wait was
// no longer open.
func closeWait(tx *txn, w store.Wait, status store.WaitStatus, resolution json.RawMessage, traceparent string) (store.Wait, bool, error) {
	var res sql.NullString
	if status == store.WaitResolved {
		res = sql.NullString{String: string(resolution), Valid: true}
	}
	closed, _, err := scanWait(tx.queryRow(`
		UPDATE waits SET status = ?1, resolution = ?2, closed_at = `+nowMS+`
		WHERE agent_uid = ?3 AND session_id = ?4 AND wait_id = ?5 AND status = 'open'
		RETURNING `+waitCols, string(status), res, w.AgentUID, w.SessionID, w.ID))
	if errors.Is(err, sql.ErrNoRows) {
		return w, false, nil
	}
	if err != nil {
		return w, false, err
	}
	if _, err := appendFrame(tx, closed.ActorKey, store.FrameWaitResolved, 0, 0, 0, store.MustBody(closed)); err != nil {
		return closed, false, err
	}
	switch closed.Kind {
	case store.WaitKindWait:
		// insertEvent wakes the session. The key is the wait's own (ids are
		// unique per session); should a client have sent an event with it,
		// that event stands for this one and the session is woken anyway.
		if _, _, err := insertTracedEvent(tx, closed.ActorKey, store.WaitResolvedEventKind(status),
			string(store.WaitEventPayload(closed)), store.WaitIdempotencyKey(closed.ID), traceparent); err != nil {
			return closed, false, err
		}
		if err := wake(tx, closed.ActorKey); err != nil {
			return closed, false, err
		}
	case store.WaitKindApproval:
		if _, err := tx.exec(`
			UPDATE actor_events SET next_attempt_at = `+nowMS+`
			WHERE event_id = ? AND agent_uid = ? AND session_id = ? AND status = 'open'`,
			closed.EventID, closed.AgentUID, closed.SessionID); err != nil {
			return closed, false, err
		}
		if err := wake(tx, closed.ActorKey); err != nil {
			return closed, false, err
		}
	}
	return closed, true, nil
}

// AppendChunks appends one chunk frame under the attempt's fences (those
// of RecordHostCall: hostCallGuard); see store.Store.
func (s *Store) AppendChunks(ctx context.Context, p store.AppendChunksParams) (store.Frame, error) {
	body, err := store.CheckChunks(p)
	if err != nil {
		return store.Frame{}, fmt.Errorf("store/sqlite: append chunks: %w", err)
	}
	ref := p.Ref
	var f store.Frame
	err = s.write(ctx, "append chunks", func(tx *txn) error {
		// The write lock is held from here: the guard reads what the
		// frame write below sees.
		var ok bool
		if err := tx.queryRow(`SELECT `+hostCallGuard, hostCallRefArgs(ref)...).Scan(&ok); err != nil {
			return err
		}
		if !ok {
			return classify(tx, ref, store.FenceCommit)
		}
		var err error
		f, err = appendFrame(tx, store.KeyOf(ref), store.FrameChunk, ref.ActorEventID, ref.ActorEpoch, p.Attempt, body)
		return err
	})
	return f, err
}

// RestartStream appends turn.retrying and turn.started of the attempt
// under the fences of AppendChunks, in one transaction; see store.Store.
func (s *Store) RestartStream(ctx context.Context, p store.RestartStreamParams) ([]store.Frame, error) {
	retrying, err := store.CheckRestart(p)
	if err != nil {
		return nil, fmt.Errorf("store/sqlite: restart stream: %w", err)
	}
	ref := p.Ref
	var out []store.Frame
	err = s.write(ctx, "restart stream", func(tx *txn) error {
		out = nil
		var ok bool
		if err := tx.queryRow(`SELECT `+hostCallGuard, hostCallRefArgs(ref)...).Scan(&ok); err != nil {
			return err
		}
		if !ok {
			return classify(tx, ref, store.FenceCommit)
		}
		var kind string
		if err := tx.queryRow(`SELECT kind FROM actor_events WHERE event_id = ?`, ref.ActorEventID).Scan(&kind); err != nil {
			return fmt.Errorf("event %d: %w", ref.ActorEventID, notFound(err))
		}
		key := store.KeyOf(ref)
		f, err := appendFrame(tx, key, store.FrameTurnRetrying, ref.ActorEventID, ref.ActorEpoch, p.Attempt, retrying)
		if err != nil {
			return err
		}
		out = append(out, f)
		f, err = appendFrame(tx, key, store.FrameTurnStarted, ref.ActorEventID, ref.ActorEpoch, p.Attempt,
			store.MustBody(store.TurnStartedBody{EventKind: kind}))
		if err != nil {
			return err
		}
		out = append(out, f)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// frameCols are the columns scanFrame reads, in its order.
const frameCols = `agent_uid, session_id, seq, kind, event_id, actor_epoch, attempt, body, created_at`

func scanFrame(sc scanner) (store.Frame, error) {
	var f store.Frame
	var body string
	var created int64
	err := sc.Scan(&f.AgentUID, &f.SessionID, &f.Seq, &f.Kind, &f.EventID, &f.ActorEpoch, &f.Attempt, &body, &created)
	f.Body, f.CreatedAt = json.RawMessage(body), msTime(created)
	return f, err
}

// StreamFrames pages a session's stream by Seq; see store.Store.
func (s *Store) StreamFrames(ctx context.Context, p store.StreamFramesParams) (store.StreamPage, error) {
	var pg store.StreamPage
	err := s.read(ctx, "stream frames", func(tx *txn) error {
		var oldest sql.NullInt64
		err := tx.queryRow(`
			SELECT s.last_frame_seq, (SELECT min(f.seq) FROM stream_frames f
			                          WHERE f.agent_uid = s.agent_uid AND f.session_id = s.session_id)
			FROM sessions s WHERE s.agent_uid = ? AND s.session_id = ?`,
			p.Key.AgentUID, p.Key.SessionID).Scan(&pg.Head, &oldest)
		if err != nil {
			return fmt.Errorf("session %s: %w", p.Key, notFound(err))
		}
		pg.Oldest = pg.Head + 1
		if oldest.Valid {
			pg.Oldest = oldest.Int64
		}
		rows, err := tx.query(`
			SELECT `+frameCols+` FROM stream_frames
			WHERE agent_uid = ? AND session_id = ? AND seq > ?
			ORDER BY seq LIMIT ?`, p.Key.AgentUID, p.Key.SessionID, p.After, store.PageLimit(p.Limit))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			f, err := scanFrame(rows)
			if err != nil {
				return err
			}
			pg.Frames = append(pg.Frames, f)
		}
		return rows.Err()
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
	js, err := json.Marshal(keys)
	if err != nil {
		return nil, fmt.Errorf("store/sqlite: stream heads: %w", err)
	}
	err = s.read(ctx, "stream heads", func(tx *txn) error {
		rows, err := tx.query(`
			SELECT s.agent_uid, s.session_id, s.last_frame_seq
			FROM (SELECT DISTINCT value ->> '$.agent_uid' AS agent_uid, value ->> '$.session_id' AS session_id
			      FROM json_each(?)) AS k
			JOIN sessions s ON s.agent_uid = k.agent_uid AND s.session_id = k.session_id
			WHERE s.last_frame_seq > 0`, string(js))
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

// CompactStream deletes up to p.Limit frames created before p.Before
// whose event is not open; see store.Store.
func (s *Store) CompactStream(ctx context.Context, p store.CompactStreamParams) (int, error) {
	var n int64
	err := s.write(ctx, "compact stream", func(tx *txn) error {
		res, err := tx.exec(`
			DELETE FROM stream_frames
			WHERE (agent_uid, session_id, seq) IN (
				SELECT f.agent_uid, f.session_id, f.seq FROM stream_frames f
				WHERE f.created_at < ?
				  AND NOT EXISTS (SELECT 1 FROM actor_events e WHERE e.event_id = f.event_id AND e.status = 'open')
				ORDER BY f.created_at LIMIT ?)`, p.Before.UnixMilli(), store.PageLimit(p.Limit))
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	return int(n), err
}

// getWait reads one wait, or store.ErrNotFound.
func getWait(tx *txn, key store.ActorKey, waitID string) (store.Wait, error) {
	w, _, err := scanWait(tx.queryRow(`
		SELECT `+waitCols+` FROM waits WHERE agent_uid = ? AND session_id = ? AND wait_id = ?`,
		key.AgentUID, key.SessionID, waitID))
	if err != nil {
		return w, fmt.Errorf("wait %q of %s: %w", waitID, key, notFound(err))
	}
	return w, nil
}

// ResolveWait resolves an open wait in one transaction; see store.Store.
func (s *Store) ResolveWait(ctx context.Context, p store.ResolveWaitParams) (store.Wait, error) {
	var w store.Wait
	err := s.write(ctx, "resolve wait", func(tx *txn) error {
		if _, err := sessionStatus(tx, p.Key); err != nil {
			return err
		}
		var err error
		if w, err = getWait(tx, p.Key, p.WaitID); err != nil {
			return err
		}
		if w.Status != store.WaitOpen {
			return &store.WaitClosedError{WaitID: w.ID, Status: w.Status}
		}
		resolution, err := store.CheckResolution(w.Kind, p.Resolution)
		if err != nil {
			return err
		}
		var ok bool
		if w, ok, err = closeWait(tx, w, store.WaitResolved, resolution, p.Traceparent); err != nil {
			return err
		} else if !ok {
			return errors.New("wait closed under the write lock") // unreachable: the single writer
		}
		return nil
	})
	if err != nil {
		return store.Wait{}, err
	}
	s.publish(p.Key)
	return w, nil
}

// GetWait returns one wait, or store.ErrNotFound.
func (s *Store) GetWait(ctx context.Context, key store.ActorKey, waitID string) (store.Wait, error) {
	var w store.Wait
	err := s.read(ctx, "get wait", func(tx *txn) error {
		var err error
		w, err = getWait(tx, key, waitID)
		return err
	})
	return w, err
}

// ListWaits pages an agent's or a session's waits by row id; see
// store.Store.
func (s *Store) ListWaits(ctx context.Context, p store.ListWaitsParams) (store.WaitPage, error) {
	var pg store.WaitPage
	err := s.read(ctx, "list waits", func(tx *txn) error {
		rows, err := tx.query(`
			SELECT `+waitCols+` FROM waits
			WHERE agent_uid = ?1 AND (?2 = '' OR session_id = ?2) AND (?3 = '' OR status = ?3) AND id > ?4
			ORDER BY id LIMIT ?5`,
			p.AgentUID, p.SessionID, string(p.Status), p.After, store.PageLimit(p.Limit))
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
	if pg.NextAfter == 0 {
		pg.NextAfter = p.After
	}
	return pg, err
}

// ExpireDueWaits expires up to limit due open waits (DB clock) in one
// transaction, each by compare-and-set; see store.Store.
func (s *Store) ExpireDueWaits(ctx context.Context, limit int) ([]store.ActorKey, error) {
	var out []store.ActorKey
	err := s.write(ctx, "expire due waits", func(tx *txn) error {
		out = nil
		rows, err := tx.query(`
			SELECT `+waitCols+` FROM waits
			WHERE status = 'open' AND expires_at IS NOT NULL AND expires_at <= `+nowMS+`
			ORDER BY expires_at, id LIMIT ?`, store.PageLimit(limit))
		if err != nil {
			return err
		}
		var due []store.Wait
		for rows.Next() {
			w, _, err := scanWait(rows)
			if err != nil {
				rows.Close()
				return err
			}
			due = append(due, w)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		seen := map[store.ActorKey]bool{}
		for _, w := range due {
			if _, ok, err := closeWait(tx, w, store.WaitExpired, nil, ""); err != nil {
				return err
			} else if ok && !seen[w.ActorKey] {
				seen[w.ActorKey] = true
				out = append(out, w.ActorKey)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, k := range out {
		s.publish(k)
	}
	return out, nil
}
