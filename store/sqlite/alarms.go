package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

// applyAlarms writes a turn's alarm writes (store.PlanAlarmOps) inside
// its commit transaction: clears deleted, sets upserted by name.
// InMs is added to the database clock; At is stored at millisecond
// precision.
func applyAlarms(tx *txn, key store.ActorKey, w store.AlarmWrites) error {
	for _, name := range w.Clear {
		if _, err := tx.exec(`DELETE FROM alarms WHERE agent_uid = ? AND session_id = ? AND name = ?`,
			key.AgentUID, key.SessionID, name); err != nil {
			return err
		}
	}
	for _, op := range w.Set {
		var at sql.NullInt64
		if op.At != nil {
			at = sql.NullInt64{Int64: op.At.UnixMilli(), Valid: true}
		}
		if _, err := tx.exec(`
			INSERT INTO alarms (agent_uid, session_id, name, due_at, every_ms, data, set_at)
			VALUES (?1, ?2, ?3, coalesce(?4, `+nowMS+` + ?5), ?6, ?7, `+nowMS+`)
			ON CONFLICT (agent_uid, session_id, name) DO UPDATE SET
				due_at = excluded.due_at, every_ms = excluded.every_ms, data = excluded.data, set_at = excluded.set_at`,
			key.AgentUID, key.SessionID, op.Name, at, op.InMs, op.EveryMs, nullString(string(op.Data))); err != nil {
			return err
		}
	}
	return nil
}

// ListAlarms returns a session's alarms by name.
func (s *Store) ListAlarms(ctx context.Context, key store.ActorKey) ([]store.Alarm, error) {
	var out []store.Alarm
	err := s.read(ctx, "list alarms", func(tx *txn) error {
		rows, err := tx.query(`
			SELECT name, due_at, every_ms, data, set_at FROM alarms
			WHERE agent_uid = ? AND session_id = ? ORDER BY name`, key.AgentUID, key.SessionID)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			a := store.Alarm{ActorKey: key}
			var due, set int64
			var data sql.NullString
			if err := rows.Scan(&a.Name, &due, &a.EveryMs, &data, &set); err != nil {
				return err
			}
			a.DueAt, a.SetAt = msTime(due), msTime(set)
			if data.Valid {
				a.Data = json.RawMessage(data.String)
			}
			out = append(out, a)
		}
		return rows.Err()
	})
	return out, err
}

// dueAlarm is an alarm picked for firing.
type dueAlarm struct {
	key   store.ActorKey
	name  string
	dueAt int64
	every int64
}

// fireBatchMax caps the alarms fired in one transaction, and
// fireBatchBudget its running time: a transaction that has run that long
// fires no further alarm (the next transaction goes on), so that the
// single writer is never held long enough to starve other callers' deadlines
// when the machine is slow. The budget sizes batches only; it decides
// nothing about which alarm is due.
const (
	fireBatchMax    = 128
	fireBatchBudget = 50 * time.Millisecond
)

// FireDueAlarms fires up to limit due alarms (DB clock), in transactions
// of up to fireBatchMax alarms each; see store.Store. SQLite's single
// writer already serialises every caller, so each transaction picks the
// next due alarms itself and fires each with a compare-and-set on (key,
// name, due_at): no two callers can pick the same firing, and none wastes
// a transaction on a lost race. Listeners are told after each commit.
func (s *Store) FireDueAlarms(ctx context.Context, limit int) ([]store.ActorKey, error) {
	var out []store.ActorKey
	seen := map[store.ActorKey]bool{}
	limit = store.PageLimit(limit)
	for done := 0; done < limit; {
		n := min(limit-done, fireBatchMax)
		picked, more, fired, err := s.fireBatch(ctx, n)
		if err != nil {
			return out, err
		}
		for _, k := range fired {
			s.publish(k)
			if !seen[k] {
				seen[k] = true
				out = append(out, k)
			}
		}
		done += picked
		if !more {
			break // nothing more due
		}
	}
	return out, nil
}

// fireBatch fires the n most overdue alarms (or all due, if fewer) in one
// transaction, stopping early after fireBatchBudget. It returns how many
// it fired, whether more may be due (it stopped early or found n), and
// the keys that got an event, in firing order (a key once per alarm); an
// alarm of a destroyed session is dropped, and one whose event already
// existed appends nothing.
func (s *Store) fireBatch(ctx context.Context, n int) (picked int, more bool, fired []store.ActorKey, err error) {
	err = s.write(ctx, "fire due alarms", func(tx *txn) error {
		start := time.Now() // once the writer is ours
		picked, more, fired = 0, false, nil
		rows, err := tx.query(`
			SELECT agent_uid, session_id, name, due_at, every_ms FROM alarms
			WHERE due_at <= `+nowMS+`
			ORDER BY due_at, agent_uid, session_id, name LIMIT ?`, n)
		if err != nil {
			return err
		}
		var due []dueAlarm
		for rows.Next() {
			var a dueAlarm
			if err := rows.Scan(&a.key.AgentUID, &a.key.SessionID, &a.name, &a.dueAt, &a.every); err != nil {
				rows.Close()
				return err
			}
			due = append(due, a)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		more = len(due) == n
		destroyed := make(map[store.ActorKey]bool, len(due)) // per session, read once
		for _, a := range due {
			if picked > 0 && time.Since(start) > fireBatchBudget {
				more = true
				break
			}
			picked++
			d, seen := destroyed[a.key]
			if !seen {
				_, err := sessionStatus(tx, a.key)
				d = errors.Is(err, store.ErrSessionDestroyed)
				if err != nil && !d {
					return err
				}
				destroyed[a.key] = d
			}
			ok, err := fireAlarm(tx, a, d)
			if err != nil {
				return err
			}
			if ok {
				fired = append(fired, a.key)
			}
		}
		return nil
	})
	return picked, more, fired, err
}

// fireAlarm fires a picked alarm inside tx, its session being destroyed
// or not (as read in tx); fired is false when it is destroyed (the alarm
// is dropped) or the alarm's event already existed.
func fireAlarm(tx *txn, a dueAlarm, destroyed bool) (fired bool, err error) {
	// Compare-and-set on what was picked: a one-shot (or a destroyed
	// session's) alarm is deleted, a repeating one moves to its first due
	// time after now, missed periods coalescing into this firing.
	q := `UPDATE alarms SET due_at = due_at + every_ms * ((` + nowMS + ` - due_at) / every_ms + 1)
	      WHERE agent_uid = ? AND session_id = ? AND name = ? AND due_at = ? AND every_ms = ? AND every_ms > 0
	      RETURNING data`
	if destroyed || a.every <= 0 {
		q = `DELETE FROM alarms WHERE agent_uid = ? AND session_id = ? AND name = ? AND due_at = ? AND every_ms = ?
		     RETURNING data`
	}
	var data sql.NullString
	err = tx.queryRow(q, a.key.AgentUID, a.key.SessionID, a.name, a.dueAt, a.every).Scan(&data)
	if err != nil {
		return false, err // no row is unreachable: the writer holds the lock since the pick
	}
	if destroyed {
		return false, nil // dropped with its session
	}
	due := msTime(a.dueAt)
	payload, err := store.AlarmPayload(a.name, due, data.String)
	if err != nil {
		return false, err
	}
	// The idempotency key makes each (session, alarm, due time) one
	// event; a duplicate means it fired already.
	_, fired, err = insertEvent(tx, a.key, abi.EventAlarm, payload, store.AlarmIdempotencyKey(a.name, due))
	return fired, err
}
