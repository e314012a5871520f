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

// FireDueAlarms fires up to limit due alarms (DB clock), each in a
// transaction of its own; see store.Store. It returns the keys of the
// sessions that received alarm events, each once, in firing order.
//
// Several hosts may run it at once. Each transaction picks the oldest due
// alarm with FOR UPDATE SKIP LOCKED (racing callers take different alarms
// instead of queueing on one), then, in the lock order of the package
// (alarm, then session), locks the session row and appends the event with
// the idempotency key "alarm:<name>:<due unix ms>" — a key already used
// means this (session, alarm, due time) already fired, and nothing is
// appended — waking a sleeping session and notifying listeners, and last
// deletes the alarm, or moves a repeating one to its first due time after
// now (missed periods coalesce into this firing), as a compare-and-set on
// (key, name, due_at).
func (s *Store) FireDueAlarms(ctx context.Context, limit int) ([]store.ActorKey, error) {
	limit = store.PageLimit(limit)
	var fired []store.ActorKey
	for range limit {
		var key *store.ActorKey
		var none bool
		err := s.tx(ctx, "fire due alarms", func(ctx context.Context, tx pgx.Tx) error {
			key, none = nil, false
			var err error
			key, err = fireOne(ctx, tx)
			if errors.Is(err, pgx.ErrNoRows) {
				none = true
				return nil
			}
			return err
		})
		switch {
		case errors.Is(err, errAlarmGone):
			continue
		case err != nil:
			return fired, err
		case none:
			return fired, nil
		case key != nil && !slices.Contains(fired, *key):
			fired = append(fired, *key)
		}
	}
	return fired, nil
}

// fireOne fires the oldest due alarm nobody else holds; see FireDueAlarms.
// It returns pgx.ErrNoRows when none is due, and the key when an event was
// appended. Three round trips in the transaction.
func fireOne(ctx context.Context, tx pgx.Tx) (*store.ActorKey, error) {
	// The alarm's row lock (SKIP LOCKED), then the session's: the CTE
	// holding FOR UPDATE is evaluated, and its row locked, before the
	// outer locking clause locks the joined session row.
	var a store.Alarm
	var data *string
	var status store.SessionStatus
	err := tx.QueryRow(ctx, `
		WITH a AS (
			SELECT agent_uid, session_id, name, due_at, every_ms, data FROM alarms
			WHERE due_at <= clock_timestamp()
			ORDER BY due_at LIMIT 1
			FOR UPDATE SKIP LOCKED)
		SELECT a.agent_uid, a.session_id, a.name, a.due_at, a.every_ms, a.data, s.status
		FROM a JOIN sessions s ON s.agent_uid = a.agent_uid AND s.session_id = a.session_id
		FOR NO KEY UPDATE OF s`).Scan(&a.AgentUID, &a.SessionID, &a.Name, &a.DueAt, &a.EveryMs, &data, &status)
	if err != nil {
		return nil, err
	}
	key := a.ActorKey
	b := &pgx.Batch{}
	var appended bool
	if status != store.SessionDestroyed {
		payload, err := store.AlarmPayload(a.Name, a.DueAt, derefString(data))
		if err != nil {
			return nil, err
		}
		// The idempotency key makes a (session, alarm, due time) fire
		// once: if it is used, nothing is appended.
		ne := newEvent{kind: abi.EventAlarm, payload: payload,
			idempotencyKey: store.AlarmIdempotencyKey(a.Name, a.DueAt)}
		b.Queue(insertEventSQL, insertEventArgs(key, ne)...).QueryRow(func(row pgx.Row) (err error) {
			_, appended, err = insertResult(scanEvent(row))
			return err
		})
	}
	// The compare-and-set on (key, name, due_at); the row lock taken above
	// makes it match.
	cas := `DELETE FROM alarms a WHERE a.agent_uid = $1 AND a.session_id = $2 AND a.name = $3 AND a.due_at = $4`
	if a.EveryMs > 0 && status != store.SessionDestroyed {
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
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return nil, err
	}
	if !appended {
		return nil, nil
	}
	return &key, nil
}

// derefString is *p, or "" for nil.
func derefString(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}
