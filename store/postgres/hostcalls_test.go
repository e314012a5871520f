package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/store/pgtest"
	"github.com/paddock-dev/paddock/store/postgres"
)

// TestJournalRoundTrips pins what the journal costs on the wire: a
// CommitTurn whose event has journal rows still takes two round trips (its
// usage is summed in the statement that inserts the turn, in the batch that
// carries COMMIT), and RecordHostCall and ReplayHostCall take two each
// (BEGIN, the activation's row lock and the guarded writes in one batch;
// COMMIT).
func TestJournalRoundTrips(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tr := &batchCounter{}
	s, err := postgres.Open(ctx, pgtest.DSN(t), postgres.WithTracer(tr))
	must(t, err, "Open")
	t.Cleanup(func() { _ = s.Close() })
	f := newFixtureOn(t, s)
	f.append("hello")
	ref := f.next(f.claim(time.Minute)).Delivery.TurnRef()
	trips := func() int64 { return tr.batches.Load() + tr.queries.Load() }

	// Seq 1 without a set-aside, seq 2 with one (SetAsideFrom 2: nothing
	// there yet): the UPDATE rides in the same batch.
	for seq := 1; seq <= 2; seq++ {
		before := trips()
		_, err := s.RecordHostCall(ctx, store.RecordHostCallParams{Ref: ref, SetAsideFrom: (seq - 1) * seq, Call: store.HostCall{
			Seq: seq, Kind: string(abi.CallKindModel), Destination: "e/m", RequestDigest: "sha256:r",
			Result: []byte("{}"), InputTokens: 10, OutputTokens: 1}})
		must(t, err, "RecordHostCall")
		if n := trips() - before; n != 2 {
			t.Fatalf("RecordHostCall seq %d: %d round trips, want 2", seq, n)
		}
	}
	before := trips()
	must(t, s.ReplayHostCall(ctx, ref, 1), "ReplayHostCall")
	if n := trips() - before; n != 2 {
		t.Fatalf("ReplayHostCall: %d round trips, want 2", n)
	}
	before = trips()
	turn, err := f.commit(ref)
	must(t, err, "CommitTurn")
	if n := trips() - before; n != 2 {
		t.Fatalf("CommitTurn: %d round trips, want 2", n)
	}
	if turn.Usage != (abi.Usage{InputTokens: 20, OutputTokens: 2}) {
		t.Fatalf("Usage = %+v", turn.Usage)
	}
}
