package storetest

import (
	"errors"
	"testing"

	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

// Deferred dispatch (NextDeliveryParams.Defer, Promote,
// CommitTurnParams.Deferred): a first attempt read, not written, then
// written with its commit or promoted — under the same checks as
// NextDelivery, decided inside the writing transaction.

func deferredCases() []testCase {
	return []testCase{
		{"Deferred/ADispatchWritesNothingAndItsCommitWritesItAll", testDeferredCommit},
		{"Deferred/PromoteWritesWhatNextDeliveryWould", testDeferredPromote},
		{"Deferred/OnlyAFirstAttemptIsDeferred", testDeferredOnlyFirst},
		{"Deferred/ACancelledEventIsNeverCommitted", testDeferredCancelled},
		{"Deferred/AnOlderRedrivenEventRunsFirst", testDeferredRedrivenAhead},
		{"Deferred/ALostActivationCommitsNothing", testDeferredLostActivation},
		{"Deferred/AnUpdatedAgentIsNeverRecordedUnderTheOldBinding", testDeferredUpdatedAgent},
		{"Deferred/ACommitThatDoesNotMatchItsDispatchIsInvalid", testDeferredMismatch},
	}
}

// deferredSession is a session with one committed turn (so that the
// caller knows what the agent runs: Dispatch.Agent) and its activation.
func (b *bundle) deferredSession() (store.ActorKey, store.Activation, *store.ExpectedBinding) {
	b.t.Helper()
	key := b.session()
	b.message(key, "warm")
	act := b.claim(key, LongTTL)
	d, err := b.nextExpect(act, nil)
	noErr(b.t, err, "first dispatch")
	_, err = b.commitPayloads(d, "warm reply")
	noErr(b.t, err, "first commit")
	return key, act, b.expectedOf(d)
}

// deferParams are the NextDelivery parameters of a deferred dispatch.
func (b *bundle) deferParams(act store.Activation, x *store.ExpectedBinding) store.NextDeliveryParams {
	return store.NextDeliveryParams{Activation: act.Ref(), DeliveryID: uuid.NewString(), MarkSent: true, TailMessages: 10,
		ExpectDue: true, Expect: x, Defer: true,
		Bind: func(store.AgentBinding) (string, error) { return b.agent.ModuleDigest, nil }}
}

// commitDeferred commits deferred dispatch d (made with p) with reply.
func (b *bundle) commitDeferred(act store.Activation, p store.NextDeliveryParams, d store.Dispatch, reply string) (store.Turn, error) {
	pp := store.PromoteOf(act.Ref(), p, d)
	return b.s.CommitTurn(b.ctx, store.CommitTurnParams{Ref: d.Delivery.TurnRef(), Outcome: abi.OutcomeOK,
		Messages: []abi.Message{{Role: abi.RoleAssistant, Content: reply}}, State: []byte("s-" + reply),
		Payloads: []string{string(d.Event.Payload)}, Deferred: &pp})
}

func testDeferredCommit(t *testing.T, b *bundle) {
	key, act, x := b.deferredSession()
	one := b.message(key, "one")
	before := b.streamSnapshot(key)
	p := b.deferParams(act, x)
	d, err := b.s.NextDelivery(b.ctx, p)
	noErr(t, err, "deferred NextDelivery")
	wantEq(t, d.Deferred, true, "Dispatch.Deferred")
	wantEq(t, d.Event.ID, one.ID, "deferred event")
	wantEq(t, d.Attempt, 1, "Attempt")
	wantEq(t, d.Delivery.ID, p.DeliveryID, "delivery id")
	wantEq(t, d.Delivery.State, store.DeliverySent, "delivery state")
	wantEq(t, d.Delivery.Binding, b.agent.ModuleDigest, "delivery binding")
	wantEq(t, d.Delivery.ActorEpoch, act.ActorEpoch, "delivery epoch")
	wantEq(t, d.Session.ActorKey, key, "Session")
	wantBytes(t, d.State, nil, "State: none was committed")
	wantEq(t, len(d.Tail), 2, "Tail: the warm turn's two messages")
	if after := b.streamSnapshot(key); after != before {
		t.Fatalf("a deferred dispatch wrote:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	b.wantIdle(act, "after a deferred dispatch")
	// Nothing is in flight for the API either: an append that refuses a
	// turn in flight is accepted (and is queued behind the deferred one).
	two, _, err := b.s.AppendEvent(b.ctx, store.AppendEventParams{Key: key, Kind: abi.EventMessage,
		Payload: msgPayload("two"), RefuseIfInFlight: true})
	noErr(t, err, "append refusing a turn in flight, with a deferred turn")

	turn, err := b.commitDeferred(act, p, d, "r1")
	noErr(t, err, "commit of the deferred turn")
	wantMessages(t, turn.Messages, abi.RoleUser, "one", abi.RoleAssistant, "r1")
	wantEq(t, turn.DeliveryID, d.Delivery.ID, "turn's delivery")
	wantEq(t, turn.NextOpen, true, "NextOpen (two is open)")
	ev := b.event(key, one.ID)
	wantEq(t, ev.Status, store.EventDone, "event status")
	wantEq(t, ev.Binding, b.agent.ModuleDigest, "event binding, recorded by the commit")
	wantEq(t, ev.Attempts, 0, "event attempts")
	frames := b.stream(key).Frames
	n := len(frames)
	if n < 2 {
		t.Fatalf("frames after the deferred commit: %d", n)
	}
	started, committed := frames[n-2], frames[n-1]
	wantEq(t, started.Kind, store.FrameTurnStarted, "next to last frame")
	wantEq(t, started.EventID, one.ID, "turn.started's event")
	wantEq(t, started.Attempt, 1, "turn.started's attempt")
	wantEq(t, started.ActorEpoch, act.ActorEpoch, "turn.started's epoch")
	wantEq(t, committed.Kind, store.FrameTurnCommitted, "last frame")
	wantEq(t, committed.EventID, one.ID, "turn.committed's event")
	b.wantStreamSound(key, "after the deferred commit")
	b.wantIdle(act, "after the deferred commit")
	d2 := b.next(act)
	wantEq(t, d2.Event.ID, two.ID, "the event after the deferred one")
	wantBytes(t, d2.State, []byte("s-r1"), "the next dispatch's state: the deferred commit's")

	// A deferred commit that keeps the state.
	three := b.message(key, "three")
	b.commit(d2.Delivery.TurnRef(), "r2", "s2")
	p3 := b.deferParams(act, x)
	d3, err := b.s.NextDelivery(b.ctx, p3)
	noErr(t, err, "deferred NextDelivery of three")
	wantEq(t, d3.Deferred, true, "three's Dispatch.Deferred")
	wantEq(t, d3.Event.ID, three.ID, "three")
	pp3 := store.PromoteOf(act.Ref(), p3, d3)
	turn, err = b.s.CommitTurn(b.ctx, store.CommitTurnParams{Ref: d3.Delivery.TurnRef(), Outcome: abi.OutcomeSleep,
		Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "r3"}}, KeepState: true,
		Payloads: []string{string(d3.Event.Payload)}, Deferred: &pp3})
	noErr(t, err, "deferred commit keeping the state, outcome sleep")
	wantEq(t, b.getSession(key).Status, store.SessionSleeping, "session after a deferred commit with outcome sleep")
	b.wantStreamSound(key, "after the deferred commit of three")

	// A replay of the deferred commit is refused and writes nothing.
	snap := b.streamSnapshot(key)
	_, err = b.commitDeferred(act, p, d, "MUST NOT BE WRITTEN")
	if err == nil {
		t.Fatalf("a replayed deferred commit was accepted")
	}
	if after := b.streamSnapshot(key); after != snap {
		t.Fatalf("a replayed deferred commit wrote:\nbefore:\n%s\nafter:\n%s", snap, after)
	}
}

func testDeferredPromote(t *testing.T, b *bundle) {
	key, act, x := b.deferredSession()
	one := b.message(key, "one")
	p := b.deferParams(act, x)
	d, err := b.s.NextDelivery(b.ctx, p)
	noErr(t, err, "deferred NextDelivery")
	wantEq(t, d.Deferred, true, "Dispatch.Deferred")
	noErr(t, b.s.Promote(b.ctx, store.PromoteOf(act.Ref(), p, d)), "Promote")
	cur, err := b.s.InFlight(b.ctx, act.Ref())
	noErr(t, err, "InFlight after Promote")
	wantEq(t, cur.Delivery.ID, d.Delivery.ID, "in-flight delivery")
	wantEq(t, cur.Delivery.State, store.DeliverySent, "in-flight delivery's state")
	wantEq(t, cur.Event.ID, one.ID, "in-flight event")
	wantEq(t, b.event(key, one.ID).Binding, b.agent.ModuleDigest, "binding recorded by Promote")
	frames := b.stream(key).Frames
	last := frames[len(frames)-1]
	wantEq(t, last.Kind, store.FrameTurnStarted, "last frame after Promote")
	wantEq(t, last.EventID, one.ID, "turn.started's event")
	// A second promotion finds the event current: refused, nothing written.
	snap := b.streamSnapshot(key)
	wantFence(t, b.s.Promote(b.ctx, store.PromoteOf(act.Ref(), p, d)), store.FenceSupersededDelivery, "a second Promote")
	if after := b.streamSnapshot(key); after != snap {
		t.Fatalf("a second Promote wrote:\nbefore:\n%s\nafter:\n%s", snap, after)
	}
	// The promoted turn commits like any: its delivery exists.
	turn, err := b.commitPayloads(d, "r1")
	noErr(t, err, "commit of the promoted turn")
	wantMessages(t, turn.Messages, abi.RoleUser, "one", abi.RoleAssistant, "r1")
	b.wantStreamSound(key, "after the promoted commit")
}

func testDeferredOnlyFirst(t *testing.T, b *bundle) {
	key, act, x := b.deferredSession()
	one := b.message(key, "one")
	d := b.next(act)
	b.fail(d.Delivery.TurnRef(), true, 0, 5)
	act2 := b.claim(key, LongTTL)
	d2, err := b.s.NextDelivery(b.ctx, b.deferParams(act2, x))
	noErr(t, err, "NextDelivery with Defer of a retry")
	wantEq(t, d2.Event.ID, one.ID, "retried event")
	wantEq(t, d2.Deferred, false, "a retry is taken at once")
	wantEq(t, d2.Attempt, 2, "Attempt")
	if _, err := b.s.InFlight(b.ctx, act2.Ref()); err != nil {
		t.Fatalf("InFlight after a retry's dispatch with Defer: %v (it must be in flight)", err)
	}
	// An uncounted failure leaves attempts 0 but the binding recorded:
	// not deferred either (an earlier attempt started).
	b.fail(d2.Delivery.TurnRef(), false, 0, 5)
	key2, act3, x2 := b.deferredSession()
	b.message(key2, "x")
	d3 := b.next(act3)
	b.fail(d3.Delivery.TurnRef(), false, 0, 5)
	act4 := b.claim(key2, LongTTL)
	d4, err := b.s.NextDelivery(b.ctx, b.deferParams(act4, x2))
	noErr(t, err, "NextDelivery with Defer after an uncounted failure")
	wantEq(t, d4.Attempt, 1, "Attempt after an uncounted failure")
	wantEq(t, d4.Deferred, false, "an event whose binding is recorded is taken at once")
}

func testDeferredCancelled(t *testing.T, b *bundle) {
	key, act, x := b.deferredSession()
	one := b.message(key, "one")
	p := b.deferParams(act, x)
	d, err := b.s.NextDelivery(b.ctx, p)
	noErr(t, err, "deferred NextDelivery")
	wantEq(t, d.Deferred, true, "Dispatch.Deferred")
	cr, err := b.s.CancelEvent(b.ctx, store.CancelEventParams{Key: key, EventID: one.ID, Reason: "stop"})
	noErr(t, err, "CancelEvent of the deferred event")
	wantEq(t, cr.InFlight, false, "a deferred turn is not in flight for a cancel")
	snap := b.streamSnapshot(key)
	_, err = b.commitDeferred(act, p, d, "MUST NOT BE WRITTEN")
	wantFence(t, err, store.FenceSupersededDelivery, "commit of a cancelled deferred turn")
	wantFence(t, b.s.Promote(b.ctx, store.PromoteOf(act.Ref(), p, d)), store.FenceSupersededDelivery, "Promote of a cancelled deferred turn")
	if after := b.streamSnapshot(key); after != snap {
		t.Fatalf("a refused deferred commit wrote:\nbefore:\n%s\nafter:\n%s", snap, after)
	}
	wantStatus(t, b, key, one.ID, store.EventCancelled)
	b.wantIdle(act, "after the refused deferred commit")
}

func testDeferredRedrivenAhead(t *testing.T, b *bundle) {
	key := b.session()
	poison := b.deadLetter(key, "poison", 1)
	b.message(key, "warm")
	act2 := b.claim(key, LongTTL)
	d0, err := b.nextExpect(act2, nil)
	noErr(t, err, "dispatch after the dead letter")
	_, err = b.commitPayloads(d0, "warm reply")
	noErr(t, err, "commit after the dead letter")
	two := b.message(key, "two")
	p := b.deferParams(act2, b.expectedOf(d0))
	d, err := b.s.NextDelivery(b.ctx, p)
	noErr(t, err, "deferred NextDelivery behind a dead letter")
	wantEq(t, d.Event.ID, two.ID, "deferred event")
	wantEq(t, d.Deferred, true, "Dispatch.Deferred")
	_, err = b.s.RedriveEvent(b.ctx, key, poison.ID)
	noErr(t, err, "RedriveEvent")
	snap := b.streamSnapshot(key)
	_, err = b.commitDeferred(act2, p, d, "MUST NOT BE WRITTEN")
	wantFence(t, err, store.FenceSupersededDelivery, "commit of a deferred turn an older event now precedes")
	if after := b.streamSnapshot(key); after != snap {
		t.Fatalf("a refused deferred commit wrote:\nbefore:\n%s\nafter:\n%s", snap, after)
	}
	wantEq(t, b.next(act2).Event.ID, poison.ID, "the redriven event runs first (invariant 5)")
}

func testDeferredLostActivation(t *testing.T, b *bundle) {
	key := b.session()
	b.message(key, "warm")
	act := b.claim(key, SetupTTL)
	d0, err := b.nextExpect(act, nil)
	noErr(t, err, "first dispatch")
	_, err = b.commitPayloads(d0, "warm reply")
	noErr(t, err, "first commit")
	b.message(key, "one")
	p := b.deferParams(act, b.expectedOf(d0))
	d, err := b.s.NextDelivery(b.ctx, p)
	noErr(t, err, "deferred NextDelivery")
	wantEq(t, d.Deferred, true, "Dispatch.Deferred")
	b.waitExpired(act)
	snap := b.streamSnapshot(key)
	_, err = b.commitDeferred(act, p, d, "MUST NOT BE WRITTEN")
	wantFence(t, err, store.FenceExpiredLease, "commit of a deferred turn past its lease")
	if after := b.streamSnapshot(key); after != snap {
		t.Fatalf("a deferred commit past its lease wrote:\nbefore:\n%s\nafter:\n%s", snap, after)
	}
	// A newer activation: stale epoch, for the commit and the promotion.
	_, err = b.s.ExpireActivation(b.ctx, store.ExpireActivationParams{Ref: act.Ref(), MaxAttempts: 5})
	noErr(t, err, "ExpireActivation")
	b.claim(key, LongTTL)
	snap = b.streamSnapshot(key)
	_, err = b.commitDeferred(act, p, d, "MUST NOT BE WRITTEN")
	wantFence(t, err, store.FenceStaleEpoch, "commit of a deferred turn of an older activation")
	wantFence(t, b.s.Promote(b.ctx, store.PromoteOf(act.Ref(), p, d)), store.FenceStaleEpoch, "Promote under an older activation")
	if after := b.streamSnapshot(key); after != snap {
		t.Fatalf("a refused deferred commit wrote:\nbefore:\n%s\nafter:\n%s", snap, after)
	}
}

func testDeferredUpdatedAgent(t *testing.T, b *bundle) {
	v1 := b.module("deferred v1")
	a := b.newAgent("deferred-"+uuid.NewString()[:8], v1.Digest, store.CrashRestart)
	key := b.sessionOf(a.UID, store.CrashRestart)
	b.message(key, "warm")
	act := b.claim(key, LongTTL)
	bind := func(ab store.AgentBinding) (string, error) { return "bound:" + ab.ModuleDigest, nil }
	d0, err := b.s.NextDelivery(b.ctx, store.NextDeliveryParams{Activation: act.Ref(), DeliveryID: uuid.NewString(),
		MarkSent: true, Bind: bind})
	noErr(t, err, "first dispatch")
	_, err = b.commitPayloads(d0, "warm")
	noErr(t, err, "first commit")
	one := b.message(key, "one")
	p := store.NextDeliveryParams{Activation: act.Ref(), DeliveryID: uuid.NewString(), MarkSent: true, Bind: bind,
		ExpectDue: true, Defer: true, Expect: &store.ExpectedBinding{Agent: d0.Agent, Binding: "bound:" + v1.Digest}}
	d, err := b.s.NextDelivery(b.ctx, p)
	noErr(t, err, "deferred NextDelivery")
	wantEq(t, d.Deferred, true, "Dispatch.Deferred")
	wantEq(t, d.Delivery.Binding, "bound:"+v1.Digest, "deferred binding")
	v2 := b.module("deferred v2")
	_, err = b.s.CreateAgent(b.ctx, store.CreateAgentParams{UID: a.UID, Name: a.Name, ModuleDigest: v2.Digest,
		CrashPolicy: store.CrashRestart, Upsert: true})
	noErr(t, err, "update the agent")
	_, err = b.commitDeferred(act, p, d, "MUST NOT BE WRITTEN")
	wantFence(t, err, store.FenceSupersededDelivery, "commit of a deferred turn whose agent was updated")
	wantFence(t, b.s.Promote(b.ctx, store.PromoteOf(act.Ref(), p, d)), store.FenceSupersededDelivery, "Promote after an agent update")
	wantEq(t, b.event(key, one.ID).Binding, "", "the event's binding after the refusals")
	// The next dispatch binds it to what the agent runs now.
	p.DeliveryID, p.Defer = uuid.NewString(), false
	p.Expect = nil
	d2, err := b.s.NextDelivery(b.ctx, p)
	noErr(t, err, "NextDelivery after the update")
	wantEq(t, d2.Delivery.Binding, "bound:"+v2.Digest, "binding: the updated agent's")
}

func testDeferredMismatch(t *testing.T, b *bundle) {
	key, act, x := b.deferredSession()
	b.message(key, "one")
	p := b.deferParams(act, x)
	d, err := b.s.NextDelivery(b.ctx, p)
	noErr(t, err, "deferred NextDelivery")
	pp := store.PromoteOf(act.Ref(), p, d)
	pp.Delivery.Revision++
	snap := b.streamSnapshot(key)
	_, err = b.s.CommitTurn(b.ctx, store.CommitTurnParams{Ref: d.Delivery.TurnRef(), Outcome: abi.OutcomeOK,
		KeepState: true, Payloads: []string{string(d.Event.Payload)}, Deferred: &pp})
	if !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("commit whose Deferred names another revision: %v, want ErrInvalid", err)
	}
	pp = store.PromoteOf(act.Ref(), p, d)
	_, err = b.s.CommitTurn(b.ctx, store.CommitTurnParams{Ref: d.Delivery.TurnRef(), Outcome: abi.OutcomeWait,
		KeepState: true, Payloads: []string{string(d.Event.Payload)}, Deferred: &pp,
		Wait: &store.WaitParams{ID: "w"}})
	if !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("deferred commit opening a wait: %v, want ErrInvalid", err)
	}
	if after := b.streamSnapshot(key); after != snap {
		t.Fatalf("an invalid deferred commit wrote:\nbefore:\n%s\nafter:\n%s", snap, after)
	}
}
