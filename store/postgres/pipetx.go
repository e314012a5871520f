package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

// txConn is what the body of a pipelined transaction uses.
type txConn interface {
	querier
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// beginSQL opens a pipelined transaction.
const beginSQL = "BEGIN ISOLATION LEVEL READ COMMITTED"

// pipeTx is a READ COMMITTED transaction on one connection whose BEGIN
// travels in the same round trip as its first statement or batch, instead
// of a round trip of its own (pgx's Begin). The hot paths (NextDelivery,
// CommitTurn) save one round trip per transaction with it.
//
// Batches sent through it must consume their results with callbacks and
// Close (as every batch of this package does): a BEGIN queued in front of
// the first batch has a result of its own.
type pipeTx struct {
	conn      *pgxpool.Conn
	begun     bool
	committed bool // the last batch carried COMMIT (SendBatchCommit)
}

var _ txConn = (*pipeTx)(nil)

func (t *pipeTx) begin(ctx context.Context) error {
	if t.begun {
		return nil
	}
	if _, err := t.conn.Exec(ctx, beginSQL); err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	t.begun = true
	return nil
}

// SendBatch sends b, with BEGIN in front if the transaction has not begun.
func (t *pipeTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if !t.begun {
		nb := &pgx.Batch{}
		nb.Queue(beginSQL)
		nb.QueuedQueries = append(nb.QueuedQueries, b.QueuedQueries...)
		b, t.begun = nb, true
	}
	return t.conn.SendBatch(ctx, b)
}

// SendBatchAlone sends b as the whole transaction when it has not begun:
// one implicit transaction (the batch ends in a single Sync, so a failing
// statement rolls back every one of them), without BEGIN and COMMIT — two
// statements fewer than SendBatchCommit for the same effect. After BEGIN
// it is SendBatchCommit. b's callbacks must not veto (see SendBatchCommit).
func (t *pipeTx) SendBatchAlone(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.begun {
		return t.SendBatchCommit(ctx, b)
	}
	// Nothing to roll back or commit after it: begun stays false.
	t.committed = true
	return t.conn.SendBatch(ctx, b)
}

// SendBatchCommit sends b with COMMIT queued after it: the transaction's
// last round trip. b's callbacks run after the COMMIT was sent, so they
// must not veto: a guard that must refuse the transaction raises inside
// the database (paddock_check), which aborts it before the COMMIT runs
// (the server skips the rest of a failed pipeline; pipeTxDo then rolls
// back). A nil error from Close means committed.
func (t *pipeTx) SendBatchCommit(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	nb := &pgx.Batch{}
	if !t.begun {
		nb.Queue(beginSQL)
		t.begun = true
	}
	nb.QueuedQueries = append(nb.QueuedQueries, b.QueuedQueries...)
	nb.Queue("COMMIT").Exec(func(tag pgconn.CommandTag) error {
		if tag.String() == "ROLLBACK" {
			return fmt.Errorf("commit: %w", errTxRolledBack)
		}
		t.committed = true
		return nil
	})
	return t.conn.SendBatch(ctx, nb)
}

// QueryRow runs sql, with BEGIN in the same round trip if the transaction
// has not begun.
func (t *pipeTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if t.begun {
		return t.conn.QueryRow(ctx, sql, args...)
	}
	b := &pgx.Batch{}
	b.Queue(beginSQL)
	b.Queue(sql, args...)
	t.begun = true
	br := t.conn.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		br.Close()
		return errRow{fmt.Errorf("begin: %w", err)}
	}
	return batchRow{row: br.QueryRow(), br: br}
}

// Query runs sql in the transaction.
func (t *pipeTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := t.begin(ctx); err != nil {
		return nil, err
	}
	return t.conn.Query(ctx, sql, args...)
}

// Exec runs sql in the transaction.
func (t *pipeTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := t.begin(ctx); err != nil {
		return pgconn.CommandTag{}, err
	}
	return t.conn.Exec(ctx, sql, args...)
}

// batchRow is the row of a batch; Scan closes the batch.
type batchRow struct {
	row pgx.Row
	br  pgx.BatchResults
}

func (r batchRow) Scan(dest ...any) error {
	err := r.row.Scan(dest...)
	if cerr := r.br.Close(); err == nil {
		err = cerr
	}
	return err
}

// errRow is a row that failed before it was read.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// pipeTxDo runs fn in a pipelined transaction (see pipeTx) under the call
// deadline, with tx's semantics: commit when fn returns nil, roll back
// otherwise, rerun fn on a deadlock or serialisation failure.
func (s *Store) pipeTxDo(ctx context.Context, op string, fn func(ctx context.Context, tx txConn) error) error {
	return s.rerun(ctx, op, func(ctx context.Context) error { return s.pipeTxOnce(ctx, fn) })
}

func (s *Store) pipeTxOnce(ctx context.Context, fn func(ctx context.Context, tx txConn) error) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquire: %w", err)
	}
	// A connection left inside a transaction (a failed ROLLBACK) is not
	// idle, and pgxpool destroys it on Release instead of reusing it.
	defer conn.Release()
	t := &pipeTx{conn: conn}
	if err := fn(ctx, t); err != nil {
		if t.begun {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			_, _ = conn.Exec(rctx, "ROLLBACK")
			cancel()
		}
		return err
	}
	if !t.begun || t.committed {
		return nil
	}
	tag, err := conn.Exec(ctx, "COMMIT")
	if err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	if tag.String() == "ROLLBACK" {
		// The transaction had failed without fn noticing: nothing was
		// written.
		return fmt.Errorf("commit: %w", errTxRolledBack)
	}
	return nil
}

// errTxRolledBack: COMMIT found the transaction failed and rolled it back.
var errTxRolledBack = errors.New("transaction was rolled back")

// codeCheckFailed is paddock_check's SQLSTATE (migration 00004).
const codeCheckFailed = "PD001"

// Prefixes of paddock_check messages that map to typed errors.
const (
	checkSuperseded = "superseded: "
	checkLockRace   = "lock race: "
	// fenceRefusedDelivery and fenceRefusedActivation are the whole
	// messages of a raising fence (commitFenceRaising): which guard matched
	// no row.
	fenceRefusedDelivery   = "fence refused: delivery"
	fenceRefusedActivation = "fence refused: activation"
)

// fenceRefusal is a raising fence's refusal (checkErr): the transaction
// rolled back, and explainRefusal names the reason from the rows as they
// are after it. deliveryMatched: the delivery's guard passed and the
// activation's did not.
type fenceRefusal struct{ deliveryMatched bool }

func (f *fenceRefusal) Error() string {
	if f.deliveryMatched {
		return fenceRefusedActivation
	}
	return fenceRefusedDelivery
}

// explainRefusal turns a *fenceRefusal in err into the *store.FenceError
// that names its reason (classify, reading outside the rolled-back
// transaction: it decides nothing, the guard already refused); other
// errors are returned as they are.
func (s *Store) explainRefusal(ctx context.Context, ref abi.TurnRef, op store.FenceOp, err error) error {
	var fr *fenceRefusal
	if !errors.As(err, &fr) {
		return err
	}
	return s.call(ctx, "explain fence refusal", func(ctx context.Context) error {
		return classify(ctx, s.pool, ref, op, fr.deliveryMatched)
	})
}

// isCheck reports whether err is paddock_check's refusal with message msg.
func isCheck(err error, msg string) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == codeCheckFailed && pe.Message == msg
}

// checkErr maps a paddock_check refusal to its typed error: a superseded
// delivery's *store.FenceError, or errLockRace (the transaction reruns).
func checkErr(err error) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != codeCheckFailed {
		return err
	}
	switch {
	case pe.Message == fenceRefusedDelivery:
		return &fenceRefusal{}
	case pe.Message == fenceRefusedActivation:
		return &fenceRefusal{deliveryMatched: true}
	case strings.HasPrefix(pe.Message, checkSuperseded):
		return &store.FenceError{Reason: store.FenceSupersededDelivery, Detail: strings.TrimPrefix(pe.Message, checkSuperseded)}
	case strings.HasPrefix(pe.Message, checkLockRace):
		return fmt.Errorf("%s: %w", strings.TrimPrefix(pe.Message, checkLockRace), errLockRace)
	}
	return err
}
