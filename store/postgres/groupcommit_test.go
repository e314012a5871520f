package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/store/pgtest"
	"github.com/paddock-dev/paddock/store/postgres"
)

// batchCounter counts batches and single statements sent.
type batchCounter struct{ batches, queries atomic.Int64 }

func (c *batchCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.queries.Add(1)
	return ctx
}
func (c *batchCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *batchCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.batches.Add(1)
	return ctx
}
func (c *batchCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (c *batchCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// TestGroupCommitOfConcurrentAppends: many concurrent appends to many
// sessions — some reusing idempotency keys at once, some to a destroyed
// session — share batches, and each still gets exactly its own outcome:
// every session's events are contiguous and in call order per sender, a
// reused key returns the first event, a destroyed session refuses.
func TestGroupCommitOfConcurrentAppends(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tr := &batchCounter{}
	s, err := postgres.Open(ctx, pgtest.DSN(t), postgres.WithTracer(tr))
	must(t, err, "Open")
	t.Cleanup(func() { _ = s.Close() })
	f := newFixtureOn(t, s)
	agent := f.key.AgentUID
	const senders, each = 16, 25
	keys := make([]store.ActorKey, senders)
	for i := range keys {
		keys[i] = f.session(agent)
	}
	dead := f.session(agent)
	_, err = s.DestroySession(ctx, dead)
	must(t, err, "DestroySession")

	tr.batches.Store(0)
	var wg sync.WaitGroup
	ids := make([][]int64, senders)
	errs := make(chan error, 4*senders*each)
	for i := range senders {
		wg.Go(func() {
			for j := range each {
				e, created, err := s.AppendEvent(ctx, store.AppendEventParams{Key: keys[i], Kind: abi.EventMessage,
					Payload: []byte(fmt.Sprintf(`{"message":"%d-%d"}`, i, j))})
				if err != nil || !created {
					errs <- fmt.Errorf("sender %d append %d: created %v, %w", i, j, created, err)
					return
				}
				ids[i] = append(ids[i], e.ID)
			}
		})
		// Two callers race on each idempotency key of the shared session.
		wg.Go(func() {
			for j := range each {
				_, _, err := s.AppendEvent(ctx, store.AppendEventParams{Key: f.key, Kind: abi.EventMessage,
					Payload: []byte(`{"message":"idem"}`), IdempotencyKey: fmt.Sprint("k", j)})
				if err != nil {
					errs <- err
				}
			}
		})
		if i%4 == 0 {
			wg.Go(func() {
				_, _, err := s.AppendEvent(ctx, store.AppendEventParams{Key: dead, Kind: abi.EventMessage, Payload: []byte(`{"message":"late"}`)})
				if !errors.Is(err, store.ErrSessionDestroyed) {
					errs <- fmt.Errorf("append to a destroyed session: %v, want ErrSessionDestroyed", err)
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for i, key := range keys {
		evs, err := s.ListEvents(ctx, store.ListEventsParams{Key: key, Limit: 1000})
		must(t, err, "ListEvents")
		if len(evs) != each {
			t.Fatalf("session %d has %d events, want %d", i, len(evs), each)
		}
		for j, e := range evs {
			if e.Seq != int64(j+1) || e.ID != ids[i][j] || string(e.Payload) != fmt.Sprintf(`{"message":"%d-%d"}`, i, j) {
				t.Fatalf("session %d event %d: seq %d id %d (sent as %d) payload %s", i, j, e.Seq, e.ID, ids[i][j], e.Payload)
			}
		}
	}
	shared, err := s.ListEvents(ctx, store.ListEventsParams{Key: f.key, Limit: 1000})
	must(t, err, "ListEvents")
	if len(shared) != each {
		t.Fatalf("the shared session has %d events, want %d: one per idempotency key", len(shared), each)
	}
	if deadEvs, _ := s.ListEvents(ctx, store.ListEventsParams{Key: dead, Limit: 10}); len(deadEvs) != 0 {
		t.Fatalf("a destroyed session got %d events", len(deadEvs))
	}
	// Not a timing assertion: with 2·16 concurrent callers, batches must
	// have held more than one append on average, or nothing was grouped.
	total := int64(senders*each + senders*each + senders/4)
	if b := tr.batches.Load(); b >= total {
		t.Fatalf("%d batches for %d appends: nothing was grouped", b, total)
	} else {
		t.Logf("%d appends in %d batches", total, b)
	}
}

// TestAppendsEndWhenTheStoreCloses: appends queued for group commit, or
// made after Close, return (an error or their event) instead of waiting
// for flushers that are gone.
func TestAppendsEndWhenTheStoreCloses(t *testing.T) {
	t.Parallel()
	s, err := postgres.Open(context.Background(), pgtest.DSN(t))
	must(t, err, "Open")
	f := newFixtureOn(t, s)
	keys := make([]store.ActorKey, 20)
	for i := range keys {
		keys[i] = f.session(f.key.AgentUID)
	}
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Go(func() {
			_, _, _ = s.AppendEvent(context.Background(), store.AppendEventParams{Key: keys[i%len(keys)], Kind: abi.EventMessage, Payload: []byte(`{"message":"x"}`)})
		})
	}
	_ = s.Close()
	for range 20 {
		wg.Go(func() {
			if _, _, err := s.AppendEvent(context.Background(), store.AppendEventParams{Key: f.key, Kind: abi.EventMessage, Payload: []byte(`{"message":"late"}`)}); err == nil {
				t.Error("an append after Close succeeded")
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute): // a liveness bound, not a timing one
		t.Fatal("appends still blocked a minute after Close")
	}
}

// TestGroupCommitOfConcurrentDispatchesAndCommits: rounds of concurrent dispatches and
// commits of many sessions, each with a replay of a turn committed in the round before
// (which its fence refuses), share batches, and each still gets exactly
// its own outcome: every fresh commit commits its turn with its own
// messages, every replay is refused as superseded and writes nothing. A
// refusal rolls its batch back, so the others of it commit on their own.
func TestGroupCommitOfConcurrentDispatchesAndCommits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tr := &batchCounter{}
	s, f := openTraced(t, tr)
	const sessions, rounds = 16, 6
	acts := liveSessions(f, sessions)
	var last []abi.TurnRef // the refs committed in the round before
	var batches int64      // of the rounds without replays
	var expect *store.ExpectedBinding
	var agent atomic.Pointer[store.AgentBinding]
	var dispatches, dispatchBatches int64
	for round := range rounds {
		refs := make([]abi.TurnRef, sessions)
		payloads := make([]string, sessions)
		for i, a := range acts {
			f.key = a.ActorKey
			f.append(fmt.Sprintf("r%d-s%d", round, i))
		}
		// The dispatches, concurrent too once the agent is known: they
		// share batches (the group commit) and each takes its own session's event.
		tr.batches.Store(0)
		var wg sync.WaitGroup
		for i, a := range acts {
			wg.Go(func() {
				p := store.NextDeliveryParams{Activation: a.Ref(), DeliveryID: uuid.NewString(), Binding: "sha256:test",
					MarkSent: true, TailMessages: 10, ExpectDue: true, Expect: expect}
				d, err := s.NextDelivery(ctx, p)
				if err != nil {
					t.Errorf("round %d session %d: NextDelivery: %v", round, i, err)
					return
				}
				if got := string(d.Event.Payload); got != fmt.Sprintf(`{"message": "r%d-s%d"}`, round, i) {
					t.Errorf("round %d session %d dispatched %s", round, i, got)
				}
				refs[i], payloads[i] = d.Delivery.TurnRef(), string(d.Event.Payload)
				agent.Store(&d.Agent)
			})
		}
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
		if expect != nil {
			dispatchBatches += tr.batches.Load()
			dispatches += sessions
		}
		expect = &store.ExpectedBinding{Agent: *agent.Load(), Binding: "sha256:test"}
		tr.batches.Store(0)
		errs := make(chan error, 2*sessions)
		for i, ref := range refs {
			wg.Go(func() {
				turn, err := s.CommitTurn(ctx, store.CommitTurnParams{Ref: ref, Outcome: abi.OutcomeOK, KeepState: true,
					Messages: []abi.Message{{Role: abi.RoleAssistant, Content: fmt.Sprintf("reply r%d-s%d", round, i)}},
					Payloads: []string{payloads[i]}})
				switch {
				case err != nil:
					errs <- fmt.Errorf("round %d session %d: %w", round, i, err)
				case turn.TurnNo != int64(round+1) || len(turn.Messages) != 2 ||
					turn.Messages[0].Content != fmt.Sprintf("r%d-s%d", round, i) ||
					turn.Messages[1].Content != fmt.Sprintf("reply r%d-s%d", round, i):
					errs <- fmt.Errorf("round %d session %d: turn %d with %+v", round, i, turn.TurnNo, turn.Messages)
				}
			})
		}
		for i, ref := range last {
			if round%2 == 0 || i%4 != 0 {
				continue // replays in odd rounds only: the even ones count batches
			}
			wg.Go(func() {
				if err := replayRefused(ctx, s, ref); err != nil {
					errs <- err
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		if round%2 == 0 {
			batches += tr.batches.Load()
		}
		last = refs
	}
	for i, a := range acts {
		turns, err := s.Transcript(ctx, store.TranscriptParams{Key: a.ActorKey, Limit: 100})
		must(t, err, "Transcript")
		if len(turns) != rounds {
			t.Fatalf("session %d has %d turns, want %d", i, len(turns), rounds)
		}
		for r, turn := range turns {
			if got := turn.Messages[len(turn.Messages)-1].Content; got != fmt.Sprintf("reply r%d-s%d", r, i) {
				t.Fatalf("session %d turn %d replied %q", i, r+1, got)
			}
		}
	}
	// Not a timing assertion: with 16 concurrent commits a round, batches
	// must have held more than one commit on average, or nothing was
	// grouped (counted in the rounds without replays, whose refusals roll
	// their batch back and send its commits alone).
	if dispatchBatches >= dispatches {
		t.Fatalf("%d batches for %d dispatches: nothing was grouped", dispatchBatches, dispatches)
	}
	t.Logf("%d dispatches in %d batches", dispatches, dispatchBatches)
	if total := int64(sessions * rounds / 2); batches >= total {
		t.Fatalf("%d batches for %d commits: nothing was grouped", batches, total)
	} else {
		t.Logf("%d commits in %d batches", total, batches)
	}
}

// TestGroupCommitOfConcurrentActivationClaims: concurrent claims of many
// sessions, each asking for its first turn, share batches
// (the group commit) and each gets its own outcome; then, in a second round,
// sessions claimed twice at once: one live activation per session
// (invariant 1), the other claim refused with ErrActivationLive (a claim
// that raises sends its batch alone), each winner's first turn its own
// session's event at attempt 1.
func TestGroupCommitOfConcurrentActivationClaims(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tr := &batchCounter{}
	s, err := postgres.Open(ctx, pgtest.DSN(t), postgres.WithTracer(tr))
	must(t, err, "Open")
	t.Cleanup(func() { _ = s.Close() })
	f := newFixtureOn(t, s)
	// The expectation a host keeps of the agent (its last dispatch).
	f.key = f.session(f.key.AgentUID)
	f.append("warm")
	warm := f.claim(time.Hour)
	d, err := s.NextDelivery(ctx, store.NextDeliveryParams{Activation: warm.Ref(), DeliveryID: uuid.NewString(),
		Binding: "sha256:test", MarkSent: true})
	must(t, err, "NextDelivery")
	expect := &store.ExpectedBinding{Agent: d.Agent, Binding: "sha256:test"}
	const sessions = 16
	round := func(name string, claims []int) {
		keys := make([]store.ActorKey, sessions)
		for i := range keys {
			keys[i] = f.session(f.key.AgentUID)
			f.key = keys[i]
			f.append(fmt.Sprintf("%s-s%d", name, i))
		}
		tr.batches.Store(0)
		type result struct {
			a   store.Activation
			err error
		}
		results := make([]result, len(claims))
		start := make(chan struct{})
		var wg sync.WaitGroup
		for c, i := range claims {
			wg.Go(func() {
				p := store.ClaimActivationParams{Key: keys[i], UID: uuid.NewString(), LeaseID: uuid.NewString(),
					HostID: "host", LeaseTTL: time.Hour}
				p.First = &store.NextDeliveryParams{Activation: store.ActivationRef{UID: p.UID, ActorKey: keys[i],
					ActorEpoch: 1, LeaseID: p.LeaseID}, DeliveryID: uuid.NewString(), MarkSent: true, TailMessages: 10,
					ExpectDue: true, Expect: expect}
				<-start
				a, err := s.ClaimActivation(ctx, p)
				results[c] = result{a, err}
			})
		}
		close(start)
		wg.Wait()
		won, winner := make(map[int]int), make(map[int]string)
		for c, i := range claims {
			r := results[c]
			switch {
			case errors.Is(r.err, store.ErrActivationLive):
				continue
			case r.err != nil:
				t.Fatalf("%s: session %d: ClaimActivation: %v", name, i, r.err)
			}
			won[i]++
			winner[i] = r.a.UID
			if r.a.First == nil {
				t.Errorf("%s: session %d: the winning claim took no first turn", name, i)
				continue
			}
			want := fmt.Sprintf(`{"message": "%s-s%d"}`, name, i)
			if got := string(r.a.First.Event.Payload); got != want || r.a.First.Attempt != 1 {
				t.Errorf("%s: session %d: first turn %s at attempt %d, want %s at 1", name, i, got, r.a.First.Attempt, want)
			}
		}
		for i := range keys {
			if won[i] != 1 {
				t.Errorf("%s: session %d: %d claims won, want 1", name, i, won[i])
			}
			cur, err := s.CurrentActivation(ctx, keys[i])
			must(t, err, "CurrentActivation")
			if cur.UID != winner[i] || cur.State != store.ActivationActive {
				t.Errorf("%s: session %d: current activation %s (%s), want the winner's %s, active", name, i, cur.UID, cur.State, winner[i])
			}
		}
	}
	distinct := make([]int, sessions)
	for i := range distinct {
		distinct[i] = i
	}
	round("distinct", distinct)
	// Not a timing assertion: with 16 claims released at once and none
	// refused, batches must have held more than one on average, or
	// nothing was grouped.
	if b := tr.batches.Load(); b >= sessions {
		t.Fatalf("%d batches for %d claims: nothing was grouped", b, sessions)
	} else {
		t.Logf("%d claims in %d batches", sessions, b)
	}
	var twice []int
	for i := range sessions {
		twice = append(twice, i, i)
	}
	round("twice", twice)
}

// TestGroupCommitOfConcurrentAuditRows: audit rows appended at once, and
// events appended among them (a signal's event, then its audit row),
// share batches, and each caller gets its own committed row or event
// back; a row the server refuses (a NUL byte in its object) rolls its
// batch back, fails alone, and costs the others of its batch nothing but a
// second try.
func TestGroupCommitOfConcurrentAuditRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tr := &batchCounter{}
	s, err := postgres.Open(ctx, pgtest.DSN(t), postgres.WithTracer(tr))
	must(t, err, "Open")
	t.Cleanup(func() { _ = s.Close() })
	f := newFixtureOn(t, s)
	const callers, each = 16, 20
	keys := make([]store.ActorKey, callers)
	for i := range keys {
		keys[i] = f.session(f.key.AgentUID)
	}
	tr.batches.Store(0)
	var wg sync.WaitGroup
	var good, bad atomic.Int64
	for i := range callers {
		wg.Go(func() {
			for j := range each {
				e, created, err := s.AppendEvent(ctx, store.AppendEventParams{Key: keys[i], Kind: abi.EventMessage,
					Payload: []byte(fmt.Sprintf(`{"message":"%d-%d"}`, i, j))})
				if err != nil || !created || e.Seq != int64(j+1) {
					t.Errorf("caller %d append %d: seq %d, created %v, %v", i, j, e.Seq, created, err)
					return
				}
				p := store.AppendAuditParams{TokenID: fmt.Sprint("tok", i), Action: "signal.send",
					Object: fmt.Sprintf("/v1/agents/a/sessions/s%d-%d/signals", i, j), Result: "ok", Status: 202}
				refused := i%4 == 0 && j%5 == 0
				if refused {
					p.Object += "\x00"
				}
				row, err := s.AppendAudit(ctx, p)
				switch {
				case refused && err == nil:
					t.Errorf("caller %d row %d with a NUL byte was stored as %d", i, j, row.ID)
				case refused:
					bad.Add(1)
				case err != nil:
					t.Errorf("caller %d row %d: %v", i, j, err)
				case row.ID <= 0 || row.Object != p.Object || row.TokenID != p.TokenID:
					t.Errorf("caller %d row %d: got %+v back", i, j, row)
				default:
					good.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	es, err := s.ListAudit(ctx, store.ListAuditParams{Limit: store.MaxAuditLimit})
	must(t, err, "ListAudit")
	if int64(len(es)) != good.Load() || bad.Load() == 0 {
		t.Fatalf("%d rows stored for %d accepted appends (%d refused)", len(es), good.Load(), bad.Load())
	}
	for i, key := range keys {
		evs, err := s.ListEvents(ctx, store.ListEventsParams{Key: key, Limit: 1000})
		must(t, err, "ListEvents")
		if len(evs) != each {
			t.Fatalf("session %d has %d events, want %d", i, len(evs), each)
		}
	}
	// Not a timing assertion: with 16 concurrent callers, batches must
	// have held more than one statement on average, or nothing was grouped.
	if b := tr.batches.Load(); b >= 2*callers*each {
		t.Fatalf("%d batches for %d events and audit rows: nothing was grouped", b, 2*callers*each)
	} else {
		t.Logf("%d events and audit rows in %d batches (%d single statements)", 2*callers*each, b, tr.queries.Load())
	}
}

// kindsTracer records, for each batch sent, how many turn commits and
// appends it held.
type kindsTracer struct{ batches, mixed, commits, appends atomic.Int64 }

type batchKinds struct{ commits, appends atomic.Int64 }

type batchKindsKey struct{}

func (k *kindsTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (k *kindsTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (k *kindsTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	k.batches.Add(1)
	return context.WithValue(ctx, batchKindsKey{}, &batchKinds{})
}
func (k *kindsTracer) TraceBatchQuery(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	bk, _ := ctx.Value(batchKindsKey{}).(*batchKinds)
	if bk == nil {
		return
	}
	if strings.Contains(d.SQL, "INSERT INTO turns") {
		bk.commits.Add(1)
	}
	switch {
	case strings.Contains(d.SQL, "WITH ORDINALITY AS na("): // a set append: one element per append
		if agents, ok := d.Args[0].([]string); ok {
			bk.appends.Add(int64(len(agents)))
		}
	case strings.Contains(d.SQL, "status <> 'destroyed'") && strings.Contains(d.SQL, "INSERT INTO actor_events"):
		bk.appends.Add(1)
	}
}
func (k *kindsTracer) TraceBatchEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchEndData) {
	bk, _ := ctx.Value(batchKindsKey{}).(*batchKinds)
	if bk == nil {
		return
	}
	if bk.commits.Load() > 0 && bk.appends.Load() > 0 {
		k.mixed.Add(1)
	}
	if bk.commits.Load() > 1 {
		k.commits.Add(1)
	}
	if bk.appends.Load() > 1 {
		k.appends.Add(1)
	}
}

// TestGroupCommitOfMixedKinds: each round, the turn commits of many
// sessions, appends of their next events and, in odd rounds, replays of
// the turns committed the round before (which their fences refuse) are
// sent at once. Commits share batches with each other and appends with
// each other, in the two lanes (a session's append waiting for its own
// commit's row, or the reverse), and every request still gets exactly its
// own outcome: every turn commits once with its own event, no append is
// lost or doubled by a batch a replay rolled back, each session's events
// are contiguous.
func TestGroupCommitOfMixedKinds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tr := &kindsTracer{}
	s, f := openTraced(t, tr)
	const sessions, rounds = 12, 6
	acts := liveSessions(f, sessions)
	for i, a := range acts {
		f.key = a.ActorKey
		f.append(fmt.Sprintf("m0-s%d", i))
	}
	var last []abi.TurnRef
	for round := range rounds {
		refs, payloads := make([]abi.TurnRef, sessions), make([]string, sessions)
		for i, a := range acts {
			d := f.next(a)
			if want := fmt.Sprintf(`{"message": "m%d-s%d"}`, round, i); string(d.Event.Payload) != want {
				t.Fatalf("round %d session %d dispatched %s, want %s", round, i, d.Event.Payload, want)
			}
			refs[i], payloads[i] = d.Delivery.TurnRef(), string(d.Event.Payload)
		}
		start := make(chan struct{})
		errs := make(chan error, 3*sessions)
		var wg sync.WaitGroup
		for i, a := range acts {
			wg.Go(func() {
				<-start
				turn, err := s.CommitTurn(ctx, store.CommitTurnParams{Ref: refs[i], Outcome: abi.OutcomeOK, KeepState: true,
					Messages: []abi.Message{{Role: abi.RoleAssistant, Content: fmt.Sprintf("reply m%d-s%d", round, i)}},
					Payloads: []string{payloads[i]}})
				if err != nil {
					errs <- fmt.Errorf("round %d session %d: commit: %w", round, i, err)
				} else if turn.TurnNo != int64(round+1) {
					errs <- fmt.Errorf("round %d session %d: turn %d", round, i, turn.TurnNo)
				}
			})
			wg.Go(func() {
				<-start
				e, created, err := s.AppendEvent(ctx, store.AppendEventParams{Key: a.ActorKey, Kind: abi.EventMessage,
					Payload: []byte(fmt.Sprintf(`{"message": "m%d-s%d"}`, round+1, i))})
				if err != nil || !created || e.Seq != int64(round+2) {
					errs <- fmt.Errorf("round %d session %d: append: seq %d, created %v, %v", round, i, e.Seq, created, err)
				}
			})
		}
		for i, ref := range last {
			if round%2 == 0 || i%3 != 0 {
				continue
			}
			wg.Go(func() {
				<-start
				if err := replayRefused(ctx, s, ref); err != nil {
					errs <- err
				}
			})
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		if t.Failed() {
			t.FailNow()
		}
		last = refs
	}
	for i, a := range acts {
		turns, err := s.Transcript(ctx, store.TranscriptParams{Key: a.ActorKey, Limit: 100})
		must(t, err, "Transcript")
		if len(turns) != rounds {
			t.Fatalf("session %d has %d turns, want %d", i, len(turns), rounds)
		}
		for r, turn := range turns {
			if len(turn.Messages) != 2 || turn.Messages[0].Content != fmt.Sprintf("m%d-s%d", r, i) ||
				turn.Messages[1].Content != fmt.Sprintf("reply m%d-s%d", r, i) {
				t.Fatalf("session %d turn %d: %+v", i, r+1, turn.Messages)
			}
		}
		evs, err := s.ListEvents(ctx, store.ListEventsParams{Key: a.ActorKey, Limit: 100})
		must(t, err, "ListEvents")
		if len(evs) != rounds+1 {
			t.Fatalf("session %d has %d events, want %d", i, len(evs), rounds+1)
		}
		for j, e := range evs {
			if e.Seq != int64(j+1) {
				t.Fatalf("session %d event %d has seq %d", i, j, e.Seq)
			}
		}
	}
	// Not a timing assertion: 12 or more requests of a lane released
	// together each round find its flusher busy with the first of them, so
	// the rest share the next batch.
	if tr.mixed.Load() != 0 {
		t.Fatalf("%d batches of %d held both a commit and an append: the lanes were not kept apart", tr.mixed.Load(), tr.batches.Load())
	}
	if tr.commits.Load() == 0 || tr.appends.Load() == 0 {
		t.Fatalf("of %d batches, %d held several commits and %d several appends: a kind was not grouped",
			tr.batches.Load(), tr.commits.Load(), tr.appends.Load())
	}
	t.Logf("of %d batches, %d held several commits and %d several appends", tr.batches.Load(), tr.commits.Load(), tr.appends.Load())
}

// openTraced opens a store on a fresh database with tracer, and the
// fixture on it.
func openTraced(t *testing.T, tracer pgx.QueryTracer) (*postgres.Store, *fixture) {
	t.Helper()
	dsn := pgtest.DSN(t)
	s, err := postgres.Open(context.Background(), dsn, postgres.WithTracer(tracer))
	must(t, err, "Open")
	t.Cleanup(func() { _ = s.Close() })
	t.Cleanup(func() { noOrphans(t, dsn) }) // runs first
	return s, newFixtureOn(t, s)
}

// liveSessions creates n sessions of f's agent, each with a live
// activation of an hour's lease.
func liveSessions(f *fixture, n int) []store.Activation {
	acts := make([]store.Activation, n)
	for i := range acts {
		f.key = f.session(f.key.AgentUID)
		acts[i] = f.claim(time.Hour)
	}
	return acts
}

// replayRefused commits ref, a turn committed already, again; it returns
// an error unless the fence refused it as superseded.
func replayRefused(ctx context.Context, s *postgres.Store, ref abi.TurnRef) error {
	_, err := s.CommitTurn(ctx, store.CommitTurnParams{Ref: ref, Outcome: abi.OutcomeOK, KeepState: true,
		Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "MUST NOT BE WRITTEN"}},
		Payloads: []string{`{"message":"replayed"}`}})
	var fe *store.FenceError
	if !errors.As(err, &fe) || fe.Reason != store.FenceSupersededDelivery {
		return fmt.Errorf("replay of %s: %v, want a superseded_delivery refusal", ref, err)
	}
	return nil
}

// TestAppendsDoNotQueueBehindAStalledTurnBatch: the group commit's lanes.
// A turn commit whose batch waits for a row lock (held here by another
// transaction: a slow request on its own path, another host's batch)
// stalls the turns lane, but a signal to another session is accepted —
// durable, its call returned — while that batch still waits: acceptance
// has a lane, a connection and a backend of its own. Once the lock is
// released the commit goes through unharmed.
func TestAppendsDoNotQueueBehindAStalledTurnBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, f := fixtureOnOwnStore(t)
	e := f.append("the turn that stalls")
	a := f.claim(time.Hour)
	d := f.next(a)
	other := f.session(f.key.AgentUID)

	st := stallTurnsLane(t, dsn, f, a, d)

	// With one lane the append queued behind the stalled batch until the
	// holder let go; its deadline here is the failure.
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ev, created, err := f.s.AppendEvent(actx, store.AppendEventParams{Key: other, Kind: abi.EventMessage,
		Payload: []byte(`{"message": "accepted meanwhile"}`)})
	if err != nil || !created {
		t.Fatalf("append to another session while a turn batch is stalled: created %v, %v", created, err)
	}
	st.stillWaiting()
	var status string
	must(t, st.watch.QueryRow(ctx, `SELECT status FROM actor_events WHERE event_id = $1`, ev.ID).Scan(&status),
		"read the accepted event from another connection")
	if status != "open" {
		t.Fatalf("the accepted event is %q, want open", status)
	}

	if turn := st.release(); turn.EventID != e.ID {
		t.Fatalf("the stalled commit committed event %d, want %d", turn.EventID, e.ID)
	}
}

// TestClaimsDoNotQueueBehindAStalledTurnBatch: the starts lane. A turn
// commit whose batch waits for a row lock stalls the turns lane, but a
// cold start of another session — its activation claimed with its first
// turn read, durable, the call returned — goes through meanwhile: claims
// have a lane, a connection and a backend of their own. In the turns lane
// the claim queued behind the stalled batch until the lock was released.
// Once it is, the commit goes through unharmed.
func TestClaimsDoNotQueueBehindAStalledTurnBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn, f := fixtureOnOwnStore(t)
	f.append("the turn that stalls")
	a := f.claim(time.Hour)
	d := f.next(a)
	expect := &store.ExpectedBinding{Agent: d.Agent, Binding: "sha256:test"}
	stalled := f.key
	f.key = f.session(f.key.AgentUID)
	cold := f.append("the cold start")

	st := stallTurnsLane(t, dsn, f, a, d)

	// In the turns lane the claim queued behind the stalled batch until the
	// holder let go; its deadline here is the failure.
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	p := store.ClaimActivationParams{Key: f.key, UID: uuid.NewString(), LeaseID: uuid.NewString(),
		HostID: "host", LeaseTTL: time.Hour}
	p.First = &store.NextDeliveryParams{Activation: store.ActivationRef{UID: p.UID, ActorKey: f.key,
		ActorEpoch: 1, LeaseID: p.LeaseID}, DeliveryID: uuid.NewString(), MarkSent: true, TailMessages: 10,
		ExpectDue: true, Expect: expect}
	started, err := f.s.ClaimActivation(cctx, p)
	if err != nil {
		t.Fatalf("cold start of another session while a turn batch is stalled: %v", err)
	}
	if started.First == nil || started.First.Event.ID != cold.ID {
		t.Fatalf("the cold start's first turn is %+v, want event %d", started.First, cold.ID)
	}
	st.stillWaiting()
	var live int
	must(t, st.watch.QueryRow(ctx, `SELECT count(*) FROM activations WHERE activation_uid = $1 AND state = 'active'`,
		started.UID).Scan(&live), "read the claimed activation from another connection")
	if live != 1 {
		t.Fatalf("the claimed activation is not active on another connection (%d rows)", live)
	}

	st.release()
	cur, err := f.s.CurrentActivation(ctx, stalled)
	must(t, err, "CurrentActivation")
	if cur.UID != a.UID {
		t.Fatalf("the stalled session's activation is %s, want %s", cur.UID, a.UID)
	}
}

// stalledTurnsLane is a turns lane stalled by a held row lock (the lanes'
// tests): the commit of a dispatched turn whose batch waits for its
// activation's row, held by another transaction until release.
type stalledTurnsLane struct {
	t         *testing.T
	tx        pgx.Tx
	watch     *pgx.Conn // a connection of its own, for reads meanwhile
	committed chan commitOutcome
}

type commitOutcome struct {
	turn store.Turn
	err  error
}

// stallTurnsLane locks activation a's row in a transaction of its own,
// sends the commit of d (a's dispatched turn) and returns once the
// commit's batch waits for that lock; it fails t if the commit returns
// first. The connections close and the lock is released with the test.
func stallTurnsLane(t *testing.T, dsn string, f *fixture, a store.Activation, d store.Dispatch) *stalledTurnsLane {
	t.Helper()
	ctx := context.Background()
	holder, err := pgx.Connect(ctx, dsn)
	must(t, err, "connect")
	t.Cleanup(func() { _ = holder.Close(ctx) })
	watch, err := pgx.Connect(ctx, dsn)
	must(t, err, "connect")
	t.Cleanup(func() { _ = watch.Close(ctx) })
	tx, err := holder.Begin(ctx)
	must(t, err, "begin")
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	_, err = tx.Exec(ctx, `SELECT 1 FROM activations WHERE activation_uid = $1 FOR UPDATE`, a.UID)
	must(t, err, "lock the activation")

	st := &stalledTurnsLane{t: t, tx: tx, watch: watch, committed: make(chan commitOutcome, 1)}
	go func() {
		turn, err := f.s.CommitTurn(ctx, store.CommitTurnParams{Ref: d.Delivery.TurnRef(), Outcome: abi.OutcomeOK,
			KeepState: true, Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "reply"}},
			Payloads: []string{string(d.Event.Payload)}})
		st.committed <- commitOutcome{turn, err}
	}()
	awaitLockWait(t, watch, "the commit's batch", func() (string, bool) {
		select {
		case r := <-st.committed:
			return fmt.Sprint(r.err), true
		default:
			return "", false
		}
	})
	return st
}

// stillWaiting fails the test if the stalled commit has returned.
func (st *stalledTurnsLane) stillWaiting() {
	st.t.Helper()
	select {
	case r := <-st.committed:
		st.t.Fatalf("the commit returned (%v) before the lock was released", r.err)
	default:
	}
}

// release lets the lock go and returns the stalled commit's turn once it
// committed; it fails the test if the commit fails or takes over 30 s.
func (st *stalledTurnsLane) release() store.Turn {
	st.t.Helper()
	must(st.t, st.tx.Commit(context.Background()), "release the lock")
	select {
	case r := <-st.committed:
		must(st.t, r.err, "the stalled commit")
		return r.turn
	case <-time.After(30 * time.Second):
		st.t.Fatal("the commit did not finish after the lock was released")
		return store.Turn{}
	}
}
