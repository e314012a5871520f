package postgres_test

import (
	"context"
	"encoding/json"
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

// setCounter counts batches and, among their statements, the set commits
// (store/postgres/setcommit.go) and their deferred commits sent one by one.
type setCounter struct {
	batchCounter
	sets, singles atomic.Int64
}

func (c *setCounter) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	switch {
	case strings.Contains(d.SQL, "WITH ORDINALITY AS i(agent_uid"):
		c.sets.Add(1)
	case strings.Contains(d.SQL, "UPDATE activations SET lease_expires_at = greatest"):
		c.singles.Add(1)
	}
}

// warmTurns commits a first, written turn of each of acts, and returns the
// expectation their dispatches tell (the agent and its binding), with
// which the next dispatches can be deferred.
func warmTurns(t *testing.T, s *postgres.Store, f *fixture, acts []store.Activation) *store.ExpectedBinding {
	t.Helper()
	var expect *store.ExpectedBinding
	for _, a := range acts {
		f.key = a.ActorKey
		f.append("warm")
		d := f.next(a)
		_, err := s.CommitTurn(context.Background(), store.CommitTurnParams{Ref: d.Delivery.TurnRef(), Outcome: abi.OutcomeOK, KeepState: true,
			Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "warm reply"}}, Payloads: []string{string(d.Event.Payload)}})
		must(t, err, "first commit")
		expect = &store.ExpectedBinding{Agent: d.Agent, Binding: "sha256:test"}
	}
	return expect
}

// TestSetCommitOfDeferredTurns: rounds of concurrent deferred commits of
// many sessions go out as set commits, and each turn gets exactly its own
// outcome: a fresh commit writes its turn (number, messages, state or
// state kept, its two stream frames); a commit whose event was cancelled
// after its dispatch is refused as superseded — explained on its own path
// — and writes nothing, while the other turns of its set commit.
func TestSetCommitOfDeferredTurns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tr := &setCounter{}
	s, f := openTraced(t, tr)
	const sessions, rounds = 16, 8
	acts := liveSessions(f, sessions)
	expect := warmTurns(t, s, f, acts)
	bind := func(store.AgentBinding) (string, error) { return "sha256:test", nil }
	wantTurns := make([]int64, sessions) // committed turns per session
	for i := range wantTurns {
		wantTurns[i] = 1
	}
	wantState := make([]string, sessions)
	refusedAll := 0
	for round := range rounds {
		type turn struct {
			p       store.NextDeliveryParams
			d       store.Dispatch
			refused bool
		}
		turns := make([]turn, sessions)
		for i, a := range acts {
			f.key = a.ActorKey
			f.append(fmt.Sprintf("r%d-s%d", round, i))
			p := store.NextDeliveryParams{Activation: a.Ref(), DeliveryID: uuid.NewString(), MarkSent: true,
				TailMessages: 10, ExpectDue: true, Expect: expect, Defer: true, Bind: bind}
			d, err := s.NextDelivery(ctx, p)
			must(t, err, "deferred NextDelivery")
			if !d.Deferred {
				t.Fatalf("round %d session %d: dispatch not deferred", round, i)
			}
			turns[i] = turn{p: p, d: d}
			if round%2 == 1 && i%5 == 0 {
				_, err := s.CancelEvent(ctx, store.CancelEventParams{Key: a.ActorKey, EventID: d.Event.ID, Reason: "stop"})
				must(t, err, "CancelEvent")
				turns[i].refused = true
			}
		}
		before := make([]store.StreamPage, sessions)
		for i, a := range acts {
			pg, err := s.StreamFrames(ctx, store.StreamFramesParams{Key: a.ActorKey, Limit: 1000})
			must(t, err, "StreamFrames")
			before[i] = pg
		}
		var wg sync.WaitGroup
		errs := make(chan error, sessions)
		got := make([]store.Turn, sessions)
		for i, a := range acts {
			tu := turns[i]
			wg.Go(func() {
				pp := store.PromoteOf(a.Ref(), tu.p, tu.d)
				cp := store.CommitTurnParams{Ref: tu.d.Delivery.TurnRef(), Outcome: abi.OutcomeOK,
					Messages: []abi.Message{{Role: abi.RoleAssistant, Content: fmt.Sprintf("reply r%d-s%d", round, i)}},
					Payloads: []string{string(tu.d.Event.Payload)}, Deferred: &pp}
				if i%2 == 0 {
					cp.State = []byte(fmt.Sprintf("state r%d-s%d", round, i))
				} else {
					cp.KeepState = true
				}
				tn, err := s.CommitTurn(ctx, cp)
				var fe *store.FenceError
				switch {
				case tu.refused && (!errors.As(err, &fe) || fe.Reason != store.FenceSupersededDelivery):
					errs <- fmt.Errorf("round %d session %d: cancelled turn's commit: %v, want superseded_delivery", round, i, err)
				case !tu.refused && err != nil:
					errs <- fmt.Errorf("round %d session %d: %w", round, i, err)
				}
				got[i] = tn
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		if t.Failed() {
			t.FailNow()
		}
		for i, a := range acts {
			pg, err := s.StreamFrames(ctx, store.StreamFramesParams{Key: a.ActorKey, After: before[i].Head, Limit: 1000})
			must(t, err, "StreamFrames")
			if turns[i].refused {
				refusedAll++
				if len(pg.Frames) != 0 {
					t.Fatalf("round %d session %d: a refused commit wrote frames %+v", round, i, pg.Frames)
				}
				continue
			}
			wantTurns[i]++
			if i%2 == 0 {
				wantState[i] = fmt.Sprintf("state r%d-s%d", round, i)
			}
			tn := got[i]
			if tn.TurnNo != wantTurns[i] || len(tn.Messages) != 2 || tn.Messages[1].Content != fmt.Sprintf("reply r%d-s%d", round, i) ||
				tn.CommittedAt.IsZero() || tn.NextOpen {
				t.Fatalf("round %d session %d: turn %+v, want turn %d with its reply and nothing else open", round, i, tn, wantTurns[i])
			}
			if len(pg.Frames) != 2 || pg.Frames[0].Kind != store.FrameTurnStarted || pg.Frames[1].Kind != store.FrameTurnCommitted ||
				pg.Frames[0].Seq != before[i].Head+1 || pg.Frames[1].Seq != before[i].Head+2 {
				t.Fatalf("round %d session %d: frames %+v after head %d, want turn.started and turn.committed", round, i, pg.Frames, before[i].Head)
			}
			var body struct {
				TurnNo   int64         `json:"turn_no"`
				Messages []abi.Message `json:"messages"`
			}
			if err := json.Unmarshal(pg.Frames[1].Body, &body); err != nil || body.TurnNo != tn.TurnNo || len(body.Messages) != 2 {
				t.Fatalf("round %d session %d: turn.committed body %s (%v)", round, i, pg.Frames[1].Body, err)
			}
		}
	}
	for i, a := range acts {
		ts, err := s.Transcript(ctx, store.TranscriptParams{Key: a.ActorKey, Limit: 100})
		must(t, err, "Transcript")
		if int64(len(ts)) != wantTurns[i] {
			t.Fatalf("session %d has %d turns, want %d", i, len(ts), wantTurns[i])
		}
		state, err := s.SessionState(ctx, a.ActorKey)
		must(t, err, "SessionState")
		if string(state) != wantState[i] {
			t.Fatalf("session %d state %q, want %q", i, state, wantState[i])
		}
	}
	// Not a timing assertion: with 16 concurrent commits a round, some
	// batches held several, or nothing went out as a set commit.
	if tr.sets.Load() == 0 {
		t.Fatalf("no set commit in %d rounds (%d deferred commits sent one by one)", rounds, tr.singles.Load())
	}
	t.Logf("%d set commits, %d deferred commits alone, %d refused", tr.sets.Load(), tr.singles.Load(), refusedAll)
}

// splitTracer records, per turns-lane batch, how many set commits and
// written claims it held, in send order.
type splitTracer struct {
	batchCounter
	mu      sync.Mutex
	batches [][2]int // {set commits, written claims}
}

func (k *splitTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	if d.Batch == nil {
		return ctx
	}
	var kinds [2]int
	for _, q := range d.Batch.QueuedQueries {
		switch {
		case strings.Contains(q.SQL, "WITH ORDINALITY AS i(agent_uid"):
			kinds[0]++
		case strings.Contains(q.SQL, "SELECT e.event_id, ag.kind, coalesce(ag.module_digest"): // claimDeliverySQL
			kinds[1]++
		}
	}
	k.mu.Lock()
	k.batches = append(k.batches, kinds)
	k.mu.Unlock()
	return ctx
}

// TestSetCommitSplitsAMixedBatch: a turns-lane batch of deferred commits
// and written claims of other sessions (a burst of cold starts) goes out
// as a set commit of the commits alone, then the claims as the next
// batch; every request gets its own answer.
func TestSetCommitSplitsAMixedBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tr := &splitTracer{}
	dsn := pgtest.DSN(t)
	s, err := postgres.Open(ctx, dsn, postgres.WithTracer(tr))
	must(t, err, "Open")
	t.Cleanup(func() { _ = s.Close() })
	t.Cleanup(func() { noOrphans(t, dsn) })
	f := newFixtureOn(t, s)
	const commits, claims = 8, 3
	acts := liveSessions(f, 1+commits+claims)
	blocker, committers, claimers := acts[0], acts[1:1+commits], acts[1+commits:]
	expect := warmTurns(t, s, f, committers)
	bind := func(store.AgentBinding) (string, error) { return "sha256:test", nil }
	type turn struct {
		p store.NextDeliveryParams
		d store.Dispatch
	}
	turns := make([]turn, commits)
	for i, a := range committers {
		f.key = a.ActorKey
		f.append(fmt.Sprintf("job %d", i))
		p := store.NextDeliveryParams{Activation: a.Ref(), DeliveryID: uuid.NewString(), MarkSent: true,
			TailMessages: 10, ExpectDue: true, Expect: expect, Defer: true, Bind: bind}
		d, err := s.NextDelivery(ctx, p)
		must(t, err, "deferred NextDelivery")
		if !d.Deferred {
			t.Fatalf("session %d: dispatch not deferred", i)
		}
		turns[i] = turn{p: p, d: d}
	}
	for i, a := range append([]store.Activation{blocker}, claimers...) {
		f.key = a.ActorKey
		f.append(fmt.Sprintf("claim %d", i))
	}

	// Stall the turns lane: the blocker's claim waits for its activation
	// row, held here, and everything sent meanwhile queues behind it.
	conn, err := pgx.Connect(ctx, dsn)
	must(t, err, "Connect")
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	must(t, err, "Begin")
	_, err = tx.Exec(ctx, `SELECT 1 FROM activations WHERE activation_uid = $1 FOR UPDATE`, blocker.UID)
	must(t, err, "lock the blocker's activation")
	// A written claim of the turns lane (one statement: the expectation
	// known, not deferred), as a remote worker's turn or a plugin's takes.
	claim := func(a store.Activation) (store.Dispatch, error) {
		return s.NextDelivery(ctx, store.NextDeliveryParams{Activation: a.Ref(), DeliveryID: uuid.NewString(),
			MarkSent: true, TailMessages: 10, ExpectDue: true, Expect: expect, Bind: bind})
	}
	stalled := make(chan error, 1)
	go func() {
		_, err := claim(blocker)
		stalled <- err
	}()
	time.Sleep(300 * time.Millisecond) // the blocker's batch is in flight
	tr.mu.Lock()
	before := len(tr.batches)
	tr.mu.Unlock()

	var wg sync.WaitGroup
	errs := make(chan error, commits+claims)
	got := make([]store.Turn, commits)
	for i, a := range committers {
		tu := turns[i]
		wg.Go(func() {
			pp := store.PromoteOf(a.Ref(), tu.p, tu.d)
			tn, err := s.CommitTurn(ctx, store.CommitTurnParams{Ref: tu.d.Delivery.TurnRef(), Outcome: abi.OutcomeOK, KeepState: true,
				Messages: []abi.Message{{Role: abi.RoleAssistant, Content: fmt.Sprintf("reply %d", i)}},
				Payloads: []string{string(tu.d.Event.Payload)}, Deferred: &pp})
			if err != nil {
				errs <- fmt.Errorf("commit %d: %w", i, err)
			}
			got[i] = tn
		})
	}
	claimed := make([]store.Dispatch, claims)
	for i, a := range claimers {
		wg.Go(func() {
			d, err := claim(a)
			if err != nil {
				errs <- fmt.Errorf("claim %d: %w", i, err)
			}
			claimed[i] = d
		})
	}
	time.Sleep(300 * time.Millisecond) // all of them queued behind the blocker
	must(t, tx.Commit(ctx), "release the blocker")
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if err := <-stalled; err != nil {
		t.Fatalf("the blocker's claim: %v", err)
	}
	if t.Failed() {
		t.FailNow()
	}
	for i, tn := range got {
		if tn.TurnNo != 2 || len(tn.Messages) != 2 || tn.Messages[1].Content != fmt.Sprintf("reply %d", i) {
			t.Fatalf("commit %d: turn %+v, want turn 2 with its reply", i, tn)
		}
	}
	for i, d := range claimed {
		if d.Event.Payload == nil || !strings.Contains(string(d.Event.Payload), fmt.Sprintf("claim %d", i+1)) || d.Deferred {
			t.Fatalf("claim %d: dispatch %+v, want its own event, written", i, d)
		}
	}
	tr.mu.Lock()
	after := tr.batches[before:]
	tr.mu.Unlock()
	// The batch after the blocker's: the set commit alone; then the claims.
	if len(after) < 2 || after[0] != [2]int{1, 0} || after[1][0] != 0 || after[1][1] != claims {
		t.Fatalf("batches after the stall (set commits, claims): %v; want [1 0] then [0 %d]", after, claims)
	}
}
