package postgres_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/store/pgtest"
	"github.com/paddock-dev/paddock/store/postgres"
)

// setAppendTracer counts the set appends sent and the appends they held.
type setAppendTracer struct{ sets, held atomic.Int64 }

func (k *setAppendTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (k *setAppendTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (k *setAppendTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (k *setAppendTracer) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	if strings.Contains(d.SQL, "WITH ORDINALITY AS na(") {
		k.sets.Add(1)
		if agents, ok := d.Args[0].([]string); ok {
			k.held.Add(int64(len(agents)))
		}
	}
}
func (k *setAppendTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// setAppendSessions opens a traced store and returns it with its DSN, a
// session to stall a batch on (stalledBatch) and 12 other sessions.
func setAppendSessions(t *testing.T) (tr *setAppendTracer, s *postgres.Store, dsn string, blocker store.ActorKey, keys []store.ActorKey) {
	t.Helper()
	dsn = pgtest.DSN(t)
	tr = &setAppendTracer{}
	s, err := postgres.Open(context.Background(), dsn, postgres.WithTracer(tr))
	must(t, err, "Open")
	t.Cleanup(func() { _ = s.Close() })
	f := newFixtureOn(t, s)
	for range 12 {
		keys = append(keys, f.session(f.key.AgentUID))
	}
	return tr, s, dsn, f.key, keys
}

// stalledBatch holds a session row so that the acceptance lane's batch
// appending to it waits; the requests made meanwhile queue and go out as
// the next batch once release is called.
func stalledBatch(t *testing.T, s *postgres.Store, dsn string, blocker store.ActorKey) (release func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	must(t, err, "Connect")
	tx, err := conn.Begin(ctx)
	must(t, err, "Begin")
	_, err = tx.Exec(ctx, `SELECT 1 FROM sessions WHERE agent_uid = $1 AND session_id = $2 FOR NO KEY UPDATE`, blocker.AgentUID, blocker.SessionID)
	must(t, err, "lock")
	done := make(chan error, 1)
	go func() {
		_, _, err := s.AppendEvent(ctx, store.AppendEventParams{Key: blocker, Kind: abi.EventMessage, Payload: []byte(`{"message":"stall"}`)})
		done <- err
	}()
	time.Sleep(300 * time.Millisecond) // the stalled batch is in flight
	return func() {
		_ = tx.Commit(ctx)
		if err := <-done; err != nil {
			t.Errorf("the stalled append: %v", err)
		}
		conn.Close(ctx)
	}
}

// TestSetAppendBadValueFallsBackPerRequest: a set append whose batch holds
// an append with a NUL byte in its idempotency key and one with a key too
// long for the index fails as a whole; every append then runs on its own
// path: the good ones are appended once, the bad ones fail alone.
func TestSetAppendBadValueFallsBackPerRequest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tr, s, dsn, blocker, keys := setAppendSessions(t)
	var long strings.Builder
	for long.Len() < 9000 {
		long.WriteString(rand.Text()) // incompressible: too long for the index
	}
	longKey := long.String()
	release := stalledBatch(t, s, dsn, blocker)
	type res struct {
		e       store.Event
		created bool
		err     error
	}
	out := make([]res, len(keys))
	var wg sync.WaitGroup
	for i, key := range keys {
		idem := fmt.Sprint("k", i)
		switch i {
		case 3:
			idem = "bad\x00key"
		case 7:
			idem = longKey
		}
		wg.Go(func() {
			e, c, err := s.AppendEvent(ctx, store.AppendEventParams{Key: key, Kind: abi.EventMessage,
				Payload: []byte(fmt.Sprintf(`{"message":"m%d"}`, i)), IdempotencyKey: idem})
			out[i] = res{e, c, err}
		})
	}
	time.Sleep(300 * time.Millisecond)
	release()
	wg.Wait()
	if tr.sets.Load() == 0 {
		t.Fatalf("no set append went out")
	}
	t.Logf("%d set appends holding %d appends", tr.sets.Load(), tr.held.Load())
	for i, r := range out {
		bad := i == 3 || i == 7
		switch {
		case bad && r.err == nil:
			t.Errorf("append %d with a bad key: event %d created %v, want an error", i, r.e.ID, r.created)
		case bad:
			t.Logf("append %d: %v", i, r.err)
		case r.err != nil || !r.created || r.e.Seq != 1:
			t.Errorf("append %d: %+v", i, r)
		}
		evs, err := s.ListEvents(ctx, store.ListEventsParams{Key: keys[i], Limit: 10})
		must(t, err, "ListEvents")
		if want := map[bool]int{true: 0, false: 1}[bad]; len(evs) != want {
			t.Errorf("session %d holds %d events, want %d", i, len(evs), want)
		}
	}
}

// TestSetAppendCancelledCallers: callers whose contexts end while their
// requests wait behind a stalled batch are answered with their context's
// error and append nothing (they never went out); the others' set append
// commits each of theirs once.
func TestSetAppendCancelledCallers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tr, s, dsn, blocker, keys := setAppendSessions(t)
	release := stalledBatch(t, s, dsn, blocker)
	errs := make([]error, len(keys))
	cancels := make([]context.CancelFunc, len(keys))
	var wg sync.WaitGroup
	for i, key := range keys {
		cctx, cancel := context.WithCancel(ctx)
		cancels[i] = cancel
		wg.Go(func() {
			_, _, errs[i] = s.AppendEvent(cctx, store.AppendEventParams{Key: key, Kind: abi.EventMessage,
				Payload: []byte(fmt.Sprintf(`{"message":"m%d"}`, i))})
		})
	}
	time.Sleep(300 * time.Millisecond)
	for i := 0; i < len(keys); i += 3 {
		cancels[i]()
	}
	time.Sleep(100 * time.Millisecond)
	release()
	wg.Wait()
	for _, c := range cancels {
		c()
	}
	if tr.sets.Load() != 1 || tr.held.Load() != 8 {
		t.Errorf("%d set appends holding %d appends, want one of 8", tr.sets.Load(), tr.held.Load())
	}
	for i, key := range keys {
		evs, err := s.ListEvents(ctx, store.ListEventsParams{Key: key, Limit: 10})
		must(t, err, "ListEvents")
		cancelled := i%3 == 0
		switch {
		case cancelled && (!errors.Is(errs[i], context.Canceled) || len(evs) != 0):
			t.Errorf("cancelled append %d: %v, %d events", i, errs[i], len(evs))
		case !cancelled && (errs[i] != nil || len(evs) != 1):
			t.Errorf("append %d: %v, %d events", i, errs[i], len(evs))
		}
	}
}
