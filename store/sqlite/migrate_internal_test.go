package sqlite

import (
	"database/sql"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pressly/goose/v3"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

// v2Rows is what a part-2 store holds: two agents, sessions with state, a
// committed turn, a dead letter with its error chain, an alarm, and a turn in
// flight (live activation, sent delivery) that must still commit after the
// upgrade.
const v2Rows = `
INSERT INTO modules (digest, abi_version, size, bytes, created_at) VALUES
    ('sha256:m1', 1, 1, x'00', 1000), ('sha256:m2', 1, 1, x'01', 2000);
INSERT INTO agents (agent_uid, name, module_digest, crash_policy, created_at, updated_at) VALUES
    ('a1', 'alpha', 'sha256:m1', 'sleep', 1000, 1100),
    ('a2', 'beta', 'sha256:m2', 'restart', 2000, 2200);
INSERT INTO sessions (agent_uid, session_id, key, input, status, crash_policy, actor_epoch, last_event_seq,
    turn_count, created_at, sleep_reason) VALUES
    ('a1', 's1', 'k1', x'0102', 'active', 'sleep', 2, 3, 1, 1200, NULL),
    ('a2', 's2', NULL, NULL, 'sleeping', 'restart', 0, 0, 0, 2300, 'capacity');
INSERT INTO session_state (agent_uid, session_id, state, updated_at) VALUES ('a1', 's1', x'ff', 1300);
INSERT INTO actor_events (agent_uid, session_id, seq, kind, payload, idempotency_key, status, attempts,
    next_attempt_at, last_error, binding, accepted_at, closed_at) VALUES
    ('a1', 's1', 1, 'message', '{"message":"one"}', 'idem-1', 'done', 0, 1200, NULL, 'sha256:m1', 1200, 1250),
    ('a1', 's1', 2, 'message', '{"message":"two"}', NULL, 'dead_letter', 3, 1260, 'boom', 'sha256:m1', 1260, 1270),
    ('a1', 's1', 3, 'message', '{"message":"three"}', NULL, 'open', 0, 1280, NULL, 'sha256:m1', 1280, NULL);
INSERT INTO activations (activation_uid, agent_uid, session_id, actor_epoch, lease_id, lease_expires_at,
    current_event_id, revision, state, host_id, created_at) VALUES
    ('act1', 'a1', 's1', 1, 'l1', 1240, NULL, 0, 'stopped', 'h', 1210),
    ('act2', 'a1', 's1', 2, 'l2', CAST(unixepoch('subsec')*1000 AS INTEGER) + 3600000, 3, 0, 'active', 'h', 1290);
INSERT INTO deliveries (delivery_id, agent_uid, session_id, activation_uid, actor_epoch, event_id, revision,
    state, binding, created_at, sent_at, closed_at) VALUES
    ('d1', 'a1', 's1', 'act1', 1, 1, 0, 'accepted', 'sha256:m1', 1220, 1221, 1250),
    ('d3', 'a1', 's1', 'act2', 2, 3, 0, 'sent', 'sha256:m1', 1295, 1296, NULL);
INSERT INTO turns (agent_uid, session_id, turn_no, event_id, delivery_id, actor_epoch, outcome, committed_at)
    VALUES ('a1', 's1', 1, 1, 'd1', 1, 'ok', 1250);
INSERT INTO messages (agent_uid, session_id, turn_no, idx, role, content) VALUES
    ('a1', 's1', 1, 0, 'user', 'one'), ('a1', 's1', 1, 1, 'assistant', 'reply one');
INSERT INTO event_errors (agent_uid, session_id, event_id, attempt_seq, attempt, actor_epoch, counted, error,
    failed_at) VALUES ('a1', 's1', 2, 1, 3, 1, 1, 'boom', 1270);
INSERT INTO alarms (agent_uid, session_id, name, due_at, every_ms, data, set_at)
    VALUES ('a1', 's1', 'tick', 99999999999999, 0, '{"n":1}', 1250);
`

// openV2 creates a database at path with migrations 1 and 2 only, the way
// a part-2 driver left it, and fills it with v2Rows.
func openV2(t *testing.T, path string) {
	t.Helper()
	ctx := t.Context()
	db, p := gooseOn(t, path)
	defer db.Close()
	if _, err := p.UpTo(ctx, 2); err != nil {
		t.Fatalf("up to 2: %v", err)
	}
	if _, err := db.ExecContext(ctx, v2Rows); err != nil {
		t.Fatalf("part-2 rows: %v", err)
	}
}

// gooseOn opens the database at path the way Open's writer does, with a
// goose provider over the embedded migrations. The caller closes db.
func gooseOn(t *testing.T, path string) (*sql.DB, *goose.Provider) {
	t.Helper()
	wdsn, _, err := dsns(path, config{busyTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite", wdsn)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		t.Fatal(err)
	}
	p, err := goose.NewProvider(goose.DialectSQLite3, db, sub, goose.WithDisableGlobalRegistry(true),
		goose.WithLogger(goose.NopLogger()))
	if err != nil {
		t.Fatal(err)
	}
	return db, p
}

// latestVersion is the goose version of the newest migration.
const latestVersion = "10"

// dumpQueries read every row of every table but agents and plugin_workers,
// in a stable order, and the schema of every object except those two
// tables and their automatic indexes, and sessions_key (which 00004
// changes; TestMigration00003KeepsRowsIndexesAndReferences checks it).
var dumpQueries = []string{
	`SELECT type, name, tbl_name, coalesce(sql, '') FROM sqlite_schema
	  WHERE tbl_name NOT IN ('agents', 'plugin_workers', 'goose_db_version') AND name <> 'sessions_key' ORDER BY type, name`,
	`SELECT * FROM modules ORDER BY digest`,
	`SELECT * FROM sessions ORDER BY agent_uid, session_id`,
	`SELECT * FROM session_state ORDER BY agent_uid, session_id`,
	`SELECT * FROM actor_events ORDER BY event_id`,
	`SELECT * FROM activations ORDER BY activation_uid`,
	`SELECT * FROM deliveries ORDER BY delivery_id`,
	`SELECT * FROM turns ORDER BY agent_uid, session_id, turn_no`,
	`SELECT * FROM messages ORDER BY agent_uid, session_id, turn_no, idx`,
	`SELECT * FROM event_errors ORDER BY agent_uid, session_id, event_id, attempt_seq`,
	`SELECT * FROM alarms ORDER BY agent_uid, session_id, name`,
}

// dump renders the rows of queries as text.
func dump(t *testing.T, db *sql.DB, queries ...string) string {
	t.Helper()
	var b strings.Builder
	for _, q := range queries {
		rows, err := db.QueryContext(t.Context(), q)
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		cols, err := rows.Columns()
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s\n", cols)
		for rows.Next() {
			vals := make([]any, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				t.Fatal(err)
			}
			for i, v := range vals {
				if i > 0 {
					b.WriteString(" | ")
				}
				fmt.Fprintf(&b, "%v", v)
			}
			b.WriteString("\n")
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		rows.Close()
	}
	return b.String()
}

func queryString(t *testing.T, db *sql.DB, q string) string {
	t.Helper()
	var s string
	if err := db.QueryRowContext(t.Context(), q).Scan(&s); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return s
}

// TestMigration00003KeepsRowsIndexesAndReferences upgrades a part-2
// database with data in it: the agents rebuild keeps every row (as kind
// wasm), every other table's rows and schema, the sessions' references to
// agents, and leaves foreign keys enforced on the writer.
func TestMigration00003KeepsRowsIndexesAndReferences(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "v2.db")
	openV2(t, path)

	db, _ := gooseOn(t, path)
	before := dump(t, db, dumpQueries...)
	agentsBefore := dump(t, db, `SELECT agent_uid, name, module_digest, crash_policy, created_at, updated_at
		FROM agents ORDER BY agent_uid`)
	indexesBefore := dump(t, db, `SELECT name FROM sqlite_schema WHERE type = 'index' AND tbl_name = 'agents' ORDER BY name`)
	db.Close()

	// What 00003 and 00004 did, at version 4 (00005 adds tables and turns
	// columns: TestMigration00005AddsTheJournal).
	db, p := gooseOn(t, path)
	if _, err := p.UpTo(ctx, 4); err != nil {
		t.Fatalf("up to 4: %v", err)
	}
	if after := dump(t, db, dumpQueries...); after != before {
		t.Fatalf("rows or schema outside agents changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	db.Close()

	s, err := Open(ctx, path)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer s.Close()

	if got := queryString(t, s.w, `SELECT max(version_id) FROM goose_db_version`); got != latestVersion {
		t.Fatalf("goose version = %s, want %s", got, latestVersion)
	}
	if got := queryString(t, s.w, `SELECT sql FROM sqlite_schema WHERE name = 'sessions_key'`); !strings.Contains(got, "status <> 'destroyed'") {
		t.Fatalf("sessions_key after 00004: %s, want it partial over sessions not destroyed", got)
	}
	if got := dump(t, s.w, `SELECT agent_uid, name, module_digest, crash_policy, created_at, updated_at
		FROM agents ORDER BY agent_uid`); got != agentsBefore {
		t.Fatalf("agents changed:\nbefore:\n%s\nafter:\n%s", agentsBefore, got)
	}
	if got := dump(t, s.w, `SELECT kind, plugin IS NULL FROM agents ORDER BY agent_uid`); got != "[kind plugin IS NULL]\nwasm | 1\nwasm | 1\n" {
		t.Fatalf("kind and plugin of migrated agents:\n%s", got)
	}
	if got := dump(t, s.w, `SELECT name FROM sqlite_schema WHERE type = 'index' AND tbl_name = 'agents' ORDER BY name`); got != indexesBefore {
		t.Fatalf("indexes of agents:\nbefore:\n%s\nafter:\n%s", indexesBefore, got)
	}
	if got := queryString(t, s.w, `SELECT sql FROM sqlite_schema WHERE name = 'agents'`); !strings.Contains(got, "CREATE TABLE \"agents\"") &&
		!strings.Contains(got, "CREATE TABLE agents") {
		t.Fatalf("agents table sql: %s", got)
	}
	for _, child := range []string{"sessions"} {
		if got := queryString(t, s.w, `SELECT "table" FROM pragma_foreign_key_list('`+child+`') WHERE "from" = 'agent_uid'`); got != "agents" {
			t.Fatalf("%s references %q, want agents", child, got)
		}
	}
	if got := dump(t, s.w, `PRAGMA foreign_key_check`); got != "[table rowid parent fkid]\n" {
		t.Fatalf("foreign key violations after the upgrade:\n%s", got)
	}
	// The migration turned foreign keys off on the writer's connection and
	// must have turned them back on.
	if got := queryString(t, s.w, `PRAGMA foreign_keys`); got != "1" {
		t.Fatalf("writer foreign_keys = %s after the upgrade, want 1", got)
	}
	if _, err := s.w.ExecContext(ctx, `INSERT INTO sessions (agent_uid, session_id, crash_policy, created_at)
		VALUES ('no-such-agent', 'x', 'sleep', 1)`); err == nil {
		t.Fatalf("a session of an unknown agent was inserted: foreign keys are not enforced")
	}
	if _, err := s.w.ExecContext(ctx, `UPDATE agents SET plugin = 'no-such-plugin' WHERE agent_uid = 'a1'`); err == nil {
		t.Fatalf("agents.plugin accepted an unknown plugin worker")
	}
	if _, err := s.w.ExecContext(ctx, `UPDATE agents SET kind = 'plugin' WHERE agent_uid = 'a1'`); err == nil {
		t.Fatalf("a plugin agent with a module digest and no plugin passed the CHECK")
	}

	// Through the store: the migrated agents read as wasm, the turn in
	// flight commits, and a migrated agent can become a plugin agent.
	a, err := s.GetAgent(ctx, store.DefaultNamespace, "alpha")
	if err != nil {
		t.Fatal(err)
	}
	if a.UID != "a1" || a.Kind != store.KindWasm || a.ModuleDigest != "sha256:m1" || a.Plugin != "" ||
		a.CrashPolicy != store.CrashSleep {
		t.Fatalf("migrated agent = %+v", a)
	}
	ss, err := s.GetSession(ctx, store.ActorKey{AgentUID: "a1", SessionID: "s1"})
	if err != nil {
		t.Fatal(err)
	}
	if ss.Key != "k1" || ss.TurnCount != 1 || ss.EventCount != 3 || ss.OpenEvents != 1 || ss.DeadLetters != 1 {
		t.Fatalf("migrated session = %+v", ss)
	}
	turn, err := s.CommitTurn(ctx, store.CommitTurnParams{
		Ref: abi.TurnRef{DeliveryID: "d3", ActivationUID: "act2", ActorEpoch: 2, ActorEventID: 3, Revision: 0,
			AgentUID: "a1", SessionID: "s1"},
		Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "reply three"}},
		Outcome:  abi.OutcomeOK,
	})
	if err != nil {
		t.Fatalf("CommitTurn of the turn in flight: %v", err)
	}
	if turn.TurnNo != 2 {
		t.Fatalf("turn = %+v", turn)
	}
	if _, _, err := s.PutPluginWorker(ctx, store.PluginWorker{Name: "coder", Path: "/p", SHA256: "00", Processes: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateAgent(ctx, store.CreateAgentParams{UID: "ignored", Name: "beta", Kind: store.KindPlugin,
		Plugin: "coder", CrashPolicy: store.CrashRestart, Upsert: true}); err != nil {
		t.Fatalf("upsert of a migrated agent to plugin: %v", err)
	}
}

// TestMigration00003DownAndRerun takes 00003 down and up again, refuses to
// take it down while a plugin agent exists (leaving the database as it was),
// and reruns the Up when goose lost its version row (a crash between the
// migration's COMMIT and goose's bookkeeping).
func TestMigration00003DownAndRerun(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "v2.db")
	openV2(t, path)
	db, p := gooseOn(t, path)
	want := dump(t, db, append(dumpQueries, `SELECT * FROM agents ORDER BY agent_uid`)...)
	if _, err := p.Up(ctx); err != nil {
		t.Fatalf("up: %v", err)
	}
	if _, err := p.DownTo(ctx, 2); err != nil {
		t.Fatalf("down to 2: %v", err)
	}
	if got := dump(t, db, append(dumpQueries, `SELECT * FROM agents ORDER BY agent_uid`)...); got != want {
		t.Fatalf("after up and down:\nwant:\n%s\ngot:\n%s", want, got)
	}
	if got := queryString(t, db, `PRAGMA foreign_keys`); got != "1" {
		t.Fatalf("foreign_keys = %s after down, want 1", got)
	}
	// A crash after the Up's COMMIT: goose has no row for version 3 and
	// runs the Up again.
	if _, err := p.UpTo(ctx, 3); err != nil {
		t.Fatalf("up again: %v", err)
	}
	if _, err := db.ExecContext(ctx, `DELETE FROM goose_db_version WHERE version_id = 3`); err != nil {
		t.Fatal(err)
	}
	db.Close()

	s, err := Open(ctx, path)
	if err != nil {
		t.Fatalf("Open reruns 00003: %v", err)
	}
	list, err := s.ListAgents(ctx, store.DefaultNamespace)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].Kind != store.KindWasm || list[1].Kind != store.KindWasm {
		t.Fatalf("agents after the rerun: %+v", list)
	}
	if _, _, err := s.PutPluginWorker(ctx, store.PluginWorker{Name: "coder", Path: "/p", SHA256: "00", Processes: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateAgent(ctx, store.CreateAgentParams{UID: "a3", Name: "gamma", Kind: store.KindPlugin,
		Plugin: "coder", CrashPolicy: store.CrashRestart}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// Down refuses while the plugin agent exists, and changes nothing
	// (what 00005's Down and 00004's, which commit before 00003's refuses,
	// change is not in the dump).
	db, p = gooseOn(t, path)
	if _, err := p.DownTo(ctx, 4); err != nil {
		t.Fatalf("down to 4: %v", err)
	}
	want = dump(t, db, append(dumpQueries, `SELECT * FROM agents ORDER BY agent_uid`, `SELECT * FROM plugin_workers`)...)
	if _, err := p.DownTo(ctx, 2); err == nil {
		t.Fatalf("down to 2 with a plugin agent: no error")
	}
	db.Close() // rolls back what the failed Down began
	db, _ = gooseOn(t, path)
	defer db.Close()
	if got := dump(t, db, append(dumpQueries, `SELECT * FROM agents ORDER BY agent_uid`, `SELECT * FROM plugin_workers`)...); got != want {
		t.Fatalf("after a refused down:\nwant:\n%s\ngot:\n%s", want, got)
	}
	if got := queryString(t, db, `SELECT max(version_id) FROM goose_db_version`); got != "3" {
		t.Fatalf("goose version after a refused down = %s, want 3", got)
	}
}

// TestMigration00005AddsTheJournal upgrades a part-2 database with data in
// it to the journal: every existing row and object is kept (the dump at
// version 4 is unchanged, the committed turn reads with zero usage), the
// turn in flight records a host call and commits with its usage, secrets
// are stored; 00005 goes down with rows in its tables, back to the exact
// version-4 schema, and comes up again.
func TestMigration00005AddsTheJournal(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "v2.db")
	openV2(t, path)
	db, p := gooseOn(t, path)
	if _, err := p.UpTo(ctx, 4); err != nil {
		t.Fatalf("up to 4: %v", err)
	}
	schema4 := dump(t, db, dumpQueries[0])
	db.Close()

	s, err := Open(ctx, path)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer s.Close()
	key := store.ActorKey{AgentUID: "a1", SessionID: "s1"}
	turns, err := s.Transcript(ctx, store.TranscriptParams{Key: key})
	if err != nil {
		t.Fatal(err)
	}
	if len(turns) != 1 || turns[0].Usage != (abi.Usage{}) {
		t.Fatalf("migrated transcript = %+v", turns)
	}
	ref := abi.TurnRef{DeliveryID: "d3", ActivationUID: "act2", ActorEpoch: 2, ActorEventID: 3, AgentUID: "a1", SessionID: "s1"}
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
	if got := dump(t, s.w, `PRAGMA foreign_key_check`); got != "[table rowid parent fkid]\n" {
		t.Fatalf("foreign key violations after the upgrade:\n%s", got)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	db, p = gooseOn(t, path)
	defer db.Close()
	if _, err := p.DownTo(ctx, 4); err != nil {
		t.Fatalf("down to 4: %v", err)
	}
	if got := dump(t, db, dumpQueries[0]); got != schema4 {
		t.Fatalf("schema after the down:\nwant:\n%s\ngot:\n%s", schema4, got)
	}
	if got := queryString(t, db, `SELECT count(*) FROM turns`); got != "2" {
		t.Fatalf("turns after the down: %s", got)
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatalf("up again: %v", err)
	}
}

// TestMigration00006AddsTheStream upgrades a version-5 database with data
// in it to the session stream: the existing session reads an empty stream
// (head 0), its turn in flight streams chunks and commits (frames from
// Seq 1) with a wait; 00006 goes down with rows in its tables, back to the
// exact version-5 schema, and comes up again.
func TestMigration00006AddsTheStream(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "v5.db")
	openV2(t, path)
	db, p := gooseOn(t, path)
	if _, err := p.UpTo(ctx, 5); err != nil {
		t.Fatalf("up to 5: %v", err)
	}
	schema5 := dump(t, db, dumpQueries[0])
	db.Close()

	s, err := Open(ctx, path)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer s.Close()
	key := store.ActorKey{AgentUID: "a1", SessionID: "s1"}
	pg, err := s.StreamFrames(ctx, store.StreamFramesParams{Key: key})
	if err != nil || pg.Head != 0 || pg.Oldest != 1 || len(pg.Frames) != 0 {
		t.Fatalf("migrated session's stream = %+v, %v; want empty", pg, err)
	}
	ref := abi.TurnRef{DeliveryID: "d3", ActivationUID: "act2", ActorEpoch: 2, ActorEventID: 3, AgentUID: "a1", SessionID: "s1"}
	if _, err := s.AppendChunks(ctx, store.AppendChunksParams{Ref: ref, Attempt: 1,
		Chunks: []abi.Chunk{{Type: abi.ChunkText, Text: "hi"}}}); err != nil {
		t.Fatalf("AppendChunks: %v", err)
	}
	if _, err := s.CommitTurn(ctx, store.CommitTurnParams{Ref: ref, Outcome: abi.OutcomeWait,
		Wait: &store.WaitParams{ID: "w", Timeout: time.Hour}}); err != nil {
		t.Fatalf("CommitTurn: %v", err)
	}
	pg, err = s.StreamFrames(ctx, store.StreamFramesParams{Key: key})
	if err != nil || pg.Head != 3 || len(pg.Frames) != 3 || pg.Frames[0].Seq != 1 {
		t.Fatalf("stream after the upgrade = %+v, %v; want chunk, turn.committed, wait.opened from 1", pg, err)
	}
	if got := dump(t, s.w, `PRAGMA foreign_key_check`); got != "[table rowid parent fkid]\n" {
		t.Fatalf("foreign key violations after the upgrade:\n%s", got)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	db, p = gooseOn(t, path)
	defer db.Close()
	if _, err := p.DownTo(ctx, 5); err != nil {
		t.Fatalf("down to 5: %v", err)
	}
	if got := dump(t, db, dumpQueries[0]); got != schema5 {
		t.Fatalf("schema after the down:\nwant:\n%s\ngot:\n%s", schema5, got)
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatalf("up again: %v", err)
	}
}
