package postgres_test

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

// claimUnderHeldLock runs the one-round-trip dispatch
// (NextDeliveryParams.Expect) of a while another transaction holds a's row
// lock and, once the dispatch waits for it, runs change in that
// transaction and commits it. It returns the dispatch's answer.
func claimUnderHeldLock(t *testing.T, dsn string, f *fixture, a store.Activation, x *store.ExpectedBinding,
	change func(ctx context.Context, tx pgx.Tx)) (store.Dispatch, error) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	must(t, err, "connect")
	defer func() { _ = conn.Close(ctx) }()
	watch, err := pgx.Connect(ctx, dsn)
	must(t, err, "connect")
	defer func() { _ = watch.Close(ctx) }()
	tx, err := conn.Begin(ctx)
	must(t, err, "begin")
	_, err = tx.Exec(ctx, `SELECT 1 FROM activations WHERE activation_uid = $1 FOR UPDATE`, a.UID)
	must(t, err, "lock activation")

	type answer struct {
		d   store.Dispatch
		err error
	}
	done := make(chan answer, 1)
	go func() {
		d, err := f.s.NextDelivery(f.ctx, store.NextDeliveryParams{Activation: a.Ref(), DeliveryID: uuid.NewString(),
			Binding: "sha256:test", MarkSent: true, TailMessages: 10, ExpectDue: true, Expect: x,
			Bind: func(store.AgentBinding) (string, error) { return "sha256:test", nil }})
		done <- answer{d, err}
	}()
	awaitLockWait(t, watch, "the dispatch", func() (string, bool) {
		select {
		case r := <-done:
			return fmt.Sprintf("%+v, %v", r.d.Event, r.err), true
		default:
			return "", false
		}
	})
	change(ctx, tx)
	must(t, tx.Commit(ctx), "commit the holder")
	r := <-done
	return r.d, r.err
}

// awaitLockWait polls pg_stat_activity until a backend of the test's
// database waits for a lock, as the call named what is expected to; it
// fails the test when returned reports that the call returned first (and
// how), or after 30 s.
func awaitLockWait(t *testing.T, watch *pgx.Conn, what string, returned func() (string, bool)) {
	t.Helper()
	awaitLockWaiters(t, watch, 1, what, returned)
}

// awaitLockWaiters polls pg_stat_activity until at least n backends of the
// test's database wait for a lock; it fails the test when returned reports
// that the call named what returned first (and how), or after 30 s.
func awaitLockWaiters(t *testing.T, watch *pgx.Conn, n int, what string, returned func() (string, bool)) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting int
		must(t, watch.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting), "pg_stat_activity")
		if waiting >= n {
			return
		}
		if how, ok := returned(); ok {
			t.Fatalf("%s did not wait for the held lock: %s", what, how)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never waited for the held lock (%d of %d waiting)", what, waiting, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// primedFixture: a fixture whose activation ran one turn, and the Expect its
// controller holds after it.
func primedFixture(t *testing.T) (string, *fixture, store.Activation, *store.ExpectedBinding) {
	t.Helper()
	dsn, f := fixtureOnOwnStore(t)
	f.append("prime")
	a := f.claim(time.Hour)
	d := f.next(a)
	_, err := f.commit(d.Delivery.TurnRef())
	must(t, err, "commit")
	return dsn, f, a, &store.ExpectedBinding{Agent: d.Agent, Binding: "sha256:test"}
}

// TestOneTripClaimWhoseCandidateClosedWhileItWaited: the claim's candidate
// (read before its wait for the activation's lock) is cancelled by the lock
// holder. The dispatch must take the next open event, set it current, and
// leave the cancelled one without a delivery or a turn.started.
func TestOneTripClaimWhoseCandidateClosedWhileItWaited(t *testing.T) {
	t.Parallel()
	dsn, f, a, x := primedFixture(t)
	e1 := f.append("cancelled while the claim waits")
	e2 := f.append("the one to run")
	d, err := claimUnderHeldLock(t, dsn, f, a, x, func(ctx context.Context, tx pgx.Tx) {
		_, err := tx.Exec(ctx, `UPDATE actor_events SET status = 'cancelled', closed_at = clock_timestamp()
			WHERE event_id = $1`, e1.ID)
		must(t, err, "cancel e1")
	})
	must(t, err, "dispatch")
	if d.Event.ID != e2.ID || d.Delivery.EventID != e2.ID {
		t.Fatalf("dispatched event %d (delivery's %d), want %d", d.Event.ID, d.Delivery.EventID, e2.ID)
	}
	cur, err := f.s.InFlight(f.ctx, a.Ref())
	must(t, err, "InFlight")
	if cur.Event.ID != e2.ID || cur.Delivery.ID != d.Delivery.ID {
		t.Fatalf("in flight: event %d delivery %s, want %d %s", cur.Event.ID, cur.Delivery.ID, e2.ID, d.Delivery.ID)
	}
	pg, err := f.s.StreamFrames(f.ctx, store.StreamFramesParams{Key: f.key, Limit: 100})
	must(t, err, "StreamFrames")
	for i, fr := range pg.Frames {
		if fr.Seq != int64(i+1) {
			t.Fatalf("frame %d has seq %d", i+1, fr.Seq)
		}
		if fr.EventID == e1.ID && fr.Kind == store.FrameTurnStarted {
			t.Fatalf("a turn.started of the cancelled event %d", e1.ID)
		}
	}
	_, err = f.s.CommitTurn(f.ctx, store.CommitTurnParams{Ref: d.Delivery.TurnRef(), Outcome: abi.OutcomeOK, KeepState: true,
		Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "ran"}}, Payloads: []string{string(d.Event.Payload)}})
	must(t, err, "commit with payloads")
}

// TestOneTripClaimWhoseActivationEndedWhileItWaited: the lock holder ends
// the activation (the watchdog's expiry); the dispatch takes nothing.
func TestOneTripClaimWhoseActivationEndedWhileItWaited(t *testing.T) {
	t.Parallel()
	dsn, f, a, x := primedFixture(t)
	e1 := f.append("never runs here")
	_, err := claimUnderHeldLock(t, dsn, f, a, x, func(ctx context.Context, tx pgx.Tx) {
		_, err := tx.Exec(ctx, `UPDATE activations SET state = 'failed', ended_at = clock_timestamp(), end_reason = 'lease expired'
			WHERE activation_uid = $1`, a.UID)
		must(t, err, "expire")
	})
	if !errors.Is(err, store.ErrNotLive) {
		t.Fatalf("dispatch of an activation ended while it waited: %v, want ErrNotLive", err)
	}
	var n int
	conn, err := pgx.Connect(f.ctx, dsn)
	must(t, err, "connect")
	defer func() { _ = conn.Close(f.ctx) }()
	must(t, conn.QueryRow(f.ctx, `SELECT count(*) FROM deliveries WHERE event_id = $1`, e1.ID).Scan(&n), "count")
	if n != 0 {
		t.Fatalf("%d deliveries of event %d by an ended activation", n, e1.ID)
	}
}
