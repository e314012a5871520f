package postgres

import (
	"context"
	"io/fs"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/store/pgtest"
)

// TestMigration00002UpgradesExistingData applies 00001 alone, writes a
// session with an open event the way the part-1 driver did, then opens the
// store (which applies 00002): the old rows read with the lifecycle
// defaults and the event still dispatches. Then 00002 goes down and up
// again.
func TestMigration00002UpgradesExistingData(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn := pgtest.DSN(t)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	sub, err := fs.Sub(migrationFS, "migrations")
	if err != nil {
		t.Fatal(err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, sub, goose.WithDisableGlobalRegistry(true),
		goose.WithLogger(goose.NopLogger()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(ctx, 1); err != nil {
		t.Fatalf("up to 1: %v", err)
	}
	_, err = pool.Exec(ctx, `
		INSERT INTO modules (digest, abi_version, size, bytes) VALUES ('sha256:m', 1, 1, '\x00');
		INSERT INTO agents (agent_uid, name, module_digest, crash_policy) VALUES ('a', 'agent', 'sha256:m', 'sleep');
		INSERT INTO sessions (agent_uid, session_id, crash_policy, last_event_seq) VALUES ('a', 's', 'sleep', 1);
		INSERT INTO actor_events (agent_uid, session_id, seq, kind, payload, next_attempt_at, accepted_at)
		VALUES ('a', 's', 1, 'message', '{"message": "old"}', clock_timestamp(), clock_timestamp());`)
	if err != nil {
		t.Fatalf("part-1 rows: %v", err)
	}

	s, err := Open(ctx, dsn)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer s.Close()
	key := store.ActorKey{AgentUID: "a", SessionID: "s"}
	ss, err := s.GetSession(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if ss.Status != store.SessionActive || ss.OpenEvents != 1 || ss.DeadLetters != 0 || ss.SleepReason != "" ||
		ss.PendingSince != nil {
		t.Fatalf("migrated session = %+v", ss)
	}
	act, err := s.ClaimActivation(ctx, store.ClaimActivationParams{Key: key, UID: "act", LeaseID: "l", HostID: "h",
		LeaseTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	d, err := s.NextDelivery(ctx, store.NextDeliveryParams{Activation: act.Ref(), DeliveryID: "d", MarkSent: true})
	if err != nil {
		t.Fatal(err)
	}
	if d.Event.SteerOf != 0 || d.Event.Redrives != 0 || len(d.Steers) != 0 {
		t.Fatalf("migrated event = %+v, steers %v", d.Event, d.Steers)
	}
	// A counted failure applies the stored policy (sleep) and writes the
	// chain: the new columns and tables are in use.
	fr, err := s.FailAttempt(ctx, store.FailAttemptParams{Ref: d.Delivery.TurnRef(), Error: "x", Counted: true,
		MaxAttempts: 5})
	if err != nil {
		t.Fatal(err)
	}
	if fr.SessionStatus != store.SessionSleeping {
		t.Fatalf("fail result = %+v", fr)
	}
	if _, err := p.DownTo(ctx, 1); err != nil {
		t.Fatalf("down to 1: %v", err)
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatalf("up again: %v", err)
	}
}
