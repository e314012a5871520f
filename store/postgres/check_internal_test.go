package postgres

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/store/pgtest"
)

// TestPaddockCheckRefusesTheCommitOfItsBatch: a guard that fails inside a
// batch ending in COMMIT aborts the transaction before the COMMIT (nothing
// written, the connection reusable), and its message maps to the typed
// error: superseded → *store.FenceError, lock race → errLockRace (rerun).
func TestPaddockCheckRefusesTheCommitOfItsBatch(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.pool.Exec(ctx, `CREATE TABLE check_probe (n int)`); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		msg   string
		fence bool
		race  bool
	}{{checkSuperseded + "event 7 is no longer open", true, false}, {checkLockRace + "steers changed", false, true}, {"other", false, false}} {
		err := s.pipeTxDo(ctx, "probe", func(ctx context.Context, tx txConn) error {
			if _, err := tx.Exec(ctx, `INSERT INTO check_probe VALUES (1)`); err != nil {
				return err
			}
			b := pipeBatch(`SELECT paddock_check(false, $1)`, c.msg)
			return checkErr(tx.(*pipeTx).SendBatchCommit(ctx, b).Close())
		})
		var fe *store.FenceError
		switch {
		case c.fence && (!errors.As(err, &fe) || fe.Reason != store.FenceSupersededDelivery || fe.Detail != "event 7 is no longer open"):
			t.Errorf("%q: %v, want a superseded_delivery FenceError", c.msg, err)
		case c.race && !errors.Is(err, errLockRace):
			t.Errorf("%q: %v, want errLockRace (after %d reruns)", c.msg, err, txAttempts)
		case !c.fence && !c.race && (err == nil || errors.Is(err, errLockRace) || errors.As(err, &fe)):
			t.Errorf("%q: %v, want the database error as is", c.msg, err)
		}
	}
	var n int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM check_probe`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("rows written by refused transactions: %d (%v), want 0", n, err)
	}
	// A passing guard commits with its batch.
	err = s.pipeTxDo(ctx, "probe", func(ctx context.Context, tx txConn) error {
		if _, err := tx.Exec(ctx, `INSERT INTO check_probe VALUES (2)`); err != nil {
			return err
		}
		return checkErr(tx.(*pipeTx).SendBatchCommit(ctx, pipeBatch(`SELECT paddock_check(true, 'fine')`)).Close())
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM check_probe`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("rows after a passing guard: %d (%v), want 1", n, err)
	}
}

// pipeBatch is a batch of one statement.
func pipeBatch(sql string, args ...any) *pgx.Batch {
	b := &pgx.Batch{}
	b.Queue(sql, args...)
	return b
}
