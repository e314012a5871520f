// Package postgres is Paddock's production store driver: PostgreSQL through
// jackc/pgx/v5 and pgxpool, for one or many hosts sharing a database.
//
// How it keeps the store's promises (docs/DESIGN.md "Invariants"):
//
//   - Fences in SQL. CommitTurn and FailAttempt lock the activation row
//     (SELECT ... FOR UPDATE) first, so that a commit and the watchdog's
//     ExpireActivation serialise, then run UPDATEs whose WHERE compares every
//     turn_ref field by equality, the lease against clock_timestamp(). A
//     guarded UPDATE that matches no row rolls the transaction back; reads in
//     the same transaction only explain why (*store.FenceError), they never
//     decide.
//   - One live activation per actor key is the partial unique index
//     activations_live, used as the ON CONFLICT arbiter of ClaimActivation.
//   - The database clock. Every correctness time is clock_timestamp() (the
//     statement's wall time, not now(), which is frozen at BEGIN); durations
//     are passed as microseconds and added in SQL.
//   - READ COMMITTED with row locks, no SERIALIZABLE: each per-session write
//     path locks the rows it guards, always in one order: the activation,
//     (on the turn paths) its current event, alarms, the session, other
//     events. The turn paths (NextDelivery, CommitTurn, FailAttempt,
//     ExpireActivation) lock the activation first; an event is current for
//     at most one activation, so only its lock holder locks it that early.
//     CommitTurn writes alarms before it bumps the
//     session's turn count, and a crash policy "destroy" deletes alarms
//     before it destroys the session. Steer, CancelEvent, SleepSession and
//     DestroySession lock the live activation, then the session (lockKey),
//     rereading the live activation under the session lock so that a claim
//     committed in between reruns them. FireDueAlarms locks a batch of
//     alarms (FOR UPDATE SKIP LOCKED: racing hosts take different alarms),
//     then their sessions, sorted by actor key (as group commit does). ClaimActivation reads for a live activation before it locks
//     the session, so that it does not queue behind a commit that itself
//     waits for the session row. Deadlocks (40P01), serialisation failures
//     (40001) and those lock races, possible only through unusual
//     interleavings, are retried a few times (TestLifecycleHammerHasNoDeadlocks
//     checks the server's deadlock counter stays at zero).
//   - LISTEN/NOTIFY. Every write that should wake a host runs
//     pg_notify('paddock_events', 'agent_uid/session_id') in its transaction
//     (sent at commit): AppendEvent, Steer, CancelEvent, RedriveEvent,
//     DiscardEvent, WakeSession, DestroySession and each alarm firing.
//     AppendEvent's and Steer's payload is tagged
//     'origin:seq:agent_uid/session_id' (origin: this Store value's random
//     id, seq: the event's), so that SubscribeEchoes tells this process's
//     own appends from the rest. Subscribe listens on a dedicated connection
//     outside the pool and reconnects with backoff. It is a wake-up hint
//     only: RunnableSessions is the truth.
//   - Deadlines. Every call runs under a context deadline (the caller's, or
//     the store's call timeout when the caller set none), because pgxpool has
//     no acquire timeout.
//
// Schema changes are goose migrations embedded from migrations/ and applied
// by Open under a PostgreSQL advisory lock, so that several hosts starting at
// once migrate one at a time.
package postgres

import (
	"cmp"
	"context"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"net"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/paddock-dev/paddock/store"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Defaults of the store's options.
const (
	// DefaultCallTimeout bounds a call whose context has no deadline.
	DefaultCallTimeout = 10 * time.Second
	// notifyChannel is the LISTEN/NOTIFY channel of new events.
	notifyChannel = "paddock_events"
	// txAttempts bounds retries of a transaction that hit a deadlock or a
	// serialisation failure.
	txAttempts = 4
)

// ListenerApplicationName is the application_name of Subscribe's
// connections when the DSN sets none, to find them in pg_stat_activity.
const ListenerApplicationName = "paddock-listener"

// liveStates is the SQL list of live activation states; it must match the
// predicate of the activations_live index.
const liveStates = `('starting', 'active', 'draining')`

// Store is the PostgreSQL store. It is safe for concurrent use.
type Store struct {
	pool *pgxpool.Pool
	// leases is a small pool of its own for lease renewal and the lease
	// watchdog's scan, so that a host whose main pool is saturated by turns
	// and API calls still renews its leases on time (a lease that runs out
	// under load costs the turn an attempt).
	leases *pgxpool.Pool
	// listenCfg configures Subscribe's dedicated connections.
	listenCfg   *pgx.ConnConfig
	callTimeout time.Duration

	// closedCtx is cancelled by Close; subscriptions end with it.
	closedCtx context.Context
	closeCtx  context.CancelFunc
	mu        sync.Mutex // guards isClosed and subs.Add
	isClosed  bool
	subs      sync.WaitGroup

	// groupCommit sends concurrent appends and audit rows, commits,
	// one-statement dispatches, deferred dispatches' reads and promotions
	// and activation claims in shared batches (groups, a batcher per lane).
	groupCommit bool
	groups

	// origin tags the notifications of this Store value's appends, so that
	// its own listeners tell their echoes from other writers' (subscribe.go).
	origin string
}

var _ store.Store = (*Store)(nil)

// Option configures Open.
type Option func(*config)

type config struct {
	callTimeout   time.Duration
	maxConns      int32
	tracer        pgx.QueryTracer
	noGroupCommit bool
}

// WithoutGroupCommit sends every AppendEvent, CommitTurn, dispatch and
// AppendAudit on its own (default: group commit, groupcommit.go).
func WithoutGroupCommit() Option {
	return func(c *config) { c.noGroupCommit = true }
}

// WithTracer installs a pgx tracer on every connection of the main pool
// (not the lease pool or subscriptions). It may also implement
// pgx.BatchTracer and pgx.PrepareTracer. `paddock bench` counts round trips
// with it.
func WithTracer(t pgx.QueryTracer) Option {
	return func(c *config) { c.tracer = t }
}

// WithCallTimeout sets the deadline given to calls whose context has none
// (default DefaultCallTimeout).
func WithCallTimeout(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.callTimeout = d
		}
	}
}

// WithMaxConns caps the connection pool (default: pool_max_conns from the
// DSN, else max(20, 4 × NumCPU)). Subscribe's connections and the group
// commit's three (one per lane, taken out of the pool) are extra.
func WithMaxConns(n int32) Option {
	return func(c *config) {
		if n > 0 {
			c.maxConns = n
		}
	}
}

// Open connects to the database named by dsn (a postgres:// URL or a
// keyword/value string, pool_* settings allowed), checks the connection and
// applies the embedded migrations.
func Open(ctx context.Context, dsn string, opts ...Option) (*Store, error) {
	cfg := config{callTimeout: DefaultCallTimeout}
	for _, o := range opts {
		o(&cfg)
	}
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("store/postgres: open: parse dsn: %w", err)
	}
	switch {
	case cfg.maxConns > 0:
		pcfg.MaxConns = cfg.maxConns
	case !strings.Contains(dsn, "pool_max_conns"):
		// pgxpool's default, max(4, NumCPU), starves a host that runs many
		// sessions at once; 20 is DBOS's default and what peers use.
		pcfg.MaxConns = max(20, int32(4*runtime.NumCPU()))
	}
	// A batch sent without BEGIN runs as one implicit transaction (the
	// group commit, a commit in one round trip): at READ
	// COMMITTED, as BEGIN says elsewhere, whatever the database's default.
	pcfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "read committed"
	ctx, cancel := withDeadline(ctx, max(cfg.callTimeout, time.Minute))
	defer cancel()
	lcfg := pcfg.Copy()
	if cfg.tracer != nil {
		pcfg.ConnConfig.Tracer = cfg.tracer
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("store/postgres: open: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("store/postgres: open: ping: %w", err)
	}
	if err := migrate(ctx, pool); err != nil {
		pool.Close()
		return nil, fmt.Errorf("store/postgres: open: migrate: %w", err)
	}
	lcfg.MaxConns, lcfg.MinConns = 2, 1
	leases, err := pgxpool.NewWithConfig(ctx, lcfg)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("store/postgres: open: lease pool: %w", err)
	}
	listenCfg := pcfg.ConnConfig.Copy()
	if listenCfg.RuntimeParams["application_name"] == "" {
		listenCfg.RuntimeParams["application_name"] = ListenerApplicationName
	}
	closedCtx, closeCtx := context.WithCancel(context.Background())
	s := &Store{
		pool:        pool,
		leases:      leases,
		listenCfg:   listenCfg,
		callTimeout: cfg.callTimeout,
		closedCtx:   closedCtx,
		closeCtx:    closeCtx,
		groupCommit: !cfg.noGroupCommit,
		origin:      fmt.Sprintf("%016x", rand.Uint64()),
	}
	s.groups = newGroups(s)
	return s, nil
}

// migrate applies the embedded goose migrations through a database/sql view
// of the pool, holding a session advisory lock while it does.
func migrate(ctx context.Context, pool *pgxpool.Pool) error {
	db := stdlib.OpenDBFromPool(pool) // closing db leaves the pool open
	defer db.Close()
	sub, err := fs.Sub(migrationFS, "migrations")
	if err != nil {
		return err
	}
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockTimeout(1, 300), lock.WithUnlockTimeout(1, 60))
	if err != nil {
		return err
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, sub,
		goose.WithSessionLocker(locker),
		goose.WithDisableGlobalRegistry(true),
		goose.WithLogger(goose.NopLogger()),
	)
	if err != nil {
		return err
	}
	_, err = p.Up(ctx)
	return err
}

// Driver returns "postgres".
func (s *Store) Driver() string { return "postgres" }

// Close ends subscriptions, waits for their connections to close and closes
// the pool. It is idempotent.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.isClosed {
		s.mu.Unlock()
		return nil
	}
	s.isClosed = true
	s.mu.Unlock()
	s.closeCtx()
	s.subs.Wait()
	s.leases.Close()
	s.pool.Close()
	return nil
}

// withDeadline adds d to ctx unless it already has a deadline.
func withDeadline(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, d)
}

// call runs fn under the call deadline and prefixes its error with
// "store/postgres: op: ". Typed store errors that carry data
// (*store.FenceError, *store.NoDueEventError) are returned as they are, so
// that a type assertion works as well as errors.As.
func (s *Store) call(ctx context.Context, op string, fn func(ctx context.Context) error) error {
	ctx, cancel := withDeadline(ctx, s.callTimeout)
	defer cancel()
	return wrap(op, fn(ctx))
}

// tx runs fn in one READ COMMITTED transaction under the call deadline,
// committing when fn returns nil and rolling back otherwise. A deadlock or
// serialisation failure (anywhere, including COMMIT) reruns fn from the
// start; fn must therefore have no effects outside the transaction.
func (s *Store) tx(ctx context.Context, op string, fn func(ctx context.Context, tx pgx.Tx) error) error {
	return s.txWith(ctx, op, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, fn)
}

// readTx runs fn in one read-only REPEATABLE READ transaction (one snapshot
// for several reads) under the call deadline.
func (s *Store) readTx(ctx context.Context, op string, fn func(ctx context.Context, tx pgx.Tx) error) error {
	return s.txWith(ctx, op, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, fn)
}

// txWith is tx with the given transaction options.
func (s *Store) txWith(ctx context.Context, op string, opts pgx.TxOptions, fn func(ctx context.Context, tx pgx.Tx) error) error {
	return s.rerun(ctx, op, func(ctx context.Context) error { return s.txOnce(ctx, opts, fn) })
}

// rerun runs one transaction attempt under the call deadline, again (up
// to txAttempts times, after a jittered 1-2, 2-4, 4-8 ms) while it fails
// with a deadlock, a serialisation failure or errLockRace.
func (s *Store) rerun(ctx context.Context, op string, once func(ctx context.Context) error) error {
	ctx, cancel := withDeadline(ctx, s.callTimeout)
	defer cancel()
	var err error
	for attempt := 1; ; attempt++ {
		err = once(ctx)
		if !retryable(err) || attempt == txAttempts || ctx.Err() != nil {
			break
		}
		d := time.Duration(1<<(attempt-1)) * time.Millisecond
		d += rand.N(d)
		select {
		case <-time.After(d):
		case <-ctx.Done():
		}
	}
	return wrap(op, err)
}

func (s *Store) txOnce(ctx context.Context, opts pgx.TxOptions, fn func(ctx context.Context, tx pgx.Tx) error) error {
	tx, err := s.pool.BeginTx(ctx, opts)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	if err := fn(ctx, tx); err != nil {
		// Rollback under its own short deadline: ctx may be what failed.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = tx.Rollback(rctx)
		cancel()
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// wrap prefixes err with the package and operation, except for the typed
// errors callers inspect by type, and marks a failure to reach the server
// as store.ErrUnavailable.
func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	var fe *store.FenceError
	var nd *store.NoDueEventError
	if errors.As(err, &fe) {
		return fe
	}
	if errors.As(err, &nd) {
		return nd
	}
	return store.MarkUnavailable(fmt.Errorf("store/postgres: %s: %w", op, err))
}

// SQLSTATE codes the driver branches on.
const (
	codeUniqueViolation      = "23505"
	codeForeignKeyViolation  = "23503"
	codeSerializationFailure = "40001"
	codeDeadlockDetected     = "40P01"
)

// pgCode returns err's SQLSTATE, or "".
func pgCode(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// errLockRace rolls a transaction back to be run again: between finding a
// row and locking it in the driver's lock order, another transaction changed
// which row it should have been (see lockKey).
var errLockRace = errors.New("lock race: rows changed while being locked")

// retryable reports whether a transaction failed only because of how it
// interleaved with another, or because a schema change outdated a
// statement the connection had prepared (SQLSTATE 0A000, "cached plan
// must not change result type": the server refused it before it wrote
// anything, and pgx dropped it from the connection's cache, so the rerun
// prepares it again).
func retryable(err error) bool {
	if errors.Is(err, errLockRace) {
		return true
	}
	switch pgCode(err) {
	case codeSerializationFailure, codeDeadlockDetected, codeCachedPlanChanged:
		return true
	}
	return false
}

// endsConnection reports whether e has severity FATAL or PANIC: the
// backend ends the connection, whether or not its transaction committed.
func endsConnection(e *pgconn.PgError) bool {
	sev := cmp.Or(e.SeverityUnlocalized, e.Severity)
	return sev == "FATAL" || sev == "PANIC"
}

// connectionEnded reports whether err ended the connection rather than
// the transaction: a server error of severity FATAL or PANIC
// (endsConnection), the connection closed or timed out. The transaction
// may have committed, so the request must not run again.
func connectionEnded(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return endsConnection(pe)
	}
	var ne net.Error
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &ne) || pgconn.Timeout(err)
}

// notFound maps pgx.ErrNoRows to store.ErrNotFound.
func notFound(err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return store.ErrNotFound
	}
	return err
}

// micros converts a duration to whole microseconds (PostgreSQL's interval
// resolution) for "clock_timestamp() + $n * interval '1 microsecond'";
// negative durations count as zero.
func micros(d time.Duration) int64 { return max(d, 0).Microseconds() }

// nullString stores "" as NULL.
func nullString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// nilIfEmpty stores and returns an empty blob as nil (NULL).
func nilIfEmpty(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return b
}

// utc returns t in UTC; pgx scans timestamptz in the local zone.
func utc(t time.Time) time.Time { return t.UTC() }

// utcPtr is utc for a nullable column.
func utcPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}
