package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

func fenceCases() []testCase {
	return []testCase{
		{"Invariant3/CommitRejectsStaleEpochAndWritesNothing", testFenceStaleEpoch},
		{"Invariant3/CommitRejectsStaleRevisionAndWritesNothing", testFenceStaleRevision},
		{"Invariant3/CommitRejectsSupersededDeliveryAndWritesNothing", testFenceSuperseded},
		{"Invariant3/CommitRejectsExpiredLeaseAndWritesNothing", testFenceExpiredLease},
		{"Invariant3/CommitRejectsUnknownDeliveryAndWritesNothing", testFenceUnknownDelivery},
		{"Invariant3/CommitRejectsWrongActorKeyAndWritesNothing", testFenceWrongActorKey},
		{"Invariant3/FailAttemptChecksTheSameFencesAndWritesNothing", testFailAttemptFences},
		{"Invariant3/ReplayAfterFailAttemptRaisedTheEpochIsStaleEpoch", testReplayAfterFailAttempt},
		{"Invariant3/ReplayAfterWatchdogExpiryIsStaleEpoch", testReplayAfterExpiry},
	}
}

// fenceFixture is a session with one committed turn (state "s1") and a
// second event in flight under a newer activation, plus another session
// with a turn in flight.
type fenceFixture struct {
	key, otherKey store.ActorKey
	first, ev     store.Event
	old, act      store.Activation
	ref, otherRef abi.TurnRef
}

func newFenceFixture(b *bundle, ttl time.Duration) *fenceFixture {
	b.t.Helper()
	f := &fenceFixture{key: b.session(), otherKey: b.session()}
	f.first = b.message(f.key, "first")
	f.old = b.claim(f.key, LongTTL)
	b.commit(b.next(f.old).Delivery.TurnRef(), "reply one", "s1")
	noErr(b.t, b.s.StopActivation(b.ctx, f.old.Ref()), "StopActivation")

	b.message(f.otherKey, "other")
	f.otherRef = b.next(b.claim(f.otherKey, LongTTL)).Delivery.TurnRef()

	f.ev = b.message(f.key, "second")
	f.act = b.claim(f.key, ttl)
	f.ref = b.next(f.act).Delivery.TurnRef()
	return f
}

// reject commits bad, with and without the payloads the dispatch carried
// (CommitTurnParams.Payloads: a driver may commit differently with them),
// and requires the given rejection with nothing written to either session.
func (f *fenceFixture) reject(b *bundle, bad abi.TurnRef, reason store.FenceReason, what string) {
	b.t.Helper()
	before, beforeOther := b.snapshot(f.key), b.snapshot(f.otherKey)
	for _, payloads := range [][]string{nil, {`{"message":"MUST NOT BE WRITTEN"}`}} {
		_, err := b.s.CommitTurn(b.ctx, store.CommitTurnParams{
			Ref: bad, Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "MUST NOT BE WRITTEN"}},
			State: []byte("BAD STATE"), Outcome: abi.OutcomeOK, Payloads: payloads,
		})
		what := fmt.Sprintf("%s (payloads %q)", what, payloads)
		wantFence(b.t, err, reason, what)
		b.sameSnapshot(f.key, before, what)
		b.sameSnapshot(f.otherKey, beforeOther, what)
	}
}

// rejectFail is reject for FailAttempt.
func (f *fenceFixture) rejectFail(b *bundle, bad abi.TurnRef, reason store.FenceReason, what string) {
	b.t.Helper()
	before, beforeOther := b.snapshot(f.key), b.snapshot(f.otherKey)
	_, err := b.s.FailAttempt(b.ctx, store.FailAttemptParams{
		Ref: bad, Error: "MUST NOT BE WRITTEN", Counted: true, Backoff: time.Hour, MaxAttempts: 1,
	})
	wantFence(b.t, err, reason, what)
	b.sameSnapshot(f.key, before, what)
	b.sameSnapshot(f.otherKey, beforeOther, what)
}

// proveUntouched shows that the rejected replies changed neither the
// delivery, the activation nor the state: the genuine ref still commits (or,
// its lease expired, still fails the attempt), and the next dispatch sees
// state "s1".
func (f *fenceFixture) proveUntouched(b *bundle, leaseExpired bool) {
	b.t.Helper()
	t := b.t
	var d store.Dispatch
	if leaseExpired {
		fr := b.fail(f.ref, false, 0, 1)
		wantEq(t, fr.Attempts, 0, "uncounted attempts")
		wantEq(t, fr.DeadLettered, false, "dead lettered")
		d = b.next(b.claim(f.key, LongTTL))
		wantEq(t, d.Event.ID, f.ev.ID, "the same event is delivered again")
		wantEq(t, d.Attempt, 1, "attempt after an uncounted failure")
	} else {
		turn, err := b.s.CommitTurn(b.ctx, store.CommitTurnParams{
			Ref: f.ref, Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "reply two"}}, KeepState: true, Outcome: abi.OutcomeOK,
		})
		noErr(t, err, "CommitTurn with the genuine ref after the rejections")
		wantEq(t, turn.TurnNo, int64(2), "TurnNo")
		wantMessages(t, turn.Messages, abi.RoleUser, "second", abi.RoleAssistant, "reply two")
		third := b.message(f.key, "third")
		d = b.next(f.act)
		wantEq(t, d.Event.ID, third.ID, "next event")
	}
	wantBytes(t, d.State, []byte("s1"), "session state after the rejected replies")
	for _, m := range d.Tail {
		if m.Content == "MUST NOT BE WRITTEN" {
			t.Fatalf("a rejected reply reached the transcript: %+v", d.Tail)
		}
	}
	_, err := b.s.CommitTurn(b.ctx, store.CommitTurnParams{Ref: f.otherRef, Outcome: abi.OutcomeOK, KeepState: true})
	noErr(t, err, "the other session still commits")
}

func testFenceStaleEpoch(t *testing.T, b *bundle) {
	f := newFenceFixture(b, LongTTL)
	bad := f.ref
	bad.ActorEpoch--
	f.reject(b, bad, store.FenceStaleEpoch, "older epoch")
	bad = f.ref
	bad.ActorEpoch++
	f.reject(b, bad, store.FenceStaleEpoch, "newer epoch")
	f.proveUntouched(b, false)
}

func testFenceStaleRevision(t *testing.T, b *bundle) {
	f := newFenceFixture(b, LongTTL)
	bad := f.ref
	bad.Revision++
	f.reject(b, bad, store.FenceStaleRevision, "other revision (+1)")
	bad = f.ref
	bad.Revision--
	f.reject(b, bad, store.FenceStaleRevision, "other revision (-1)")
	f.proveUntouched(b, false)
}

func testFenceSuperseded(t *testing.T, b *bundle) {
	f := newFenceFixture(b, LongTTL)
	bad := f.ref
	bad.ActorEventID = f.first.ID
	f.reject(b, bad, store.FenceSupersededDelivery, "another event")
	bad = f.ref
	bad.ActorEventID = f.ev.ID + 1000
	f.reject(b, bad, store.FenceSupersededDelivery, "an unknown event")
	bad = f.ref
	bad.ActivationUID = f.old.UID
	f.reject(b, bad, store.FenceSupersededDelivery, "the previous activation")
	bad = f.ref
	bad.ActivationUID = uuid.NewString()
	f.reject(b, bad, store.FenceSupersededDelivery, "an unknown activation")
	f.proveUntouched(b, false)
}

func testFenceExpiredLease(t *testing.T, b *bundle) {
	f := newFenceFixture(b, SetupTTL)
	b.waitExpired(f.act)
	f.reject(b, f.ref, store.FenceExpiredLease, "expired lease")
	f.proveUntouched(b, true)
}

func testFenceUnknownDelivery(t *testing.T, b *bundle) {
	f := newFenceFixture(b, LongTTL)
	bad := f.ref
	bad.DeliveryID = uuid.NewString()
	f.reject(b, bad, store.FenceUnknownDelivery, "unknown delivery id")
	bad.ActorEpoch++ // the delivery id decides first
	f.reject(b, bad, store.FenceUnknownDelivery, "unknown delivery id with another epoch")
	f.proveUntouched(b, false)
}

func testFenceWrongActorKey(t *testing.T, b *bundle) {
	f := newFenceFixture(b, LongTTL)
	bad := f.ref
	bad.SessionID = f.otherKey.SessionID
	f.reject(b, bad, store.FenceWrongActorKey, "another session of the agent")
	bad = f.ref
	bad.AgentUID = uuid.NewString()
	f.reject(b, bad, store.FenceWrongActorKey, "another agent")
	bad = f.otherRef // the other session's genuine delivery, sent to this key
	bad.AgentUID, bad.SessionID = f.key.AgentUID, f.key.SessionID
	f.reject(b, bad, store.FenceWrongActorKey, "another session's delivery")
	f.proveUntouched(b, false)
}

func testFailAttemptFences(t *testing.T, b *bundle) {
	f := newFenceFixture(b, LongTTL)
	bad := f.ref
	bad.ActorEpoch--
	f.rejectFail(b, bad, store.FenceStaleEpoch, "FailAttempt with an older epoch")
	bad = f.ref
	bad.Revision++
	f.rejectFail(b, bad, store.FenceStaleRevision, "FailAttempt with another revision")
	bad = f.ref
	bad.ActorEventID = f.first.ID
	f.rejectFail(b, bad, store.FenceSupersededDelivery, "FailAttempt for another event")
	bad = f.ref
	bad.DeliveryID = uuid.NewString()
	f.rejectFail(b, bad, store.FenceUnknownDelivery, "FailAttempt with an unknown delivery")
	bad = f.ref
	bad.SessionID = f.otherKey.SessionID
	f.rejectFail(b, bad, store.FenceWrongActorKey, "FailAttempt for another session")
	f.proveUntouched(b, false)
}

func testReplayAfterFailAttempt(t *testing.T, b *bundle) {
	key := b.session()
	ev := b.message(key, "flaky")
	a1 := b.claim(key, LongTTL)
	late := b.next(a1).Delivery.TurnRef()
	b.fail(late, true, 0, 5)

	a2 := b.claim(key, LongTTL)
	if a2.ActorEpoch <= late.ActorEpoch {
		t.Fatalf("epoch after the failed attempt = %d, not above %d", a2.ActorEpoch, late.ActorEpoch)
	}
	d2 := b.next(a2)
	wantEq(t, d2.Event.ID, ev.ID, "retried event")
	wantEq(t, d2.Attempt, 2, "retry attempt")

	before := b.snapshot(key)
	_, err := b.s.CommitTurn(b.ctx, store.CommitTurnParams{Ref: late, Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "late"}}, Outcome: abi.OutcomeOK})
	wantFence(t, err, store.FenceStaleEpoch, "late reply of the failed attempt")
	b.sameSnapshot(key, before, "late reply of the failed attempt")

	turn := b.commit(d2.Delivery.TurnRef(), "on time", "")
	wantEq(t, turn.ActorEpoch, a2.ActorEpoch, "committed epoch")
	_, err = b.s.CommitTurn(b.ctx, store.CommitTurnParams{Ref: late, Outcome: abi.OutcomeOK})
	wantFence(t, err, store.FenceStaleEpoch, "late reply after the retry committed")
	wantEq(t, len(b.transcript(key)), 1, "turns")
}

func testReplayAfterExpiry(t *testing.T, b *bundle) {
	key := b.session()
	b.message(key, "slow")
	a := b.claim(key, SetupTTL)
	late := b.next(a).Delivery.TurnRef()
	b.waitExpired(a)
	_, err := b.s.ExpireActivation(b.ctx, store.ExpireActivationParams{Ref: a.Ref(), MaxAttempts: 5})
	noErr(t, err, "ExpireActivation")
	before := b.snapshot(key)
	_, err = b.s.CommitTurn(b.ctx, store.CommitTurnParams{Ref: late, Outcome: abi.OutcomeOK})
	wantFence(t, err, store.FenceStaleEpoch, "late reply after the watchdog failed the activation")
	b.sameSnapshot(key, before, "late reply after expiry")
	_, err = b.s.FailAttempt(b.ctx, store.FailAttemptParams{Ref: late, Error: "late", Counted: true, MaxAttempts: 5})
	wantFence(t, err, store.FenceStaleEpoch, "late failure after the watchdog failed the activation")
	b.sameSnapshot(key, before, "late failure after expiry")
}
