// Package store is Paddock's durable truth: the interface the host needs and
// the types it speaks, implemented by the postgres and sqlite drivers.
//
// Every fence decision lives here and is made in SQL: a turn commits only if
// the echoed turn_ref equals the delivery and activation rows inside the
// commit transaction (docs/DESIGN.md invariant 3). Nothing in this package trusts a
// value the caller read earlier. Every time comparison that decides
// correctness uses the database's clock (docs/DESIGN.md invariant 8). (DESIGN is
// docs/DESIGN.md at the repository root.)
//
// The conformance suite in store/storetest runs against every driver; its
// README.md writes down the rules it pins where this package's doc comments
// leave a choice (the fence classification order, the order of checks of
// each method, what a refused call must leave untouched).
//
// # Rules every driver follows
//
// The contract is the doc comments of Store, its parameter types and
// errors.go. Beyond them:
//
//   - Fences are WHERE equalities. A guarded write compares every field it
//     is guarded by (for a turn_ref: delivery id, activation uid, epoch,
//     event, revision, agent uid, session id; for an ActivationRef: uid, key,
//     epoch, lease id, a live state) in the statement that writes. When it
//     matches nothing, the transaction writes nothing; reads in the same
//     transaction only explain why (*FenceError, ErrNotLive). The activation
//     row is locked before the guarded writes of CommitTurn, FailAttempt,
//     NextDelivery and ExpireActivation, so a commit and the watchdog
//     serialise. RecordHostCall and ReplayHostCall are guarded writes of a
//     turn_ref too (docs/DESIGN.md invariant 12): CommitTurn's checks
//     (delivery sent, activation live at that epoch, revision and current
//     event with its lease unexpired, event open) in the statement that
//     writes the journal, after the same row lock, refused with
//     CommitTurn's classification (FenceCommit).
//   - The database clock. "now" is computed in SQL — PostgreSQL:
//     clock_timestamp() (not now(), which is frozen at BEGIN); SQLite:
//     CAST(unixepoch('subsec')*1000 AS INTEGER), timestamps being INTEGER
//     unix milliseconds. Durations (lease TTL, backoff, alarm delays) are
//     passed as numbers and added to now in SQL. Never pass time.Now() from
//     Go into a correctness decision.
//   - One session per transaction. Every per-session table carries the actor
//     key (agent_uid, session_id), and no correctness path needs two
//     sessions in one transaction, so the store can shard by actor key.
//     (The postgres driver's group commit batches several sessions' appends
//     into one transaction for throughput; it can be switched off.
//     FireDueAlarms fires a batch of due alarms, of any sessions, in one
//     transaction; each firing is decided on its own row, so a sharded
//     store could split a batch by actor key.)
//   - Sequence numbers. An event's seq is sessions.last_event_seq+1, taken
//     under the session row's lock in the transaction that inserts it; an
//     idempotency key is looked up after that lock (or the transaction is
//     rolled back on the unique violation and the key re-read), so a
//     duplicate returns the first event and leaves no seq bump behind. A
//     claim bumps sessions.actor_epoch in the transaction that inserts the
//     activation; a claim refused by the partial unique index rolls the
//     bump back. ClaimActivation never takes over an expired activation:
//     the watchdog (ExpireActivation) fails it first.
//   - The binding is written on an event only while it is empty (its first
//     attempt) and copied to each delivery; the store never interprets it.
//   - A turn's transcript messages are: index 0 the event's own message
//     (role "user", the payload's "message" string; none when it is absent
//     or empty), then each attached steer's message the same way in seq
//     order, then the worker's messages.
//   - Paging: After is exclusive; Limit defaults to 100 and is capped at
//     1000.
//   - Wake-ups are published only after the transaction commits, for every
//     write that makes a session runnable or changes what its controller
//     should do: AppendEvent and Steer (when they created an event),
//     RedriveEvent, CancelEvent, each alarm fired by FireDueAlarms,
//     DestroySession (the first time) and WakeSession (when it woke the
//     session). PostgreSQL: pg_notify('paddock_events',
//     agent_uid||'/'||session_id) inside the transaction; SQLite: a
//     non-blocking send to this process's subscribers. Subscribe is a hint;
//     RunnableSessions is the truth.
//   - Errors: the sentinels and typed errors of errors.go, wrapped with %w
//     and the operation ("store: commit turn: …"); a missing row is
//     ErrNotFound, a unique name or key taken is ErrConflict where the
//     method says so. Every call runs under a deadline: the caller's, or the
//     driver's default when the context has none.
//   - Text that may come from a guest or worker (errors, messages) must be
//     storable on both drivers: PostgreSQL refuses NUL and invalid UTF-8
//     (the host passes it through abi.SafeText).
//
// # Schema
//
// The same tables and columns on both drivers (types differ: timestamptz and
// bytea on PostgreSQL, INTEGER milliseconds and BLOB on SQLite):
//
//   - modules(digest PK, abi_version, size, bytes, created_at)
//   - plugin_workers(name PK, path, sha256, env JSON object, processes ≥ 1,
//     created_at, updated_at)
//   - agents(agent_uid PK, name UNIQUE, kind wasm|plugin, module_digest →
//     modules, plugin → plugin_workers, crash_policy, created_at,
//     updated_at); a CHECK holds exactly one of module_digest (wasm) and
//     plugin (plugin)
//   - sessions(PK agent_uid+session_id, key UNIQUE per agent when set
//     among sessions not destroyed (partial index sessions_key),
//     input, status, crash_policy, actor_epoch (highest issued),
//     last_event_seq, turn_count, created_at, sleep_ts, destroy_ts,
//     sleep_reason, pending_since)
//   - session_state(PK agent_uid+session_id, state, updated_at)
//   - actor_events(event_id PK (identity / autoincrement), agent_uid,
//     session_id, seq UNIQUE per session, kind, payload (JSON text),
//     idempotency_key UNIQUE per session when set, status, attempts,
//     next_attempt_at (the acceptance time at insert), last_error, binding,
//     accepted_at, closed_at, steer_of, redrives); partial indexes on open
//     events by seq, on dead letters, on attached steers
//   - event_errors(PK agent_uid+session_id+event_id+attempt_seq, attempt,
//     actor_epoch, counted, error, failed_at): one row per FailAttempt or
//     ExpireActivation that touched the event
//   - activations(activation_uid PK, agent_uid, session_id, actor_epoch,
//     lease_id, lease_expires_at, current_event_id, revision, state,
//     host_id, created_at, ended_at, end_reason); the partial unique index
//     on (agent_uid, session_id) WHERE state IN ('starting', 'active',
//     'draining') is docs/DESIGN.md invariant 1
//   - deliveries(delivery_id PK, agent_uid, session_id, activation_uid,
//     actor_epoch, event_id, revision, state, binding, created_at, sent_at,
//     closed_at, error)
//   - turns(PK agent_uid+session_id+turn_no, event_id UNIQUE (an event
//     commits at most once), delivery_id, actor_epoch, outcome,
//     committed_at)
//   - messages(PK agent_uid+session_id+turn_no+idx, role, content)
//   - alarms(PK agent_uid+session_id+name, due_at, every_ms, data, set_at);
//     indexed by due_at
//   - host_calls(id PK (identity / integer), agent_uid, session_id,
//     event_id, seq ≥ 1, actor_epoch, kind http|model, destination,
//     request_digest, result, error_code, status, started_at (the host's
//     clock), duration_ms, input_tokens, output_tokens, replays,
//     replayed_epoch, set_aside, created_at): the journal of docs/DESIGN.md
//     invariant 12; the partial unique index host_calls_live on (event_id,
//     seq) WHERE NOT set_aside is the journal proper (one live row per
//     event and seq); indexed by (agent_uid, started_at) for
//     AgentTokensSince. event_id references actor_events on SQLite only
//     (PostgreSQL keeps no foreign key by a bare id, like turns.event_id)
//   - turns also carry input_tokens, output_tokens: the event's journal not
//     set aside, summed when the turn is recorded (Turn.Usage)
//   - secrets(name PK, sealed (encrypted by the host), created_at,
//     updated_at)
//
// Migrations are goose SQL files embedded from each driver's migrations/
// folder and applied by Open (00001 init, 00002 the durable lifecycle,
// 00003 agent kinds and plugin workers; PostgreSQL 00004 the paddock_check
// guard function; then the session key index over live sessions
// (PostgreSQL 00005, SQLite 00004) and the journal and secrets
// (PostgreSQL 00006, SQLite 00005)). An applied migration is never edited: a
// change is the next number, on both drivers, with a Down, and an upgrade
// test with data in it (migrate_internal_test.go). SQLite cannot alter a
// column's constraints in place: a table rebuild runs with
// `-- +goose NO TRANSACTION`, foreign keys off inside an explicit BEGIN
// IMMEDIATE … COMMIT, keeping every row, index and reference, and is safe
// to rerun if the process died before goose recorded the version.
//
// # Drivers
//
// sqlite.Open(ctx, dsnOrPath, opts...) takes a path or a file: DSN and
// sets WAL, busy_timeout, foreign_keys, synchronous NORMAL; writes run on
// one connection with _txlock=immediate, pure reads on a query_only pool;
// it holds an exclusive flock on path+".lock" until Close, so a database
// file serves one process (one host) and a second Open fails with
// sqlite.ErrInUse naming the file and the holder.
// postgres.Open(ctx, dsn, opts...) uses pgxpool with READ COMMITTED and row
// locks taken in one order, retrying deadlocks and serialisation failures
// (40P01, 40001). Each driver's package doc says how it keeps these rules.
//
// # Tests
//
// A driver runs storetest.Exercise from its own test file with a fresh,
// migrated store per call; PostgreSQL tests get a fresh database each from
// store/pgtest (DATABASE_URL, or a throwaway cluster from the installed
// server binaries; never skipped). Changing the Store interface means
// extending the suite in the same change.
package store
