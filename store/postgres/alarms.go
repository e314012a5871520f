package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

// ListAlarms returns a session's alarms by name.
func (s *Store) ListAlarms(ctx context.Context, key store.ActorKey) ([]store.Alarm, error) {
	var out []store.Alarm
	err := s.call(ctx, "list alarms", func(ctx context.Context) error {
		rows, err := s.pool.Query(ctx, `
			SELECT name, due_at, every_ms, data, set_at FROM alarms
			WHERE agent_uid = $1 AND session_id = $2 ORDER BY name`, key.AgentUID, key.SessionID)
		if err != nil {
			return err
		}
		out, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Alarm, error) {
			a := store.Alarm{ActorKey: key}
			var data *string
			err := r.Scan(&a.Name, &a.DueAt, &a.EveryMs, &data, &a.SetAt)
			a.DueAt, a.SetAt = utc(a.DueAt), utc(a.SetAt)
			if data != nil {
				a.Data = json.RawMessage(*data)
			}
			return a, err
		})
		return err
	})
	return out, err
}

// errAlarmGone rolls back the firing of an alarm whose compare-and-set
// matched nothing: another host fired or changed it.
var errAlarmGone = errors.New("alarm fired or changed elsewhere")

// fireBatchMax caps the alarms fired in one transaction.
const fireBatchMax = 128

// FireDueAlarms fires up to limit due alarms (DB clock), in transactions
// of up to fireBatchMax alarms each; see store.Store. It returns the keys
// of the sessions that received alarm events, each once, in firing order.
//
// Several hosts may run it at once. Each transaction claims the oldest due
// alarms with FOR UPDATE SKIP LOCKED (racing callers take different alarms
// instead of queueing on one), then, in the lock order of the package
// (alarms, then sessions, these sorted by actor key), locks their sessions'
// rows — skipping a session another transaction holds, whose alarms stay
// due for a later call — and, for each alarm, appends
// the event with the idempotency key "alarm:<name>:<due unix ms>" — a key
// already used means this (session, alarm, due time) already fired, and
// nothing is appended — waking a sleeping session and notifying listeners,
// and last deletes the alarm, or moves a repeating one to its first due
// time after now (missed periods coalesce into this firing), as a
// compare-and-set on (key, name, due_at). A destroyed session's alarm is
// deleted without an event. Two round trips per batch.
func (s *Store) FireDueAlarms(ctx context.Context, limit int) ([]store.ActorKey, error) {
	limit = store.PageLimit(limit)
	var fired []store.ActorKey
	done := 0
	for attempt := 0; done < limit && attempt < limit; attempt++ {
		n := min(limit-done, fireBatchMax)
		var picked int
		var keys []store.ActorKey
		err := s.tx(ctx, "fire due alarms", func(ctx context.Context, tx pgx.Tx) error {
			var err error
			picked, keys, err = fireBatch(ctx, tx, n)
			return err
		})
		switch {
		case errors.Is(err, errAlarmGone):
			continue
		case err != nil:
			return fired, err
		}
		for _, k := range keys {
			if !slices.Contains(fired, k) {
				fired = append(fired, k)
			}
		}
		done += picked
		if picked < n {
			break // nothing more due (or held by other callers)
		}
	}
	return fired, nil
}

// dueAlarm is an alarm claimed for firing, with its session's status.
type dueAlarm struct {
	store.Alarm
	data   *string
	status store.SessionStatus
}

// fireBatch fires up to n due alarms nobody else holds; see FireDueAlarms.
// It returns how many alarms it claimed and the keys that got an event, in
// firing order (a key once per alarm).
func fireBatch(ctx context.Context, tx pgx.Tx, n int) (int, []store.ActorKey, error) {
	// The oldest due alarms, ties by actor key (so that alarms of one
	// session due at one instant tend to go in one batch rather than make
	// concurrent batches wait on the same session row). The alarms' row
	// locks (SKIP LOCKED), then the sessions': the CTE holding FOR UPDATE
	// is evaluated, and its rows locked, before s locks each of their
	// sessions once, in key order (the lock is taken above the sort; the
	// "C" collation is the byte order the group commit sorts by), skipping
	// a session another transaction holds: its alarms stay due and fire in
	// a later sweep. Never waiting for a session row is what keeps the
	// sweep out of deadlocks: it holds alarm rows of several sessions, and
	// a group-commit batch may hold one of those sessions' row while it
	// sets an alarm of another. Once: a join that locked a session row per
	// alarm locked it a second time from the version its snapshot saw,
	// which could queue for that version's tuple lock behind a locker
	// waiting for this transaction (seen in TestLifecycleHammerHasNoDeadlocks).
	rows, err := tx.Query(ctx, `
		WITH a AS (
			SELECT agent_uid, session_id, name, due_at, every_ms, data FROM alarms
			WHERE due_at <= clock_timestamp()
			ORDER BY due_at, agent_uid, session_id, name LIMIT $1
			FOR UPDATE SKIP LOCKED),
		s AS MATERIALIZED (
			SELECT agent_uid, session_id, status FROM sessions
			WHERE (agent_uid, session_id) IN (SELECT agent_uid, session_id FROM a)
			ORDER BY agent_uid COLLATE "C", session_id COLLATE "C"
			FOR NO KEY UPDATE SKIP LOCKED)
		SELECT a.agent_uid, a.session_id, a.name, a.due_at, a.every_ms, a.data, s.status
		FROM a JOIN s ON s.agent_uid = a.agent_uid AND s.session_id = a.session_id
		ORDER BY a.agent_uid, a.session_id, a.due_at, a.name`, n)
	if err != nil {
		return 0, nil, err
	}
	due, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (dueAlarm, error) {
		var a dueAlarm
		err := r.Scan(&a.AgentUID, &a.SessionID, &a.Name, &a.DueAt, &a.EveryMs, &a.data, &a.status)
		return a, err
	})
	if err != nil || len(due) == 0 {
		return 0, nil, err
	}
	b := &pgx.Batch{}
	appended := make([]bool, len(due))
	for i, a := range due {
		key := a.ActorKey
		live := a.status != store.SessionDestroyed
		if live {
			payload, err := store.AlarmPayload(a.Name, a.DueAt, derefString(a.data))
			if err != nil {
				return 0, nil, err
			}
			// The idempotency key makes a (session, alarm, due time) fire
			// once: if it is used, nothing is appended.
			ne := newEvent{kind: abi.EventAlarm, payload: payload,
				idempotencyKey: store.AlarmIdempotencyKey(a.Name, a.DueAt)}
			b.Queue(insertEventSQL, insertEventArgs(key, ne)...).QueryRow(func(row pgx.Row) (err error) {
				_, appended[i], err = insertResult(scanEvent(row))
				return err
			})
		}
		// The compare-and-set on (key, name, due_at); the row lock taken
		// above makes it match.
		cas := `DELETE FROM alarms a WHERE a.agent_uid = $1 AND a.session_id = $2 AND a.name = $3 AND a.due_at = $4`
		if a.EveryMs > 0 && live {
			// The smallest k >= 1 with due_at + k*every_ms > now.
			cas = `
				UPDATE alarms a SET due_at = a.due_at + ((floor(extract(epoch FROM (n.t - a.due_at)) * 1000 / a.every_ms)::bigint
					+ 1) * a.every_ms) * interval '1 millisecond'
				FROM (SELECT clock_timestamp() AS t) n
				WHERE a.agent_uid = $1 AND a.session_id = $2 AND a.name = $3 AND a.due_at = $4`
		}
		b.Queue(cas, key.AgentUID, key.SessionID, a.Name, a.DueAt).Exec(func(tag pgconn.CommandTag) error {
			if tag.RowsAffected() == 0 {
				return errAlarmGone
			}
			return nil
		})
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return 0, nil, err
	}
	var keys []store.ActorKey
	for i, a := range due {
		if appended[i] {
			keys = append(keys, a.ActorKey)
		}
	}
	return len(due), keys, nil
}

// derefString is *p, or "" for nil.
func derefString(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}
