package sqlite

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
)

// Group commit of the writer. SQLite has one writer, and every write
// (an append, a dispatch, a turn's commit) was its own transaction: a
// BEGIN IMMEDIATE, the statements, and a COMMIT that writes every page the
// transaction touched to the WAL (`paddock bench --store sqlite`, 8
// producers: the commit was a fifth of the process's CPU, WAL frames and
// their pwrite calls most of it). Writes that queue while one runs now
// share the next transaction: each runs as it would alone, inside a
// SAVEPOINT, so that its error rolls back its own writes only, and every
// caller returns once the shared COMMIT is done ("durable before 202", as
// durable as one transaction of its own). A lone write goes out as before,
// with no savepoint. There is no waiting window: batches grow only while a
// transaction is in flight.
//
// The statements of a batch run under the batch's deadline (callTimeout
// from its start), not a caller's: a caller whose context ends while its
// write waits returns with its context's error, and its write, if already
// run, may commit (as a single statement whose caller gave up). Were a
// caller's cancellation to interrupt a statement, SQLite would roll back
// the whole transaction with the others' writes in it.
//
// When the transaction itself fails (a savepoint that cannot be rolled
// back or released, the COMMIT: a full disk, an I/O error), nothing of the
// batch is committed and every write of it returns that error.

// groupMax caps the writes in one transaction.
const groupMax = 64

// writeReq is one queued write.
type writeReq struct {
	ctx  context.Context
	op   string
	fn   func(tx *txn) error
	done chan error // buffered: the flusher never blocks on it
	// state is queued, then running (the flusher took it) or abandoned
	// (its caller gave up first): fn writes its caller's variables, so it
	// runs only while its caller waits for it.
	state atomic.Int32
}

// A writeReq's states.
const (
	writeQueued int32 = iota
	writeRunning
	writeAbandoned
)

// take reports whether the flusher may run r: its caller still waits.
func (r *writeReq) take() bool { return r.state.CompareAndSwap(writeQueued, writeRunning) }

// startWriter starts the flusher of s's writes (Open).
func (s *Store) startWriter() {
	s.writes = make(chan *writeReq, 4*groupMax)
	s.writerDone = make(chan struct{})
	go func() {
		defer close(s.writerDone)
		for {
			var first *writeReq
			select {
			case first = <-s.writes:
			case <-s.done:
				return
			}
			batch := []*writeReq{first}
		more:
			for len(batch) < groupMax {
				select {
				case r := <-s.writes:
					batch = append(batch, r)
				default:
					break more
				}
			}
			s.writeGroup(batch)
		}
	}()
}

// write runs fn in one IMMEDIATE transaction on the writer, shared with
// the writes queued meanwhile (see above). fn's error rolls its writes
// back and is returned wrapped as "store/sqlite: op: ".
func (s *Store) write(ctx context.Context, op string, fn func(tx *txn) error) error {
	r := &writeReq{ctx: ctx, op: op, fn: fn, done: make(chan error, 1)}
	select {
	case s.writes <- r:
	case <-ctx.Done():
		return fmt.Errorf("store/sqlite: %s: %w", op, ctx.Err())
	case <-s.done:
		return fmt.Errorf("store/sqlite: %s: %w", op, errClosed)
	}
	select {
	case err := <-r.done:
		return err
	case <-ctx.Done():
		if r.state.CompareAndSwap(writeQueued, writeAbandoned) {
			return fmt.Errorf("store/sqlite: %s: %w", op, ctx.Err())
		}
		// Running: fn is writing this caller's variables, and its group
		// ends within its deadline.
		return <-r.done
	case <-s.writerDone:
		if r.state.CompareAndSwap(writeQueued, writeAbandoned) {
			return fmt.Errorf("store/sqlite: %s: %w", op, errClosed)
		}
		return <-r.done
	}
}

// errClosed is the error of a write made after Close.
var errClosed = errors.New("store closed")

// writeGroup runs batch's writes in one transaction and answers each.
func (s *Store) writeGroup(batch []*writeReq) {
	live := make([]*writeReq, 0, len(batch))
	for _, r := range batch {
		if r.ctx.Err() == nil && r.take() {
			live = append(live, r)
			continue
		}
		// Its caller gave up, or is about to and then finds it abandoned
		// and takes this answer.
		r.state.CompareAndSwap(writeQueued, writeAbandoned)
		err := r.ctx.Err()
		if err == nil {
			err = context.Canceled
		}
		r.done <- fmt.Errorf("store/sqlite: %s: %w", r.op, err)
	}
	switch len(live) {
	case 0:
		return
	case 1:
		r := live[0]
		r.done <- s.writeOne(r.ctx, r.op, r.fn)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.callTimeout)
	defer cancel()
	fail := func(rs []*writeReq, err error) {
		for _, r := range rs {
			r.done <- fmt.Errorf("store/sqlite: %s: group commit: %w", r.op, err)
		}
	}
	sqlTx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		fail(live, fmt.Errorf("begin: %w", err))
		return
	}
	tx := &txn{ctx: ctx, tx: sqlTx, cache: &s.wstmts}
	defer tx.prepareMissed()
	results := make([]error, len(live))
	for i, r := range live {
		if _, err := sqlTx.ExecContext(ctx, `SAVEPOINT group_write`); err != nil {
			_ = sqlTx.Rollback()
			fail(live, fmt.Errorf("savepoint: %w", err))
			return
		}
		if err := r.fn(tx); err != nil {
			results[i] = fmt.Errorf("store/sqlite: %s: %w", r.op, err)
			if _, rerr := sqlTx.ExecContext(ctx, `ROLLBACK TO group_write`); rerr != nil {
				_ = sqlTx.Rollback()
				fail(live, fmt.Errorf("%s: roll back to its savepoint after %v: %w", r.op, err, rerr))
				return
			}
		}
		if _, err := sqlTx.ExecContext(ctx, `RELEASE group_write`); err != nil {
			_ = sqlTx.Rollback()
			fail(live, fmt.Errorf("release: %w", err))
			return
		}
	}
	if err := sqlTx.Commit(); err != nil {
		fail(live, fmt.Errorf("commit: %w", err))
		return
	}
	s.sharedWrites.Add(int64(len(live)))
	for i, r := range live {
		r.done <- results[i]
	}
}

// writeOne runs fn in one IMMEDIATE transaction of its own on the writer.
func (s *Store) writeOne(ctx context.Context, op string, fn func(tx *txn) error) error {
	ctx, cancel := withDeadline(ctx, s.cfg.callTimeout)
	defer cancel()
	sqlTx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store/sqlite: %s: begin: %w", op, err)
	}
	tx := &txn{ctx: ctx, tx: sqlTx, cache: &s.wstmts}
	defer tx.prepareMissed()
	if err := fn(tx); err != nil {
		_ = sqlTx.Rollback()
		return fmt.Errorf("store/sqlite: %s: %w", op, err)
	}
	if err := sqlTx.Commit(); err != nil {
		return fmt.Errorf("store/sqlite: %s: commit: %w", op, err)
	}
	return nil
}
