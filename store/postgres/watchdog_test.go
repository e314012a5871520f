package postgres_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paddock-dev/paddock/store"
)

// TestWatchdogDoesNotQueueBehindAStalledTransaction: a host stalled inside a
// turn-path transaction (a GC pause, SIGSTOP, a VM freeze, a partition that
// leaves its connection open) holds its activation's row lock until it
// resumes — for a partition, until the server notices the dead connection.
// Its lease expires meanwhile. ExpireActivation must not wait for that lock:
// every host's watchdog walks the expired activations in one loop, longest
// expired first, so one wait there stopped the lease watchdog (and the scan
// behind it) of every host for every session. Found by cmd/paddock-chaos
// (host_stall): while one host was stopped, no other host failed any expired
// activation until it resumed.
func TestWatchdogDoesNotQueueBehindAStalledTransaction(t *testing.T) {
	t.Parallel()
	dsn, f := fixtureOnOwnStore(t)
	s := f.s
	stalledKey := f.key
	other := f.session(f.key.AgentUID)

	// Two live activations whose leases expire; the stalled one first, so
	// that it heads the watchdog's list.
	// The leases are long enough for NextDelivery to run under a loaded
	// machine (a 50 ms one expired before it), then waited out.
	const ttl = 2 * time.Second
	f.append("stalled turn")
	stalled := f.claim(ttl)
	f.next(stalled) // its turn is in flight
	f.key = other
	f.append("other turn")
	f.claim(ttl)
	f.key = stalledKey
	time.Sleep(ttl + 200*time.Millisecond)

	// The stalled host's transaction: the activation row lock that
	// NextDelivery, CommitTurn and FailAttempt take first.
	release := holdActivationRow(t, dsn, stalled.UID)

	expired, err := s.ExpiredActivations(f.ctx, 100)
	must(t, err, "ExpiredActivations")
	if len(expired) != 2 || expired[0].UID != stalled.UID {
		t.Fatalf("expired = %+v, want the stalled activation, then the other", expired)
	}
	// The watchdog's walk, under its deadline.
	ctx, cancel := context.WithTimeout(f.ctx, 5*time.Second)
	defer cancel()
	start := time.Now()
	_, err = s.ExpireActivation(ctx, store.ExpireActivationParams{Ref: expired[0], MaxAttempts: 10})
	if !errors.Is(err, store.ErrNotLive) {
		t.Fatalf("ExpireActivation of the locked activation: %v after %v, want ErrNotLive at once (skipped until its transaction ends)", err, time.Since(start))
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("ExpireActivation of the locked activation took %v: it waited for the lock", d)
	}
	_, err = s.ExpireActivation(ctx, store.ExpireActivationParams{Ref: expired[1], MaxAttempts: 10})
	must(t, err, "ExpireActivation of the other activation")
	if exp, err := s.ExpiredActivations(f.ctx, 100); err != nil || len(exp) != 1 || exp[0].UID != stalled.UID {
		t.Fatalf("after the walk: %+v, %v; want only the stalled activation left", exp, err)
	}

	// The stalled host resumes and its transaction ends; the next walk
	// fails the activation and counts the attempt its turn had.
	release()
	fr, err := s.ExpireActivation(f.ctx, store.ExpireActivationParams{Ref: expired[0], MaxAttempts: 10})
	must(t, err, "ExpireActivation after the stall")
	if fr.Attempts != 1 {
		t.Errorf("the stalled turn's event has %d attempts, want 1", fr.Attempts)
	}
}

// holdActivationRow locks the activation row uid from a connection of its
// own, as a turn transaction (NextDelivery, CommitTurn, FailAttempt) does
// first, until release is called (or the test ends).
func holdActivationRow(t *testing.T, dsn, uid string) (release func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	must(t, err, "connect")
	tx, err := conn.Begin(ctx)
	must(t, err, "begin")
	_, err = tx.Exec(ctx, `SELECT 1 FROM activations WHERE activation_uid = $1 FOR UPDATE`, uid)
	must(t, err, "lock activation "+uid)
	var once sync.Once
	release = func() {
		once.Do(func() {
			must(t, tx.Rollback(ctx), "rollback")
			_ = conn.Close(ctx)
		})
	}
	t.Cleanup(release)
	return release
}
