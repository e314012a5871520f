// Package sqlite is Paddock's embedded default store: a store.Store on one
// SQLite database file (modernc.org/sqlite, pure Go, WAL), for one host.
//
// # Why it is shaped this way
//
//   - One writer. Every write transaction runs on a single *sql.DB with one
//     connection and BEGIN IMMEDIATE (_txlock=immediate), so a transaction
//     holds the database's write lock from its first statement: the
//     activation row of a commit is as locked as it would be by SELECT ... FOR
//     UPDATE on PostgreSQL, and read-modify-write never fails with
//     SQLITE_BUSY on a lock upgrade. Pure reads use a separate query_only pool
//     (WAL gives them a snapshot while the writer works).
//   - Fences in SQL. A commit is a set of UPDATEs whose WHERE clauses compare
//     every field of the echoed turn_ref by equality with the delivery and
//     activation rows, and the lease with the database clock (docs/DESIGN.md
//     invariants 3 and 8). The rows are read only after a guarded UPDATE
//     matched nothing, to say why, in the same transaction, before rolling it
//     back.
//   - Time. Timestamps are INTEGER unix milliseconds and "now" is always
//     computed in SQL: CAST(unixepoch('subsec')*1000 AS INTEGER). Durations
//     (lease TTL, backoff) are passed as milliseconds and added in SQL.
//   - Subscribe is an in-process fan-out: only this process's appends wake
//     subscribers. That is enough for the single host SQLite serves.
//
// Limits: one process per database file, enforced: Open takes an exclusive
// advisory lock (flock(2)) on a lock file beside the database, path+".lock",
// held until Close, and fails with an *InUseError (ErrInUse) naming the file
// and the holding process when another Store has it. A SQLite file so
// serves one host: a second host on it would wait on SQLite's write lock
// behind the first, forever if the first is stopped (SIGSTOP). The kernel
// releases the lock when its process dies, kill -9 included, so a restart
// opens the file at once. Several hosts share a PostgreSQL store. A
// ":memory:" database is not supported (the reader pool would see a
// different, empty database).
package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pressly/goose/v3"
	sqlite "modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/paddock-dev/paddock/store"
)

// Schema migrations, applied by Open.
//
//go:embed migrations/*.sql
var migrations embed.FS

// nowMS is the database clock in unix milliseconds, for use inside SQL.
const nowMS = "CAST(unixepoch('subsec')*1000 AS INTEGER)"

// liveStates is the SQL list of live activation states (docs/DESIGN.md invariant 1).
const liveStates = "('starting','active','draining')"

// Defaults of the options.
const (
	defaultCallTimeout = 10 * time.Second
	defaultBusyTimeout = 10 * time.Second
)

// Option configures Open.
type Option func(*config)

type config struct {
	readers     int
	callTimeout time.Duration
	busyTimeout time.Duration
}

// WithReaders sets the size of the read-only connection pool (default:
// GOMAXPROCS, at least 2). Writes always use one connection.
func WithReaders(n int) Option {
	return func(c *config) {
		if n > 0 {
			c.readers = n
		}
	}
}

// WithCallTimeout sets the deadline put on a call whose context has none
// (default 10 s).
func WithCallTimeout(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.callTimeout = d
		}
	}
}

// WithBusyTimeout sets SQLite's busy_timeout, how long a connection waits
// for a lock held by another connection (default 10 s).
func WithBusyTimeout(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.busyTimeout = d
		}
	}
}

// Store is the SQLite implementation of store.Store. It is safe for
// concurrent use.
type Store struct {
	w   *sql.DB // the single writer: MaxOpenConns 1, BEGIN IMMEDIATE
	r   *sql.DB // readers: query_only
	cfg config
	// lock is the database file's exclusive lock, held until Close.
	lock *fileLock

	wstmts stmtCache // prepared statements of the writer
	rstmts stmtCache // prepared statements of the readers

	mu     sync.Mutex
	subs   map[*subscriber]struct{}
	closed bool
	done   chan struct{}

	// writes queue the writes for the writer's flusher (groupwrite.go),
	// which closes writerDone when it returns (after done closes).
	writes     chan *writeReq
	writerDone chan struct{}
	// sharedWrites counts the writes committed in a transaction shared
	// with others.
	sharedWrites atomic.Int64
}

var (
	_ store.Store          = (*Store)(nil)
	_ store.EchoSubscriber = (*Store)(nil)
)

// subscriber is one Subscribe (ch) or SubscribeEchoes (echoes) channel.
type subscriber struct {
	ch     chan store.ActorKey
	echoes chan store.Wakeup
}

// send hands w to the subscriber without blocking (a full channel drops
// the hint).
func (sub *subscriber) send(w store.Wakeup) {
	if sub.echoes != nil {
		select {
		case sub.echoes <- w:
		default:
		}
		return
	}
	select {
	case sub.ch <- w.Key:
	default:
	}
}

// close closes the subscriber's channel.
func (sub *subscriber) close() {
	if sub.echoes != nil {
		close(sub.echoes)
		return
	}
	close(sub.ch)
}

// Open opens (creating if needed) the database at dsnOrPath and applies the
// embedded migrations. dsnOrPath is a file path or a "file:" URI; Open adds
// the connection settings it relies on (WAL, busy_timeout, foreign_keys,
// synchronous NORMAL, _txlock=immediate for the writer, query_only for the
// readers), replacing any given for the same names.
func Open(ctx context.Context, dsnOrPath string, opts ...Option) (*Store, error) {
	cfg := config{
		readers:     max(2, runtime.GOMAXPROCS(0)),
		callTimeout: defaultCallTimeout,
		busyTimeout: defaultBusyTimeout,
	}
	for _, o := range opts {
		o(&cfg)
	}
	wdsn, rdsn, err := dsns(dsnOrPath, cfg)
	if err != nil {
		return nil, fmt.Errorf("store/sqlite: open: %w", err)
	}
	path, err := dbPath(dsnOrPath)
	if err != nil {
		return nil, fmt.Errorf("store/sqlite: open: %w", err)
	}
	lock, err := lockFile(path)
	if err != nil {
		var inUse *InUseError
		if errors.As(err, &inUse) {
			return nil, err
		}
		return nil, fmt.Errorf("store/sqlite: open: %w", err)
	}
	opened := false
	defer func() {
		if !opened {
			_ = lock.release()
		}
	}()
	w, err := sql.Open("sqlite", wdsn)
	if err != nil {
		return nil, fmt.Errorf("store/sqlite: open: %w", err)
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxLifetime(0)
	w.SetConnMaxIdleTime(0)

	// Migrations may take longer than one call.
	ctx, cancel := withDeadline(ctx, 6*cfg.callTimeout)
	defer cancel()
	if err := migrate(ctx, w); err != nil {
		_ = w.Close()
		return nil, fmt.Errorf("store/sqlite: open: %w", err)
	}
	r, err := sql.Open("sqlite", rdsn)
	if err != nil {
		_ = w.Close()
		return nil, fmt.Errorf("store/sqlite: open: %w", err)
	}
	r.SetMaxOpenConns(cfg.readers)
	r.SetMaxIdleConns(cfg.readers)
	if err := r.PingContext(ctx); err != nil {
		_ = w.Close()
		_ = r.Close()
		return nil, fmt.Errorf("store/sqlite: open: readers: %w", err)
	}
	opened = true
	s := &Store{
		w: w, r: r, cfg: cfg, lock: lock,
		wstmts: stmtCache{db: w}, rstmts: stmtCache{db: r},
		subs: make(map[*subscriber]struct{}), done: make(chan struct{}),
	}
	s.startWriter()
	return s, nil
}

// dsns builds the writer and reader DSNs from a path or a file: URI.
func dsns(dsnOrPath string, cfg config) (writer, reader string, err error) {
	if dsnOrPath == "" || dsnOrPath == ":memory:" || strings.Contains(dsnOrPath, "mode=memory") {
		return "", "", fmt.Errorf("a database file is required, got %q", dsnOrPath)
	}
	var path, rawQuery string
	if rest, ok := strings.CutPrefix(dsnOrPath, "file:"); ok {
		path, rawQuery, _ = strings.Cut(rest, "?")
	} else {
		// A plain path: escape what a file: URI would misread.
		path = strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(dsnOrPath)
	}
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return "", "", fmt.Errorf("parse dsn query: %w", err)
	}
	// Drop the settings Open owns, then set them.
	var pragmas []string
	for _, p := range q["_pragma"] {
		name, _, _ := strings.Cut(strings.ToLower(strings.TrimSpace(p)), "(")
		name, _, _ = strings.Cut(name, "=")
		switch strings.TrimSpace(name) {
		case "journal_mode", "busy_timeout", "foreign_keys", "synchronous", "query_only":
		default:
			pragmas = append(pragmas, p)
		}
	}
	for _, k := range []string{"_txlock", "_busy_timeout", "_timeout", "_journal_mode", "_journal",
		"_foreign_keys", "_fk", "_synchronous", "_sync", "_query_only"} {
		q.Del(k)
	}
	q.Del("_pragma")
	common := append([]string{
		fmt.Sprintf("busy_timeout(%d)", cfg.busyTimeout.Milliseconds()),
		"foreign_keys(1)",
		"synchronous(NORMAL)",
	}, pragmas...)

	wq := cloneValues(q)
	// temp_store MEMORY: the sub-journals of the writer's savepoints (one
	// per write of a group commit, groupwrite.go) stay in memory; in
	// temporary files their writes were a tenth of the writer's CPU.
	wq["_pragma"] = append([]string{"journal_mode(WAL)", "temp_store(MEMORY)"}, common...)
	wq.Set("_txlock", "immediate")

	rq := cloneValues(q)
	rq["_pragma"] = common
	rq.Set("_query_only", "1")

	return "file:" + path + "?" + wq.Encode(), "file:" + path + "?" + rq.Encode(), nil
}

func cloneValues(v url.Values) url.Values {
	out := make(url.Values, len(v))
	for k, vs := range v {
		out[k] = append([]string(nil), vs...)
	}
	return out
}

// migrate applies the embedded goose migrations on the writer.
func migrate(ctx context.Context, db *sql.DB) error {
	fsys, err := fs.Sub(migrations, "migrations")
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectSQLite3, db, fsys, goose.WithDisableGlobalRegistry(true))
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	return nil
}

// Driver returns "sqlite".
func (s *Store) Driver() string { return "sqlite" }

// Close closes the connection pools and every subscription channel. It is
// safe to call more than once.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.done)
	for sub := range s.subs {
		sub.close()
		delete(s.subs, sub)
	}
	s.mu.Unlock()
	<-s.writerDone // the transaction in flight, if any, has ended
	s.wstmts.close()
	s.rstmts.close()
	return errors.Join(s.r.Close(), s.w.Close(), s.lock.release())
}

// Subscribe returns a channel that receives the key of every session this
// Store appends an event to. Sends never block: a full channel drops the
// hint. The channel closes when ctx ends or the Store closes.
func (s *Store) Subscribe(ctx context.Context) (<-chan store.ActorKey, error) {
	sub := &subscriber{ch: make(chan store.ActorKey, 256)}
	if err := s.subscribe(ctx, sub); err != nil {
		return nil, err
	}
	return sub.ch, nil
}

// SubscribeEchoes is Subscribe whose hints carry, for an event appended
// by AppendEvent or Steer, its seq (store.EchoSubscriber): every append
// of a SQLite Store is its own process's, so the host pairs each with the
// caller's report (host.Host.Appended), which carries the event.
func (s *Store) SubscribeEchoes(ctx context.Context) (<-chan store.Wakeup, error) {
	sub := &subscriber{echoes: make(chan store.Wakeup, 256)}
	if err := s.subscribe(ctx, sub); err != nil {
		return nil, err
	}
	return sub.echoes, nil
}

// subscribe registers sub until ctx ends or the Store closes.
func (s *Store) subscribe(ctx context.Context, sub *subscriber) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errors.New("store/sqlite: subscribe: store is closed")
	}
	s.subs[sub] = struct{}{}
	s.mu.Unlock()
	go func() {
		select {
		case <-ctx.Done():
		case <-s.done:
		}
		s.mu.Lock()
		if _, ok := s.subs[sub]; ok {
			delete(s.subs, sub)
			sub.close()
		}
		s.mu.Unlock()
	}()
	return nil
}

// publish wakes this process's subscribers; it never blocks.
func (s *Store) publish(key store.ActorKey) {
	s.publishWakeup(store.Wakeup{Key: key})
}

// publishAppend is publish for the event of seq that AppendEvent or Steer
// appended (store.Wakeup.EchoSeq).
func (s *Store) publishAppend(key store.ActorKey, seq int64) {
	s.publishWakeup(store.Wakeup{Key: key, EchoSeq: seq})
}

func (s *Store) publishWakeup(w store.Wakeup) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for sub := range s.subs {
		sub.send(w)
	}
}

// withDeadline adds d to ctx unless it already has a deadline.
func withDeadline(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, d)
}

// read runs fn in one read-only transaction on the reader pool, so that
// several SELECTs see one snapshot.
func (s *Store) read(ctx context.Context, op string, fn func(tx *txn) error) error {
	ctx, cancel := withDeadline(ctx, s.cfg.callTimeout)
	defer cancel()
	sqlTx, err := s.r.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return fmt.Errorf("store/sqlite: %s: begin: %w", op, err)
	}
	tx := &txn{ctx: ctx, tx: sqlTx, cache: &s.rstmts}
	defer tx.prepareMissed()
	defer func() { _ = sqlTx.Rollback() }()
	if err := fn(tx); err != nil {
		return fmt.Errorf("store/sqlite: %s: %w", op, err)
	}
	return nil
}

// stmtCache holds one pool's prepared statements by query text. SQLite
// spends more time compiling this package's statements than running them,
// so each query is prepared once per connection and reused.
type stmtCache struct {
	db    *sql.DB
	stmts sync.Map // query string -> *sql.Stmt
}

// get returns the prepared statement for query, or nil.
func (c *stmtCache) get(query string) *sql.Stmt {
	if st, ok := c.stmts.Load(query); ok {
		return st.(*sql.Stmt)
	}
	return nil
}

// prepare prepares queries on the pool. It must not run inside one of the
// pool's transactions: with the single writer connection it would wait for
// itself. A failure is not an error: the query then runs unprepared.
func (c *stmtCache) prepare(ctx context.Context, queries []string) {
	for _, q := range queries {
		if c.get(q) != nil {
			continue
		}
		st, err := c.db.PrepareContext(ctx, q)
		if err != nil {
			continue
		}
		if _, loaded := c.stmts.LoadOrStore(q, st); loaded {
			_ = st.Close()
		}
	}
}

func (c *stmtCache) close() {
	c.stmts.Range(func(k, v any) bool {
		_ = v.(*sql.Stmt).Close()
		c.stmts.Delete(k)
		return true
	})
}

// txn is one transaction with the store's prepared statements.
type txn struct {
	ctx    context.Context
	tx     *sql.Tx
	cache  *stmtCache
	missed []string
}

// stmt returns query's prepared statement bound to the transaction
// (database/sql reuses it on this connection, or prepares it there), or
// nil, remembering the miss for prepareMissed.
func (t *txn) stmt(query string) *sql.Stmt {
	if st := t.cache.get(query); st != nil {
		return t.tx.StmtContext(t.ctx, st)
	}
	t.missed = append(t.missed, query)
	return nil
}

func (t *txn) exec(query string, args ...any) (sql.Result, error) {
	if st := t.stmt(query); st != nil {
		return st.ExecContext(t.ctx, args...)
	}
	return t.tx.ExecContext(t.ctx, query, args...)
}

func (t *txn) query(query string, args ...any) (*sql.Rows, error) {
	if st := t.stmt(query); st != nil {
		return st.QueryContext(t.ctx, args...)
	}
	return t.tx.QueryContext(t.ctx, query, args...)
}

func (t *txn) queryRow(query string, args ...any) *sql.Row {
	if st := t.stmt(query); st != nil {
		return st.QueryRowContext(t.ctx, args...)
	}
	return t.tx.QueryRowContext(t.ctx, query, args...)
}

// prepareMissed prepares, after the transaction released its connection,
// the queries that ran unprepared in it.
func (t *txn) prepareMissed() {
	if len(t.missed) > 0 && t.ctx.Err() == nil {
		t.cache.prepare(t.ctx, t.missed)
	}
}

// isConstraint reports whether err is a UNIQUE or PRIMARY KEY violation.
func isConstraint(err error) bool {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return false
	}
	switch se.Code() {
	case sqlite3.SQLITE_CONSTRAINT_UNIQUE, sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY:
		return true
	}
	return false
}

// notFound maps sql.ErrNoRows to store.ErrNotFound.
func notFound(err error) error {
	if errors.Is(err, sql.ErrNoRows) {
		return store.ErrNotFound
	}
	return err
}

// msTime converts database milliseconds to a UTC time.
func msTime(ms int64) time.Time { return time.UnixMilli(ms).UTC() }

// msPtr converts a nullable millisecond column.
func msPtr(v sql.NullInt64) *time.Time {
	if !v.Valid {
		return nil
	}
	t := msTime(v.Int64)
	return &t
}

// nullString stores "" as NULL.
func nullString(s string) sql.NullString { return sql.NullString{String: s, Valid: s != ""} }

// nullBytes stores a nil slice as NULL.
func nullBytes(b []byte) any {
	if b == nil {
		return nil
	}
	return b
}

// scanner is a *sql.Row or *sql.Rows.
type scanner interface{ Scan(dest ...any) error }
