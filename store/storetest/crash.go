package storetest

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

func crashCases() []testCase {
	return []testCase{
		{"CrashPolicy/RestartKeepsSessionActiveAndRetriesAfterBackoff", testCrashRestart},
		{"CrashPolicy/SleepParksSessionOnCountedFailAttempt", testCrashSleepFail},
		{"CrashPolicy/SleepParksSessionOnExpiredSentDelivery", testCrashSleepExpire},
		{"CrashPolicy/SleepAtMaxAttemptsDeadLettersAndMovesOn", testCrashSleepDeadLetter},
		{"CrashPolicy/DestroyDiscardsOpenEventsOnCountedFailAttempt", testCrashDestroyFail},
		{"CrashPolicy/DestroyOnExpiredSentDeliveryKeepsTheDeadLetter", testCrashDestroyExpire},
		{"CrashPolicy/UncountedFailureNeverAppliesThePolicy", testCrashUncounted},
		{"CrashPolicy/SleepTimingAndSessionTransitionAgreeAcrossPaths", testCrashSleepTiming},
		{"Destroy/DiscardsOpenEventsFailsLiveActivationRefusesSignals", testDestroy},
	}
}

func sleepCases() []testCase {
	return []testCase{
		{"Sleep/SleepingSessionRefusesClaimAndIsNotRunnable", testSleepingRefusesClaim},
		{"Sleep/AppendEventWakesSleepingSession", testAppendWakes},
		{"Sleep/WakeSessionWakesAndIsANoOpWhenActive", testWakeSession},
		{"Sleep/SleepSessionParksIdleSessionRefusesLiveActivation", testSleepSession},
		{"Sleep/SetPendingRecordsFirstWaitAndClears", testSetPending},
		{"Sleep/CommitWithOutcomeSleepParksSessionWithoutOpenEvents", testCommitOutcomeSleep},
		{"Sleep/CommitWithOutcomeFinishParksSessionUntilTheNextSignal", testCommitOutcomeFinish},
		{"Liveness/SessionAsleepForCapacityWithADueEventIsRunnable", testCapacitySleeperRunnable},
		{"Liveness/ClaimWakesOnlyASessionAsleepForCapacity", testClaimWakesCapacitySleeper},
		{"Liveness/RunnableSessionsLeavesOutSkippedAgents", testRunnableSkipsAgents},
	}
}

// wantSleeping checks a session sleeps for reason.
func wantSleeping(t testing.TB, s store.Session, reason, what string) {
	t.Helper()
	wantEq(t, s.Status, store.SessionSleeping, what+": Status")
	wantEq(t, s.SleepReason, reason, what+": SleepReason")
	if s.SleepTS == nil {
		t.Fatalf("%s: a sleeping session has no SleepTS", what)
	}
}

// wantActive checks a session is active with no sleep recorded.
func wantActive(t testing.TB, s store.Session, what string) {
	t.Helper()
	wantEq(t, s.Status, store.SessionActive, what+": Status")
	wantEq(t, s.SleepReason, "", what+": SleepReason")
	if s.SleepTS != nil {
		t.Fatalf("%s: an active session has SleepTS %v", what, s.SleepTS)
	}
}

func (b *bundle) tryClaim(key store.ActorKey) error {
	_, err := b.s.ClaimActivation(b.ctx, store.ClaimActivationParams{
		Key: key, UID: uuid.NewString(), LeaseID: uuid.NewString(), HostID: b.host, LeaseTTL: LongTTL,
	})
	return err
}

func testCrashRestart(t *testing.T, b *bundle) {
	key := b.sessionWith(store.CrashRestart)
	ev := b.message(key, "boom")
	act := b.claim(key, LongTTL)
	fr := b.fail(b.next(act).Delivery.TurnRef(), true, time.Hour, 5)
	wantEq(t, fr.SessionStatus, store.SessionActive, "FailResult.SessionStatus")
	wantActive(t, b.getSession(key), "after a counted failure under restart")
	got := b.event(key, ev.ID)
	wantEq(t, got.Status, store.EventOpen, "event Status")
	if d := got.NextAttemptAt.Sub(got.AcceptedAt); d < 59*time.Minute {
		t.Fatalf("restart retries after the backoff: NextAttemptAt is %v after acceptance", d)
	}

	// The same on an expired sent delivery.
	key2 := b.sessionWith(store.CrashRestart)
	b.message(key2, "lost host")
	a2 := b.claim(key2, SetupTTL)
	b.next(a2)
	b.waitExpired(a2)
	fr, err := b.s.ExpireActivation(b.ctx, store.ExpireActivationParams{Ref: a2.Ref(), Backoff: time.Hour, MaxAttempts: 5})
	noErr(t, err, "ExpireActivation")
	wantEq(t, fr.Attempts, 1, "expired sent delivery counts")
	wantEq(t, fr.SessionStatus, store.SessionActive, "FailResult.SessionStatus after expiry")
	wantActive(t, b.getSession(key2), "after an expiry under restart")
}

func testCrashSleepFail(t *testing.T, b *bundle) {
	key := b.sessionWith(store.CrashSleep)
	ev := b.message(key, "boom")
	later := b.message(key, "later")
	act := b.claim(key, LongTTL)
	fr := b.fail(b.next(act).Delivery.TurnRef(), true, time.Hour, 5)
	wantEq(t, fr.SessionStatus, store.SessionSleeping, "FailResult.SessionStatus")
	wantEq(t, fr.Attempts, 1, "FailResult.Attempts")
	wantEq(t, fr.DeadLettered, false, "FailResult.DeadLettered")
	s := b.getSession(key)
	wantSleeping(t, s, "crash", "after a counted failure under sleep")
	wantEq(t, s.OpenEvents, int64(2), "OpenEvents")

	got := b.event(key, ev.ID)
	wantEq(t, got.Status, store.EventOpen, "the failed event waits open")
	wantEq(t, got.Attempts, 1, "Attempts")
	if d := got.NextAttemptAt.Sub(got.AcceptedAt); d > time.Minute {
		t.Fatalf("under sleep the wake is the trigger: NextAttemptAt is %v after acceptance, want no backoff", d)
	}
	wantEq(t, got.NextAttemptAt.Sub(fr.NextAttemptAt).Abs() <= time.Millisecond, true, "FailResult.NextAttemptAt matches the event")
	wantEq(t, b.event(key, later.ID).Status, store.EventOpen, "later event")

	wantIs(t, b.tryClaim(key), store.ErrSessionSleeping, "claim of a crashed sleeping session")
	if slices.Contains(b.runnable(), key) {
		t.Fatalf("a sleeping session is runnable")
	}

	// A wake resumes it with the failed event first.
	woke, err := b.s.WakeSession(b.ctx, key)
	noErr(t, err, "WakeSession")
	wantActive(t, woke, "WakeSession result")
	if !slices.Contains(b.runnable(), key) {
		t.Fatalf("a woken session with a due event is not runnable")
	}
	d := b.next(b.claim(key, LongTTL))
	wantEq(t, d.Event.ID, ev.ID, "the failed event runs again first")
	wantEq(t, d.Attempt, 2, "Attempt")
}

func testCrashSleepExpire(t *testing.T, b *bundle) {
	key := b.sessionWith(store.CrashSleep)
	ev := b.message(key, "host lost")
	createdKey := b.sessionWith(store.CrashSleep)
	b.message(createdKey, "never sent")
	act := b.claim(key, SetupTTL)
	b.next(act)
	cAct := b.claim(createdKey, SetupTTL)
	_, err := b.tryNext(cAct, false, "")
	noErr(t, err, "NextDelivery without MarkSent")
	b.waitExpired(act, cAct)

	fr, err := b.s.ExpireActivation(b.ctx, store.ExpireActivationParams{Ref: act.Ref(), Backoff: time.Hour, MaxAttempts: 5})
	noErr(t, err, "ExpireActivation")
	wantEq(t, fr.EventID, ev.ID, "EventID")
	wantEq(t, fr.Attempts, 1, "Attempts")
	wantEq(t, fr.SessionStatus, store.SessionSleeping, "FailResult.SessionStatus")
	wantSleeping(t, b.getSession(key), "crash", "after an expired sent delivery under sleep")
	got := b.event(key, ev.ID)
	wantEq(t, got.Status, store.EventOpen, "event Status")
	if d := got.NextAttemptAt.Sub(got.AcceptedAt); d > time.Minute {
		t.Fatalf("NextAttemptAt is %v after acceptance, want no backoff under sleep", d)
	}
	wantIs(t, b.tryClaim(key), store.ErrSessionSleeping, "claim after the crash")

	// A created delivery is not the event's fault: no policy.
	fr, err = b.s.ExpireActivation(b.ctx, store.ExpireActivationParams{Ref: cAct.Ref(), Backoff: time.Hour, MaxAttempts: 5})
	noErr(t, err, "ExpireActivation of a created delivery")
	wantEq(t, fr.Attempts, 0, "uncounted Attempts")
	wantEq(t, fr.SessionStatus, store.SessionActive, "FailResult.SessionStatus of an uncounted expiry")
	wantActive(t, b.getSession(createdKey), "after an uncounted expiry under sleep")
}

func testCrashSleepDeadLetter(t *testing.T, b *bundle) {
	key := b.sessionWith(store.CrashSleep)
	ev := b.message(key, "poison")
	later := b.message(key, "later")
	fr := b.fail(b.next(b.claim(key, LongTTL)).Delivery.TurnRef(), true, 0, 1)
	wantEq(t, fr.DeadLettered, true, "DeadLettered")
	// The dead letter moves the session on: it does not sleep behind an
	// event that will not run again.
	wantEq(t, fr.SessionStatus, store.SessionActive, "SessionStatus")
	s := b.getSession(key)
	wantActive(t, s, "after a dead letter under sleep")
	wantEq(t, s.DeadLetters, int64(1), "DeadLetters")
	wantEq(t, s.OpenEvents, int64(1), "OpenEvents")
	wantEq(t, b.event(key, ev.ID).Status, store.EventDeadLetter, "event Status")
	d := b.next(b.claim(key, LongTTL))
	wantEq(t, d.Event.ID, later.ID, "the later event runs without a wake")
}

// testCrashSleepTiming pins the sleep policy's decision after a counted
// failure, through FailAttempt and ExpireActivation alike: a parked event is
// due at once (the wake is the trigger) and the session moves active →
// sleeping with reason "crash", its pending wait cleared; a failure that
// dead-letters the event is not parked, so the policy does not touch its
// timing: next_attempt_at = DB now + backoff, as under restart (docs/DESIGN.md
// "Failed attempt"), and the session stays active (pending kept).
func testCrashSleepTiming(t *testing.T, b *bundle) {
	// Parked: a pending session, failed counted with an hour of backoff.
	key := b.sessionWith(store.CrashSleep)
	ev := b.message(key, "boom")
	act := b.claim(key, LongTTL)
	ref := b.next(act).Delivery.TurnRef()
	noErr(t, b.s.SetPending(b.ctx, key, true), "SetPending")
	before := b.getSession(key)
	if before.PendingSince == nil {
		t.Fatalf("SetPending recorded no PendingSince")
	}
	fr := b.fail(ref, true, time.Hour, 5)
	wantEq(t, fr.SessionStatus, store.SessionSleeping, "FailResult.SessionStatus")
	s := b.getSession(key)
	wantSleeping(t, s, "crash", "a pending session after a counted failure under sleep")
	if s.PendingSince != nil {
		t.Fatalf("PendingSince = %v on a session the crash policy parked", s.PendingSince)
	}
	got := b.event(key, ev.ID)
	if d := got.NextAttemptAt.Sub(*s.SleepTS).Abs(); d > time.Minute {
		t.Fatalf("a parked event is due at once: NextAttemptAt %v is %v from SleepTS %v", got.NextAttemptAt, d, *s.SleepTS)
	}
	wantEq(t, got.NextAttemptAt.Sub(fr.NextAttemptAt).Abs() <= time.Millisecond, true, "FailResult.NextAttemptAt matches the event")

	// Dead-lettered by FailAttempt: the backoff stands, the session stays
	// active and still pending.
	dlKey := b.sessionWith(store.CrashSleep)
	dl := b.message(dlKey, "poison")
	dlRef := b.next(b.claim(dlKey, LongTTL)).Delivery.TurnRef()
	noErr(t, b.s.SetPending(b.ctx, dlKey, true), "SetPending")
	fr = b.fail(dlRef, true, time.Hour, 1)
	wantEq(t, fr.DeadLettered, true, "FailResult.DeadLettered")
	wantEq(t, fr.SessionStatus, store.SessionActive, "FailResult.SessionStatus of a dead letter under sleep")
	s = b.getSession(dlKey)
	wantActive(t, s, "after a dead letter under sleep")
	if s.PendingSince == nil {
		t.Fatalf("a dead letter under sleep cleared PendingSince: the session was not parked")
	}
	got = b.event(dlKey, dl.ID)
	wantEq(t, got.Status, store.EventDeadLetter, "event Status")
	if d := got.NextAttemptAt.Sub(got.AcceptedAt); d < 59*time.Minute {
		t.Fatalf("a dead letter under sleep keeps the backoff like restart: NextAttemptAt is %v after acceptance", d)
	}
	wantEq(t, got.NextAttemptAt.Sub(fr.NextAttemptAt).Abs() <= time.Millisecond, true, "FailResult.NextAttemptAt matches the dead letter")

	// Dead-lettered by the watchdog: the same.
	wKey := b.sessionWith(store.CrashSleep)
	wEv := b.message(wKey, "host lost, poison")
	wAct := b.claim(wKey, SetupTTL)
	b.next(wAct)
	b.waitExpired(wAct)
	fr, err := b.s.ExpireActivation(b.ctx, store.ExpireActivationParams{Ref: wAct.Ref(), Backoff: time.Hour, MaxAttempts: 1})
	noErr(t, err, "ExpireActivation")
	wantEq(t, fr.DeadLettered, true, "watchdog: DeadLettered")
	wantEq(t, fr.SessionStatus, store.SessionActive, "watchdog: SessionStatus")
	wantActive(t, b.getSession(wKey), "after a watchdog dead letter under sleep")
	got = b.event(wKey, wEv.ID)
	if d := got.NextAttemptAt.Sub(got.AcceptedAt); d < 59*time.Minute {
		t.Fatalf("watchdog: a dead letter under sleep keeps the backoff: NextAttemptAt is %v after acceptance", d)
	}
	wantEq(t, got.NextAttemptAt.Sub(fr.NextAttemptAt).Abs() <= time.Millisecond, true, "watchdog: FailResult.NextAttemptAt")
}

func testCrashDestroyFail(t *testing.T, b *bundle) {
	key := b.sessionWith(store.CrashDestroy)
	b.setAlarms(key, abi.AlarmOp{Name: "nudge", InMs: 3_600_000})
	ev := b.message(key, "fatal")
	later := b.message(key, "later")
	act := b.claim(key, LongTTL)
	ref := b.next(act).Delivery.TurnRef()
	fr := b.fail(ref, true, time.Hour, 5)
	wantEq(t, fr.SessionStatus, store.SessionDestroyed, "FailResult.SessionStatus")
	wantEq(t, fr.DeadLettered, false, "DeadLettered")
	s := b.getSession(key)
	wantEq(t, s.Status, store.SessionDestroyed, "Status")
	if s.DestroyTS == nil {
		t.Fatalf("a destroyed session has no DestroyTS")
	}
	wantEq(t, s.OpenEvents, int64(0), "OpenEvents")
	for _, id := range []int64{ev.ID, later.ID} {
		e := b.event(key, id)
		wantEq(t, e.Status, store.EventDiscarded, "event Status after destroy")
		if e.ClosedAt == nil {
			t.Fatalf("discarded event %d has no ClosedAt", id)
		}
	}
	wantEq(t, b.event(key, ev.ID).Attempts, 1, "the failed attempt is still counted")
	wantEq(t, len(b.alarms(key)), 0, "alarms of a destroyed session")
	_, _, err := b.s.AppendEvent(b.ctx, store.AppendEventParams{Key: key, Kind: abi.EventMessage, Payload: json.RawMessage(`{"message":"hello?"}`)})
	wantIs(t, err, store.ErrSessionDestroyed, "AppendEvent to a destroyed session")
	wantIs(t, b.tryClaim(key), store.ErrSessionDestroyed, "claim of a destroyed session")
	_, err = b.s.CommitTurn(b.ctx, store.CommitTurnParams{Ref: ref, Outcome: abi.OutcomeOK})
	wantFence(t, err, store.FenceStaleEpoch, "late reply after destroy")
}

func testCrashDestroyExpire(t *testing.T, b *bundle) {
	key := b.sessionWith(store.CrashDestroy)
	ev := b.message(key, "fatal")
	later := b.message(key, "later")
	act := b.claim(key, SetupTTL)
	b.next(act)
	b.waitExpired(act)
	fr, err := b.s.ExpireActivation(b.ctx, store.ExpireActivationParams{Ref: act.Ref(), MaxAttempts: 1})
	noErr(t, err, "ExpireActivation")
	wantEq(t, fr.DeadLettered, true, "dead lettered at MaxAttempts 1")
	wantEq(t, fr.SessionStatus, store.SessionDestroyed, "FailResult.SessionStatus")
	s := b.getSession(key)
	wantEq(t, s.Status, store.SessionDestroyed, "Status")
	wantEq(t, s.DeadLetters, int64(1), "DeadLetters")
	wantEq(t, b.event(key, ev.ID).Status, store.EventDeadLetter, "the dead letter stays a dead letter")
	wantEq(t, b.event(key, later.ID).Status, store.EventDiscarded, "later event discarded")
	dls, err := b.s.ListDeadLetters(b.ctx, store.ListDeadLettersParams{AgentUID: key.AgentUID, SessionID: key.SessionID})
	noErr(t, err, "ListDeadLetters")
	if len(dls) != 1 || dls[0].Event.ID != ev.ID {
		t.Fatalf("dead letters of the destroyed session = %+v, want event %d", dls, ev.ID)
	}
}

func testCrashUncounted(t *testing.T, b *bundle) {
	for _, policy := range []store.CrashPolicy{store.CrashSleep, store.CrashDestroy} {
		key := b.sessionWith(policy)
		ev := b.message(key, "transport trouble")
		act := b.claim(key, LongTTL)
		fr := b.fail(b.next(act).Delivery.TurnRef(), false, 0, 1)
		wantEq(t, fr.SessionStatus, store.SessionActive, string(policy)+": SessionStatus")
		wantActive(t, b.getSession(key), string(policy)+": after an uncounted failure")
		wantEq(t, b.event(key, ev.ID).Status, store.EventOpen, string(policy)+": event Status")
		// A delivery never sent, failed uncounted: the same.
		act = b.claim(key, LongTTL)
		d, err := b.tryNext(act, false, "")
		noErr(t, err, "NextDelivery without MarkSent")
		fr = b.fail(d.Delivery.TurnRef(), false, 0, 1)
		wantEq(t, fr.SessionStatus, store.SessionActive, string(policy)+": SessionStatus (created delivery)")
		wantActive(t, b.getSession(key), string(policy)+": after failing a created delivery")
		b.commit(b.next(b.claim(key, LongTTL)).Delivery.TurnRef(), "finally", "")
	}
}

func testDestroy(t *testing.T, b *bundle) {
	key := b.session()
	b.setAlarms(key, abi.AlarmOp{Name: "later", InMs: 3_600_000})
	first := b.message(key, "in flight")
	second := b.message(key, "queued")
	act := b.claim(key, LongTTL)
	ref := b.next(act).Delivery.TurnRef()
	other := b.session()
	b.message(other, "unaffected")

	s, err := b.s.DestroySession(b.ctx, key)
	noErr(t, err, "DestroySession")
	wantEq(t, s.Status, store.SessionDestroyed, "Status")
	if s.DestroyTS == nil {
		t.Fatalf("DestroySession returned no DestroyTS")
	}
	wantEq(t, s.OpenEvents, int64(0), "OpenEvents")
	for _, id := range []int64{first.ID, second.ID} {
		e := b.event(key, id)
		wantEq(t, e.Status, store.EventDiscarded, "event Status")
		if e.ClosedAt == nil {
			t.Fatalf("discarded event %d has no ClosedAt", id)
		}
	}
	wantEq(t, len(b.alarms(key)), 0, "alarms after destroy")
	turnsBefore := len(b.transcript(key))

	// The live activation failed: the reply in flight is fenced off.
	_, err = b.s.CommitTurn(b.ctx, store.CommitTurnParams{Ref: ref, Outcome: abi.OutcomeOK,
		Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "too late"}}})
	wantFence(t, err, store.FenceStaleEpoch, "commit after destroy")
	_, err = b.s.FailAttempt(b.ctx, store.FailAttemptParams{Ref: ref, Error: "x", Counted: true, MaxAttempts: 1})
	wantFence(t, err, store.FenceStaleEpoch, "FailAttempt after destroy")
	wantIs(t, b.s.StopActivation(b.ctx, act.Ref()), store.ErrNotLive, "StopActivation after destroy")
	_, err = b.s.InFlight(b.ctx, act.Ref())
	wantIs(t, err, store.ErrNotLive, "InFlight after destroy")
	wantEq(t, len(b.transcript(key)), turnsBefore, "turns after destroy")

	// Nothing is accepted any more.
	_, _, err = b.s.AppendEvent(b.ctx, store.AppendEventParams{Key: key, Kind: abi.EventMessage, Payload: json.RawMessage(`{"message":"hi"}`)})
	wantIs(t, err, store.ErrSessionDestroyed, "AppendEvent after destroy")
	_, err = b.s.Steer(b.ctx, store.SteerParams{Key: key, Payload: json.RawMessage(`{"message":"hi"}`), DeliveryID: uuid.NewString()})
	wantIs(t, err, store.ErrSessionDestroyed, "Steer after destroy")
	wantIs(t, b.tryClaim(key), store.ErrSessionDestroyed, "claim after destroy")
	_, err = b.s.WakeSession(b.ctx, key)
	wantIs(t, err, store.ErrSessionDestroyed, "WakeSession after destroy")
	_, err = b.s.SleepSession(b.ctx, store.SleepSessionParams{Key: key, Reason: "capacity"})
	wantIs(t, err, store.ErrSessionDestroyed, "SleepSession after destroy")
	if got := b.runnable(); slices.Contains(got, key) || !slices.Contains(got, other) {
		t.Fatalf("RunnableSessions = %v, want %v and not the destroyed %v", got, other, key)
	}
	_, err = b.s.CancelEvent(b.ctx, store.CancelEventParams{Key: key, EventID: second.ID, Reason: "x"})
	wantIs(t, err, store.ErrConflict, "CancelEvent of a discarded event")

	// Idempotent.
	before := b.snapshot(key)
	again, err := b.s.DestroySession(b.ctx, key)
	noErr(t, err, "second DestroySession")
	wantEq(t, again.Status, store.SessionDestroyed, "second Status")
	wantEq(t, again.DestroyTS.Equal(*s.DestroyTS), true, "second DestroySession keeps DestroyTS")
	b.sameSnapshot(key, before, "second DestroySession")

	_, err = b.s.DestroySession(b.ctx, store.ActorKey{AgentUID: b.agent.UID, SessionID: "missing"})
	wantIs(t, err, store.ErrNotFound, "DestroySession of an unknown session")
	wantActive(t, b.getSession(other), "another session")

	// Invariant 4: every event ended in one terminal status.
	for _, e := range b.events(key) {
		if e.Status == store.EventOpen {
			t.Fatalf("event %d still open after destroy", e.ID)
		}
	}
}

func testSleepingRefusesClaim(t *testing.T, b *bundle) {
	key := b.session()
	b.message(key, "waits")
	awake := b.session()
	b.message(awake, "runs")
	// Not a capacity reason: those stay runnable (invariant 11).
	s, err := b.s.SleepSession(b.ctx, store.SleepSessionParams{Key: key, Reason: "parked"})
	noErr(t, err, "SleepSession")
	wantSleeping(t, s, "parked", "SleepSession result")
	epoch := b.getSession(key).ActorEpoch

	before := b.snapshot(key)
	wantIs(t, b.tryClaim(key), store.ErrSessionSleeping, "claim of a sleeping session")
	b.sameSnapshot(key, before, "refused claim")
	wantEq(t, b.getSession(key).ActorEpoch, epoch, "a refused claim does not raise the epoch")
	got := b.runnable()
	if slices.Contains(got, key) || !slices.Contains(got, awake) {
		t.Fatalf("RunnableSessions = %v, want %v and not the sleeping %v", got, awake, key)
	}
}

func testAppendWakes(t *testing.T, b *bundle) {
	key := b.session()
	_, err := b.s.SleepSession(b.ctx, store.SleepSessionParams{Key: key, Reason: "pending timeout"})
	noErr(t, err, "SleepSession")
	ev := b.message(key, "wake up")
	s := b.getSession(key)
	wantActive(t, s, "after AppendEvent")
	if !slices.Contains(b.runnable(), key) {
		t.Fatalf("a woken session is not runnable")
	}
	wantEq(t, b.next(b.claim(key, LongTTL)).Event.ID, ev.ID, "the waking event runs")
}

func testWakeSession(t *testing.T, b *bundle) {
	key := b.session()
	s, err := b.s.WakeSession(b.ctx, key)
	noErr(t, err, "WakeSession of an active session")
	wantActive(t, s, "WakeSession of an active session")
	_, err = b.s.SleepSession(b.ctx, store.SleepSessionParams{Key: key, Reason: "capacity"})
	noErr(t, err, "SleepSession")
	s, err = b.s.WakeSession(b.ctx, key)
	noErr(t, err, "WakeSession")
	wantActive(t, s, "WakeSession result")
	wantActive(t, b.getSession(key), "after WakeSession")
	b.claim(key, LongTTL)
	_, err = b.s.WakeSession(b.ctx, store.ActorKey{AgentUID: b.agent.UID, SessionID: "missing"})
	wantIs(t, err, store.ErrNotFound, "WakeSession of an unknown session")
}

func testSleepSession(t *testing.T, b *bundle) {
	key := b.session()
	act := b.claim(key, LongTTL)
	_, err := b.s.SleepSession(b.ctx, store.SleepSessionParams{Key: key, Reason: "capacity"})
	wantIs(t, err, store.ErrActivationLive, "SleepSession with a live activation")
	wantActive(t, b.getSession(key), "after a refused SleepSession")
	noErr(t, b.s.StopActivation(b.ctx, act.Ref()), "StopActivation")

	s, err := b.s.SleepSession(b.ctx, store.SleepSessionParams{Key: key, Reason: "capacity"})
	noErr(t, err, "SleepSession")
	wantSleeping(t, s, "capacity", "SleepSession")
	again, err := b.s.SleepSession(b.ctx, store.SleepSessionParams{Key: key, Reason: "other"})
	noErr(t, err, "SleepSession of a sleeping session")
	wantSleeping(t, again, "capacity", "a second SleepSession changes nothing")
	wantEq(t, again.SleepTS.Equal(*s.SleepTS), true, "a second SleepSession keeps SleepTS")
	_, err = b.s.SleepSession(b.ctx, store.SleepSessionParams{Key: store.ActorKey{AgentUID: b.agent.UID, SessionID: "missing"}, Reason: "x"})
	wantIs(t, err, store.ErrNotFound, "SleepSession of an unknown session")
}

func testSetPending(t *testing.T, b *bundle) {
	key := b.session()
	if b.getSession(key).PendingSince != nil {
		t.Fatalf("a new session is pending")
	}
	noErr(t, b.s.SetPending(b.ctx, key, true), "SetPending(true)")
	first := b.getSession(key).PendingSince
	if first == nil {
		t.Fatalf("SetPending(true) left PendingSince nil")
	}
	noErr(t, b.s.SetPending(b.ctx, key, true), "second SetPending(true)")
	wantEq(t, b.getSession(key).PendingSince.Equal(*first), true, "PendingSince keeps the first wait")
	noErr(t, b.s.SetPending(b.ctx, key, false), "SetPending(false)")
	if p := b.getSession(key).PendingSince; p != nil {
		t.Fatalf("PendingSince = %v after SetPending(false)", p)
	}
	// Sleeping ends the wait.
	noErr(t, b.s.SetPending(b.ctx, key, true), "SetPending(true)")
	_, err := b.s.SleepSession(b.ctx, store.SleepSessionParams{Key: key, Reason: "pending timeout"})
	noErr(t, err, "SleepSession")
	s := b.getSession(key)
	wantSleeping(t, s, "pending timeout", "after the pending timeout")
	if s.PendingSince != nil {
		t.Fatalf("PendingSince = %v after SleepSession", s.PendingSince)
	}
	wantIs(t, b.s.SetPending(b.ctx, store.ActorKey{AgentUID: b.agent.UID, SessionID: "missing"}, true), store.ErrNotFound, "SetPending of an unknown session")
}

func testCommitOutcomeSleep(t *testing.T, b *bundle) {
	key := b.session()
	b.message(key, "bye for now")
	act := b.claim(key, LongTTL)
	_, err := b.s.CommitTurn(b.ctx, store.CommitTurnParams{Ref: b.next(act).Delivery.TurnRef(), Outcome: abi.OutcomeSleep,
		Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "zzz"}}})
	noErr(t, err, "CommitTurn sleep")
	wantSleeping(t, b.getSession(key), "agent", "after a sleep outcome with no open event")
	noErr(t, b.s.StopActivation(b.ctx, act.Ref()), "StopActivation of the sleeping session's activation")
	wantIs(t, b.tryClaim(key), store.ErrSessionSleeping, "claim after a sleep outcome")

	busy := b.session()
	b.message(busy, "first")
	b.message(busy, "second")
	a2 := b.claim(busy, LongTTL)
	_, err = b.s.CommitTurn(b.ctx, store.CommitTurnParams{Ref: b.next(a2).Delivery.TurnRef(), Outcome: abi.OutcomeSleep})
	noErr(t, err, "CommitTurn sleep with an open event left")
	wantActive(t, b.getSession(busy), "a sleep outcome with an open event left")

	// The next signal wakes the parked one.
	b.message(key, "back")
	wantActive(t, b.getSession(key), "after a signal")
	if !slices.Contains(b.runnable(), key) {
		t.Fatalf("the woken session is not runnable")
	}
}

func testCommitOutcomeFinish(t *testing.T, b *bundle) {
	key := b.session()
	b.message(key, "all done")
	act := b.claim(key, LongTTL)
	_, err := b.s.CommitTurn(b.ctx, store.CommitTurnParams{Ref: b.next(act).Delivery.TurnRef(), Outcome: abi.OutcomeFinish})
	noErr(t, err, "CommitTurn finish")
	wantSleeping(t, b.getSession(key), store.SleepReasonFinish, "after a finish outcome with no open event")
	noErr(t, b.s.StopActivation(b.ctx, act.Ref()), "StopActivation of the finished session's activation")
	wantIs(t, b.tryClaim(key), store.ErrSessionSleeping, "claim after a finish outcome")
	if slices.Contains(b.runnable(), key) {
		t.Fatalf("a finished session with nothing open is runnable")
	}

	// Events already queued still run (invariant 11): the session stays
	// active until they are done.
	busy := b.session()
	b.message(busy, "first")
	second := b.message(busy, "second")
	a2 := b.claim(busy, LongTTL)
	_, err = b.s.CommitTurn(b.ctx, store.CommitTurnParams{Ref: b.next(a2).Delivery.TurnRef(), Outcome: abi.OutcomeFinish})
	noErr(t, err, "CommitTurn finish with an open event left")
	wantActive(t, b.getSession(busy), "a finish outcome with an open event left")
	wantEq(t, b.next(a2).Event.ID, second.ID, "the queued event runs after finish")

	// Finish does not destroy: the next signal wakes the session.
	ev := b.message(key, "one more thing")
	wantActive(t, b.getSession(key), "after a signal")
	wantEq(t, b.next(b.claim(key, LongTTL)).Event.ID, ev.ID, "the waking event runs")
}

// testCapacitySleeperRunnable is docs/DESIGN.md invariant 11 at the store: a
// session put to sleep only for lack of capacity that holds a due open
// event is listed by RunnableSessions (so a host with a free slot wakes
// and runs it); asleep for another reason, or with nothing due, it is not.
func testCapacitySleeperRunnable(t *testing.T, b *bundle) {
	park := func(reason string, signal bool) store.ActorKey {
		t.Helper()
		key := b.session()
		if signal {
			b.message(key, "accepted")
		}
		_, err := b.s.SleepSession(b.ctx, store.SleepSessionParams{Key: key, Reason: reason})
		noErr(t, err, "SleepSession "+reason)
		wantSleeping(t, b.getSession(key), reason, "parked for "+reason)
		return key
	}
	capacity := park(store.SleepReasonCapacity, true)
	pending := park(store.SleepReasonPendingTimeout, true)
	crashed := park(store.SleepReasonCrash, true)
	idle := park(store.SleepReasonPendingTimeout, false)
	got := b.runnable()
	for _, k := range []store.ActorKey{capacity, pending} {
		if !slices.Contains(got, k) {
			t.Fatalf("RunnableSessions = %v: a session asleep for capacity with a due event (%v) is missing", got, k)
		}
	}
	for _, k := range []store.ActorKey{crashed, idle} {
		if slices.Contains(got, k) {
			t.Fatalf("RunnableSessions = %v: lists %v (asleep by the crash policy, or with nothing open)", got, k)
		}
	}
	for _, k := range []store.ActorKey{capacity, pending} {
		if !store.WaitsForCapacity(b.getSession(k)) {
			t.Fatalf("WaitsForCapacity(%v) = false", k)
		}
	}
	// The host wakes it when it has a slot; then it claims and runs as usual,
	// and with a live activation it is no longer listed.
	_, err := b.s.WakeSession(b.ctx, pending)
	noErr(t, err, "WakeSession")
	act := b.claim(pending, LongTTL)
	if slices.Contains(b.runnable(), pending) {
		t.Fatalf("a session with a live activation is runnable")
	}
	b.commit(b.next(act).Delivery.TurnRef(), "ran", "")
}

// testClaimWakesCapacitySleeper: a claim with WakeForCapacity wakes and
// claims, in one transaction, a session asleep only for lack of capacity;
// a session asleep for another reason — the crash policy's sleep, which a
// capacity sleeper can become between the scan and the claim — is refused
// and stays asleep with its reason and epoch (docs/DESIGN.md invariant 11).
// Without WakeForCapacity a capacity sleeper is refused as before.
func testClaimWakesCapacitySleeper(t *testing.T, b *bundle) {
	park := func(reason string) store.ActorKey {
		t.Helper()
		key := b.session()
		b.message(key, "accepted")
		_, err := b.s.SleepSession(b.ctx, store.SleepSessionParams{Key: key, Reason: reason})
		noErr(t, err, "SleepSession "+reason)
		return key
	}
	claim := func(key store.ActorKey, wake bool) (store.Activation, error) {
		return b.s.ClaimActivation(b.ctx, store.ClaimActivationParams{
			Key: key, UID: uuid.NewString(), LeaseID: uuid.NewString(), HostID: b.host, LeaseTTL: LongTTL,
			WakeForCapacity: wake,
		})
	}

	// Asleep for capacity when the scan listed it, then woken, run and
	// slept by the crash policy before this host's claim: refused.
	crashed := park(store.SleepReasonCapacity)
	_, err := b.s.WakeSession(b.ctx, crashed)
	noErr(t, err, "WakeSession")
	_, err = b.s.SleepSession(b.ctx, store.SleepSessionParams{Key: crashed, Reason: store.SleepReasonCrash})
	noErr(t, err, "SleepSession crash")
	before := b.getSession(crashed)
	_, err = claim(crashed, true)
	wantIs(t, err, store.ErrSessionSleeping, "claim with WakeForCapacity of a crash-slept session")
	after := b.getSession(crashed)
	wantSleeping(t, after, store.SleepReasonCrash, "the crash-slept session after the claim")
	wantEq(t, after.ActorEpoch, before.ActorEpoch, "the crash-slept session's epoch")

	for _, reason := range []string{store.SleepReasonAgent, store.SleepReasonFinish} {
		key := park(reason)
		_, err = claim(key, true)
		wantIs(t, err, store.ErrSessionSleeping, "claim with WakeForCapacity of a session asleep for "+reason)
		wantSleeping(t, b.getSession(key), reason, "asleep for "+reason+" after the claim")
	}

	for _, reason := range store.CapacitySleepReasons() {
		key := park(reason)
		before := b.getSession(key)
		_, err = claim(key, false)
		wantIs(t, err, store.ErrSessionSleeping, "claim without WakeForCapacity of a session asleep for "+reason)
		wantSleeping(t, b.getSession(key), reason, "asleep for "+reason+" after a plain claim")

		act, err := claim(key, true)
		noErr(t, err, "claim with WakeForCapacity of a session asleep for "+reason)
		got := b.getSession(key)
		wantActive(t, got, "woken by the claim ("+reason+")")
		wantEq(t, act.ActorEpoch, before.ActorEpoch+1, "the claim's epoch")
		wantEq(t, got.ActorEpoch, act.ActorEpoch, "the session's epoch after the claim")
		b.commit(b.next(act).Delivery.TurnRef(), "ran", "")
	}

	// An active session claims as usual with the flag set.
	active := b.session()
	b.message(active, "m")
	act, err := claim(active, true)
	noErr(t, err, "claim with WakeForCapacity of an active session")
	b.commit(b.next(act).Delivery.TurnRef(), "ran", "")
}

// testRunnableSkipsAgents: RunnableSessions leaves out every session of
// p.SkipAgents — those of a pool the caller cannot run — so that they
// cannot fill its page ahead of sessions it can run.
func testRunnableSkipsAgents(t *testing.T, b *bundle) {
	other := b.newAgent("skip-"+uuid.NewString()[:8], b.agent.ModuleDigest, store.CrashRestart)
	var skipped []store.ActorKey
	for range 3 {
		k := b.sessionOf(other.UID, store.CrashRestart)
		b.message(k, "can't run here")
		skipped = append(skipped, k)
	}
	runnable := b.session()
	b.message(runnable, "runs here")

	all := b.runnable()
	for _, k := range append(skipped, runnable) {
		if !slices.Contains(all, k) {
			t.Fatalf("RunnableSessions = %v: %v is missing", all, k)
		}
	}
	got, err := b.s.RunnableSessions(b.ctx, store.RunnableSessionsParams{Limit: 1000, SkipAgents: []string{other.UID}})
	noErr(t, err, "RunnableSessions with SkipAgents")
	if !slices.Contains(got, runnable) {
		t.Fatalf("RunnableSessions(SkipAgents) = %v: %v is missing", got, runnable)
	}
	for _, k := range got {
		if k.AgentUID == other.UID {
			t.Fatalf("RunnableSessions(SkipAgents) = %v: lists %v of a skipped agent", got, k)
		}
	}
	for _, k := range append(skipped, runnable) {
		act := b.claim(k, LongTTL)
		b.commit(b.next(act).Delivery.TurnRef(), "ran", "")
	}
}
