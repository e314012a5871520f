package postgres

import (
	"context"
	"fmt"
	"testing"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

// TestRunnableSessionsCostNothingForIdleSessions: the runnable scan, which
// every host runs each ScanInterval (a second by default), reads only the
// sessions that have open events. An idle session — awake, its activation
// stopped, nothing open — is most of a long-lived deployment's sessions;
// the scan had probed every awake session's oldest open event, 20,000
// probes here for the three sessions that have work.
func TestRunnableSessionsCostNothingForIdleSessions(t *testing.T) {
	ctx := context.Background()
	s, a := agentStore(t, "runnable")
	const idle = 20000
	if _, err := s.pool.Exec(ctx, `INSERT INTO sessions (agent_uid, session_id, crash_policy, actor_epoch, last_event_seq, turn_count)
		SELECT $1, 'idle' || g, 'restart', 1, 3, 3 FROM generate_series(1, $2::int) g`, a.UID, idle); err != nil {
		t.Fatal(err)
	}
	if _, err := s.pool.Exec(ctx, `INSERT INTO actor_events (agent_uid, session_id, seq, kind, payload, status, next_attempt_at, accepted_at, closed_at)
		SELECT $1, 'idle' || g, q, 'message', '{}', 'done', now(), now(), now() FROM generate_series(1, $2::int) g, generate_series(1, 3) q`, a.UID, idle); err != nil {
		t.Fatal(err)
	}
	var want []string
	for i := range 3 {
		ss, _, err := s.CreateSession(ctx, store.CreateSessionParams{AgentUID: a.UID, SessionID: fmt.Sprint("busy", i), CrashPolicy: store.CrashRestart})
		if err != nil {
			t.Fatal(err)
		}
		for j := range 2 {
			if _, _, err := s.AppendEvent(ctx, store.AppendEventParams{Key: ss.ActorKey, Kind: abi.EventMessage, Payload: []byte(fmt.Sprintf(`{"message":"%d"}`, j))}); err != nil {
				t.Fatal(err)
			}
		}
		want = append(want, ss.SessionID)
	}
	if _, err := s.pool.Exec(ctx, `ANALYZE`); err != nil {
		t.Fatal(err)
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	stat := `SELECT coalesce(sum(seq_scan), 0), coalesce(sum(idx_tup_fetch), 0) + coalesce(sum(seq_tup_read), 0) FROM pg_stat_xact_user_tables
		WHERE relid IN ('sessions'::regclass, 'actor_events'::regclass, 'activations'::regclass)`
	var seq0, read0, seq1, read1 int64
	if err := tx.QueryRow(ctx, stat).Scan(&seq0, &read0); err != nil {
		t.Fatal(err)
	}
	rows, err := tx.Query(ctx, runnableSessionsSQL, 256, []string{}, store.CapacitySleepReasons(), []string{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var agent, session string
		if err := rows.Scan(&agent, &session); err != nil {
			t.Fatal(err)
		}
		got = append(got, session)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRow(ctx, stat).Scan(&seq1, &read1); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("runnable sessions %v, want %v", got, want)
	}
	// Rows read, by index or by a whole scan (of the empty activations
	// table, the planner's choice), not whole scans: a whole scan of a
	// table that matters reads its rows.
	if read1-read0 > 100 {
		t.Errorf("the runnable scan of 3 busy sessions among %d idle ones read %d rows (%d whole scans)", idle, read1-read0, seq1-seq0)
	}
}
