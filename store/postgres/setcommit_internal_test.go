package postgres

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

// The set commit's plan and its refusals, on tables of realistic size
// (setcommit.go). Written in review.

// setFixture: a store with one agent, n live sessions each holding a
// deferred dispatch, plus filler rows to realistic sizes (setCommitSetup).
type setFixture struct {
	s      *Store
	agent  store.Agent
	expect *store.ExpectedBinding
	acts   []store.Activation
}

// setCommitSetup fills the tables with fillSessions sessions' rows (10
// turns each, a live activation with an open event on one in 20), analyzes
// them, and returns n real sessions' deferred commits, ready to queue.
func setCommitSetup(t *testing.T, n int, fillSessions int) (*setFixture, []*groupReq[commitIn, commitRes]) {
	ctx := context.Background()
	s, a := agentStore(t, "plan")
	f := &setFixture{s: s, agent: a}
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := s.pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%v\n%s", err, sql)
		}
	}
	for _, tb := range []string{"sessions", "activations", "actor_events", "deliveries", "turns", "messages", "stream_heads", "stream_frames", "session_state"} {
		exec(`ALTER TABLE ` + tb + ` SET (autovacuum_enabled = off)`)
	}
	fill := func(from, to int) {
		exec(`INSERT INTO sessions (agent_uid, session_id, crash_policy, actor_epoch, last_event_seq, turn_count)
			SELECT $1, 'f' || g, 'restart', 3, 10, 10 FROM generate_series($2::int, $3::int) g`, a.UID, from, to)
		exec(`INSERT INTO activations (activation_uid, agent_uid, session_id, actor_epoch, lease_id, lease_expires_at, revision, state, host_id)
			SELECT 'fa' || g || '-' || e, $1, 'f' || g, e, 'l', now(), 0, 'stopped', 'h'
			FROM generate_series($2::int, $3::int) g, generate_series(1, 3) e`, a.UID, from, to)
		exec(`INSERT INTO actor_events (agent_uid, session_id, seq, kind, payload, status, next_attempt_at, accepted_at, closed_at, binding)
			SELECT $1, 'f' || g, q, 'message', '{"message":"x"}', 'done', now(), now(), now(), 'sha256:plan'
			FROM generate_series($2::int, $3::int) g, generate_series(1, 10) q`, a.UID, from, to)
		exec(`INSERT INTO deliveries (delivery_id, agent_uid, session_id, activation_uid, actor_epoch, event_id, revision, state, binding)
			SELECT 'fd' || event_id, agent_uid, session_id, 'x', 1, event_id, 0, 'accepted', 'sha256:plan'
			FROM actor_events WHERE session_id LIKE 'f%' AND event_id NOT IN (SELECT event_id FROM deliveries)`)
		exec(`INSERT INTO turns (agent_uid, session_id, turn_no, event_id, delivery_id, actor_epoch, outcome, committed_at)
			SELECT agent_uid, session_id, seq, event_id, 'fd' || event_id, 1, 'ok', now()
			FROM actor_events WHERE session_id LIKE 'f%' AND event_id NOT IN (SELECT event_id FROM turns)`)
		exec(`INSERT INTO messages (agent_uid, session_id, turn_no, idx, role, content)
			SELECT t.agent_uid, t.session_id, t.turn_no, i, 'user', 'hello'
			FROM turns t, generate_series(0, 1) i WHERE t.session_id LIKE 'f%' AND t.event_id NOT IN (SELECT 0)
			AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.agent_uid = t.agent_uid AND m.session_id = t.session_id AND m.turn_no = t.turn_no)`)
		exec(`INSERT INTO stream_heads (agent_uid, session_id, last_seq)
			SELECT $1, 'f' || g, 20 FROM generate_series($2::int, $3::int) g`, a.UID, from, to)
		exec(`INSERT INTO stream_frames (agent_uid, session_id, seq, kind, body)
			SELECT $1, 'f' || g, q, 'turn.committed', '{}' FROM generate_series($2::int, $3::int) g, generate_series(1, 20) q`, a.UID, from, to)
		exec(`INSERT INTO session_state (agent_uid, session_id, state)
			SELECT $1, 'f' || g, 'st' FROM generate_series($2::int, $3::int) g`, a.UID, from, to)
		// Some live activations with an open event each (other hosts' sessions).
		exec(`INSERT INTO activations (activation_uid, agent_uid, session_id, actor_epoch, lease_id, lease_expires_at, revision, state, host_id)
			SELECT 'fl' || g, $1, 'f' || g, 4, 'l', now() + interval '1 hour', 0, 'active', 'h2'
			FROM generate_series($2::int, $3::int) g WHERE g % 20 = 0`, a.UID, from, to)
		exec(`INSERT INTO actor_events (agent_uid, session_id, seq, kind, payload, status, next_attempt_at, accepted_at)
			SELECT $1, 'f' || g, 11, 'message', '{"message":"x"}', 'open', now(), now()
			FROM generate_series($2::int, $3::int) g WHERE g % 20 = 0`, a.UID, from, to)
	}
	fill(1, fillSessions)
	exec(`ANALYZE`) // the statistics say one agent: the case of the n² plan

	// n real sessions: a written first turn (for the expectation), then a
	// deferred dispatch each.
	for i := 0; i < n; i++ {
		ss, _, err := s.CreateSession(ctx, store.CreateSessionParams{AgentUID: a.UID, SessionID: fmt.Sprintf("r%03d", i), CrashPolicy: store.CrashRestart})
		if err != nil {
			t.Fatal(err)
		}
		key := ss.ActorKey
		for j := 0; j < 2; j++ {
			if _, _, err := s.AppendEvent(ctx, store.AppendEventParams{Key: key, Kind: abi.EventMessage, Payload: []byte(fmt.Sprintf(`{"message":"m%d"}`, j))}); err != nil {
				t.Fatal(err)
			}
		}
		act, err := s.ClaimActivation(ctx, store.ClaimActivationParams{Key: key, UID: uuid.NewString(), LeaseID: uuid.NewString(), HostID: "h", LeaseTTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		f.acts = append(f.acts, act)
		d, err := s.NextDelivery(ctx, store.NextDeliveryParams{Activation: act.Ref(), DeliveryID: uuid.NewString(), Binding: a.ModuleDigest, MarkSent: true})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.CommitTurn(ctx, store.CommitTurnParams{Ref: d.Delivery.TurnRef(), Outcome: abi.OutcomeOK, KeepState: true,
			Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "r"}}, Payloads: []string{string(d.Event.Payload)}}); err != nil {
			t.Fatal(err)
		}
		f.expect = &store.ExpectedBinding{Agent: d.Agent, Binding: a.ModuleDigest}
	}
	var commits []*groupReq[commitIn, commitRes]
	for _, act := range f.acts {
		np := store.NextDeliveryParams{Activation: act.Ref(), DeliveryID: uuid.NewString(), MarkSent: true, ExpectDue: true,
			Expect: f.expect, Defer: true, TailMessages: 10}
		d, err := s.NextDelivery(ctx, np)
		if err != nil || !d.Deferred {
			t.Fatalf("deferred dispatch: %v %+v", err, d)
		}
		pp := store.PromoteOf(act.Ref(), np, d)
		p := store.CommitTurnParams{Ref: d.Delivery.TurnRef(), Outcome: abi.OutcomeOK, State: []byte("s"),
			Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "reply"}}, Payloads: []string{string(d.Event.Payload)},
			Deferred: &pp, LeaseTTL: time.Hour}
		commits = append(commits, &groupReq[commitIn, commitRes]{in: commitIn{p: p}})
	}
	return f, commits
}

// runSetTimed runs q (rolled back) with plan cache mode mode on a fresh
// connection, after warm-up executions, and returns its time and the
// index scans it made on actor_events.
func runSetTimed(t *testing.T, s *Store, q *pgx.QueuedQuery, mode string, warm int) (time.Duration, int64, string) {
	ctx := context.Background()
	conn, err := pgx.ConnectConfig(ctx, s.pool.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `SET plan_cache_mode = `+mode); err != nil {
		t.Fatal(err)
	}
	run := func() (time.Duration, int64) {
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		var before, after int64
		stat := `SELECT coalesce(idx_scan, 0) FROM pg_stat_xact_user_tables WHERE relid = 'actor_events'::regclass`
		if err := tx.QueryRow(ctx, stat).Scan(&before); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		rows, err := tx.Query(ctx, q.SQL, q.Arguments...)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		el := time.Since(start)
		if err := tx.QueryRow(ctx, stat).Scan(&after); err != nil {
			t.Fatal(err)
		}
		return el, after - before
	}
	for range warm {
		run()
	}
	el, scans := run()
	// Which plan the cache holds now.
	var generic, custom int64
	_ = conn.QueryRow(ctx, `SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement LIKE '%WITH ORDINALITY AS i(agent_uid%'`).Scan(&generic, &custom)
	return el, scans, fmt.Sprintf("generic_plans=%d custom_plans=%d", generic, custom)
}

// TestSetCommitRefusedTurnRenewsNoLease: a turn of a set commit whose checks
// fail (its event cancelled after the dispatch) answers solo, but its
// activation's lease was renewed by the set commit all the same:
// deferredCommitSQL would have rolled the renewal back with the refusal.
func TestSetCommitRefusedTurnRenewsNoLease(t *testing.T) {
	ctx := context.Background()
	f, commits := setCommitSetup(t, 2, 10)
	for _, c := range commits {
		c.in.p.LeaseTTL = 10 * time.Hour
	}
	refusedAct := f.acts[0]
	if _, err := f.s.CancelEvent(ctx, store.CancelEventParams{Key: refusedAct.ActorKey, EventID: commits[0].in.p.Ref.ActorEventID, Reason: "x"}); err != nil {
		t.Fatal(err)
	}
	lease := func(uid string) time.Time {
		var at time.Time
		if err := f.s.pool.QueryRow(ctx, `SELECT lease_expires_at FROM activations WHERE activation_uid = $1`, uid).Scan(&at); err != nil {
			t.Fatal(err)
		}
		return at
	}
	before := lease(refusedAct.UID)
	b := &pgx.Batch{}
	queueSetCommit(b, commits)
	if err := f.s.pool.SendBatch(ctx, b).Close(); err != nil {
		t.Fatal(err)
	}
	r0, r1 := commits[0].answer(), commits[1].answer()
	if !r0.solo || r1.solo {
		t.Fatalf("answers %+v %+v, want the cancelled one solo and the other committed", r0, r1)
	}
	// The single statement on its own path, for comparison.
	_, err := f.s.CommitTurn(ctx, commits[0].in.p)
	var fe *store.FenceError
	if !errors.As(err, &fe) {
		t.Fatalf("solo commit of the cancelled turn: %v", err)
	}
	if after := lease(refusedAct.UID); !after.Equal(before) {
		t.Errorf("a refused turn of the set commit wrote its activation's lease: %v -> %v (+%v)", before, after, after.Sub(before).Round(time.Minute))
	}
}

// TestSetCommitIndexScansStayLinear: a set commit of 128 turns, run as
// the pipe runs it (a prepared statement past its first five executions,
// plan_cache_mode auto), must probe actor_events a few times per turn.
// With one agent (analyzed), the generic plan evaluates the oldest-open-
// event lateral for every pair of (activation, turn): n² probes.
func TestSetCommitIndexScansStayLinear(t *testing.T) {
	const n = 128
	f, commits := setCommitSetup(t, n, 5000)
	b := &pgx.Batch{}
	queueSetCommit(b, commits)
	el, scans, _ := runSetTimed(t, f.s, b.QueuedQueries[0], "auto", 6)
	if scans > 8*n {
		t.Errorf("a set commit of %d turns made %d index scans of actor_events (%.0f per turn) in %v", n, scans, float64(scans)/n, el)
	}
}

// TestSetCommitScansNoTableWhole: on small analyzed tables (300 sessions,
// about 1,000 activations: the bench's size), the set commit's generic
// plan reads every table it writes by index. The lease renewal's
// = ANY(ARRAY(...)), estimated at ten rows, had scanned activations whole
// in every set commit of paddock bench (auto_explain), a tenth of the
// statement's time.
func TestSetCommitScansNoTableWhole(t *testing.T) {
	const n = 16
	f, commits := setCommitSetup(t, n, 300)
	b := &pgx.Batch{}
	queueSetCommit(b, commits)
	q := b.QueuedQueries[0]
	ctx := context.Background()
	conn, err := pgx.ConnectConfig(ctx, f.s.pool.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	stat := `SELECT relname, coalesce(seq_scan, 0) FROM pg_stat_xact_user_tables
		WHERE relname IN ('activations', 'sessions', 'actor_events', 'deliveries', 'turns', 'stream_heads', 'session_state')`
	for run := range 7 { // the sixth execution and later run the generic plan
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		before := map[string]int64{}
		rows, _ := tx.Query(ctx, stat)
		for rows.Next() {
			var rel string
			var sc int64
			_ = rows.Scan(&rel, &sc)
			before[rel] = sc
		}
		if rows, err = tx.Query(ctx, q.SQL, q.Arguments...); err != nil {
			t.Fatal(err)
		}
		committed := 0
		for rows.Next() {
			vals, _ := rows.Values()
			if vals[1] == true {
				committed++
			}
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		if committed != n {
			t.Fatalf("run %d: %d of %d turns committed", run, committed, n)
		}
		rows, _ = tx.Query(ctx, stat)
		for rows.Next() {
			var rel string
			var sc int64
			_ = rows.Scan(&rel, &sc)
			if run == 6 && sc != before[rel] {
				t.Errorf("the set commit's generic plan scanned %s whole %d times", rel, sc-before[rel])
			}
		}
		_ = tx.Rollback(ctx)
	}
}
