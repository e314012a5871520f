package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

func deferredAttackCases() []testCase {
	return []testCase{
		{"Deferred/Attack/CommitWithAlarmsPayloadsNilAndNext", testDeferredAttackPaths},
		{"Deferred/Attack/PromoteAfterTheDeferredCommitIsRefused", testDeferredAttackPromoteAfterCommit},
		{"Deferred/Attack/CommitRacingCancel", testDeferredAttackCancelRace},
		{"Deferred/Attack/CommitRacingPromote", testDeferredAttackCommitPromoteRace},
	}
}

func testDeferredAttackPaths(t *testing.T, b *bundle) {
	key, act, x := b.deferredSession()
	// Alarms: the promotion, then the usual commit, in one transaction.
	one := b.message(key, "one")
	p := b.deferParams(act, x)
	d, err := b.s.NextDelivery(b.ctx, p)
	noErr(t, err, "deferred NextDelivery")
	wantEq(t, d.Deferred, true, "Deferred")
	pp := store.PromoteOf(act.Ref(), p, d)
	in := int64(time.Hour / time.Millisecond)
	_, err = b.s.CommitTurn(b.ctx, store.CommitTurnParams{Ref: d.Delivery.TurnRef(), Outcome: abi.OutcomeOK,
		Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "r1"}}, KeepState: true,
		Payloads: []string{string(d.Event.Payload)}, Deferred: &pp,
		Alarms: []abi.AlarmOp{{Name: "a1", InMs: in}}})
	noErr(t, err, "deferred commit with an alarm")
	wantEq(t, b.event(key, one.ID).Status, store.EventDone, "one")
	wantEq(t, len(b.alarms(key)), 1, "alarms")
	b.wantStreamSound(key, "after a deferred commit with alarms")
	b.wantIdle(act, "after a deferred commit with alarms")

	// Payloads nil: the store reads them.
	two := b.message(key, "two")
	p = b.deferParams(act, x)
	d, err = b.s.NextDelivery(b.ctx, p)
	noErr(t, err, "deferred NextDelivery 2")
	wantEq(t, d.Deferred, true, "Deferred 2")
	pp = store.PromoteOf(act.Ref(), p, d)
	turn, err := b.s.CommitTurn(b.ctx, store.CommitTurnParams{Ref: d.Delivery.TurnRef(), Outcome: abi.OutcomeOK,
		Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "r2"}}, KeepState: true, Deferred: &pp})
	noErr(t, err, "deferred commit without payloads")
	wantMessages(t, turn.Messages, abi.RoleUser, "two", abi.RoleAssistant, "r2")
	wantEq(t, b.event(key, two.ID).Status, store.EventDone, "two")
	b.wantStreamSound(key, "after a deferred commit without payloads")
	b.wantIdle(act, "after a deferred commit without payloads")

	// With Next: the following event is taken in the commit's transaction.
	three := b.message(key, "three")
	four := b.message(key, "four")
	p = b.deferParams(act, x)
	d, err = b.s.NextDelivery(b.ctx, p)
	noErr(t, err, "deferred NextDelivery 3")
	wantEq(t, d.Event.ID, three.ID, "three")
	wantEq(t, d.Deferred, true, "Deferred 3")
	pp = store.PromoteOf(act.Ref(), p, d)
	np := b.deferParams(act, x)
	np.Defer = false
	turn, err = b.s.CommitTurn(b.ctx, store.CommitTurnParams{Ref: d.Delivery.TurnRef(), Outcome: abi.OutcomeOK,
		Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "r3"}}, KeepState: true,
		Payloads: []string{string(d.Event.Payload)}, Deferred: &pp, Next: &np})
	noErr(t, err, "deferred commit with Next")
	if turn.Next == nil || turn.Next.Event.ID != four.ID {
		t.Fatalf("Next: %+v, want event four", turn.Next)
	}
	_, err = b.commitPayloads(*turn.Next, "r4")
	noErr(t, err, "commit of four")
	b.wantStreamSound(key, "after a deferred commit with Next")
	b.wantIdle(act, "after four")
}

func testDeferredAttackPromoteAfterCommit(t *testing.T, b *bundle) {
	key, act, x := b.deferredSession()
	one := b.message(key, "one")
	b.message(key, "two")
	p := b.deferParams(act, x)
	d, err := b.s.NextDelivery(b.ctx, p)
	noErr(t, err, "deferred NextDelivery")
	_, err = b.commitDeferred(act, p, d, "r1")
	noErr(t, err, "deferred commit")
	// The host's path after a commit whose answer was lost: it promotes.
	snap := b.streamSnapshot(key)
	err = b.s.Promote(b.ctx, store.PromoteOf(act.Ref(), p, d))
	wantFence(t, err, store.FenceSupersededDelivery, "Promote after the deferred commit")
	if after := b.streamSnapshot(key); after != snap {
		t.Fatalf("a Promote after the commit wrote:\nbefore:\n%s\nafter:\n%s", snap, after)
	}
	wantEq(t, b.event(key, one.ID).Status, store.EventDone, "one")
	b.wantIdle(act, "after the refused promotion")
}

func testDeferredAttackCancelRace(t *testing.T, b *bundle) {
	key, act, x := b.deferredSession()
	for i := range raceRounds {
		ev := b.message(key, fmt.Sprintf("cancel me %d", i))
		p := b.deferParams(act, x)
		d, err := b.s.NextDelivery(b.ctx, p)
		noErr(t, err, "deferred NextDelivery")
		wantEq(t, d.Deferred, true, "Deferred")
		var cerr, derr error
		race(func() { _, derr = b.commitDeferred(act, p, d, "r") },
			func() {
				_, cerr = b.s.CancelEvent(b.ctx, store.CancelEventParams{Key: key, EventID: ev.ID, Reason: "race"})
			})
		st := b.event(key, ev.ID).Status
		switch {
		case derr == nil && cerr == nil:
			t.Fatalf("round %d: both the commit and the cancel succeeded (status %s)", i, st)
		case derr == nil:
			wantEq(t, st, store.EventDone, "committed event")
		case cerr == nil:
			wantEq(t, st, store.EventCancelled, "cancelled event")
			wantFence(t, derr, store.FenceSupersededDelivery, "deferred commit of a cancelled event")
		default:
			t.Fatalf("round %d: both failed: %v / %v", i, derr, cerr)
		}
		b.wantIdle(act, "after the race")
		b.wantStreamSound(key, "after the race")
	}
}

func testDeferredAttackCommitPromoteRace(t *testing.T, b *bundle) {
	key, act, x := b.deferredSession()
	for i := range raceRounds {
		ev := b.message(key, fmt.Sprintf("m %d", i))
		p := b.deferParams(act, x)
		d, err := b.s.NextDelivery(b.ctx, p)
		noErr(t, err, "deferred NextDelivery")
		var perr, derr error
		var turn store.Turn
		race(func() { turn, derr = b.commitDeferred(act, p, d, "r") },
			func() { perr = b.s.Promote(b.ctx, store.PromoteOf(act.Ref(), p, d)) })
		if derr != nil && perr == nil {
			// Promoted first: the promoted turn commits like any.
			turn, derr = b.commitPayloads(d, "r")
		}
		noErr(t, derr, fmt.Sprintf("round %d: commit (promote: %v)", i, perr))
		wantEq(t, turn.EventID, ev.ID, "turn")
		wantEq(t, b.event(key, ev.ID).Status, store.EventDone, "event")
		b.wantIdle(act, "after the race")
		b.wantStreamSound(key, "after the race")
	}
	n := 0
	for _, tr := range b.transcript(key) {
		_ = tr
		n++
	}
	wantEq(t, n, raceRounds+1, "turns")
}
