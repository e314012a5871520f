package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"reflect"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/store/pgtest"
)

// TestMigration00002UpgradesExistingData applies 00001 alone, writes a
// session with an open event the way the part-1 driver did, then opens the
// store (which applies 00002): the old rows read with the lifecycle
// defaults and the event still dispatches. Then 00002 goes down and up
// again.
func TestMigration00002UpgradesExistingData(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn, pool, p := migrationProvider(ctx, t)
	if _, err := p.UpTo(ctx, 1); err != nil {
		t.Fatalf("up to 1: %v", err)
	}
	_, err := pool.Exec(ctx, `
		INSERT INTO modules (digest, abi_version, size, bytes) VALUES ('sha256:m', 1, 1, '\x00');
		INSERT INTO agents (agent_uid, name, module_digest, crash_policy) VALUES ('a', 'agent', 'sha256:m', 'sleep');
		INSERT INTO sessions (agent_uid, session_id, crash_policy, last_event_seq) VALUES ('a', 's', 'sleep', 1);
		INSERT INTO actor_events (agent_uid, session_id, seq, kind, payload, next_attempt_at, accepted_at)
		VALUES ('a', 's', 1, 'message', '{"message": "old"}', clock_timestamp(), clock_timestamp());`)
	if err != nil {
		t.Fatalf("part-1 rows: %v", err)
	}

	s, err := Open(ctx, dsn)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer s.Close()
	key := store.ActorKey{AgentUID: "a", SessionID: "s"}
	ss, err := s.GetSession(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if ss.Status != store.SessionActive || ss.OpenEvents != 1 || ss.DeadLetters != 0 || ss.SleepReason != "" ||
		ss.PendingSince != nil {
		t.Fatalf("migrated session = %+v", ss)
	}
	act, err := s.ClaimActivation(ctx, store.ClaimActivationParams{Key: key, UID: "act", LeaseID: "l", HostID: "h",
		LeaseTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	d, err := s.NextDelivery(ctx, store.NextDeliveryParams{Activation: act.Ref(), DeliveryID: "d", MarkSent: true})
	if err != nil {
		t.Fatal(err)
	}
	if d.Event.SteerOf != 0 || d.Event.Redrives != 0 || len(d.Steers) != 0 {
		t.Fatalf("migrated event = %+v, steers %v", d.Event, d.Steers)
	}
	// A counted failure applies the stored policy (sleep) and writes the
	// chain: the new columns and tables are in use.
	fr, err := s.FailAttempt(ctx, store.FailAttemptParams{Ref: d.Delivery.TurnRef(), Error: "x", Counted: true,
		MaxAttempts: 5})
	if err != nil {
		t.Fatal(err)
	}
	if fr.SessionStatus != store.SessionSleeping {
		t.Fatalf("fail result = %+v", fr)
	}
	if _, err := p.DownTo(ctx, 1); err != nil {
		t.Fatalf("down to 1: %v", err)
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatalf("up again: %v", err)
	}
}

// TestMigration00003AddsAgentKinds applies 00001 and 00002, writes agents
// with sessions the way the part-2 driver did, then opens the store (which
// applies 00003): the agents read as kind wasm with their modules, their
// sessions still run, the CHECK binds kind to module or plugin, and a
// migrated agent becomes a plugin agent. 00003 goes down only once no plugin
// agent is left.
func TestMigration00003AddsAgentKinds(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn, pool, p := migrationProvider(ctx, t)
	if _, err := p.UpTo(ctx, 2); err != nil {
		t.Fatalf("up to 2: %v", err)
	}
	_, err := pool.Exec(ctx, `
		INSERT INTO modules (digest, abi_version, size, bytes) VALUES ('sha256:m1', 1, 1, '\x00'), ('sha256:m2', 1, 1, '\x01');
		INSERT INTO agents (agent_uid, name, module_digest, crash_policy) VALUES
			('a1', 'alpha', 'sha256:m1', 'sleep'), ('a2', 'beta', 'sha256:m2', 'restart');
		INSERT INTO sessions (agent_uid, session_id, crash_policy, last_event_seq) VALUES ('a1', 's', 'sleep', 1);
		INSERT INTO actor_events (agent_uid, session_id, seq, kind, payload, next_attempt_at, accepted_at)
		VALUES ('a1', 's', 1, 'message', '{"message": "old"}', clock_timestamp(), clock_timestamp());`)
	if err != nil {
		t.Fatalf("part-2 rows: %v", err)
	}
	var before []string
	rows, err := pool.Query(ctx, `SELECT row_to_json(a)::text FROM agents a ORDER BY agent_uid`)
	if err != nil {
		t.Fatal(err)
	}
	before, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}

	s, err := Open(ctx, dsn)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer s.Close()
	list, err := s.ListAgents(ctx, store.DefaultNamespace)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 {
		t.Fatalf("agents after the upgrade: %+v", list)
	}
	for i, want := range []store.Agent{
		{UID: "a1", Namespace: store.DefaultNamespace, Name: "alpha", Kind: store.KindWasm, ModuleDigest: "sha256:m1", CrashPolicy: store.CrashSleep},
		{UID: "a2", Namespace: store.DefaultNamespace, Name: "beta", Kind: store.KindWasm, ModuleDigest: "sha256:m2", CrashPolicy: store.CrashRestart},
	} {
		got := list[i]
		got.CreatedAt, got.UpdatedAt = time.Time{}, time.Time{}
		if got != want {
			t.Fatalf("agent %d = %+v, want %+v", i, got, want)
		}
	}
	// The old columns are untouched.
	rows, err = pool.Query(ctx, `SELECT (row_to_json(a)::jsonb - 'kind' - 'plugin' - 'namespace')::text FROM agents a ORDER BY agent_uid`)
	if err != nil {
		t.Fatal(err)
	}
	after, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	for i := range before {
		var b, a map[string]any
		if err := json.Unmarshal([]byte(before[i]), &b); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal([]byte(after[i]), &a); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("agent row %d: before %s, after %s", i, before[i], after[i])
		}
	}
	if _, err := pool.Exec(ctx, `UPDATE agents SET kind = 'plugin' WHERE agent_uid = 'a1'`); err == nil {
		t.Fatal("a plugin agent with a module and no plugin passed the CHECK")
	}
	if _, err := pool.Exec(ctx, `UPDATE agents SET plugin = 'nope' WHERE agent_uid = 'a1'`); err == nil {
		t.Fatal("agents.plugin accepted an unknown plugin worker")
	}

	key := store.ActorKey{AgentUID: "a1", SessionID: "s"}
	act, err := s.ClaimActivation(ctx, store.ClaimActivationParams{Key: key, UID: "act", LeaseID: "l", HostID: "h",
		LeaseTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	d, err := s.NextDelivery(ctx, store.NextDeliveryParams{Activation: act.Ref(), DeliveryID: "d", MarkSent: true,
		Binding: "sha256:m1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CommitTurn(ctx, store.CommitTurnParams{Ref: d.Delivery.TurnRef(), Outcome: abi.OutcomeOK}); err != nil {
		t.Fatal(err)
	}

	if _, _, err := s.PutPluginWorker(ctx, store.PluginWorker{Name: "coder", Path: "/p", SHA256: "00", Processes: 1}); err != nil {
		t.Fatal(err)
	}
	up := store.CreateAgentParams{UID: "ignored", Name: "alpha", Kind: store.KindPlugin, Plugin: "coder",
		CrashPolicy: store.CrashSleep, Upsert: true}
	if a, err := s.CreateAgent(ctx, up); err != nil || a.UID != "a1" || a.Kind != store.KindPlugin {
		t.Fatalf("upsert of a migrated agent to plugin: %+v, %v", a, err)
	}
	if _, err := p.DownTo(ctx, 2); err == nil {
		t.Fatal("down to 2 with a plugin agent: no error")
	}
	// Read by SQL: the refused down took the namespaces (00010) away,
	// which the driver's reads need.
	var kind, plugin string
	if err := pool.QueryRow(ctx, `SELECT kind, plugin FROM agents WHERE name = 'alpha'`).Scan(&kind, &plugin); err != nil ||
		kind != store.KindPlugin || plugin != "coder" {
		t.Fatalf("agent after a refused down: %s %s, %v", kind, plugin, err)
	}
	// The refused down rolled back the migrations above 3 before it
	// stopped (agent_versions among them, which CreateAgent writes): up
	// again.
	if _, err := p.Up(ctx); err != nil {
		t.Fatalf("up after the refused down: %v", err)
	}
	up.Kind, up.Plugin, up.ModuleDigest = store.KindWasm, "", "sha256:m1"
	if _, err := s.CreateAgent(ctx, up); err != nil {
		t.Fatal(err)
	}
	if _, err := p.DownTo(ctx, 2); err != nil {
		t.Fatalf("down to 2: %v", err)
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatalf("up again: %v", err)
	}
}

// migrationProvider opens a fresh test database and a goose provider over
// this driver's embedded migrations, none applied yet; both are closed
// when the test ends.
func migrationProvider(ctx context.Context, t *testing.T) (dsn string, pool *pgxpool.Pool, p *goose.Provider) {
	t.Helper()
	dsn = pgtest.DSN(t)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { db.Close() })
	sub, err := fs.Sub(migrationFS, "migrations")
	if err != nil {
		t.Fatal(err)
	}
	p, err = goose.NewProvider(goose.DialectPostgres, db, sub, goose.WithDisableGlobalRegistry(true),
		goose.WithLogger(goose.NopLogger()))
	if err != nil {
		t.Fatal(err)
	}
	return dsn, pool, p
}

// TestMigration00006AddsTheJournal applies 00001-00005, writes a committed
// turn and a turn in flight the way the previous driver did, then opens the
// store (which applies 00006): the old turn reads with zero usage, the turn
// in flight records a host call and commits with its usage, secrets are
// stored. 00006 goes down with rows in the new tables and comes up again.
func TestMigration00006AddsTheJournal(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn, pool, p := migrationProvider(ctx, t)
	if _, err := p.UpTo(ctx, 5); err != nil {
		t.Fatalf("up to 5: %v", err)
	}
	_, err := pool.Exec(ctx, `
		INSERT INTO modules (digest, abi_version, size, bytes) VALUES ('sha256:m', 1, 1, '\x00');
		INSERT INTO agents (agent_uid, name, kind, module_digest, crash_policy) VALUES ('a', 'agent', 'wasm', 'sha256:m', 'restart');
		INSERT INTO sessions (agent_uid, session_id, crash_policy, last_event_seq, turn_count, actor_epoch)
		VALUES ('a', 's', 'restart', 2, 1, 1);
		INSERT INTO actor_events (agent_uid, session_id, seq, kind, payload, status, next_attempt_at, accepted_at, closed_at)
		VALUES ('a', 's', 1, 'message', '{"message": "one"}', 'done', clock_timestamp(), clock_timestamp(), clock_timestamp());
		INSERT INTO turns (agent_uid, session_id, turn_no, event_id, delivery_id, actor_epoch, outcome, committed_at)
		SELECT 'a', 's', 1, event_id, 'd1', 1, 'ok', clock_timestamp() FROM actor_events WHERE seq = 1;
		INSERT INTO actor_events (agent_uid, session_id, seq, kind, payload, next_attempt_at, accepted_at)
		VALUES ('a', 's', 2, 'message', '{"message": "two"}', clock_timestamp(), clock_timestamp());`)
	if err != nil {
		t.Fatalf("version-5 rows: %v", err)
	}

	s, err := Open(ctx, dsn)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer s.Close()
	key := store.ActorKey{AgentUID: "a", SessionID: "s"}
	turns, err := s.Transcript(ctx, store.TranscriptParams{Key: key})
	if err != nil {
		t.Fatal(err)
	}
	if len(turns) != 1 || turns[0].Usage != (abi.Usage{}) {
		t.Fatalf("migrated transcript = %+v", turns)
	}
	act, err := s.ClaimActivation(ctx, store.ClaimActivationParams{Key: key, UID: "act", LeaseID: "l", HostID: "h",
		LeaseTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	d, err := s.NextDelivery(ctx, store.NextDeliveryParams{Activation: act.Ref(), DeliveryID: "d2", MarkSent: true})
	if err != nil {
		t.Fatal(err)
	}
	ref := d.Delivery.TurnRef()
	if _, err := s.RecordHostCall(ctx, store.RecordHostCallParams{Ref: ref, Call: store.HostCall{Seq: 1,
		Kind: string(abi.CallKindModel), Destination: "e/m", RequestDigest: "sha256:r", Result: []byte("{}"),
		InputTokens: 3, OutputTokens: 4}}); err != nil {
		t.Fatalf("RecordHostCall: %v", err)
	}
	turn, err := s.CommitTurn(ctx, store.CommitTurnParams{Ref: ref, Outcome: abi.OutcomeOK})
	if err != nil {
		t.Fatal(err)
	}
	if turn.TurnNo != 2 || turn.Usage != (abi.Usage{InputTokens: 3, OutputTokens: 4}) {
		t.Fatalf("turn after the upgrade = %+v", turn)
	}
	if _, _, err := s.PutSecret(ctx, store.DefaultNamespace, "k", []byte("sealed")); err != nil {
		t.Fatal(err)
	}
	if _, err := p.DownTo(ctx, 5); err != nil {
		t.Fatalf("down to 5: %v", err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM turns`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("turns after the down: %d, %v", n, err)
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatalf("up again: %v", err)
	}
}

// TestMigration00007AddsTheStream applies 00001-00006, writes a session
// with an open event the way the previous driver did, then opens the store
// (which applies 00007): the session's stream is empty (head 0), its next
// turn streams from Seq 1 and commits with a wait. 00007 goes down with
// rows in the new tables and comes up again.
func TestMigration00007AddsTheStream(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn, pool, p := migrationProvider(ctx, t)
	if _, err := p.UpTo(ctx, 6); err != nil {
		t.Fatalf("up to 6: %v", err)
	}
	_, err := pool.Exec(ctx, `
		INSERT INTO modules (digest, abi_version, size, bytes) VALUES ('sha256:m', 1, 1, '\x00');
		INSERT INTO agents (agent_uid, name, kind, module_digest, crash_policy) VALUES ('a', 'agent', 'wasm', 'sha256:m', 'restart');
		INSERT INTO sessions (agent_uid, session_id, crash_policy, last_event_seq) VALUES ('a', 's', 'restart', 1);
		INSERT INTO actor_events (agent_uid, session_id, seq, kind, payload, next_attempt_at, accepted_at)
		VALUES ('a', 's', 1, 'message', '{"message": "one"}', clock_timestamp(), clock_timestamp());`)
	if err != nil {
		t.Fatalf("version-6 rows: %v", err)
	}

	s, err := Open(ctx, dsn)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer s.Close()
	key := store.ActorKey{AgentUID: "a", SessionID: "s"}
	pg, err := s.StreamFrames(ctx, store.StreamFramesParams{Key: key})
	if err != nil || pg.Head != 0 || pg.Oldest != 1 || len(pg.Frames) != 0 {
		t.Fatalf("migrated session's stream = %+v, %v; want empty", pg, err)
	}
	act, err := s.ClaimActivation(ctx, store.ClaimActivationParams{Key: key, UID: "act", LeaseID: "l", HostID: "h",
		LeaseTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	d, err := s.NextDelivery(ctx, store.NextDeliveryParams{Activation: act.Ref(), DeliveryID: "d1", MarkSent: true})
	if err != nil {
		t.Fatal(err)
	}
	ref := d.Delivery.TurnRef()
	if _, err := s.AppendChunks(ctx, store.AppendChunksParams{Ref: ref, Attempt: d.Attempt,
		Chunks: []abi.Chunk{{Type: abi.ChunkText, Text: "hi"}}}); err != nil {
		t.Fatalf("AppendChunks: %v", err)
	}
	if _, err := s.CommitTurn(ctx, store.CommitTurnParams{Ref: ref, Outcome: abi.OutcomeWait,
		Wait: &store.WaitParams{ID: "w", Timeout: time.Hour}}); err != nil {
		t.Fatalf("CommitTurn: %v", err)
	}
	pg, err = s.StreamFrames(ctx, store.StreamFramesParams{Key: key})
	if err != nil || pg.Head != 4 || len(pg.Frames) != 4 || pg.Frames[0].Seq != 1 {
		t.Fatalf("stream after the upgrade = %+v, %v; want turn.started, chunk, turn.committed, wait.opened from 1", pg, err)
	}
	if _, err := p.DownTo(ctx, 6); err != nil {
		t.Fatalf("down to 6: %v", err)
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatalf("up again: %v", err)
	}
}

// TestMigration00014KeepsEveryCheck applies every migration, writes a
// session with an event, an activation, a delivery, a stream frame, a
// journal row and a wait,
// then tries each value the old CHECK constraints refused: each is refused
// with a check violation (23514) by the column's domain. 00014 goes down
// with those rows in place (the table CHECKs back, the rows still valid)
// and up again, rewriting no table.
func TestMigration00014KeepsEveryCheck(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, pool, p := migrationProvider(ctx, t)
	if _, err := p.Up(ctx); err != nil {
		t.Fatalf("up: %v", err)
	}
	_, err := pool.Exec(ctx, `
		INSERT INTO modules (digest, abi_version, size, bytes) VALUES ('sha256:m', 1, 1, '\x00');
		INSERT INTO module_namespaces (namespace, digest) VALUES ('default', 'sha256:m');
		INSERT INTO agents (agent_uid, name, module_digest, crash_policy) VALUES ('a', 'agent', 'sha256:m', 'sleep');
		INSERT INTO sessions (agent_uid, session_id, crash_policy, last_event_seq) VALUES ('a', 's', 'sleep', 1);
		INSERT INTO actor_events (agent_uid, session_id, seq, kind, payload, next_attempt_at, accepted_at)
		VALUES ('a', 's', 1, 'message', '{}', clock_timestamp(), clock_timestamp());
		INSERT INTO activations (activation_uid, agent_uid, session_id, actor_epoch, lease_id, host_id, lease_expires_at,
			state)
		VALUES ('act', 'a', 's', 1, 'l', 'h', clock_timestamp(), 'active');
		INSERT INTO deliveries (delivery_id, agent_uid, session_id, activation_uid, actor_epoch, event_id, revision, state)
		SELECT 'd', 'a', 's', 'act', 1, event_id, 0, 'sent' FROM actor_events;
		INSERT INTO stream_heads (agent_uid, session_id, last_seq) VALUES ('a', 's', 1);
		INSERT INTO stream_frames (agent_uid, session_id, seq, kind, body) VALUES ('a', 's', 1, 'turn.started', '{}');
		INSERT INTO host_calls (agent_uid, session_id, event_id, seq, actor_epoch, kind, destination, request_digest,
			result, started_at)
		SELECT 'a', 's', event_id, 1, 1, 'model', 'm', 'sha256:r', '\x00', clock_timestamp() FROM actor_events;
		INSERT INTO waits (agent_uid, session_id, wait_id, kind, event_id, created_at)
		SELECT 'a', 's', 'w', 'approval', event_id, clock_timestamp() FROM actor_events;`)
	if err != nil {
		t.Fatalf("valid rows: %v", err)
	}
	refused := func() {
		t.Helper()
		for _, bad := range []string{
			`UPDATE sessions SET status = 'asleep'`,
			`UPDATE sessions SET crash_policy = 'retry'`,
			`UPDATE actor_events SET status = 'closed'`,
			`UPDATE actor_events SET traceparent = repeat('x', 257)`,
			`UPDATE activations SET state = 'running'`,
			`UPDATE deliveries SET state = 'lost'`,
			`UPDATE stream_frames SET seq = 0`,
			`UPDATE stream_heads SET last_seq = 0`,
			`UPDATE host_calls SET seq = 0`,
			`UPDATE host_calls SET kind = 'tool'`,
			`UPDATE host_calls SET request_digest = ''`,
			`UPDATE waits SET kind = 'timer'`,
			`UPDATE waits SET status = 'done'`,
		} {
			_, err := pool.Exec(ctx, bad)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "23514" {
				t.Errorf("%s: err = %v; want a check violation (23514)", bad, err)
			}
		}
	}
	refused()
	if _, err := p.DownTo(ctx, 13); err != nil {
		t.Fatalf("down to 13: %v", err)
	}
	refused()
	files := func() map[string]uint32 {
		t.Helper()
		out := map[string]uint32{}
		for _, table := range []string{"sessions", "actor_events", "activations", "deliveries", "stream_frames",
			"stream_heads", "host_calls", "waits"} {
			var f uint32
			if err := pool.QueryRow(ctx, `SELECT relfilenode FROM pg_class WHERE oid = $1::regclass`, table).Scan(&f); err != nil {
				t.Fatalf("relfilenode of %s: %v", table, err)
			}
			out[table] = f
		}
		return out
	}
	before := files()
	if _, err := p.Up(ctx); err != nil {
		t.Fatalf("up again: %v", err)
	}
	refused()
	if after := files(); !reflect.DeepEqual(after, before) {
		t.Errorf("tables' files %v before 00014, %v after: a table was rewritten", before, after)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM actor_events WHERE status = 'open'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("open events after down and up = %d, %v; want 1", n, err)
	}
}
