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

// TestStreamRoundTrips pins what the session stream costs on the wire: the
// frames of NextDelivery and CommitTurn ride in the batches those already
// send (NextDelivery: the probe, the locking read, the batch with COMMIT;
// CommitTurn: two), a commit that opens a wait takes one more (its insert
// may refuse before COMMIT), and AppendChunks takes two, as RecordHostCall.
func TestStreamRoundTrips(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tr := &batchCounter{}
	s, err := postgres.Open(ctx, pgtest.DSN(t), postgres.WithTracer(tr))
	must(t, err, "Open")
	t.Cleanup(func() { _ = s.Close() })
	f := newFixtureOn(t, s)
	trips := func() int64 { return tr.batches.Load() + tr.queries.Load() }
	want := func(what string, before, n int64) {
		t.Helper()
		if got := trips() - before; got != n {
			t.Fatalf("%s: %d round trips, want %d", what, got, n)
		}
	}

	f.append("hello")
	act := f.claim(time.Minute)
	before := trips()
	d := f.next(act)
	want("NextDelivery", before, 3)
	ref := d.Delivery.TurnRef()
	before = trips()
	_, err = s.AppendChunks(ctx, store.AppendChunksParams{Ref: ref, Attempt: d.Attempt,
		Chunks: []abi.Chunk{{Type: abi.ChunkText, Text: "hel"}, {Type: abi.ChunkText, Text: "lo"}}})
	must(t, err, "AppendChunks")
	want("AppendChunks", before, 2)
	before = trips()
	_, err = f.commit(ref)
	must(t, err, "CommitTurn")
	want("CommitTurn", before, 2)

	f.append("ask")
	ref = f.next(act).Delivery.TurnRef()
	before = trips()
	_, err = s.CommitTurn(ctx, store.CommitTurnParams{Ref: ref, Outcome: abi.OutcomeWait, KeepState: true,
		Wait: &store.WaitParams{ID: "w"}})
	must(t, err, "CommitTurn with a wait")
	want("CommitTurn with a wait", before, 3)

	pg, err := s.StreamFrames(ctx, store.StreamFramesParams{Key: f.key})
	must(t, err, "StreamFrames")
	if pg.Head != 6 || len(pg.Frames) != 6 {
		t.Fatalf("stream: head %d, %d frames, want 6", pg.Head, len(pg.Frames))
	}
}
