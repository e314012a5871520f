package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/store/pgtest"
	"github.com/paddock-dev/paddock/store/postgres"
)

// TestRenewLeasesSkipsRowsATurnHolds: lease renewal does not wait for an
// activation row a turn transaction holds (every turn of the host would
// queue behind it); it reports that lease as still held, unrenewed, and
// renews it on the next round. A lease that is really lost is not reported.
func TestRenewLeasesSkipsRowsATurnHolds(t *testing.T) {
	t.Parallel()
	dsn := pgtest.DSN(t)
	s, err := postgres.Open(context.Background(), dsn)
	must(t, err, "Open")
	t.Cleanup(func() { _ = s.Close() })
	f := newFixtureOn(t, s)
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
	held, err := s.RenewLeases(ctx, store.RenewLeasesParams{HostID: busy.HostID, LeaseTTL: 2 * time.Minute, Refs: refs})
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

	held, err = s.RenewLeases(ctx, store.RenewLeasesParams{HostID: busy.HostID, LeaseTTL: 2 * time.Minute, Refs: refs[:1]})
	must(t, err, "RenewLeases")
	if len(held) != 1 || !expiry(busy.UID).After(busyBefore) {
		t.Fatalf("the next round did not renew the freed lease (held %+v)", held)
	}
}
