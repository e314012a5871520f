package postgres_test

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/store/pgtest"
	"github.com/paddock-dev/paddock/store/postgres"
)

// TestPipeHugeBatchesDoNotDeadlock: a batch whose statements and answers
// are each larger than the socket buffers (appends of large payloads,
// answered with their events) goes through. The server writes the first
// answers while the host still writes the batch: unless the reader reads
// them meanwhile, each side waits for the other to read.
func TestPipeHugeBatchesDoNotDeadlock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, err := postgres.Open(ctx, pgtest.DSN(t), postgres.WithCallTimeout(time.Minute))
	must(t, err, "Open")
	t.Cleanup(func() { _ = s.Close() })
	f := newFixtureOn(t, s)
	const senders = 48
	big := bytes.Repeat([]byte("x"), 512<<10)
	keys := make([]store.ActorKey, senders)
	for i := range keys {
		keys[i] = f.session(f.key.AgentUID)
	}
	ctx, cancel := context.WithTimeout(ctx, 45*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, senders)
	for i := range senders {
		wg.Go(func() {
			payload := fmt.Appendf(nil, `{"message":"%d %s"}`, i, big)
			e, created, err := s.AppendEvent(ctx, store.AppendEventParams{Key: keys[i], Kind: abi.EventMessage, Payload: payload})
			switch {
			case err != nil:
				errs <- fmt.Errorf("sender %d: %w", i, err)
			case !created || !bytes.Equal(e.Payload, payload):
				errs <- fmt.Errorf("sender %d: created %v, payload of %d bytes back, want %d", i, created, len(e.Payload), len(payload))
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for i, key := range keys {
		evs, err := s.ListEvents(context.Background(), store.ListEventsParams{Key: key, Limit: 10})
		must(t, err, "ListEvents")
		if len(evs) != 1 || len(evs[0].Payload) < len(big) {
			t.Fatalf("session %d: %d events stored, want its one large append", i, len(evs))
		}
	}
}
