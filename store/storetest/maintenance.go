package storetest

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

func maintenanceCases() []testCase {
	return []testCase{
		{"ExpireActivation/CountsAnAttemptOnlyForASentDelivery", testExpire},
		{"RunnableSessions/DueOldestEventNoLiveActivationOldestDueFirst", testRunnable},
		{"PeekSession/TheRowAndWhetherAnyEventIsOpenWithoutCountingAndTheAgent", testPeekSession},
	}
}

// testPeekSession: PeekSession answers the session's row (the counters
// left at 0), whether any event is open, before, during and after a turn,
// and the session's agent (as GetAgent reads it, updates included); an
// unknown session is ErrNotFound.
func testPeekSession(t *testing.T, b *bundle) {
	key := b.session()
	p, err := b.s.PeekSession(b.ctx, key)
	noErr(t, err, "PeekSession of a new session")
	wantEq(t, p.AnyOpen, false, "AnyOpen with no event")
	wantEq(t, p.Session.ActorKey, key, "Session key")
	ag, err := b.s.GetAgent(b.ctx, store.AnyNamespace, key.AgentUID)
	noErr(t, err, "GetAgent")
	wantEq(t, p.Agent, ag, "Agent: the session's, as GetAgent reads it")
	b.message(key, "one")
	b.message(key, "two")
	p, err = b.s.PeekSession(b.ctx, key)
	noErr(t, err, "PeekSession with two events")
	wantEq(t, p.AnyOpen, true, "AnyOpen with two open events")
	wantEq(t, p.Session.OpenEvents, int64(0), "OpenEvents is not counted")
	wantEq(t, p.Session.EventCount, int64(2), "EventCount")
	act := b.claim(key, LongTTL)
	b.commit(b.next(act).Delivery.TurnRef(), "1", "")
	b.commit(b.next(act).Delivery.TurnRef(), "2", "")
	p, err = b.s.PeekSession(b.ctx, key)
	noErr(t, err, "PeekSession after both turns")
	wantEq(t, p.AnyOpen, false, "AnyOpen once both committed")
	wantEq(t, p.Session.TurnCount, int64(2), "TurnCount")
	// An agent updated: the peek reads it as it is now.
	v1, v2 := b.module("peek v1"), b.module("peek v2")
	a := b.newAgent("peek-"+uuid.NewString()[:8], v1.Digest, store.CrashRestart)
	other := b.sessionOf(a.UID, store.CrashRestart)
	_, err = b.s.CreateAgent(b.ctx, store.CreateAgentParams{UID: a.UID, Name: a.Name, ModuleDigest: v2.Digest,
		CrashPolicy: store.CrashRestart, Upsert: true})
	noErr(t, err, "update the agent")
	p, err = b.s.PeekSession(b.ctx, other)
	noErr(t, err, "PeekSession after the agent's update")
	wantEq(t, p.Agent.UID, a.UID, "Agent")
	wantEq(t, p.Agent.ModuleDigest, v2.Digest, "Agent's module after the update")
	_, err = b.s.PeekSession(b.ctx, store.ActorKey{AgentUID: key.AgentUID, SessionID: "no-such-session"})
	wantIs(t, err, store.ErrNotFound, "PeekSession of an unknown session")
}

func testExpire(t *testing.T, b *bundle) {
	sentKey, createdKey, deadKey, idleKey, liveKey := b.session(), b.session(), b.session(), b.session(), b.session()
	sentEv := b.message(sentKey, "sent")
	createdEv := b.message(createdKey, "created")
	deadEv := b.message(deadKey, "dead")
	b.message(liveKey, "live")

	sentAct := b.claim(sentKey, SetupTTL)
	sentRef := b.next(sentAct).Delivery.TurnRef()
	createdAct := b.claim(createdKey, SetupTTL)
	d, err := b.tryNext(createdAct, false, "")
	noErr(t, err, "NextDelivery without MarkSent")
	createdRef := d.Delivery.TurnRef()
	deadAct := b.claim(deadKey, SetupTTL)
	b.next(deadAct)
	idleAct := b.claim(idleKey, SetupTTL)
	liveAct := b.claim(liveKey, LongTTL)
	b.next(liveAct)

	_, err = b.s.ExpireActivation(b.ctx, store.ExpireActivationParams{Ref: liveAct.Ref(), MaxAttempts: 5})
	wantIs(t, err, store.ErrNotLive, "ExpireActivation of an unexpired lease")

	b.waitExpired(sentAct, createdAct, deadAct, idleAct)
	expired, err := b.s.ExpiredActivations(b.ctx, 100)
	noErr(t, err, "ExpiredActivations")
	if slices.Contains(expired, liveAct.Ref()) {
		t.Fatalf("an unexpired activation is listed as expired")
	}
	limited, err := b.s.ExpiredActivations(b.ctx, 2)
	noErr(t, err, "ExpiredActivations limit 2")
	wantEq(t, len(limited), 2, "ExpiredActivations limit")

	wrong := sentAct.Ref()
	wrong.LeaseID = "another lease"
	_, err = b.s.ExpireActivation(b.ctx, store.ExpireActivationParams{Ref: wrong, MaxAttempts: 5})
	wantIs(t, err, store.ErrNotLive, "ExpireActivation with another lease id")

	fr, err := b.s.ExpireActivation(b.ctx, store.ExpireActivationParams{Ref: sentAct.Ref(), MaxAttempts: 5})
	noErr(t, err, "ExpireActivation of a sent delivery")
	wantEq(t, fr.EventID, sentEv.ID, "EventID")
	wantEq(t, fr.Attempts, 1, "a sent delivery counts an attempt")
	wantEq(t, fr.DeadLettered, false, "DeadLettered")
	ev := b.event(sentKey, sentEv.ID)
	wantEq(t, ev.Attempts, 1, "sent event Attempts")
	wantEq(t, ev.Status, store.EventOpen, "sent event Status")
	if ev.LastError == "" {
		t.Fatalf("expired attempt left no LastError")
	}

	fr, err = b.s.ExpireActivation(b.ctx, store.ExpireActivationParams{Ref: createdAct.Ref(), MaxAttempts: 1})
	noErr(t, err, "ExpireActivation of a created delivery")
	wantEq(t, fr.EventID, createdEv.ID, "EventID")
	wantEq(t, fr.Attempts, 0, "a created delivery counts no attempt")
	wantEq(t, fr.DeadLettered, false, "an uncounted expiry never dead letters")
	wantEq(t, b.event(createdKey, createdEv.ID).Attempts, 0, "created event Attempts")
	// Its delivery is no longer created: the host may not send it now.
	wantFence(t, b.s.MarkDeliverySent(b.ctx, createdRef), store.FenceSupersededDelivery, "MarkDeliverySent after expiry")

	fr, err = b.s.ExpireActivation(b.ctx, store.ExpireActivationParams{Ref: deadAct.Ref(), MaxAttempts: 1})
	noErr(t, err, "ExpireActivation at MaxAttempts")
	wantEq(t, fr.EventID, deadEv.ID, "EventID")
	wantEq(t, fr.DeadLettered, true, "an expiry at MaxAttempts dead letters")
	wantEq(t, b.event(deadKey, deadEv.ID).Status, store.EventDeadLetter, "dead event Status")

	fr, err = b.s.ExpireActivation(b.ctx, store.ExpireActivationParams{Ref: idleAct.Ref(), MaxAttempts: 1})
	noErr(t, err, "ExpireActivation of an idle activation")
	wantEq(t, fr.EventID, int64(0), "idle activation EventID")

	for _, a := range []store.Activation{sentAct, createdAct, deadAct, idleAct} {
		_, err = b.s.ExpireActivation(b.ctx, store.ExpireActivationParams{Ref: a.Ref(), MaxAttempts: 5})
		wantIs(t, err, store.ErrNotLive, "second ExpireActivation")
	}
	expired, err = b.s.ExpiredActivations(b.ctx, 100)
	noErr(t, err, "ExpiredActivations after expiry")
	wantEq(t, len(expired), 0, "expired activations left")

	// The late reply of the sent delivery cannot commit; the retry runs as
	// attempt 2 under a higher epoch; the uncounted one as attempt 1.
	_, err = b.s.CommitTurn(b.ctx, store.CommitTurnParams{Ref: sentRef, Outcome: abi.OutcomeOK})
	wantFence(t, err, store.FenceStaleEpoch, "late reply after expiry")
	retry := b.next(b.claim(sentKey, LongTTL))
	wantEq(t, retry.Event.ID, sentEv.ID, "retried event")
	wantEq(t, retry.Attempt, 2, "retry attempt after an expired sent delivery")
	if retry.Delivery.ActorEpoch <= sentRef.ActorEpoch {
		t.Fatalf("retry epoch %d not above %d", retry.Delivery.ActorEpoch, sentRef.ActorEpoch)
	}
	again := b.next(b.claim(createdKey, LongTTL))
	wantEq(t, again.Event.ID, createdEv.ID, "re-delivered event")
	wantEq(t, again.Attempt, 1, "attempt after an expired created delivery")
}

func testRunnable(t *testing.T, b *bundle) {
	due1 := b.session()
	b.message(due1, "due first")
	empty := b.session()
	running := b.session()
	b.message(running, "running")
	b.claim(running, LongTTL)
	backoff := b.session()
	b.message(backoff, "backing off")
	b.message(backoff, "due but behind a backing-off event")
	a := b.claim(backoff, LongTTL)
	b.fail(b.next(a).Delivery.TurnRef(), true, time.Hour, 5)
	finished := b.session()
	b.message(finished, "finished")
	a = b.claim(finished, LongTTL)
	b.commit(b.next(a).Delivery.TurnRef(), "ok", "")
	noErr(t, b.s.StopActivation(b.ctx, a.Ref()), "StopActivation")
	due2 := b.session()
	b.message(due2, "due second")
	retried := b.session() // uncounted failure: due again at once
	b.message(retried, "retry now")
	a = b.claim(retried, LongTTL)
	b.fail(b.next(a).Delivery.TurnRef(), false, 0, 5)

	got, err := b.s.RunnableSessions(b.ctx, store.RunnableSessionsParams{Limit: 100})
	noErr(t, err, "RunnableSessions")
	want := []store.ActorKey{due1, due2, retried}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("RunnableSessions = %v\nwant %v (not: empty %v, running %v, backoff %v, finished %v)",
			got, want, empty, running, backoff, finished)
	}
	got, err = b.s.RunnableSessions(b.ctx, store.RunnableSessionsParams{Limit: 1})
	noErr(t, err, "RunnableSessions limit 1")
	if len(got) != 1 || got[0] != due1 {
		t.Fatalf("RunnableSessions(1) = %v, want [%v]", got, due1)
	}
	// Claiming makes it not runnable.
	b.claim(due1, LongTTL)
	got, err = b.s.RunnableSessions(b.ctx, store.RunnableSessionsParams{Limit: 100})
	noErr(t, err, "RunnableSessions after a claim")
	if slices.Contains(got, due1) {
		t.Fatalf("a session with a live activation is runnable")
	}
}
