package storetest

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/store"
)

func deadLetterCases() []testCase {
	return []testCase{
		{"DeadLetters/ErrorChainHasARowForEveryFailedAttempt", testErrorChain},
		{"DeadLetters/ListPerAgentAndPerSessionWithChains", testListDeadLetters},
		{"DeadLetters/RedriveReopensUnderANewEpochAndRunsAgain", testRedrive},
		{"DeadLetters/DiscardClosesTheDeadLetter", testDiscard},
		{"DeadLetters/RedriveOrDiscardOfANonDeadLetterIsConflict", testRedriveConflict},
		{"DeadLetters/BlockPolicyHoldsLaterEventsContinuePolicyRunsThem", testDeadLetterBlock},
	}
}

// deadLetter appends an event and fails it counted until it is dead
// lettered after attempts attempts; it returns the event.
func (b *bundle) deadLetter(key store.ActorKey, text string, attempts int) store.Event {
	b.t.Helper()
	ev := b.message(key, text)
	for i := 1; i <= attempts; i++ {
		d := b.next(b.claim(key, LongTTL))
		if d.Event.ID != ev.ID {
			b.t.Fatalf("deadLetter: delivered event %d, want %d", d.Event.ID, ev.ID)
		}
		fr, err := b.s.FailAttempt(b.ctx, store.FailAttemptParams{
			Ref: d.Delivery.TurnRef(), Error: fmt.Sprintf("%s: crash %d", text, i), Counted: true, MaxAttempts: attempts,
		})
		noErr(b.t, err, "FailAttempt")
		wantEq(b.t, fr.DeadLettered, i == attempts, fmt.Sprintf("dead lettered after attempt %d", i))
	}
	return b.event(key, ev.ID)
}

func wantChainEntry(t testing.TB, e store.AttemptError, eventID int64, attempt int, epoch int64, counted bool, msg, what string) {
	t.Helper()
	wantEq(t, e.EventID, eventID, what+": EventID")
	wantEq(t, e.Attempt, attempt, what+": Attempt")
	wantEq(t, e.ActorEpoch, epoch, what+": ActorEpoch")
	wantEq(t, e.Counted, counted, what+": Counted")
	if msg != "" {
		wantEq(t, e.Error, msg, what+": Error")
	} else if e.Error == "" {
		t.Fatalf("%s: empty Error", what)
	}
	if e.FailedAt.IsZero() {
		t.Fatalf("%s: FailedAt is zero", what)
	}
}

func testErrorChain(t *testing.T, b *bundle) {
	key := b.session()
	ev := b.message(key, "troubled")
	fail := func(counted bool, msg string, maxAttempts int) (store.Activation, store.FailResult) {
		t.Helper()
		a := b.claim(key, LongTTL)
		d, err := b.tryNext(a, counted, "")
		noErr(t, err, "NextDelivery")
		fr, err := b.s.FailAttempt(b.ctx, store.FailAttemptParams{Ref: d.Delivery.TurnRef(), Error: msg, Counted: counted, MaxAttempts: maxAttempts})
		noErr(t, err, "FailAttempt")
		return a, fr
	}
	a1, _ := fail(false, "no route", 3)
	a2, _ := fail(true, "crash A", 3)
	// An expired sent delivery counts; an expired created one does not.
	a3 := b.claim(key, SetupTTL)
	b.next(a3)
	b.waitExpired(a3)
	_, err := b.s.ExpireActivation(b.ctx, store.ExpireActivationParams{Ref: a3.Ref(), MaxAttempts: 3})
	noErr(t, err, "ExpireActivation of a sent delivery")
	a4 := b.claim(key, SetupTTL)
	_, err = b.tryNext(a4, false, "")
	noErr(t, err, "NextDelivery without MarkSent")
	b.waitExpired(a4)
	_, err = b.s.ExpireActivation(b.ctx, store.ExpireActivationParams{Ref: a4.Ref(), MaxAttempts: 3})
	noErr(t, err, "ExpireActivation of a created delivery")
	a5, fr := fail(true, "crash B", 3)
	wantEq(t, fr.DeadLettered, true, "dead lettered at the third counted attempt")

	chain, err := b.s.EventErrors(b.ctx, key, ev.ID)
	noErr(t, err, "EventErrors")
	if len(chain) != 5 {
		t.Fatalf("error chain has %d entries, want 5: %+v", len(chain), chain)
	}
	wantChainEntry(t, chain[0], ev.ID, 0, a1.ActorEpoch, false, "no route", "uncounted failure")
	wantChainEntry(t, chain[1], ev.ID, 1, a2.ActorEpoch, true, "crash A", "first counted failure")
	wantChainEntry(t, chain[2], ev.ID, 2, a3.ActorEpoch, true, "", "expired sent delivery")
	wantChainEntry(t, chain[3], ev.ID, 2, a4.ActorEpoch, false, "", "expired created delivery")
	wantChainEntry(t, chain[4], ev.ID, 3, a5.ActorEpoch, true, "crash B", "dead-lettering failure")
	for i := 1; i < len(chain); i++ {
		if chain[i].FailedAt.Before(chain[i-1].FailedAt) {
			t.Fatalf("chain not in order: %+v", chain)
		}
	}
	wantEq(t, b.event(key, ev.ID).LastError, "crash B", "LastError is the last entry")

	dls, err := b.s.ListDeadLetters(b.ctx, store.ListDeadLettersParams{AgentUID: key.AgentUID})
	noErr(t, err, "ListDeadLetters")
	if len(dls) != 1 || fmt.Sprint(dls[0].Errors) != fmt.Sprint(chain) {
		t.Fatalf("ListDeadLetters = %+v, want the event with chain %+v", dls, chain)
	}

	// No failures: an empty chain. Unknown event: not found.
	clean := b.message(key, "clean")
	chain, err = b.s.EventErrors(b.ctx, key, clean.ID)
	noErr(t, err, "EventErrors of a clean event")
	wantEq(t, len(chain), 0, "chain of a clean event")
	_, err = b.s.EventErrors(b.ctx, key, clean.ID+1000)
	wantIs(t, err, store.ErrNotFound, "EventErrors of an unknown event")
	_, err = b.s.EventErrors(b.ctx, b.session(), ev.ID)
	wantIs(t, err, store.ErrNotFound, "EventErrors of another session's event")
}

func testListDeadLetters(t *testing.T, b *bundle) {
	s1, s2 := b.session(), b.session()
	otherAgent := b.newAgent("other-"+uuid.NewString()[:8], b.agent.ModuleDigest, store.CrashRestart)
	s3 := b.sessionOf(otherAgent.UID, store.CrashRestart)

	d1 := b.deadLetter(s1, "s1-a", 2)
	d2 := b.deadLetter(s2, "s2-a", 1)
	d3 := b.deadLetter(s1, "s1-b", 1)
	d4 := b.deadLetter(s3, "s3-a", 1)
	b.message(s1, "healthy") // open events are not dead letters

	ids := func(dls []store.DeadLetter) []int64 {
		var out []int64
		for _, d := range dls {
			out = append(out, d.Event.ID)
		}
		return out
	}
	all, err := b.s.ListDeadLetters(b.ctx, store.ListDeadLettersParams{AgentUID: b.agent.UID})
	noErr(t, err, "ListDeadLetters of the agent")
	wantEq(t, fmt.Sprint(ids(all)), fmt.Sprint([]int64{d1.ID, d2.ID, d3.ID}), "agent dead letters by event id")
	for _, d := range all {
		wantEq(t, d.Event.Status, store.EventDeadLetter, "listed Status")
	}
	wantEq(t, all[0].Event.ActorKey, s1, "dead letter key")
	wantEq(t, all[0].Event.LastError, "s1-a: crash 2", "dead letter LastError")
	if len(all[0].Errors) != 2 || all[0].Errors[0].Error != "s1-a: crash 1" || all[0].Errors[1].Error != "s1-a: crash 2" ||
		all[0].Errors[1].Attempt != 2 {
		t.Fatalf("chain of %d = %+v", d1.ID, all[0].Errors)
	}
	if len(all[1].Errors) != 1 || all[1].Errors[0].Error != "s2-a: crash 1" {
		t.Fatalf("chain of %d = %+v", d2.ID, all[1].Errors)
	}

	one, err := b.s.ListDeadLetters(b.ctx, store.ListDeadLettersParams{AgentUID: b.agent.UID, SessionID: s1.SessionID})
	noErr(t, err, "ListDeadLetters of a session")
	wantEq(t, fmt.Sprint(ids(one)), fmt.Sprint([]int64{d1.ID, d3.ID}), "session dead letters")
	other, err := b.s.ListDeadLetters(b.ctx, store.ListDeadLettersParams{AgentUID: otherAgent.UID})
	noErr(t, err, "ListDeadLetters of the other agent")
	wantEq(t, fmt.Sprint(ids(other)), fmt.Sprint([]int64{d4.ID}), "other agent's dead letters")

	var paged []int64
	after := int64(0)
	for range 10 {
		page, err := b.s.ListDeadLetters(b.ctx, store.ListDeadLettersParams{AgentUID: b.agent.UID, After: after, Limit: 2})
		noErr(t, err, "ListDeadLetters page")
		if len(page) == 0 {
			break
		}
		if len(page) > 2 {
			t.Fatalf("page of %d with limit 2", len(page))
		}
		paged = append(paged, ids(page)...)
		after = page[len(page)-1].Event.ID
	}
	wantEq(t, fmt.Sprint(paged), fmt.Sprint(ids(all)), "paged dead letters")

	wantEq(t, b.getSession(s1).DeadLetters, int64(2), "s1 DeadLetters")
	wantEq(t, b.getSession(s2).DeadLetters, int64(1), "s2 DeadLetters")
	list, err := b.s.ListSessions(b.ctx, store.ListSessionsParams{AgentUID: b.agent.UID})
	noErr(t, err, "ListSessions")
	for _, s := range list {
		if s.ActorKey == s1 {
			wantEq(t, s.DeadLetters, int64(2), "ListSessions DeadLetters")
		}
	}
}

func testRedrive(t *testing.T, b *bundle) {
	key := b.session()
	dl := b.deadLetter(key, "poison", 2)
	before := b.getSession(key)
	wantEq(t, before.DeadLetters, int64(1), "DeadLetters")

	ev, err := b.s.RedriveEvent(b.ctx, key, dl.ID)
	noErr(t, err, "RedriveEvent")
	wantEq(t, ev.ID, dl.ID, "ID")
	wantEq(t, ev.Status, store.EventOpen, "Status")
	wantEq(t, ev.Attempts, 0, "Attempts")
	wantEq(t, ev.Redrives, 1, "Redrives")
	wantEq(t, ev.LastError, "poison: crash 2", "LastError is kept")
	if ev.ClosedAt != nil {
		t.Fatalf("a redriven event has ClosedAt %v", ev.ClosedAt)
	}
	wantEq(t, fmt.Sprint(b.event(key, dl.ID)), fmt.Sprint(ev), "listed event after redrive")
	after := b.getSession(key)
	if after.ActorEpoch <= before.ActorEpoch {
		t.Fatalf("epoch after redrive %d, not above %d", after.ActorEpoch, before.ActorEpoch)
	}
	wantEq(t, after.DeadLetters, int64(0), "DeadLetters after redrive")
	wantEq(t, after.OpenEvents, int64(1), "OpenEvents after redrive")
	if !slices.Contains(b.runnable(), key) {
		t.Fatalf("a redriven event's session is not runnable")
	}

	act := b.claim(key, LongTTL)
	if act.ActorEpoch <= after.ActorEpoch {
		t.Fatalf("claim epoch %d not above the redrive epoch %d", act.ActorEpoch, after.ActorEpoch)
	}
	d := b.next(act)
	wantEq(t, d.Event.ID, dl.ID, "the redriven event runs")
	wantEq(t, d.Attempt, 1, "Attempt after redrive")
	wantEq(t, d.Event.Redrives, 1, "Dispatch Event.Redrives")
	b.commit(d.Delivery.TurnRef(), "fixed", "")
	wantEq(t, b.event(key, dl.ID).Status, store.EventDone, "Status after the retry committed")
	// The chain keeps the earlier failures.
	chain, err := b.s.EventErrors(b.ctx, key, dl.ID)
	noErr(t, err, "EventErrors")
	wantEq(t, len(chain), 2, "chain after redrive")

	// Fail again after a redrive: attempts start from 0 again.
	key2 := b.session()
	dl2 := b.deadLetter(key2, "again", 1)
	_, err = b.s.RedriveEvent(b.ctx, key2, dl2.ID)
	noErr(t, err, "RedriveEvent")
	fr := b.fail(b.next(b.claim(key2, LongTTL)).Delivery.TurnRef(), true, 0, 1)
	wantEq(t, fr.Attempts, 1, "attempts after a redrive")
	wantEq(t, fr.DeadLettered, true, "dead lettered again")
	chain, err = b.s.EventErrors(b.ctx, key2, dl2.ID)
	noErr(t, err, "EventErrors")
	if len(chain) != 2 || chain[0].Attempt != 1 || chain[1].Attempt != 1 {
		t.Fatalf("chain after a redrive and a failure = %+v", chain)
	}
	wantEq(t, b.event(key2, dl2.ID).Redrives, 1, "Redrives")

	// Redrive wakes a session that crashed to sleep.
	sleepy := b.sessionWith(store.CrashSleep)
	dl3 := b.deadLetter(sleepy, "sleepy", 1)
	_, err = b.s.SleepSession(b.ctx, store.SleepSessionParams{Key: sleepy, Reason: "capacity"})
	noErr(t, err, "SleepSession")
	wantSleeping(t, b.getSession(sleepy), "capacity", "put to sleep")
	_, err = b.s.RedriveEvent(b.ctx, sleepy, dl3.ID)
	noErr(t, err, "RedriveEvent of a sleeping session")
	wantActive(t, b.getSession(sleepy), "after RedriveEvent")
	wantEq(t, b.next(b.claim(sleepy, LongTTL)).Event.ID, dl3.ID, "the redriven event runs")

	// A destroyed session's dead letter cannot be redriven, but can be discarded.
	gone := b.sessionWith(store.CrashDestroy)
	dl4 := b.deadLetter(gone, "fatal", 1)
	wantEq(t, b.getSession(gone).Status, store.SessionDestroyed, "destroy policy")
	_, err = b.s.RedriveEvent(b.ctx, gone, dl4.ID)
	wantIs(t, err, store.ErrSessionDestroyed, "RedriveEvent in a destroyed session")
	disc, err := b.s.DiscardEvent(b.ctx, gone, dl4.ID)
	noErr(t, err, "DiscardEvent in a destroyed session")
	wantEq(t, disc.Status, store.EventDiscarded, "Status")

	_, err = b.s.RedriveEvent(b.ctx, key, dl.ID+1000)
	wantIs(t, err, store.ErrNotFound, "RedriveEvent of an unknown event")
	_, err = b.s.RedriveEvent(b.ctx, store.ActorKey{AgentUID: b.agent.UID, SessionID: "missing"}, dl.ID)
	wantIs(t, err, store.ErrNotFound, "RedriveEvent in an unknown session")
	_, err = b.s.RedriveEvent(b.ctx, key2, dl.ID)
	wantIs(t, err, store.ErrNotFound, "RedriveEvent of another session's event")
}

func testDiscard(t *testing.T, b *bundle) {
	key := b.session()
	dl := b.deadLetter(key, "hopeless", 1)
	ev, err := b.s.DiscardEvent(b.ctx, key, dl.ID)
	noErr(t, err, "DiscardEvent")
	wantEq(t, ev.ID, dl.ID, "ID")
	wantEq(t, ev.Status, store.EventDiscarded, "Status")
	if ev.ClosedAt == nil {
		t.Fatalf("a discarded event has no ClosedAt")
	}
	wantEq(t, ev.Attempts, 1, "Attempts are kept")
	wantEq(t, b.event(key, dl.ID).Status, store.EventDiscarded, "listed Status")
	wantEq(t, b.getSession(key).DeadLetters, int64(0), "DeadLetters after discard")
	dls, err := b.s.ListDeadLetters(b.ctx, store.ListDeadLettersParams{AgentUID: key.AgentUID})
	noErr(t, err, "ListDeadLetters")
	wantEq(t, len(dls), 0, "dead letters after discard")
	discarded, err := b.s.ListEvents(b.ctx, store.ListEventsParams{Key: key, Status: store.EventDiscarded})
	noErr(t, err, "ListEvents discarded")
	wantEq(t, len(discarded), 1, "discarded events")
	_, err = b.s.DiscardEvent(b.ctx, key, dl.ID+1000)
	wantIs(t, err, store.ErrNotFound, "DiscardEvent of an unknown event")
}

func testRedriveConflict(t *testing.T, b *bundle) {
	key := b.session()
	done := b.message(key, "done")
	act := b.claim(key, LongTTL)
	b.commit(b.next(act).Delivery.TurnRef(), "ok", "")
	noErr(t, b.s.StopActivation(b.ctx, act.Ref()), "StopActivation")
	discarded := b.deadLetter(key, "discarded", 1)
	_, err := b.s.DiscardEvent(b.ctx, key, discarded.ID)
	noErr(t, err, "DiscardEvent")
	open := b.message(key, "open")

	for _, c := range []struct {
		id     int64
		status store.EventStatus
	}{{done.ID, store.EventDone}, {discarded.ID, store.EventDiscarded}, {open.ID, store.EventOpen}} {
		before := b.snapshot(key)
		_, err := b.s.RedriveEvent(b.ctx, key, c.id)
		wantNotDeadLetter(t, err, key, c.id, c.status, fmt.Sprintf("RedriveEvent of event %d", c.id))
		_, err = b.s.DiscardEvent(b.ctx, key, c.id)
		wantNotDeadLetter(t, err, key, c.id, c.status, fmt.Sprintf("DiscardEvent of event %d", c.id))
		b.sameSnapshot(key, before, "refused redrive/discard")
	}
}

// wantNotDeadLetter fails unless err is an ErrConflict carrying a
// *store.NotDeadLetterError that names the event and its status.
func wantNotDeadLetter(t testing.TB, err error, key store.ActorKey, id int64, status store.EventStatus, what string) {
	t.Helper()
	wantIs(t, err, store.ErrConflict, what)
	var ndl *store.NotDeadLetterError
	if !errors.As(err, &ndl) {
		t.Fatalf("%s: error %v (%T) carries no *store.NotDeadLetterError", what, err, err)
	}
	if ndl.Key != key || ndl.EventID != id || ndl.Status != status {
		t.Fatalf("%s: NotDeadLetterError %+v, want event %d of %s with status %s", what, *ndl, id, key, status)
	}
	if want := fmt.Sprintf("event %d of %s is %s, not dead_letter", id, key, status); !strings.Contains(err.Error(), want) {
		t.Fatalf("%s: error %q does not say %q", what, err, want)
	}
}

func testDeadLetterBlock(t *testing.T, b *bundle) {
	blocked := b.session()
	dl := b.deadLetter(blocked, "poison", 1)
	later := b.message(blocked, "later")
	otherAgent := b.newAgent("continue-"+uuid.NewString()[:8], b.agent.ModuleDigest, store.CrashRestart)
	cont := b.sessionOf(otherAgent.UID, store.CrashRestart)
	b.deadLetter(cont, "poison", 1)
	contLater := b.message(cont, "later")
	// Only a dead letter older than the oldest open event blocks: redrive
	// the first of two dead letters and it runs, the second waits after it.
	redriven := b.session()
	r1 := b.deadLetter(redriven, "first", 1)
	b.deadLetter(redriven, "second", 1)
	_, err := b.s.RedriveEvent(b.ctx, redriven, r1.ID)
	noErr(t, err, "RedriveEvent")

	got := b.runnable(b.agent.UID)
	if slices.Contains(got, blocked) || !slices.Contains(got, cont) || !slices.Contains(got, redriven) {
		t.Fatalf("RunnableSessions(blocked %s) = %v: want %v (other agent) and %v (redriven), not %v", b.agent.UID, got, cont, redriven, blocked)
	}
	got = b.runnable()
	if !slices.Contains(got, blocked) || !slices.Contains(got, cont) {
		t.Fatalf("RunnableSessions() = %v: want both %v and %v", got, blocked, cont)
	}

	rAct := b.claim(redriven, LongTTL)
	d, err := b.s.NextDelivery(b.ctx, store.NextDeliveryParams{Activation: rAct.Ref(), DeliveryID: uuid.NewString(), MarkSent: true, BlockOnDeadLetter: true})
	noErr(t, err, "NextDelivery of a redriven event under block")
	wantEq(t, d.Event.ID, r1.ID, "the redriven event runs under block")

	act := b.claim(blocked, LongTTL)
	_, err = b.s.NextDelivery(b.ctx, store.NextDeliveryParams{Activation: act.Ref(), DeliveryID: uuid.NewString(), MarkSent: true, BlockOnDeadLetter: true})
	nd := wantNoDue(t, err, "NextDelivery blocked by a dead letter")
	if !nd.NextDueAt.IsZero() {
		t.Fatalf("blocked NextDueAt = %v, want zero", nd.NextDueAt)
	}
	wantEq(t, b.event(blocked, later.ID).Binding, "", "the blocked event was not taken")
	d = b.next(act) // policy continue
	wantEq(t, d.Event.ID, later.ID, "continue runs the later event")
	b.commit(d.Delivery.TurnRef(), "ok", "")
	noErr(t, b.s.StopActivation(b.ctx, act.Ref()), "StopActivation")

	// Discarding the dead letter unblocks.
	b.message(blocked, "after discard")
	if slices.Contains(b.runnable(b.agent.UID), blocked) {
		t.Fatalf("still blocked session is runnable")
	}
	_, err = b.s.DiscardEvent(b.ctx, blocked, dl.ID)
	noErr(t, err, "DiscardEvent")
	if !slices.Contains(b.runnable(b.agent.UID), blocked) {
		t.Fatalf("a session whose dead letter was discarded is still blocked")
	}
	act = b.claim(blocked, LongTTL)
	_, err = b.s.NextDelivery(b.ctx, store.NextDeliveryParams{Activation: act.Ref(), DeliveryID: uuid.NewString(), MarkSent: true, BlockOnDeadLetter: true})
	noErr(t, err, "NextDelivery after discard")

	a2 := b.claim(cont, LongTTL)
	d, err = b.s.NextDelivery(b.ctx, store.NextDeliveryParams{Activation: a2.Ref(), DeliveryID: uuid.NewString(), MarkSent: true})
	noErr(t, err, "NextDelivery of the continue agent")
	wantEq(t, d.Event.ID, contLater.ID, "continue")
}
