package host_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

// oneTripFn answers "quick" at once; "ignore" works 300 ms without looking
// for steers (then, given steers, says what it saw); "long" runs until its
// context ends; "wait" ends the turn with outcome wait.
func oneTripFn(started chan<- string) abi.TurnFunc {
	return func(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
		select {
		case started <- req.Event.Message:
		default:
		}
		reply := func(s string) (*abi.TurnResult, error) {
			return &abi.TurnResult{Messages: []abi.Message{{Role: abi.RoleAssistant, Content: s}}}, nil
		}
		switch {
		case len(req.Steers) > 0:
			return reply("saw " + req.Steers[0].Message)
		case req.Event.Message == "ignore":
			time.Sleep(300 * time.Millisecond)
			return reply("unsteered")
		case req.Event.Message == "long":
			<-ctx.Done()
			return nil, ctx.Err()
		case req.Event.Message == "wait":
			return &abi.TurnResult{Outcome: abi.OutcomeWait, Wait: &abi.WaitSpec{ID: "w-" + req.TurnRef.SessionID[:8], For: "a human"},
				Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "waiting"}}}, nil
		}
		return reply("re: " + req.Event.Message)
	}
}

// wantSoundStream: frames numbered without gaps; per attempt (event, epoch,
// attempt) a turn.started before anything else of it and no second one
// unless a turn.retrying came between; one turn.committed per event.
func wantSoundStream(t *testing.T, st store.Store, key store.ActorKey) []store.Frame {
	t.Helper()
	pg, err := st.StreamFrames(context.Background(), store.StreamFramesParams{Key: key, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	open := map[string]bool{}
	committed := map[int64]bool{}
	for i, f := range pg.Frames {
		if f.Seq != int64(i+1) {
			t.Fatalf("frame %d has seq %d", i+1, f.Seq)
		}
		k := fmt.Sprintf("%d/%d/%d", f.EventID, f.ActorEpoch, f.Attempt)
		switch f.Kind {
		case store.FrameTurnStarted:
			if open[k] {
				t.Errorf("frame %d: a second turn.started of %s without turn.retrying", f.Seq, k)
			}
			open[k] = true
		case store.FrameTurnRetrying, store.FrameTurnFailed:
			open[k] = false
		case store.FrameTurnCommitted:
			if !open[k] {
				t.Errorf("frame %d: turn.committed of %s outside a started attempt", f.Seq, k)
			}
			if committed[f.EventID] {
				t.Errorf("frame %d: a second turn.committed of event %d", f.Seq, f.EventID)
			}
			committed[f.EventID] = true
			open[k] = false
		case store.FrameChunk:
			if !open[k] {
				t.Errorf("frame %d: a chunk of %s outside a started attempt", f.Seq, k)
			}
		}
	}
	return pg.Frames
}

// TestOneTripSecondTurnSteeredCancelledAndWaiting: the second event of a
// live activation is dispatched with the agent the controller expects
// (one round trip on PostgreSQL) and committed with its payloads. A steer
// the worker ignores is refused as stale_revision and the turn reruns with
// it; a cancel aborts it; a wait outcome commits with its frames.
func TestOneTripSecondTurnSteeredCancelledAndWaiting(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		started := make(chan string, 16)
		f := start(t, st, map[string]abi.TurnFunc{"o": oneTripFn(started)}, testPolicy())
		ag := f.agent("o")

		// Steered while it does not look.
		key := f.session(ag)
		f.signal(key, "quick")
		f.signal(key, "ignore")
		for recv(t, started) != "ignore" {
		}
		f.waitStarted(key, 2) // in flight: written
		payload, _ := json.Marshal(map[string]string{"message": "left"})
		if _, err := st.Steer(context.Background(), store.SteerParams{Key: key, Payload: payload, DeliveryID: "d-" + key.SessionID}); err != nil {
			t.Fatal(err)
		}
		f.h.Ensure(key)
		f.waitFor("the steered second turn", func() bool { return f.get(key).TurnCount == 2 })
		var got []string
		for _, m := range f.transcript(key)[1].Messages {
			got = append(got, m.Role+":"+m.Content)
		}
		if want := "user:ignore|user:left|assistant:saw left"; strings.Join(got, "|") != want {
			t.Errorf("second turn %q, want %q", strings.Join(got, "|"), want)
		}
		if n := testutil.ToFloat64(f.h.Metrics().FenceRejections.WithLabelValues(string(store.FenceStaleRevision))); n != 1 {
			t.Errorf("stale_revision rejections = %v, want 1", n)
		}
		for _, e := range f.events(key) {
			if e.Status != store.EventDone {
				t.Errorf("event %d (%s) is %s", e.ID, e.Kind, e.Status)
			}
		}
		wantSoundStream(t, st, key)

		// Cancelled, then the next event runs.
		key = f.session(ag)
		f.signal(key, "quick")
		f.signal(key, "long")
		f.signal(key, "after")
		for recv(t, started) != "long" {
		}
		f.waitStarted(key, 2)
		if res, err := st.CancelEvent(context.Background(), store.CancelEventParams{Key: key, Reason: "no"}); err != nil || !res.InFlight {
			t.Fatalf("cancel: %+v %v", res, err)
		}
		f.h.Ensure(key)
		f.waitFor("the event after the cancelled one", func() bool { return f.get(key).TurnCount == 3 })
		ts := f.transcript(key)
		if ts[1].Outcome != store.OutcomeCancelled || ts[2].Messages[len(ts[2].Messages)-1].Content != "re: after" {
			t.Errorf("transcript %+v", ts)
		}
		wantSoundStream(t, st, key)

		// A wait outcome on the second turn.
		key = f.session(ag)
		f.signal(key, "quick")
		f.signal(key, "wait")
		f.waitFor("the waiting turn", func() bool { return f.get(key).TurnCount == 2 })
		fs := wantSoundStream(t, st, key)
		if k := fs[len(fs)-1].Kind; k != store.FrameWaitOpened {
			t.Errorf("last frame %s, want wait.opened", k)
		}
	})
}

// dispatchCounter is a store that counts the turns NextDelivery dispatched
// and those a commit took for the next turn (store.Turn.Next).
type dispatchCounter struct {
	store.Store
	dispatched, taken, first atomic.Int64
}

func (c *dispatchCounter) NextDelivery(ctx context.Context, p store.NextDeliveryParams) (store.Dispatch, error) {
	d, err := c.Store.NextDelivery(ctx, p)
	if err == nil {
		c.dispatched.Add(1)
	}
	return d, err
}

func (c *dispatchCounter) CommitTurn(ctx context.Context, p store.CommitTurnParams) (store.Turn, error) {
	t, err := c.Store.CommitTurn(ctx, p)
	if err == nil && t.Next != nil {
		c.taken.Add(1)
	}
	return t, err
}

func (c *dispatchCounter) ClaimActivation(ctx context.Context, p store.ClaimActivationParams) (store.Activation, error) {
	a, err := c.Store.ClaimActivation(ctx, p)
	if err == nil && a.First != nil {
		c.first.Add(1)
	}
	return a, err
}

// TestASessionsFirstTurnIsTakenByTheActivationsClaim: once the host has
// run the agent, a session woken by a signal gets its first turn from the
// claim of its activation (store.ClaimActivationParams.First), not from a
// dispatch of its own; each runs once, at its first attempt, with a sound
// stream.
func TestASessionsFirstTurnIsTakenByTheActivationsClaim(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		cs := &dispatchCounter{Store: st}
		f := start(t, cs, map[string]abi.TurnFunc{"o": oneTripFn(make(chan string))}, testPolicy())
		ag := f.agent("o")
		warm := f.session(ag)
		f.signal(warm, "hello")
		f.waitFor("the first session's turn", func() bool { return f.get(warm).TurnCount == 1 })
		const sessions = 4
		keys := make([]store.ActorKey, sessions)
		for i := range keys {
			keys[i] = f.session(ag)
			f.signal(keys[i], fmt.Sprintf("s%d", i))
		}
		for i, key := range keys {
			f.waitFor("each session's turn", func() bool { return f.get(key).TurnCount == 1 })
			ts := f.transcript(key)
			if got, want := ts[0].Messages[len(ts[0].Messages)-1].Content, fmt.Sprintf("re: s%d", i); got != want {
				t.Errorf("session %d replied %q, want %q", i, got, want)
			}
			for _, e := range f.events(key) {
				if e.Status != store.EventDone || e.Attempts != 0 {
					t.Errorf("event %d is %s after %d failed attempts, want done after none", e.ID, e.Status, e.Attempts)
				}
			}
			wantSoundStream(t, st, key)
		}
		// The first session's turn had no expectation to start from (it
		// was dispatched); the others' claims took theirs.
		if f, d := cs.first.Load(), cs.dispatched.Load(); f != sessions || d != 1 {
			t.Errorf("%d first turns taken by the activation's claim and %d dispatched, want %d and 1", f, d, sessions)
		}
	})
}

// TestABacklogRunsThroughTheCommitsClaims: events that wait behind a turn
// are taken each by the commit before it (store.CommitTurnParams.Next),
// not by a dispatch of their own, and run in order, once each, at their
// first attempt, with a sound stream.
func TestABacklogRunsThroughTheCommitsClaims(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		cs := &dispatchCounter{Store: st}
		started := make(chan string, 16)
		f := start(t, cs, map[string]abi.TurnFunc{"o": oneTripFn(started)}, testPolicy())
		key := f.session(f.agent("o"))
		f.signal(key, "ignore") // 300 ms: the rest queues behind it
		for recv(t, started) != "ignore" {
		}
		const backlog = 5
		for i := range backlog {
			f.signal(key, fmt.Sprintf("q%d", i))
		}
		f.waitFor("the backlog's turns", func() bool { return f.get(key).TurnCount == 1+backlog })
		ts := f.transcript(key)
		for i, tr := range ts[1:] {
			if got, want := tr.Messages[len(tr.Messages)-1].Content, fmt.Sprintf("re: q%d", i); got != want {
				t.Errorf("turn %d replied %q, want %q", i+2, got, want)
			}
		}
		for _, e := range f.events(key) {
			if e.Status != store.EventDone || e.Attempts != 0 {
				t.Errorf("event %d is %s after %d failed attempts, want done after none", e.ID, e.Status, e.Attempts)
			}
		}
		for _, fr := range wantSoundStream(t, st, key) {
			if fr.Kind == store.FrameTurnStarted && fr.Attempt != 1 {
				t.Errorf("turn.started of event %d at attempt %d", fr.EventID, fr.Attempt)
			}
		}
		d, tk := cs.dispatched.Load(), cs.taken.Load()
		if d+tk != 1+backlog || tk < backlog-1 {
			t.Errorf("%d turns dispatched by NextDelivery and %d taken by the commit before them, want %d in all, at least %d taken",
				d, tk, 1+backlog, backlog-1)
		}
	})
}
