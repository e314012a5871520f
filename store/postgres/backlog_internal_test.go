package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/store/pgtest"
)

// TestTurnStatementsStayIndexBoundedUnderABurst: a turn's dispatch and
// commit cost the same whether one or thousands of events wait behind the
// turn's event, even when the table's statistics predate the burst (a
// sleeping session woken by thousands of queued signals before autovacuum
// analyzed them). Statistics that saw no open event make the open-events
// index look empty; a statement that finds its event by id while also
// naming the session and status = 'open' was then planned on that index
// and read every open event of the session (the event's close: 3,000
// rows read for one). The test runs the dispatch's and the commit's
// statements with generic plans, as the group commit's prepared
// statements run, in a transaction it rolls back, and bounds the rows of
// actor_events they read.
func TestTurnStatementsStayIndexBoundedUnderABurst(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	m, _, err := s.PutModule(ctx, store.PutModuleParams{Digest: "sha256:burst", ABIVersion: abi.Version, Bytes: []byte("m")})
	if err != nil {
		t.Fatal(err)
	}
	a, err := s.CreateAgent(ctx, store.CreateAgentParams{UID: uuid.NewString(), Name: "burst", ModuleDigest: m.Digest, CrashPolicy: store.CrashRestart})
	if err != nil {
		t.Fatal(err)
	}
	sess, _, err := s.CreateSession(ctx, store.CreateSessionParams{AgentUID: a.UID, SessionID: uuid.NewString(), CrashPolicy: store.CrashRestart})
	if err != nil {
		t.Fatal(err)
	}
	key := sess.ActorKey
	// A history of closed events (another session's), statistics taken
	// then — few open events — and none after the burst.
	old, _, err := s.CreateSession(ctx, store.CreateSessionParams{AgentUID: a.UID, SessionID: uuid.NewString(), CrashPolicy: store.CrashRestart})
	if err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{`ALTER TABLE actor_events SET (autovacuum_enabled = off)`,
		`INSERT INTO actor_events (agent_uid, session_id, seq, kind, payload, status, next_attempt_at, accepted_at, closed_at)
			SELECT $1, $2, g, 'message', '{}', 'done', now(), now(), now() FROM generate_series(1, 300) g`,
		`UPDATE sessions SET last_event_seq = 300 WHERE agent_uid = $1 AND session_id = $2`,
		`ANALYZE actor_events`} {
		var args []any
		if strings.Contains(sql, "$1") {
			args = []any{old.AgentUID, old.SessionID}
		}
		if _, err := s.pool.Exec(ctx, sql, args...); err != nil {
			t.Fatal(err)
		}
	}
	const burst = 3000
	for i := range burst {
		if _, _, err := s.AppendEvent(ctx, store.AppendEventParams{Key: key, Kind: abi.EventMessage,
			Payload: json.RawMessage(fmt.Sprintf(`{"message":"%d"}`, i))}); err != nil {
			t.Fatal(err)
		}
	}
	act, err := s.ClaimActivation(ctx, store.ClaimActivationParams{Key: key, UID: uuid.NewString(), LeaseID: uuid.NewString(), HostID: "h", LeaseTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	// The dispatch's one statement, as the group commit sends it.
	next := store.NextDeliveryParams{Activation: act.Ref(), DeliveryID: uuid.NewString(), MarkSent: true,
		ExpectDue: true, Expect: &store.ExpectedBinding{Binding: m.Digest,
			Agent: store.AgentBinding{Namespace: store.DefaultNamespace, Kind: "wasm", ModuleDigest: m.Digest}}}
	b := &pgx.Batch{}
	queueClaim(b, next, false)
	readsBounded(t, s, "dispatch", b.QueuedQueries[0])

	d, err := s.NextDelivery(ctx, store.NextDeliveryParams{Activation: act.Ref(), DeliveryID: uuid.NewString(), Binding: m.Digest, MarkSent: true})
	if err != nil {
		t.Fatal(err)
	}
	if d.Event.Seq != 1 {
		t.Fatalf("dispatched seq %d, want 1", d.Event.Seq)
	}
	p := store.CommitTurnParams{Ref: d.Delivery.TurnRef(), Outcome: abi.OutcomeOK, KeepState: true,
		Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "reply"}}, Payloads: []string{string(d.Event.Payload)}}
	b = &pgx.Batch{}
	queueCommit(b, p, p.Payloads, true, store.AlarmWrites{}, nil)
	for _, q := range b.QueuedQueries {
		readsBounded(t, s, "commit", q)
	}
}

// readsBounded runs q in a transaction it rolls back, with the generic
// plan a prepared statement gets after its first executions (the group
// commit's connection prepares its statements once), and fails the test
// when q read more than a few rows of actor_events (pg_stat_xact_user_tables:
// rows a sequential scan read plus rows fetched through an index): a scan
// over the session's open events instead of the one row it wants.
func readsBounded(t *testing.T, s *Store, what string, q *pgx.QueuedQuery) {
	t.Helper()
	ctx := context.Background()
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	read := func() int64 {
		var n int64
		if err := tx.QueryRow(ctx, `SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)
			FROM pg_stat_xact_user_tables WHERE relid = 'actor_events'::regclass`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if _, err := tx.Exec(ctx, `SET LOCAL plan_cache_mode = force_generic_plan`); err != nil {
		t.Fatal(err)
	}
	before := read()
	rows, err := tx.Query(ctx, q.SQL, q.Arguments...)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	for rows.Next() {
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("%s: %v\n%s", what, err, q.SQL)
	}
	if n := read() - before; n > 50 {
		t.Errorf("%s read %d rows of actor_events, want a few: a statement scans the session's open events\n%s", what, n, q.SQL)
	} else {
		t.Logf("%s read %d rows of actor_events", what, n)
	}
}
