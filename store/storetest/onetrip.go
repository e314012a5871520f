package storetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

// onetripCases race the dispatch with an expected agent
// (NextDeliveryParams.Expect) and the commit with the dispatched payloads
// (CommitTurnParams.Payloads) — one implicit transaction each on
// PostgreSQL — against the writes that may land between them.
func onetripCases() []testCase {
	return []testCase{
		{"OneTrip/DispatchRacingCancelLeavesNoClosedCurrentEvent", testOneTripCancelRace},
		{"OneTrip/TwoDispatchesRacingTakeTheEventOnce", testOneTripDoubleClaim},
		{"OneTrip/DispatchRacingSteerLosesNoSteer", testOneTripSteerRace},
		{"OneTrip/DispatchRacingStopTakesNothingOrIsStopRefused", testOneTripStopRace},
		{"OneTrip/ZombieCommitWithPayloadsRefusedAndClassified", testOneTripZombie},
		{"OneTrip/WaitCommitWithPayloadsRefusedThenRetried", testOneTripWaitCommit},
		{"OneTrip/UsedDeliveryIDAnswersAsWithoutExpectAndWritesNothing", testOneTripUsedDeliveryID},
		{"OneTrip/CommitRacingSteerOrCancelEndsEachEventOnce", testOneTripCommitRaces},
	}
}

// expectedOf is the Expect a controller passes after a dispatch of the
// bundle's agent.
func (b *bundle) expectedOf(d store.Dispatch) *store.ExpectedBinding {
	return &store.ExpectedBinding{Agent: d.Agent, Binding: b.agent.ModuleDigest}
}

func (b *bundle) nextExpect(act store.Activation, x *store.ExpectedBinding) (store.Dispatch, error) {
	return b.s.NextDelivery(b.ctx, store.NextDeliveryParams{
		Activation: act.Ref(), DeliveryID: uuid.NewString(), MarkSent: true, TailMessages: 10,
		ExpectDue: true, Expect: x,
		Bind: func(store.AgentBinding) (string, error) { return b.agent.ModuleDigest, nil },
	})
}

// commitPayloads commits d's turn the way the controller does when the turn
// had no steers: with the payloads it dispatched.
func (b *bundle) commitPayloads(d store.Dispatch, reply string) (store.Turn, error) {
	return b.s.CommitTurn(b.ctx, store.CommitTurnParams{Ref: d.Delivery.TurnRef(), Outcome: abi.OutcomeOK,
		Messages: []abi.Message{{Role: abi.RoleAssistant, Content: reply}}, KeepState: true,
		Payloads: []string{string(d.Event.Payload)}})
}

// primed is a session whose activation ran one turn, and the Expect its
// controller now holds.
func (b *bundle) primed() (store.ActorKey, store.Activation, *store.ExpectedBinding) {
	b.t.Helper()
	key := b.session()
	b.message(key, "prime")
	act := b.claim(key, LongTTL)
	d, err := b.nextExpect(act, nil)
	noErr(b.t, err, "first dispatch")
	_, err = b.commitPayloads(d, "primed")
	noErr(b.t, err, "first commit")
	return key, act, b.expectedOf(d)
}

// wantStreamSound checks the session's frames: numbered from 1 without
// gaps, at most one turn.started per (event, attempt), and every frame of
// a turn after its turn.started.
func (b *bundle) wantStreamSound(key store.ActorKey, what string) {
	b.t.Helper()
	started := map[string]bool{}
	for i, f := range b.stream(key).Frames {
		if f.Seq != int64(i+1) {
			b.t.Fatalf("%s: frame %d has seq %d (gap or duplicate)", what, i+1, f.Seq)
		}
		if f.EventID == 0 {
			continue
		}
		k := fmt.Sprintf("%d/%d", f.EventID, f.Attempt)
		if f.Kind == store.FrameTurnStarted {
			if started[k] {
				b.t.Fatalf("%s: a second turn.started of event/attempt %s (frame %d)", what, k, f.Seq)
			}
			started[k] = true
		} else if !started[k] && f.Kind != store.FrameTurnCommitted {
			// A cancel of a queued event has no turn.
			continue
		} else if !started[k] {
			b.t.Fatalf("%s: %s of event/attempt %s before its turn.started", what, f.Kind, k)
		}
	}
}

// wantIdle: the activation has no current event (a dispatch with nothing
// open says nothing is due, not "not live").
func (b *bundle) wantIdle(act store.Activation, what string) {
	b.t.Helper()
	_, err := b.s.InFlight(b.ctx, act.Ref())
	if !errors.Is(err, store.ErrNotLive) {
		b.t.Fatalf("%s: InFlight = %v, want ErrNotLive (a current event is left set)", what, err)
	}
}

func race(fs ...func()) {
	var wg sync.WaitGroup
	start := make(chan struct{})
	for _, f := range fs {
		wg.Go(func() { <-start; f() })
	}
	close(start)
	wg.Wait()
}

const raceRounds = 25

// testOneTripCancelRace: a dispatch and a cancel of the event it would take,
// at once. Whichever wins, the event ends cancelled, the activation idle,
// and a dispatch that took it finds its commit refused.
func testOneTripCancelRace(t *testing.T, b *bundle) {
	key, act, x := b.primed()
	for i := range raceRounds {
		ev := b.message(key, fmt.Sprintf("cancel me %d", i))
		var d store.Dispatch
		var derr, cerr error
		race(func() { d, derr = b.nextExpect(act, x) },
			func() {
				_, cerr = b.s.CancelEvent(b.ctx, store.CancelEventParams{Key: key, EventID: ev.ID, Reason: "race"})
			})
		noErr(t, cerr, "CancelEvent")
		if derr == nil {
			wantEq(t, d.Event.ID, ev.ID, "dispatched event")
			_, err := b.commitPayloads(d, "MUST NOT BE WRITTEN")
			if err == nil {
				t.Fatalf("round %d: the commit of a cancelled event succeeded", i)
			}
		} else {
			wantNoDue(t, derr, fmt.Sprintf("round %d: dispatch racing a cancel", i))
		}
		wantEq(t, b.event(key, ev.ID).Status, store.EventCancelled, "event status")
		b.wantIdle(act, fmt.Sprintf("round %d", i))
	}
	b.wantStreamSound(key, "after cancel races")
	for _, tr := range b.transcript(key) {
		for _, m := range tr.Messages {
			if m.Content == "MUST NOT BE WRITTEN" {
				t.Fatalf("a refused commit was written: turn %d", tr.TurnNo)
			}
		}
	}
}

// testOneTripDoubleClaim: two dispatches of one activation at once (a bug
// in a controller, or a zombie): one takes the event, the other nothing.
func testOneTripDoubleClaim(t *testing.T, b *bundle) {
	key, act, x := b.primed()
	for i := range raceRounds {
		ev := b.message(key, fmt.Sprintf("once %d", i))
		var d1, d2 store.Dispatch
		var e1, e2 error
		race(func() { d1, e1 = b.nextExpect(act, x) }, func() { d2, e2 = b.nextExpect(act, nil) })
		if (e1 == nil) == (e2 == nil) {
			t.Fatalf("round %d: two dispatches: errors %v and %v, want exactly one to take the event", i, e1, e2)
		}
		d, other := d1, e2
		if e1 != nil {
			d, other = d2, e1
		}
		if !errors.Is(other, store.ErrNotLive) {
			t.Fatalf("round %d: the losing dispatch: %v, want ErrNotLive", i, other)
		}
		wantEq(t, d.Event.ID, ev.ID, "dispatched event")
		_, err := b.commitPayloads(d, fmt.Sprintf("r%d", i))
		noErr(t, err, "commit")
	}
	wantEq(t, len(b.transcript(key)), raceRounds+1, "turns")
	b.wantStreamSound(key, "after double claims")
}

// testOneTripSteerRace: a steer at the moment of the dispatch is either
// queued (the next event) or attached to the turn (the commit with the old
// payloads is then refused); either way it is not lost and nothing is left
// open.
func testOneTripSteerRace(t *testing.T, b *bundle) {
	key, act, x := b.primed()
	for i := range raceRounds {
		ev := b.message(key, fmt.Sprintf("steered %d", i))
		var d store.Dispatch
		var derr, serr error
		var sr store.SteerResult
		race(func() { d, derr = b.nextExpect(act, x) },
			func() {
				sr, serr = b.s.Steer(b.ctx, store.SteerParams{Key: key, DeliveryID: uuid.NewString(),
					Payload: json.RawMessage(fmt.Sprintf(`{"message":"steer %d"}`, i))})
			})
		noErr(t, serr, "Steer")
		noErr(t, derr, "dispatch")
		wantEq(t, d.Event.ID, ev.ID, "dispatched event")
		_, err := b.commitPayloads(d, "reply")
		if sr.Event.SteerOf == ev.ID {
			wantFence(t, err, store.FenceStaleRevision, "commit with the payloads of before an attached steer")
			cur, err := b.s.InFlight(b.ctx, act.Ref())
			noErr(t, err, "InFlight")
			wantEq(t, len(cur.Steers), 1, "attached steers")
			_, err = b.s.CommitTurn(b.ctx, store.CommitTurnParams{Ref: cur.Delivery.TurnRef(), Outcome: abi.OutcomeOK,
				Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "steered reply"}}, KeepState: true})
			noErr(t, err, "commit of the steered turn")
		} else {
			noErr(t, err, "commit with payloads")
			// The steer was queued: it is the next event.
			d2, err := b.nextExpect(act, x)
			noErr(t, err, "dispatch of the queued steer")
			wantEq(t, d2.Event.ID, sr.Event.ID, "queued steer dispatched")
			_, err = b.commitPayloads(d2, "steer reply")
			noErr(t, err, "commit of the queued steer")
		}
		b.wantIdle(act, fmt.Sprintf("round %d", i))
	}
	for _, ev := range b.events(key) {
		if ev.Status == store.EventOpen {
			t.Fatalf("event %d (steer of %d) left open", ev.ID, ev.SteerOf)
		}
	}
	b.wantStreamSound(key, "after steer races")
}

// testOneTripStopRace: a dispatch and a stop of the activation at once
// (StopActivation wants no current event): either the stop wins and the
// dispatch finds the activation not live, or the dispatch wins and the
// stop is refused.
func testOneTripStopRace(t *testing.T, b *bundle) {
	for i := range raceRounds / 5 {
		key, act, x := b.primed()
		ev := b.message(key, "stop race")
		var d store.Dispatch
		var derr, serr error
		race(func() { d, derr = b.nextExpect(act, x) }, func() { serr = b.s.StopActivation(b.ctx, act.Ref()) })
		switch {
		case derr == nil && serr == nil:
			t.Fatalf("round %d: both the dispatch of event %d and the stop succeeded", i, d.Event.ID)
		case derr == nil:
			_, err := b.commitPayloads(d, "ran")
			noErr(t, err, "commit after the stop was refused")
		case serr == nil:
			if !errors.Is(derr, store.ErrNotLive) {
				t.Fatalf("round %d: dispatch after a stop: %v, want ErrNotLive", i, derr)
			}
			wantEq(t, b.event(key, ev.ID).Status, store.EventOpen, "event after the stop")
		default:
			t.Fatalf("round %d: dispatch %v and stop %v both failed", i, derr, serr)
		}
		b.wantStreamSound(key, "after a stop race")
	}
}

// testOneTripZombie: a host whose lease expired answers late with the
// payloads: expired_lease while the activation is live, stale_epoch once
// the watchdog ended it; nothing written either time; a retry of the
// refused commit is refused too.
func testOneTripZombie(t *testing.T, b *bundle) {
	key := b.session()
	b.message(key, "prime")
	act := b.claim(key, SetupTTL)
	d, err := b.nextExpect(act, nil)
	noErr(t, err, "first dispatch")
	_, err = b.commitPayloads(d, "primed")
	noErr(t, err, "first commit")
	x := b.expectedOf(d)
	b.message(key, "zombie")
	d, err = b.nextExpect(act, x)
	noErr(t, err, "dispatch")
	b.waitExpired(act)
	before := b.snapshot(key)
	frames := b.streamSnapshot(key)
	for range 2 {
		_, err = b.commitPayloads(d, "MUST NOT BE WRITTEN")
		wantFence(t, err, store.FenceExpiredLease, "zombie commit with payloads")
		b.sameSnapshot(key, before, "zombie commit")
		b.sameStream(key, frames, "zombie commit")
	}
	_, err = b.s.ExpireActivation(b.ctx, store.ExpireActivationParams{Ref: act.Ref(), MaxAttempts: 10})
	noErr(t, err, "ExpireActivation")
	before = b.snapshot(key)
	frames = b.streamSnapshot(key)
	_, err = b.commitPayloads(d, "MUST NOT BE WRITTEN")
	wantFence(t, err, store.FenceStaleEpoch, "zombie commit with payloads after the watchdog")
	b.sameSnapshot(key, before, "zombie commit after the watchdog")
	b.sameStream(key, frames, "zombie commit after the watchdog")
	// The next activation runs the event again, once.
	act2 := b.claim(key, LongTTL)
	d2, err := b.nextExpect(act2, x)
	noErr(t, err, "dispatch after the watchdog")
	wantEq(t, d2.Event.ID, d.Event.ID, "the event again")
	_, err = b.commitPayloads(d, "MUST NOT BE WRITTEN")
	wantFence(t, err, store.FenceStaleEpoch, "zombie commit while the event runs again")
	_, err = b.commitPayloads(d2, "ran again")
	noErr(t, err, "commit of the second attempt")
	wantEq(t, len(b.transcript(key)), 2, "turns")
	b.wantStreamSound(key, "after a zombie")
}

// testOneTripWaitCommit: a commit with the dispatched payloads and a wait
// (two round trips: its insert may refuse) writes the turn, its frames in
// order after the turn's chunks; one refused for a wait id the session used
// writes nothing, and its retry under a fresh id commits once.
func testOneTripWaitCommit(t *testing.T, b *bundle) {
	key, act, x := b.primed()
	commit := func(d store.Dispatch, id string) (store.Turn, error) {
		return b.s.CommitTurn(b.ctx, store.CommitTurnParams{Ref: d.Delivery.TurnRef(), Outcome: abi.OutcomeWait,
			Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "waiting for " + id}}, KeepState: true,
			Wait: &store.WaitParams{ID: id, For: "human"}, Payloads: []string{string(d.Event.Payload)}})
	}
	b.message(key, "ask")
	d, err := b.nextExpect(act, x)
	noErr(t, err, "dispatch")
	b.chunks(d.Delivery.TurnRef(), d.Attempt, 0, "thinking")
	turn, err := commit(d, "w1")
	noErr(t, err, "commit with payloads and a wait")
	wantMessages(t, turn.Messages, abi.RoleUser, "ask", abi.RoleAssistant, "waiting for w1")
	wantEq(t, b.getWait(key, "w1").Status, store.WaitOpen, "wait w1")

	b.message(key, "ask again")
	d, err = b.nextExpect(act, x)
	noErr(t, err, "second dispatch")
	b.chunks(d.Delivery.TurnRef(), d.Attempt, 0, "again")
	before, frames := b.snapshot(key), b.streamSnapshot(key)
	_, err = commit(d, "w1")
	if !errors.Is(err, store.ErrConflict) {
		t.Fatalf("commit with a used wait id: %v, want ErrConflict", err)
	}
	b.sameSnapshot(key, before, "refused wait commit")
	b.sameStream(key, frames, "refused wait commit")
	_, err = commit(d, "w2")
	noErr(t, err, "retry under a fresh wait id")
	_, err = commit(d, "w3")
	wantFence(t, err, store.FenceSupersededDelivery, "a second retry after the commit")
	wantEq(t, len(b.transcript(key)), 3, "turns")
	b.wantStreamSound(key, "after wait commits")
	fs := b.stream(key).Frames
	last, prev := fs[len(fs)-1], fs[len(fs)-2]
	wantEq(t, prev.Kind, store.FrameTurnCommitted, "frame before last")
	wantEq(t, last.Kind, store.FrameWaitOpened, "last frame")
}

// testOneTripUsedDeliveryID: a dispatch with an expected agent given a
// delivery id used before (a caller's bug) answers what the dispatch
// without Expect answers and writes nothing: NextDeliveryParams.Expect
// promises the same answer either way.
func testOneTripUsedDeliveryID(t *testing.T, b *bundle) {
	key, act, x := b.primed()
	ev := b.message(key, "fails once")
	d, err := b.nextExpect(act, x)
	noErr(t, err, "dispatch")
	_, err = b.s.FailAttempt(b.ctx, store.FailAttemptParams{Ref: d.Delivery.TurnRef(), Error: "boom", Counted: true,
		Backoff: time.Hour, MaxAttempts: 5})
	noErr(t, err, "FailAttempt")
	act = b.claim(key, LongTTL)
	ask := func(x *store.ExpectedBinding, id string) error {
		_, err := b.s.NextDelivery(b.ctx, store.NextDeliveryParams{
			Activation: act.Ref(), DeliveryID: id, MarkSent: true, TailMessages: 10, ExpectDue: true, Expect: x,
			Bind: func(store.AgentBinding) (string, error) { return b.agent.ModuleDigest, nil },
		})
		return err
	}
	// Nothing is due (the event backs off), and the id is the failed
	// attempt's, whose event is still open.
	before, frames := b.snapshot(key), b.streamSnapshot(key)
	wantNoDue(t, ask(nil, d.Delivery.ID), "without Expect")
	b.sameStream(key, frames, "dispatch without Expect, nothing due")
	wantNoDue(t, ask(x, d.Delivery.ID), "with Expect")
	b.sameSnapshot(key, before, "dispatch with Expect and a used delivery id, nothing due")
	b.sameStream(key, frames, "dispatch with Expect and a used delivery id, nothing due")
	wantEq(t, b.event(key, ev.ID).Status, store.EventOpen, "event")

	// The id of a committed turn, nothing open.
	key2, act2, x2 := b.primed()
	done := b.transcript(key2)[0].DeliveryID
	before, frames = b.snapshot(key2), b.streamSnapshot(key2)
	_, err = b.s.NextDelivery(b.ctx, store.NextDeliveryParams{Activation: act2.Ref(), DeliveryID: done, MarkSent: true,
		ExpectDue: true, Expect: x2, Bind: func(store.AgentBinding) (string, error) { return b.agent.ModuleDigest, nil }})
	wantNoDue(t, err, "with Expect and a committed turn's delivery id")
	b.sameSnapshot(key2, before, "dispatch with a committed turn's delivery id")
	b.sameStream(key2, frames, "dispatch with a committed turn's delivery id")
}

// testOneTripCommitRaces: a commit with the dispatched payloads at the
// moment of a steer or of a cancel of its turn. A steer that lands first
// refuses it (stale revision) and the turn is committed again with the
// steer; one that lands after is queued and runs next. A cancel that lands
// first refuses it; one after finds nothing in flight. Either way each
// event ends once and nothing is left open.
func testOneTripCommitRaces(t *testing.T, b *bundle) {
	key, act, x := b.primed()
	for i := range raceRounds {
		ev := b.message(key, fmt.Sprintf("race %d", i))
		d, err := b.nextExpect(act, x)
		noErr(t, err, "dispatch")
		var cerr, oerr error
		var sr store.SteerResult
		var cr store.CancelResult
		steer := i%2 == 0
		race(func() { _, cerr = b.commitPayloads(d, fmt.Sprintf("reply %d", i)) },
			func() {
				if steer {
					sr, oerr = b.s.Steer(b.ctx, store.SteerParams{Key: key, DeliveryID: uuid.NewString(),
						Payload: json.RawMessage(fmt.Sprintf(`{"message":"steer %d"}`, i))})
				} else {
					cr, oerr = b.s.CancelEvent(b.ctx, store.CancelEventParams{Key: key, Reason: "race"})
				}
			})
		switch {
		case steer:
			noErr(t, oerr, "Steer")
			if sr.InFlight {
				wantFence(t, cerr, store.FenceStaleRevision, "commit after a steer")
				cur, err := b.s.InFlight(b.ctx, act.Ref())
				noErr(t, err, "InFlight")
				_, err = b.s.CommitTurn(b.ctx, store.CommitTurnParams{Ref: cur.Delivery.TurnRef(), Outcome: abi.OutcomeOK,
					Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "steered"}}, KeepState: true})
				noErr(t, err, "commit with the steer")
			} else {
				noErr(t, cerr, "commit before the steer")
				d2, err := b.nextExpect(act, x)
				noErr(t, err, "dispatch of the queued steer")
				wantEq(t, d2.Event.ID, sr.Event.ID, "queued steer")
				_, err = b.commitPayloads(d2, "steer reply")
				noErr(t, err, "commit of the queued steer")
			}
		case cerr == nil:
			if !errors.Is(oerr, store.ErrNotFound) {
				t.Fatalf("round %d: cancel after the commit: %v, want ErrNotFound", i, oerr)
			}
			wantEq(t, b.event(key, ev.ID).Status, store.EventDone, "committed event")
		default:
			noErr(t, oerr, "cancel before the commit")
			wantEq(t, cr.InFlight, true, "cancel in flight")
			var fe *store.FenceError
			if !errors.As(cerr, &fe) {
				t.Fatalf("round %d: commit after a cancel: %v, want a fence rejection", i, cerr)
			}
			wantEq(t, b.event(key, ev.ID).Status, store.EventCancelled, "cancelled event")
		}
		b.wantIdle(act, fmt.Sprintf("round %d", i))
	}
	for _, ev := range b.events(key) {
		if ev.Status == store.EventOpen {
			t.Fatalf("event %d (steer of %d) left open", ev.ID, ev.SteerOf)
		}
	}
	b.wantStreamSound(key, "after commit races")
}
