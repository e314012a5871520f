package storetest

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

func steerCases() []testCase {
	return []testCase{
		{"Steer/InFlightRaisesRevisionOldRefStaleNewRefCommitsWithTheSteer", testSteerInFlight},
		{"Steer/WithoutATurnInFlightIsQueuedLikeAMessage", testSteerQueued},
		{"Steer/AttachedSteerComesBackOnTheRetry", testSteerAfterFailure},
		{"Steer/DeadLetteredTurnDetachesItsSteers", testSteerDetached},
		{"Steer/IdempotentResendReturnsTheFirstSteer", testSteerIdempotent},
	}
}

func cancelCases() []testCase {
	return []testCase{
		{"Cancel/InFlightRecordsACancelledTurnAndFencesTheOldRef", testCancelInFlight},
		{"Cancel/QueuedEventIsCancelledWithoutATurn", testCancelQueued},
		{"Cancel/ClosedEventIsConflictUnknownIsNotFound", testCancelClosed},
	}
}

func msgPayload(text string) json.RawMessage {
	p, _ := json.Marshal(map[string]string{"message": text})
	return p
}

// steer sends a steer with a fresh delivery id.
func (b *bundle) steer(key store.ActorKey, text, idem string) store.SteerResult {
	b.t.Helper()
	r, err := b.s.Steer(b.ctx, store.SteerParams{Key: key, Payload: msgPayload(text), IdempotencyKey: idem, DeliveryID: uuid.NewString()})
	noErr(b.t, err, "Steer")
	return r
}

func (b *bundle) inFlight(act store.Activation) store.Dispatch {
	b.t.Helper()
	d, err := b.s.InFlight(b.ctx, act.Ref())
	noErr(b.t, err, "InFlight")
	return d
}

func steerIDs(evs []store.Event) []int64 {
	out := []int64{}
	for _, e := range evs {
		out = append(out, e.ID)
	}
	return out
}

func testSteerInFlight(t *testing.T, b *bundle) {
	key := b.session()
	ev := b.message(key, "write a long essay")
	act := b.claim(key, LongTTL)
	d := b.next(act)
	old := d.Delivery.TurnRef()
	fl := b.inFlight(act)
	wantEq(t, fl.Delivery.ID, old.DeliveryID, "InFlight delivery before a steer")
	wantEq(t, fl.Event.ID, ev.ID, "InFlight event")
	wantEq(t, len(fl.Steers), 0, "InFlight steers before a steer")

	newID := uuid.NewString()
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	sr, err := b.s.Steer(b.ctx, store.SteerParams{Key: key, Payload: msgPayload("make it short"), IdempotencyKey: "steer-1", DeliveryID: newID,
		Traceparent: tp})
	noErr(t, err, "Steer")
	wantEq(t, sr.Created, true, "Created")
	wantEq(t, sr.InFlight, true, "InFlight")
	wantEq(t, sr.Event.Kind, abi.EventSteer, "steer Kind")
	wantEq(t, sr.Event.Status, store.EventOpen, "steer Status")
	wantEq(t, sr.Event.SteerOf, ev.ID, "steer SteerOf")
	wantEq(t, sr.Event.IdempotencyKey, "steer-1", "steer IdempotencyKey")
	want := old
	want.DeliveryID, want.Revision = newID, old.Revision+1
	wantEq(t, sr.Ref, want, "the new turn_ref")
	wantEq(t, b.event(key, sr.Event.ID).SteerOf, ev.ID, "listed SteerOf")
	wantEq(t, b.event(key, sr.Event.ID).Traceparent, tp, "the steer's stored traceparent")

	fl = b.inFlight(act)
	wantEq(t, fl.Delivery.ID, newID, "InFlight delivery after a steer")
	wantEq(t, fl.Delivery.Revision, old.Revision+1, "InFlight delivery revision")
	wantEq(t, fl.Delivery.State, store.DeliverySent, "InFlight delivery state")
	wantEq(t, fl.Delivery.TurnRef(), sr.Ref, "InFlight delivery ref")
	wantEq(t, fl.Event.ID, ev.ID, "InFlight event")
	wantEq(t, fmt.Sprint(steerIDs(fl.Steers)), fmt.Sprint([]int64{sr.Event.ID}), "InFlight steers")

	// The old ref can neither commit nor fail the turn.
	before := b.snapshot(key)
	_, err = b.s.CommitTurn(b.ctx, store.CommitTurnParams{Ref: old, Outcome: abi.OutcomeOK,
		Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "MUST NOT BE WRITTEN"}},
		Alarms:   []abi.AlarmOp{{Name: "bad", InMs: 1000}}})
	wantFence(t, err, store.FenceStaleRevision, "commit with the pre-steer ref")
	_, err = b.s.FailAttempt(b.ctx, store.FailAttemptParams{Ref: old, Error: "x", Counted: true, MaxAttempts: 1})
	wantFence(t, err, store.FenceStaleRevision, "FailAttempt with the pre-steer ref")
	b.sameSnapshot(key, before, "rejected pre-steer replies")

	// Two more steers, one without a message.
	sr2 := b.steer(key, "and funny", "")
	wantEq(t, sr2.Ref.Revision, old.Revision+2, "second steer revision")
	r3, err := b.s.Steer(b.ctx, store.SteerParams{Key: key, Payload: json.RawMessage(`{"data":{"tone":"dry"}}`), DeliveryID: uuid.NewString()})
	noErr(t, err, "Steer without a message")
	wantEq(t, r3.InFlight, true, "third steer InFlight")
	_, err = b.s.CommitTurn(b.ctx, store.CommitTurnParams{Ref: sr2.Ref, Outcome: abi.OutcomeOK})
	wantFence(t, err, store.FenceStaleRevision, "commit with the second steer's ref")
	wantEq(t, fmt.Sprint(steerIDs(b.inFlight(act).Steers)), fmt.Sprint([]int64{sr.Event.ID, sr2.Event.ID, r3.Event.ID}), "InFlight steers in order")

	turn, err := b.s.CommitTurn(b.ctx, store.CommitTurnParams{Ref: r3.Ref, Outcome: abi.OutcomeOK,
		Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "Short. Funny. Dry."}}})
	noErr(t, err, "commit with the newest ref")
	wantEq(t, turn.EventID, ev.ID, "turn event")
	wantEq(t, turn.DeliveryID, r3.Ref.DeliveryID, "turn delivery")
	wantMessages(t, turn.Messages, abi.RoleUser, "write a long essay", abi.RoleUser, "make it short", abi.RoleUser, "and funny",
		abi.RoleAssistant, "Short. Funny. Dry.")
	wantMessages(t, b.transcript(key)[0].Messages, abi.RoleUser, "write a long essay", abi.RoleUser, "make it short",
		abi.RoleUser, "and funny", abi.RoleAssistant, "Short. Funny. Dry.")
	for _, id := range []int64{ev.ID, sr.Event.ID, sr2.Event.ID, r3.Event.ID} {
		e := b.event(key, id)
		wantEq(t, e.Status, store.EventDone, fmt.Sprintf("event %d Status", id))
		if e.ClosedAt == nil {
			t.Fatalf("done event %d has no ClosedAt", id)
		}
	}
	s := b.getSession(key)
	wantEq(t, s.OpenEvents, int64(0), "OpenEvents")
	wantEq(t, s.TurnCount, int64(1), "the steers commit with their turn")
	_, err = b.s.InFlight(b.ctx, act.Ref())
	wantIs(t, err, store.ErrNotLive, "InFlight with no current event")
	_, err = b.tryNext(act, true, "")
	wantNoDue(t, err, "NextDelivery after the steered turn")
}

func testSteerQueued(t *testing.T, b *bundle) {
	key := b.session()
	// No activation.
	q1 := b.steer(key, "steer while idle", "")
	wantEq(t, q1.Created, true, "Created")
	wantEq(t, q1.InFlight, false, "InFlight without an activation")
	wantEq(t, q1.Ref, abi.TurnRef{}, "Ref when queued")
	wantEq(t, q1.Event.SteerOf, int64(0), "SteerOf when queued")
	wantEq(t, q1.Event.Kind, abi.EventSteer, "Kind")
	// A live activation with no current event.
	act := b.claim(key, LongTTL)
	q2 := b.steer(key, "steer between turns", "")
	wantEq(t, q2.InFlight, false, "InFlight with an idle activation")
	wantEq(t, q2.Event.SteerOf, int64(0), "SteerOf with an idle activation")
	d := b.next(act)
	wantEq(t, d.Event.ID, q1.Event.ID, "the queued steer runs as its own event")
	wantEq(t, len(d.Steers), 0, "Dispatch.Steers of a queued steer")
	turn := b.commit(d.Delivery.TurnRef(), "ok", "")
	wantMessages(t, turn.Messages, abi.RoleUser, "steer while idle", abi.RoleAssistant, "ok")

	// A turn whose delivery was created but not sent: queued too.
	d2 := b.next(act)
	wantEq(t, d2.Event.ID, q2.Event.ID, "q2 runs")
	b.commit(d2.Delivery.TurnRef(), "ok", "")
	ev := b.message(key, "not yet sent")
	dc, err := b.tryNext(act, false, "")
	noErr(t, err, "NextDelivery without MarkSent")
	wantEq(t, dc.Event.ID, ev.ID, "created delivery event")
	q3 := b.steer(key, "steer before the send", "")
	wantEq(t, q3.InFlight, false, "InFlight with a created delivery")
	wantEq(t, b.event(key, q3.Event.ID).SteerOf, int64(0), "SteerOf with a created delivery")
	noErr(t, b.s.MarkDeliverySent(b.ctx, dc.Delivery.TurnRef()), "MarkDeliverySent: the queued steer did not supersede it")
	b.commit(dc.Delivery.TurnRef(), "ok", "")
	wantEq(t, b.next(act).Event.ID, q3.Event.ID, "the queued steer runs after the turn")

	_, err = b.s.Steer(b.ctx, store.SteerParams{Key: store.ActorKey{AgentUID: b.agent.UID, SessionID: "missing"}, Payload: msgPayload("x"), DeliveryID: uuid.NewString()})
	wantIs(t, err, store.ErrNotFound, "Steer to an unknown session")

	// A steer wakes a sleeping session.
	sleepy := b.session()
	_, err = b.s.SleepSession(b.ctx, store.SleepSessionParams{Key: sleepy, Reason: "capacity"})
	noErr(t, err, "SleepSession")
	b.steer(sleepy, "wake", "")
	wantActive(t, b.getSession(sleepy), "after a steer")
}

func testSteerAfterFailure(t *testing.T, b *bundle) {
	key := b.session()
	ev := b.message(key, "task")
	act := b.claim(key, LongTTL)
	b.next(act)
	sr := b.steer(key, "with a twist", "")
	// The worker that took the steer crashes under the new ref.
	fr := b.fail(sr.Ref, true, 0, 5)
	wantEq(t, fr.EventID, ev.ID, "failed event")
	wantEq(t, b.event(key, sr.Event.ID).Status, store.EventOpen, "the steer stays open")
	wantEq(t, b.event(key, sr.Event.ID).SteerOf, ev.ID, "the steer stays attached")
	s := b.getSession(key)
	wantEq(t, s.OpenEvents, int64(2), "OpenEvents")

	act2 := b.claim(key, LongTTL)
	d := b.next(act2)
	wantEq(t, d.Event.ID, ev.ID, "the retry runs the event, not the steer")
	wantEq(t, d.Attempt, 2, "Attempt")
	wantEq(t, fmt.Sprint(steerIDs(d.Steers)), fmt.Sprint([]int64{sr.Event.ID}), "Dispatch.Steers on the retry")
	wantEq(t, d.Steers[0].Kind, abi.EventSteer, "steer Kind")
	if !jsonEqual(d.Steers[0].Payload, msgPayload("with a twist")) {
		t.Fatalf("steer payload = %s", d.Steers[0].Payload)
	}
	fl := b.inFlight(act2)
	wantEq(t, fmt.Sprint(steerIDs(fl.Steers)), fmt.Sprint([]int64{sr.Event.ID}), "InFlight steers on the retry")
	turn := b.commit(d.Delivery.TurnRef(), "twisted", "")
	wantMessages(t, turn.Messages, abi.RoleUser, "task", abi.RoleUser, "with a twist", abi.RoleAssistant, "twisted")
	wantEq(t, b.event(key, sr.Event.ID).Status, store.EventDone, "steer Status")
}

func testSteerDetached(t *testing.T, b *bundle) {
	key := b.session()
	ev := b.message(key, "poison")
	act := b.claim(key, LongTTL)
	b.next(act)
	sr := b.steer(key, "please", "")
	fr := b.fail(sr.Ref, true, 0, 1)
	wantEq(t, fr.DeadLettered, true, "DeadLettered")
	st := b.event(key, sr.Event.ID)
	wantEq(t, st.Status, store.EventOpen, "the steer stays open")
	wantEq(t, st.SteerOf, int64(0), "the dead letter's steer is detached")
	d := b.next(b.claim(key, LongTTL))
	wantEq(t, d.Event.ID, sr.Event.ID, "the detached steer runs as its own event")
	wantEq(t, len(d.Steers), 0, "Dispatch.Steers")
	b.commit(d.Delivery.TurnRef(), "ok", "")
	wantEq(t, b.event(key, ev.ID).Status, store.EventDeadLetter, "the dead letter")
}

func testSteerIdempotent(t *testing.T, b *bundle) {
	key := b.session()
	ev := b.message(key, "task")
	act := b.claim(key, LongTTL)
	b.next(act)
	first := b.steer(key, "once", "s-1")
	wantEq(t, first.InFlight, true, "first InFlight")
	before := b.snapshot(key)
	again, err := b.s.Steer(b.ctx, store.SteerParams{Key: key, Payload: msgPayload("twice"), IdempotencyKey: "s-1", DeliveryID: uuid.NewString()})
	noErr(t, err, "repeated Steer")
	wantEq(t, again.Created, false, "repeat Created")
	wantEq(t, again.InFlight, false, "repeat InFlight")
	wantEq(t, again.Event.ID, first.Event.ID, "repeat returns the first steer")
	if !jsonEqual(again.Event.Payload, msgPayload("once")) {
		t.Fatalf("repeat payload = %s", again.Event.Payload)
	}
	b.sameSnapshot(key, before, "repeated Steer")
	fl := b.inFlight(act)
	wantEq(t, fl.Delivery.TurnRef(), first.Ref, "a repeated steer does not raise the revision")
	// The key is shared with AppendEvent.
	dup, created, err := b.s.AppendEvent(b.ctx, store.AppendEventParams{Key: key, Kind: abi.EventMessage, Payload: msgPayload("x"), IdempotencyKey: "s-1"})
	noErr(t, err, "AppendEvent with the steer's key")
	wantEq(t, created, false, "created")
	wantEq(t, dup.ID, first.Event.ID, "AppendEvent returns the steer")
	b.commit(first.Ref, "ok", "")
	wantEq(t, b.event(key, ev.ID).Status, store.EventDone, "event Status")
}

func testCancelInFlight(t *testing.T, b *bundle) {
	key := b.session()
	ev := b.message(key, "long job")
	next := b.message(key, "next job")
	act := b.claim(key, LongTTL)
	old := b.next(act).Delivery.TurnRef()
	sr := b.steer(key, "faster", "")

	cr, err := b.s.CancelEvent(b.ctx, store.CancelEventParams{Key: key, Reason: "user pressed stop"})
	noErr(t, err, "CancelEvent of the current event")
	wantEq(t, cr.InFlight, true, "InFlight")
	wantEq(t, cr.Event.ID, ev.ID, "cancelled event")
	wantEq(t, cr.Event.Status, store.EventCancelled, "Status")
	wantEq(t, cr.Event.LastError, "user pressed stop", "LastError")
	if cr.Event.ClosedAt == nil {
		t.Fatalf("a cancelled event has no ClosedAt")
	}
	wantEq(t, b.event(key, ev.ID).Status, store.EventCancelled, "listed Status")
	wantEq(t, b.event(key, sr.Event.ID).Status, store.EventCancelled, "the attached steer is cancelled too")
	_, err = b.s.InFlight(b.ctx, act.Ref())
	wantIs(t, err, store.ErrNotLive, "InFlight after the cancel")

	// The aborted worker's replies are fenced off.
	before := b.snapshot(key)
	for _, ref := range []abi.TurnRef{old, sr.Ref} {
		_, err = b.s.CommitTurn(b.ctx, store.CommitTurnParams{Ref: ref, Outcome: abi.OutcomeOK,
			Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "MUST NOT BE WRITTEN"}}})
		wantFence(t, err, store.FenceStaleRevision, "late reply after a cancel")
		_, err = b.s.FailAttempt(b.ctx, store.FailAttemptParams{Ref: ref, Error: "aborted", Counted: true, MaxAttempts: 1})
		wantFence(t, err, store.FenceStaleRevision, "late failure after a cancel")
	}
	b.sameSnapshot(key, before, "late replies after a cancel")

	turns := b.transcript(key)
	if len(turns) != 1 {
		t.Fatalf("transcript has %d turns, want the cancelled one", len(turns))
	}
	ct := turns[0]
	wantEq(t, ct.Outcome, store.OutcomeCancelled, "turn Outcome")
	wantEq(t, ct.EventID, ev.ID, "turn EventID")
	wantEq(t, ct.DeliveryID, sr.Ref.DeliveryID, "turn DeliveryID: the superseded delivery")
	wantEq(t, ct.ActorEpoch, act.ActorEpoch, "turn ActorEpoch")
	wantEq(t, ct.TurnNo, int64(1), "TurnNo")
	wantMessages(t, ct.Messages, abi.RoleUser, "long job", abi.RoleSystem, "cancelled: user pressed stop")
	s := b.getSession(key)
	wantEq(t, s.TurnCount, int64(1), "TurnCount")
	wantEq(t, s.OpenEvents, int64(1), "OpenEvents")

	// The activation goes on with the next event.
	d := b.next(act)
	wantEq(t, d.Event.ID, next.ID, "the next event dispatches")
	wantEq(t, d.Delivery.Revision, old.Revision+2, "revision after a steer and a cancel")
	wantEq(t, len(d.Steers), 0, "Dispatch.Steers")
	turn := b.commit(d.Delivery.TurnRef(), "done", "")
	wantEq(t, turn.TurnNo, int64(2), "TurnNo after the cancelled turn")

	_, err = b.s.CancelEvent(b.ctx, store.CancelEventParams{Key: key, Reason: "nothing"})
	wantIs(t, err, store.ErrNotFound, "CancelEvent(0) with nothing in flight")
	_, err = b.s.CancelEvent(b.ctx, store.CancelEventParams{Key: b.session(), Reason: "nothing"})
	wantIs(t, err, store.ErrNotFound, "CancelEvent(0) without an activation")

	// A delivery still created is cancelled the same way.
	key2 := b.session()
	ev2 := b.message(key2, "about to send")
	act2 := b.claim(key2, LongTTL)
	dc, err := b.tryNext(act2, false, "")
	noErr(t, err, "NextDelivery without MarkSent")
	cr, err = b.s.CancelEvent(b.ctx, store.CancelEventParams{Key: key2, EventID: ev2.ID, Reason: "changed my mind"})
	noErr(t, err, "CancelEvent by id of the current event")
	wantEq(t, cr.InFlight, true, "InFlight with a created delivery")
	wantFence(t, b.s.MarkDeliverySent(b.ctx, dc.Delivery.TurnRef()), store.FenceSupersededDelivery, "MarkDeliverySent after a cancel")
	ct = b.transcript(key2)[0]
	wantEq(t, ct.DeliveryID, dc.Delivery.ID, "cancelled turn delivery")
	wantMessages(t, ct.Messages, abi.RoleUser, "about to send", abi.RoleSystem, "cancelled: changed my mind")
	noErr(t, b.s.StopActivation(b.ctx, act2.Ref()), "StopActivation after a cancel")
}

func testCancelQueued(t *testing.T, b *bundle) {
	key := b.session()
	first := b.message(key, "running")
	queued := b.message(key, "queued")
	last := b.message(key, "last")
	act := b.claim(key, LongTTL)
	d := b.next(act)

	cr, err := b.s.CancelEvent(b.ctx, store.CancelEventParams{Key: key, EventID: queued.ID, Reason: "not needed"})
	noErr(t, err, "CancelEvent of a queued event")
	wantEq(t, cr.InFlight, false, "InFlight")
	wantEq(t, cr.Event.Status, store.EventCancelled, "Status")
	wantEq(t, cr.Event.LastError, "not needed", "LastError")
	if cr.Event.ClosedAt == nil {
		t.Fatalf("a cancelled event has no ClosedAt")
	}
	wantEq(t, len(b.transcript(key)), 0, "a queued cancel records no turn")
	wantEq(t, b.inFlight(act).Delivery.TurnRef(), d.Delivery.TurnRef(), "the turn in flight is untouched")

	b.commit(d.Delivery.TurnRef(), "ok", "") // the old ref still commits
	d2 := b.next(act)
	wantEq(t, d2.Event.ID, last.ID, "the cancelled event is skipped")
	b.commit(d2.Delivery.TurnRef(), "ok", "")
	wantEq(t, b.event(key, first.ID).Status, store.EventDone, "first")

	// Without any activation.
	key2 := b.session()
	ev := b.message(key2, "never mind")
	cr, err = b.s.CancelEvent(b.ctx, store.CancelEventParams{Key: key2, EventID: ev.ID, Reason: "x"})
	noErr(t, err, "CancelEvent without an activation")
	wantEq(t, cr.InFlight, false, "InFlight")
	wantEq(t, b.getSession(key2).OpenEvents, int64(0), "OpenEvents")
}

func testCancelClosed(t *testing.T, b *bundle) {
	key := b.session()
	done := b.message(key, "done")
	act := b.claim(key, LongTTL)
	b.commit(b.next(act).Delivery.TurnRef(), "ok", "")
	noErr(t, b.s.StopActivation(b.ctx, act.Ref()), "StopActivation")
	dead := b.deadLetter(key, "dead", 1)
	cancelled := b.message(key, "cancelled")
	_, err := b.s.CancelEvent(b.ctx, store.CancelEventParams{Key: key, EventID: cancelled.ID, Reason: "x"})
	noErr(t, err, "CancelEvent")

	for _, id := range []int64{done.ID, dead.ID, cancelled.ID} {
		before := b.snapshot(key)
		_, err := b.s.CancelEvent(b.ctx, store.CancelEventParams{Key: key, EventID: id, Reason: "again"})
		wantIs(t, err, store.ErrConflict, fmt.Sprintf("CancelEvent of closed event %d", id))
		b.sameSnapshot(key, before, "refused cancel")
	}
	_, err = b.s.CancelEvent(b.ctx, store.CancelEventParams{Key: key, EventID: cancelled.ID + 1000, Reason: "x"})
	wantIs(t, err, store.ErrNotFound, "CancelEvent of an unknown event")
	_, err = b.s.CancelEvent(b.ctx, store.CancelEventParams{Key: b.session(), EventID: done.ID, Reason: "x"})
	wantIs(t, err, store.ErrNotFound, "CancelEvent of another session's event")
	_, err = b.s.CancelEvent(b.ctx, store.CancelEventParams{Key: store.ActorKey{AgentUID: b.agent.UID, SessionID: "missing"}, EventID: done.ID})
	wantIs(t, err, store.ErrNotFound, "CancelEvent in an unknown session")
}
