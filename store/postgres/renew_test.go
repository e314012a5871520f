package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paddock-dev/paddock/store"
)

// TestRenewLeasesSkipsRowsATurnHolds: lease renewal does not wait for an
// activation row a turn transaction holds (every turn of the host would
// queue behind it); it reports that lease as still held, unrenewed, and
// renews it on the next round. A lease that is really lost is not reported.
func TestRenewLeasesSkipsRowsATurnHolds(t *testing.T) {
	t.Parallel()
	dsn, f := fixtureOnOwnStore(t)
	s := f.s
	busyKey := f.key
	f.append("busy")
	busy := f.claim(time.Minute)
	f.key = f.session(busyKey.AgentUID)
	f.append("free")
	free := f.claim(time.Minute)
	lost := busy.Ref()
	lost.LeaseID = "not-the-lease"

	expiry := func(uid string) time.Time {
		var at time.Time
		conn, err := pgx.Connect(f.ctx, dsn)
		must(t, err, "connect")
		defer conn.Close(context.Background())
		must(t, conn.QueryRow(f.ctx, `SELECT lease_expires_at FROM activations WHERE activation_uid = $1`, uid).Scan(&at), "read lease")
		return at
	}
	busyBefore := expiry(busy.UID)

	// A turn transaction holds the busy activation's row.
	release := holdActivationRow(t, dsn, busy.UID)

	ctx, cancel := context.WithTimeout(f.ctx, 5*time.Second)
	defer cancel()
	refs := []store.ActivationRef{busy.Ref(), free.Ref(), lost}
	held, err := s.RenewLeases(ctx, store.RenewLeasesParams{HostID: busy.HostID, LeaseTTL: time.Minute, Refs: refs})
	must(t, err, "RenewLeases while a turn holds a row (it must not wait for it)")
	got := map[string]bool{}
	for _, r := range held {
		got[r.UID+"/"+r.LeaseID] = true
	}
	if len(held) != 2 || !got[busy.UID+"/"+busy.LeaseID] || !got[free.UID+"/"+free.LeaseID] {
		t.Fatalf("held %+v: want the busy and the free lease, not the lost one", held)
	}
	if !expiry(busy.UID).Equal(busyBefore) {
		t.Fatal("the busy activation's lease changed under another transaction's lock")
	}
	release()

	held, err = s.RenewLeases(ctx, store.RenewLeasesParams{HostID: busy.HostID, LeaseTTL: time.Minute, Refs: refs[:1]})
	must(t, err, "RenewLeases")
	if len(held) != 1 || !expiry(busy.UID).After(busyBefore) {
		t.Fatalf("the next round did not renew the freed lease (held %+v)", held)
	}
}

// TestRenewLeasesWaitsForARowSkippedTooLong: a lease that a turn
// transaction's lock made the renewal skip until less than half of it is
// left is renewed waiting for that lock, so that a busy session does not
// lose its lease to its own turns.
func TestRenewLeasesWaitsForARowSkippedTooLong(t *testing.T) {
	t.Parallel()
	dsn, f := fixtureOnOwnStore(t)
	s := f.s
	f.append("busy")
	const ttl = 4 * time.Second
	busy := f.claim(ttl)
	var before time.Time
	conn, err := pgx.Connect(f.ctx, dsn)
	must(t, err, "connect")
	defer conn.Close(context.Background())
	must(t, conn.QueryRow(f.ctx, `SELECT lease_expires_at FROM activations WHERE activation_uid = $1`, busy.UID).Scan(&before), "read lease")

	release := holdActivationRow(t, dsn, busy.UID)
	// Less than half of the lease left: a skip now could be the last
	// before it runs out.
	time.Sleep(time.Until(before.Add(-ttl/2)) + 200*time.Millisecond)
	type result struct {
		held []store.ActivationRef
		err  error
	}
	done := make(chan result, 1)
	go func() {
		held, err := s.RenewLeases(f.ctx, store.RenewLeasesParams{HostID: busy.HostID, LeaseTTL: ttl, Refs: []store.ActivationRef{busy.Ref()}})
		done <- result{held, err}
	}()
	time.Sleep(100 * time.Millisecond) // let it reach the lock; the outcome does not depend on it
	release()
	r := <-done
	must(t, r.err, "RenewLeases")
	var after time.Time
	must(t, conn.QueryRow(f.ctx, `SELECT lease_expires_at FROM activations WHERE activation_uid = $1`, busy.UID).Scan(&after), "read lease")
	if len(r.held) != 1 || !after.After(before) {
		t.Fatalf("held %+v, lease %s → %s: the renewal skipped a lease with less than half of it left instead of waiting for it",
			r.held, before, after)
	}
}
