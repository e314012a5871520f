package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/paddock-dev/paddock/store"
)

// TestClaimWaitingForTheSessionRowDoesNotDeadlockWithTheRivalsCommit: a
// claim X of session S waits for S's row behind another transaction; a
// rival activation A of S is committed meanwhile, and A's turn commit T2
// updates A's row and then waits for S's row too (it counts the turn in
// sessions). Once the row is released, X must see A (its claim statement
// reads with a snapshot taken once it holds the row) and insert nothing.
// Before the fix the claim's one statement read with its snapshot of before
// the wait, raised the epoch, and its insert waited for A's row, which T2
// held while it waited for S's row: a deadlock PostgreSQL detected after
// deadlock_timeout (the group commit then reran the victim alone, so the
// callers' answers alone do not show it; the database's deadlock counter
// does).
func TestClaimWaitingForTheSessionRowDoesNotDeadlockWithTheRivalsCommit(t *testing.T) {
	t.Parallel()
	dsn, f := fixtureOnOwnStore(t)
	ctx := context.Background()
	key := f.key
	f.append("the rival's turn")

	watch, err := pgx.Connect(ctx, dsn)
	must(t, err, "connect")
	defer func() { _ = watch.Close(ctx) }()
	var before int64
	must(t, watch.QueryRow(ctx, `SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()`).Scan(&before),
		"pg_stat_database")

	// The rival claim's epoch bump, committed before X starts and with no
	// activation live: X's snapshot sees the session claimable.
	var epoch int64
	must(t, watch.QueryRow(ctx, `UPDATE sessions SET actor_epoch = actor_epoch + 1, status = 'active'
		WHERE agent_uid = $1 AND session_id = $2 RETURNING actor_epoch`, key.AgentUID, key.SessionID).Scan(&epoch),
		"raise the epoch")

	// H holds S's row.
	holder, err := pgx.Connect(ctx, dsn)
	must(t, err, "connect")
	defer func() { _ = holder.Close(ctx) }()
	h, err := holder.Begin(ctx)
	must(t, err, "begin the holder")
	_, err = h.Exec(ctx, `SELECT 1 FROM sessions WHERE agent_uid = $1 AND session_id = $2 FOR NO KEY UPDATE`,
		key.AgentUID, key.SessionID)
	must(t, err, "lock the session row")

	// X: the store's claim, waiting for S's row.
	x := goCall(func() error {
		_, err := f.s.ClaimActivation(f.ctx, store.ClaimActivationParams{Key: key, UID: uuid.NewString(),
			LeaseID: uuid.NewString(), HostID: "x", LeaseTTL: time.Hour})
		return err
	})
	awaitLockWait(t, watch, "the claim X", x.poll)

	// The rival's activation A, committed while X waits (after X's claim
	// statement, without the fix, took its snapshot). Its foreign key takes
	// FOR KEY SHARE on S's row, which the holder's lock lets through.
	a := store.Activation{UID: uuid.NewString(), ActorKey: key, ActorEpoch: epoch, LeaseID: uuid.NewString(),
		State: store.ActivationActive, HostID: "rival"}
	_, err = watch.Exec(ctx, `INSERT INTO activations (activation_uid, agent_uid, session_id, actor_epoch, lease_id,
			lease_expires_at, revision, state, host_id)
		VALUES ($1, $2, $3, $4, $5, clock_timestamp() + interval '1 hour', 0, 'active', $6)`,
		a.UID, key.AgentUID, key.SessionID, a.ActorEpoch, a.LeaseID, a.HostID)
	must(t, err, "insert the rival activation")
	if how, ok := x.poll(); ok {
		t.Fatalf("the claim X returned before the holder let go: %s", how)
	}

	// A's turn: the dispatch does not need S's row; T2, its commit, updates
	// A's row and then waits for S's row.
	d := f.next(a)
	t2 := goCall(func() error {
		_, err := f.commit(d.Delivery.TurnRef())
		return err
	})
	awaitLockWaiters(t, watch, 2, "the commit T2", t2.poll)
	if how, ok := x.poll(); ok {
		t.Fatalf("the claim X returned before the holder let go: %s", how)
	}

	must(t, h.Rollback(ctx), "release the session row")
	xErr, t2Err := x.wait(), t2.wait()
	for _, err := range []error{xErr, t2Err} {
		if err != nil && strings.Contains(err.Error(), "deadlock") {
			t.Errorf("a deadlock reached the caller: %v", err)
		}
	}
	if !errors.Is(xErr, store.ErrActivationLive) {
		t.Errorf("the claim X: %v, want ErrActivationLive", xErr)
	}
	if t2Err != nil {
		t.Errorf("the commit T2: %v", t2Err)
	}
	cur, err := f.s.CurrentActivation(ctx, key)
	must(t, err, "CurrentActivation")
	if cur.UID != a.UID || cur.ActorEpoch != a.ActorEpoch {
		t.Errorf("current activation %s at epoch %d, want the rival's %s at %d", cur.UID, cur.ActorEpoch, a.UID, a.ActorEpoch)
	}

	// The deadlock counter: every backend of the database flushes its
	// statistics as it exits, so close them all and read it then.
	_ = f.s.Close()
	_ = holder.Close(ctx)
	_ = watch.Close(ctx)
	if after := deadlocks(t, dsn); after != before {
		t.Fatalf("PostgreSQL detected %d deadlocks", after-before)
	}
}

// asyncCall is a store call running in its own goroutine (goCall).
type asyncCall struct {
	done     chan error
	err      error
	returned bool
}

// goCall runs fn in a goroutine of its own and returns it.
func goCall(fn func() error) *asyncCall {
	c := &asyncCall{done: make(chan error, 1)}
	go func() { c.done <- fn() }()
	return c
}

// poll reports, without waiting, whether the call returned and with what
// (awaitLockWaiters' returned).
func (c *asyncCall) poll() (string, bool) {
	if !c.returned {
		select {
		case c.err = <-c.done:
			c.returned = true
		default:
			return "", false
		}
	}
	return fmt.Sprint(c.err), true
}

// wait returns the call's error once it returned.
func (c *asyncCall) wait() error {
	if !c.returned {
		c.err, c.returned = <-c.done, true
	}
	return c.err
}
