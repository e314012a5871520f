package storetest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

// Attacks on the next turn taken in a commit's transaction
// (CommitTurnParams.Next): what it must not take, and the writes that race
// it.

func commitNextEdgeCases() []testCase {
	return []testCase{
		{"CommitNext/SleepOrFinishWithAnEventOpenRunsItAndStaysActive", testCommitNextSleepWithOpen},
		{"CommitNext/SleepWithNothingOpenParksAndTakesNothing", testCommitNextSleepNothingOpen},
		{"CommitNext/BlockOnDeadLetterTakesNothingBehindIt", testCommitNextBlocked},
		{"CommitNext/ANextEventNotYetDueIsNotTaken", testCommitNextNotDue},
		{"CommitNext/ANextEventWithSteersComesWithThem", testCommitNextSteered},
		{"CommitNext/AStaleRevisionTakesNothing", testCommitNextStale},
		{"CommitNext/RacingCancelSteerDestroyStopEndsEachEventOnce", testCommitNextRaces},
		{"CommitNext/AUsedDeliveryIDLeavesTheCommitStanding", testCommitNextUsedDeliveryID},
		{"CommitNext/AnExpiredLeaseRefusesTheCommitAndTakesNothing", testCommitNextExpired},
		{"CommitNext/ASteeredTurnsCommitTakesTheNextWithAShortTail", testCommitNextAfterSteer},
	}
}

// nextExpectOf is the Next a controller passes after d: Expect is what d
// ran, Bind the bundle's binding.
func (b *bundle) nextExpectOf(act store.Activation, d store.Dispatch, block bool) store.NextDeliveryParams {
	return store.NextDeliveryParams{
		Activation: act.Ref(), DeliveryID: uuid.NewString(), MarkSent: true, TailMessages: 10, ExpectDue: true,
		Expect: b.expectedOf(d), BlockOnDeadLetter: block,
		Bind: func(store.AgentBinding) (string, error) { return b.agent.ModuleDigest, nil },
	}
}

// commitOutcomeNext commits d with an outcome and Next.
func (b *bundle) commitOutcomeNext(d store.Dispatch, outcome abi.Outcome, next store.NextDeliveryParams) (store.Turn, error) {
	return b.s.CommitTurn(b.ctx, store.CommitTurnParams{
		Ref: d.Delivery.TurnRef(), Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "r"}}, KeepState: true,
		Outcome: outcome, Payloads: []string{string(d.Event.Payload)}, Next: &next,
	})
}

// nextOrDispatch is turn.Next, or what NextDelivery takes right after the
// commit when the driver left it to it.
func (b *bundle) nextOrDispatch(turn store.Turn, np store.NextDeliveryParams) (store.Dispatch, error) {
	if turn.Next != nil {
		return *turn.Next, nil
	}
	np.DeliveryID = uuid.NewString()
	return b.s.NextDelivery(b.ctx, np)
}

func testCommitNextSleepWithOpen(t *testing.T, b *bundle) {
	for _, outcome := range []abi.Outcome{abi.OutcomeSleep, abi.OutcomeFinish} {
		key := b.session()
		b.message(key, "one")
		two := b.message(key, "two")
		act := b.claim(key, LongTTL)
		d, err := b.nextExpect(act, nil)
		noErr(t, err, "dispatch")
		np := b.nextExpectOf(act, d, false)
		turn, err := b.commitOutcomeNext(d, outcome, np)
		noErr(t, err, fmt.Sprintf("commit %s with Next", outcome))
		wantEq(t, b.getSession(key).Status, store.SessionActive, fmt.Sprintf("status after %s with an event open", outcome))
		n, err := b.nextOrDispatch(turn, np)
		noErr(t, err, fmt.Sprintf("the next turn after %s", outcome))
		wantEq(t, n.Event.ID, two.ID, "the next turn's event")
		wantEq(t, n.Session.Status, store.SessionActive, "the next dispatch's session status")
		b.commit(n.Delivery.TurnRef(), "r2", "")
		wantStatus(t, b, key, two.ID, store.EventDone)
		b.wantStreamSound(key, "after "+string(outcome))
	}
}

func testCommitNextSleepNothingOpen(t *testing.T, b *bundle) {
	key := b.session()
	b.message(key, "only")
	act := b.claim(key, LongTTL)
	d, err := b.nextExpect(act, nil)
	noErr(t, err, "dispatch")
	turn, err := b.commitOutcomeNext(d, abi.OutcomeSleep, b.nextExpectOf(act, d, false))
	noErr(t, err, "commit sleep with Next")
	if turn.Next != nil {
		t.Fatalf("Turn.Next = event %d with nothing open", turn.Next.Event.ID)
	}
	s := b.getSession(key)
	wantEq(t, s.Status, store.SessionSleeping, "status: parked")
	wantEq(t, s.SleepReason, store.OutcomeSleepReason(abi.OutcomeSleep), "sleep reason")
	b.wantIdle(act, "after a sleep that took nothing")
	b.wantStreamSound(key, "after the sleep")
}

func wantStatus(t *testing.T, b *bundle, key store.ActorKey, id int64, want store.EventStatus) {
	t.Helper()
	wantEq(t, b.event(key, id).Status, want, fmt.Sprintf("event %d's status", id))
}

func testCommitNextBlocked(t *testing.T, b *bundle) {
	key := b.session()
	b.deadLetter(key, "poison", 1)
	b.message(key, "one")
	two := b.message(key, "two")
	act := b.claim(key, LongTTL)
	// Dispatched without the block (as under policy continue), committed
	// asking the next turn with it.
	d, err := b.nextExpect(act, nil)
	noErr(t, err, "dispatch behind the dead letter, unblocked")
	turn, err := b.commitOutcomeNext(d, abi.OutcomeOK, b.nextExpectOf(act, d, true))
	noErr(t, err, "commit with a blocking Next")
	if turn.Next != nil {
		t.Fatalf("Turn.Next took event %d behind a dead letter with BlockOnDeadLetter", turn.Next.Event.ID)
	}
	wantStatus(t, b, key, two.ID, store.EventOpen)
	wantEq(t, b.event(key, two.ID).Binding, "", "the blocked event's binding")
	b.wantIdle(act, "after the blocked Next")
	b.wantStreamSound(key, "after the blocked Next")
}

// redrivenAhead is a session whose dead-lettered first event was redriven
// after a second event failed (and maybe was steered): the first runs
// again, committed with Next, and the second is the candidate.
func (b *bundle) redrivenAhead(backoff time.Duration, steer bool) (store.ActorKey, store.Event, store.Activation, store.Dispatch) {
	b.t.Helper()
	key := b.session()
	poison := b.deadLetter(key, "poison", 1)
	two := b.message(key, "two")
	act1 := b.claim(key, LongTTL)
	d := b.next(act1)
	wantEq(b.t, d.Event.ID, two.ID, "the event after the dead letter")
	ref := d.Delivery.TurnRef()
	if steer {
		r := b.steer(key, "left", "")
		if !r.InFlight {
			b.t.Fatalf("steer not attached to the turn in flight")
		}
		ref = r.Ref
	}
	_, err := b.s.FailAttempt(b.ctx, store.FailAttemptParams{Ref: ref, Error: "crash", Counted: true, Backoff: backoff, MaxAttempts: 5})
	noErr(b.t, err, "FailAttempt")
	_, err = b.s.RedriveEvent(b.ctx, key, poison.ID)
	noErr(b.t, err, "RedriveEvent")
	act2 := b.claim(key, LongTTL)
	d1, err := b.nextExpect(act2, nil)
	noErr(b.t, err, "dispatch of the redriven event")
	wantEq(b.t, d1.Event.ID, poison.ID, "the redriven event runs first")
	return key, two, act2, d1
}

func testCommitNextNotDue(t *testing.T, b *bundle) {
	key, two, act, d := b.redrivenAhead(time.Hour, false)
	np := b.nextExpectOf(act, d, false)
	turn, err := b.commitOutcomeNext(d, abi.OutcomeOK, np)
	noErr(t, err, "commit with Next, the next event backing off")
	if turn.Next != nil {
		t.Fatalf("Turn.Next took event %d an hour before it is due", turn.Next.Event.ID)
	}
	var nd *store.NoDueEventError
	np.DeliveryID = uuid.NewString()
	if _, err := b.s.NextDelivery(b.ctx, np); !errors.As(err, &nd) || nd.NextDueAt.IsZero() {
		t.Fatalf("NextDelivery after the commit: %v, want *NoDueEventError with NextDueAt", err)
	}
	wantStatus(t, b, key, two.ID, store.EventOpen)
	wantEq(t, b.event(key, two.ID).Attempts, 1, "the backing-off event's attempts")
}

func testCommitNextSteered(t *testing.T, b *bundle) {
	_, two, act, d := b.redrivenAhead(0, true)
	np := b.nextExpectOf(act, d, false)
	turn, err := b.commitOutcomeNext(d, abi.OutcomeOK, np)
	noErr(t, err, "commit with Next, the next event steered earlier")
	n, err := b.nextOrDispatch(turn, np)
	noErr(t, err, "the next turn")
	wantEq(t, n.Event.ID, two.ID, "the next event")
	wantEq(t, len(n.Steers), 1, "the steers attached to it at its earlier attempt")
	wantEq(t, n.Attempt, 2, "its attempt")
	turn2, err := b.s.CommitTurn(b.ctx, store.CommitTurnParams{Ref: n.Delivery.TurnRef(), Outcome: abi.OutcomeOK, KeepState: true,
		Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "saw it"}}})
	noErr(t, err, "commit of the steered event")
	wantMessages(t, turn2.Messages, abi.RoleUser, "two", abi.RoleUser, "left", abi.RoleAssistant, "saw it")
}

func testCommitNextStale(t *testing.T, b *bundle) {
	key := b.session()
	b.message(key, "one")
	two := b.message(key, "two")
	act := b.claim(key, LongTTL)
	d, err := b.nextExpect(act, nil)
	noErr(t, err, "dispatch")
	r := b.steer(key, "left", "")
	if !r.InFlight {
		t.Fatalf("steer not attached")
	}
	before := b.snapshot(key)
	_, err = b.commitOutcomeNext(d, abi.OutcomeOK, b.nextExpectOf(act, d, false))
	wantFence(t, err, store.FenceStaleRevision, "commit of the older revision with Next")
	b.sameSnapshot(key, before, "a stale commit with Next")
	cur := b.inFlight(act)
	wantEq(t, cur.Event.ID, d.Event.ID, "the turn in flight after the refusal")
	wantStatus(t, b, key, two.ID, store.EventOpen)
}

// testCommitNextRaces: a commit asking the next turn races a cancel of the
// event it would take, a steer, a destroy of the session or a stop of the
// activation. Whatever wins, every event ends once, a turn taken is the
// activation's current one (or fenced off), and the stream stays sound.
func testCommitNextRaces(t *testing.T, b *bundle) {
	for round := range raceRounds * 2 {
		key := b.session()
		b.message(key, "one")
		two := b.message(key, "two")
		three := b.message(key, "three")
		act := b.claim(key, LongTTL)
		d, err := b.nextExpect(act, nil)
		noErr(t, err, "dispatch")
		np := b.nextExpectOf(act, d, false)
		var turn store.Turn
		var cerr, rerr error
		var cres store.CancelResult
		var sres store.SteerResult
		kind := []string{"cancel", "steer", "destroy", "stop"}[round%4]
		what := fmt.Sprintf("round %d (%s)", round, kind)
		race(func() { turn, cerr = b.commitOutcomeNext(d, abi.OutcomeOK, np) }, func() {
			switch kind {
			case "cancel":
				cres, rerr = b.s.CancelEvent(b.ctx, store.CancelEventParams{Key: key, EventID: two.ID, Reason: "race"})
			case "steer":
				sres, rerr = b.s.Steer(b.ctx, store.SteerParams{Key: key, Payload: msgPayload("left"), DeliveryID: uuid.NewString()})
			case "destroy":
				_, rerr = b.s.DestroySession(b.ctx, key)
			case "stop":
				rerr = b.s.StopActivation(b.ctx, act.Ref())
				if errors.Is(rerr, store.ErrNotLive) {
					rerr = nil
				}
			}
		})
		noErr(t, rerr, what+": the racing write")
		var fe *store.FenceError
		if cerr != nil && !errors.As(cerr, &fe) {
			t.Fatalf("%s: commit: %v, want success or a fence", what, cerr)
		}
		if cerr != nil && turn.Next != nil {
			t.Fatalf("%s: a refused commit took event %d", what, turn.Next.Event.ID)
		}
		if cerr == nil && turn.Next != nil {
			n := turn.Next
			switch {
			case kind == "cancel" && !cres.InFlight && n.Event.ID == two.ID:
				t.Fatalf("%s: the commit took event %d, cancelled while queued", what, two.ID)
			case kind == "cancel" && !cres.InFlight:
				wantEq(t, n.Event.ID, three.ID, what+": the event after the cancelled one")
			case kind == "cancel":
				wantEq(t, n.Event.ID, two.ID, what+": the event cancelled in flight")
			default:
				wantEq(t, n.Event.ID, two.ID, what+": the next event")
			}
			// Its commit succeeds exactly when nothing closed it or ended the
			// activation since.
			_, err := b.s.CommitTurn(b.ctx, store.CommitTurnParams{Ref: n.Delivery.TurnRef(), Outcome: abi.OutcomeOK, KeepState: true,
				Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "r2"}}})
			fenced := (kind == "cancel" && cres.InFlight) || kind == "destroy" || (kind == "steer" && sres.InFlight && sres.Ref.ActorEventID == n.Event.ID)
			if fenced && err == nil {
				t.Fatalf("%s: the taken turn of event %d committed though a %s closed or superseded it", what, n.Event.ID, kind)
			}
			if !fenced && err != nil {
				t.Fatalf("%s: the taken turn of event %d: %v", what, n.Event.ID, err)
			}
			if fenced && !errors.As(err, &fe) {
				t.Fatalf("%s: the taken turn's commit: %v, want a fence", what, err)
			}
		}
		if cerr == nil && turn.Next == nil && kind != "destroy" {
			b.wantIdle(act, what+": a commit that took nothing")
		}
		// Every event ended at most once.
		seen := map[int64]bool{}
		for _, tr := range b.transcript(key) {
			if seen[tr.EventID] {
				t.Fatalf("%s: event %d in the transcript twice", what, tr.EventID)
			}
			seen[tr.EventID] = true
		}
		b.wantStreamSound(key, what)
	}
}

func testCommitNextUsedDeliveryID(t *testing.T, b *bundle) {
	key := b.session()
	b.message(key, "one")
	two := b.message(key, "two")
	act := b.claim(key, LongTTL)
	d, err := b.nextExpect(act, nil)
	noErr(t, err, "dispatch")
	np := b.nextExpectOf(act, d, false)
	np.DeliveryID = d.Delivery.ID // in use: the committing turn's own
	turn, err := b.commitOutcomeNext(d, abi.OutcomeOK, np)
	noErr(t, err, "commit whose Next reuses a delivery id")
	if turn.Next != nil {
		t.Fatalf("Turn.Next took event %d under a delivery id in use", turn.Next.Event.ID)
	}
	wantEq(t, len(b.transcript(key)), 1, "turns: the commit stands")
	wantStatus(t, b, key, d.Event.ID, store.EventDone)
	b.wantIdle(act, "after a Next that could not be taken")
	n, err := b.nextExpect(act, b.expectedOf(d))
	noErr(t, err, "NextDelivery after the commit")
	wantEq(t, n.Event.ID, two.ID, "the next event")
	wantEq(t, n.Attempt, 1, "its attempt")
	b.wantStreamSound(key, "after the used delivery id")
}

func testCommitNextExpired(t *testing.T, b *bundle) {
	key := b.session()
	b.message(key, "one")
	two := b.message(key, "two")
	act := b.claim(key, SetupTTL)
	d, err := b.nextExpect(act, nil)
	noErr(t, err, "dispatch")
	b.waitExpired(act)
	before := b.snapshot(key)
	turn, err := b.commitOutcomeNext(d, abi.OutcomeOK, b.nextExpectOf(act, d, false))
	var fe *store.FenceError
	if !errors.As(err, &fe) {
		t.Fatalf("commit under an expired lease with Next: %v, want a fence", err)
	}
	if turn.Next != nil {
		t.Fatalf("a refused commit took event %d", turn.Next.Event.ID)
	}
	b.sameSnapshot(key, before, "a refused commit with Next")
	wantEq(t, b.event(key, two.ID).Binding, "", "the next event's binding")
}

func testCommitNextAfterSteer(t *testing.T, b *bundle) {
	key := b.session()
	b.message(key, "one")
	two := b.message(key, "two")
	act := b.claim(key, LongTTL)
	d, err := b.nextExpect(act, nil)
	noErr(t, err, "dispatch")
	r := b.steer(key, "left", "")
	np := b.nextExpectOf(act, d, false)
	np.TailMessages = 2
	// The steered turn commits under its new ref, without payloads (the
	// store reads the event's and the steer's).
	turn, err := b.s.CommitTurn(b.ctx, store.CommitTurnParams{Ref: r.Ref, Outcome: abi.OutcomeOK, State: []byte("s1"),
		Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "saw left"}}, Next: &np})
	noErr(t, err, "commit of the steered turn with Next")
	wantMessages(t, turn.Messages, abi.RoleUser, "one", abi.RoleUser, "left", abi.RoleAssistant, "saw left")
	n, err := b.nextOrDispatch(turn, np)
	noErr(t, err, "the next turn")
	wantEq(t, n.Event.ID, two.ID, "the next event")
	wantEq(t, len(n.Steers), 0, "the next event's steers")
	wantEq(t, fmt.Sprint(n.Tail), fmt.Sprint([]abi.Message{{Role: abi.RoleUser, Content: "left"}, {Role: abi.RoleAssistant, Content: "saw left"}}),
		"the next turn's tail: the last two messages")
	wantBytes(t, n.State, []byte("s1"), "the next turn's state")
	for _, e := range b.events(key) {
		if e.SteerOf != 0 {
			wantEq(t, e.Status, store.EventDone, "the steer's status")
		}
	}
	b.wantStreamSound(key, "after the steered commit with Next")
}
