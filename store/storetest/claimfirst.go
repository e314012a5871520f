package storetest

import (
	"errors"
	"testing"

	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

// The first turn taken in an activation claim's transaction
// (ClaimActivationParams.First).

func claimFirstCases() []testCase {
	return []testCase{
		{"ClaimFirst/TakesTheFirstTurnAsNextDeliveryWould", testClaimFirstTakes},
		{"ClaimFirst/NothingOpenTakesNothingAndTheClaimStands", testClaimFirstNothingOpen},
		{"ClaimFirst/AnEpochOtherThanTheClaimsTakesNothing", testClaimFirstOtherEpoch},
		{"ClaimFirst/ARefusedClaimTakesNothing", testClaimFirstRefused},
		{"ClaimFirst/ABindErrorLeavesTheClaimStanding", testClaimFirstBindError},
		{"ClaimFirst/ADeliveryIDInUseLeavesTheClaimStanding", testClaimFirstDeliveryIDInUse},
		{"ClaimFirst/AnotherActivationsFirstIsInvalid", testClaimFirstOtherActivation},
		{"ClaimFirst/AnUpdatedAgentIsNeverTakenUnderTheOldBinding", testClaimFirstUpdatedAgent},
		{"ClaimFirst/DeferredReadsTheFirstTurnAndWritesNothing", testClaimFirstDeferred},
		{"ClaimFirst/DeferredUnderAnUpdatedAgentTakesNothing", testClaimFirstDeferredUpdatedAgent},
		{"ClaimFirst/DeferredWithoutAnEpochTakesTheClaims", testClaimFirstDeferredClaimsEpoch},
	}
}

// claimFirstParams are the claim of a new activation of key asking for its
// first turn at epoch (the session's epoch + 1 when the caller is right),
// expecting the bundle's agent.
func (b *bundle) claimFirstParams(key store.ActorKey, epoch int64) store.ClaimActivationParams {
	p := store.ClaimActivationParams{Key: key, UID: uuid.NewString(), LeaseID: uuid.NewString(), HostID: b.host, LeaseTTL: LongTTL}
	ab := store.AgentBinding{Namespace: b.agent.Namespace, Kind: b.agent.Kind, ModuleDigest: b.agent.ModuleDigest}
	p.First = &store.NextDeliveryParams{
		Activation: store.ActivationRef{UID: p.UID, ActorKey: key, ActorEpoch: epoch, LeaseID: p.LeaseID},
		DeliveryID: uuid.NewString(), Binding: b.agent.ModuleDigest, MarkSent: true, TailMessages: 10, ExpectDue: true,
		Expect: &store.ExpectedBinding{Agent: ab, Binding: b.agent.ModuleDigest},
	}
	return p
}

// epochOf is the session's current actor epoch.
func (b *bundle) epochOf(key store.ActorKey) int64 {
	b.t.Helper()
	s, err := b.s.GetSession(b.ctx, key)
	noErr(b.t, err, "GetSession")
	return s.ActorEpoch
}

func testClaimFirstTakes(t *testing.T, b *bundle) {
	key := b.session()
	one := b.message(key, "one")
	b.message(key, "two")
	p := b.claimFirstParams(key, b.epochOf(key)+1)
	act, err := b.s.ClaimActivation(b.ctx, p)
	noErr(t, err, "ClaimActivation with First")
	wantEq(t, act.ActorEpoch, p.First.Activation.ActorEpoch, "the claim's epoch")
	if act.First == nil {
		t.Fatalf("ClaimActivation with First and an event due: Activation.First = nil")
	}
	d := *act.First
	wantEq(t, d.Event.ID, one.ID, "first event")
	wantEq(t, d.Delivery.ID, p.First.DeliveryID, "first delivery id")
	wantEq(t, d.Delivery.ActivationUID, act.UID, "first delivery's activation")
	wantEq(t, d.Delivery.ActorEpoch, act.ActorEpoch, "first delivery's epoch")
	wantEq(t, d.Delivery.State, store.DeliverySent, "first delivery's state")
	wantEq(t, d.Delivery.Binding, b.agent.ModuleDigest, "first delivery's binding")
	wantEq(t, d.Attempt, 1, "Attempt")
	wantEq(t, d.Session.ActorKey, key, "Session")
	wantEq(t, d.Session.ActorEpoch, act.ActorEpoch, "Session's epoch: the claim's")
	frames := b.stream(key).Frames
	if len(frames) == 0 || frames[len(frames)-1].Kind != store.FrameTurnStarted || frames[len(frames)-1].EventID != one.ID {
		t.Fatalf("last frame after the claim: %+v, want turn.started of event %d", frames, one.ID)
	}
	// The activation is busy with it: NextDelivery takes nothing more.
	if _, err := b.tryNext(act, true, b.agent.ModuleDigest); !errors.Is(err, store.ErrNotLive) {
		t.Fatalf("NextDelivery after the claim took the first turn: %v, want ErrNotLive", err)
	}
	// The taken turn commits under its own ref; the activation goes on.
	turn := b.commit(d.Delivery.TurnRef(), "r1", "s1")
	wantMessages(t, turn.Messages, abi.RoleUser, "one", abi.RoleAssistant, "r1")
	d2 := b.next(act)
	wantEq(t, d2.Event.Payload != nil, true, "second event's payload")
	b.commit(d2.Delivery.TurnRef(), "r2", "s2")
	wantEq(t, len(b.transcript(key)), 2, "turns")
}

func testClaimFirstNothingOpen(t *testing.T, b *bundle) {
	key := b.session()
	p := b.claimFirstParams(key, b.epochOf(key)+1)
	act, err := b.s.ClaimActivation(b.ctx, p)
	noErr(t, err, "ClaimActivation with First and nothing open")
	if act.First != nil {
		t.Fatalf("Activation.First = event %d with nothing open", act.First.Event.ID)
	}
	var nd *store.NoDueEventError
	if _, err := b.tryNext(act, true, b.agent.ModuleDigest); !errors.As(err, &nd) {
		t.Fatalf("NextDelivery after a claim that took nothing: %v, want *NoDueEventError (the activation idle and live)", err)
	}
	later := b.message(key, "later")
	wantEq(t, b.next(act).Event.ID, later.ID, "the later event, under the claimed activation")
}

func testClaimFirstOtherEpoch(t *testing.T, b *bundle) {
	key := b.session()
	one := b.message(key, "one")
	// The caller read the session before another activation came and went:
	// it expects an epoch the claim does not give.
	old := b.epochOf(key) + 1
	noErr(t, b.s.StopActivation(b.ctx, b.claim(key, LongTTL).Ref()), "StopActivation")
	p := b.claimFirstParams(key, old)
	act, err := b.s.ClaimActivation(b.ctx, p)
	noErr(t, err, "ClaimActivation with First at a stale epoch")
	wantEq(t, act.ActorEpoch, old+1, "the claim's epoch")
	if act.First != nil {
		t.Fatalf("Activation.First = event %d at epoch %d, though the claim gave epoch %d", act.First.Event.ID, old, act.ActorEpoch)
	}
	d := b.next(act)
	wantEq(t, d.Event.ID, one.ID, "the event, dispatched afterwards")
	wantEq(t, d.Attempt, 1, "its attempt: the stale First counted none")
}

func testClaimFirstRefused(t *testing.T, b *bundle) {
	key := b.session()
	b.message(key, "one")
	live := b.claim(key, LongTTL)
	before := b.streamSnapshot(key)
	_, err := b.s.ClaimActivation(b.ctx, b.claimFirstParams(key, live.ActorEpoch+1))
	if !errors.Is(err, store.ErrActivationLive) {
		t.Fatalf("ClaimActivation with First beside a live activation: %v, want ErrActivationLive", err)
	}
	if after := b.streamSnapshot(key); after != before {
		t.Fatalf("a refused claim with First wrote:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	wantEq(t, b.next(live).Attempt, 1, "the event's attempt under the live activation")
}

func testClaimFirstBindError(t *testing.T, b *bundle) {
	key := b.session()
	one := b.message(key, "one")
	p := b.claimFirstParams(key, b.epochOf(key)+1)
	// Without an expectation every driver binds with Bind, which fails here.
	p.First.Expect = nil
	p.First.Bind = func(store.AgentBinding) (string, error) { return "", errors.New("no runner for it") }
	act, err := b.s.ClaimActivation(b.ctx, p)
	noErr(t, err, "ClaimActivation whose first dispatch's Bind fails")
	if act.First != nil {
		t.Fatalf("Activation.First = event %d though Bind failed", act.First.Event.ID)
	}
	d := b.next(act)
	wantEq(t, d.Event.ID, one.ID, "the event, dispatched afterwards")
	wantEq(t, d.Attempt, 1, "its attempt")
}

func testClaimFirstDeliveryIDInUse(t *testing.T, b *bundle) {
	key := b.session()
	b.message(key, "one")
	two := b.message(key, "two")
	act := b.claim(key, LongTTL)
	d := b.next(act)
	b.commit(d.Delivery.TurnRef(), "r1", "s1")
	noErr(t, b.s.StopActivation(b.ctx, act.Ref()), "StopActivation")
	// The first turn's delivery id is one the session used: its insert is
	// refused, and the claim must stand without it.
	p := b.claimFirstParams(key, b.epochOf(key)+1)
	p.First.DeliveryID = d.Delivery.ID
	act2, err := b.s.ClaimActivation(b.ctx, p)
	noErr(t, err, "ClaimActivation whose first delivery id is in use")
	if act2.First != nil {
		t.Fatalf("Activation.First = event %d under a delivery id in use", act2.First.Event.ID)
	}
	wantEq(t, act2.ActorEpoch, act.ActorEpoch+1, "the claim's epoch")
	d2 := b.next(act2)
	wantEq(t, d2.Event.ID, two.ID, "the next event, dispatched afterwards")
	wantEq(t, d2.Attempt, 1, "its attempt")
}

func testClaimFirstOtherActivation(t *testing.T, b *bundle) {
	key := b.session()
	b.message(key, "one")
	before := b.streamSnapshot(key)
	for name, mutate := range map[string]func(*store.ClaimActivationParams){
		"uid":     func(p *store.ClaimActivationParams) { p.First.Activation.UID = uuid.NewString() },
		"lease":   func(p *store.ClaimActivationParams) { p.First.Activation.LeaseID = uuid.NewString() },
		"session": func(p *store.ClaimActivationParams) { p.First.Activation.SessionID = "other" },
		// Only a deferred first turn may leave the epoch to the claim.
		"no epoch, written": func(p *store.ClaimActivationParams) { p.First.Activation.ActorEpoch = 0 },
	} {
		p := b.claimFirstParams(key, b.epochOf(key)+1)
		mutate(&p)
		if _, err := b.s.ClaimActivation(b.ctx, p); !errors.Is(err, store.ErrInvalid) {
			t.Fatalf("ClaimActivation asking the first turn of another activation (%s): %v, want ErrInvalid", name, err)
		}
	}
	if after := b.streamSnapshot(key); after != before {
		t.Fatalf("an invalid claim wrote:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	// Nothing was claimed.
	act := b.claim(key, LongTTL)
	wantEq(t, b.next(act).Attempt, 1, "the event's attempt")
}

// updatedAgentClaim is a session of a new agent with one event ("one"),
// the agent then updated from module v1 to v2, and the claim of its first
// turn by a caller that still expects v1 (its last dispatch of this
// agent), deferred or not; bind binds "bound:<digest>".
func (b *bundle) updatedAgentClaim(deferred bool) (key store.ActorKey, one store.Event, v2 store.Module,
	bind func(store.AgentBinding) (string, error), p store.ClaimActivationParams) {
	b.t.Helper()
	v1 := b.module("first v1")
	a := b.newAgent("first-"+uuid.NewString()[:8], v1.Digest, store.CrashRestart)
	key = b.sessionOf(a.UID, store.CrashRestart)
	bind = func(ab store.AgentBinding) (string, error) { return "bound:" + ab.ModuleDigest, nil }
	one = b.message(key, "one")
	v2 = b.module("first v2")
	_, err := b.s.CreateAgent(b.ctx, store.CreateAgentParams{UID: a.UID, Name: a.Name, ModuleDigest: v2.Digest,
		CrashPolicy: store.CrashRestart, Upsert: true})
	noErr(b.t, err, "update the agent")
	p = store.ClaimActivationParams{Key: key, UID: uuid.NewString(), LeaseID: uuid.NewString(), HostID: b.host, LeaseTTL: LongTTL}
	p.First = &store.NextDeliveryParams{
		Activation: store.ActivationRef{UID: p.UID, ActorKey: key, ActorEpoch: b.epochOf(key) + 1, LeaseID: p.LeaseID},
		DeliveryID: uuid.NewString(), MarkSent: true, Bind: bind, ExpectDue: true, Defer: deferred,
		Expect: &store.ExpectedBinding{Agent: store.AgentBinding{Namespace: a.Namespace, Kind: a.Kind, ModuleDigest: v1.Digest},
			Binding: "bound:" + v1.Digest},
	}
	return key, one, v2, bind, p
}

func testClaimFirstUpdatedAgent(t *testing.T, b *bundle) {
	// The event is either left to NextDelivery or bound to v2, never to v1.
	_, one, v2, bind, p := b.updatedAgentClaim(false)
	act, err := b.s.ClaimActivation(b.ctx, p)
	noErr(t, err, "ClaimActivation with First expecting the old agent")
	first := act.First
	if first == nil {
		d, err := b.s.NextDelivery(b.ctx, store.NextDeliveryParams{Activation: act.Ref(), DeliveryID: uuid.NewString(),
			MarkSent: true, Bind: bind, ExpectDue: true, Expect: p.First.Expect})
		noErr(t, err, "NextDelivery after the claim")
		first = &d
	}
	wantEq(t, first.Event.ID, one.ID, "first event")
	wantEq(t, first.Delivery.Binding, "bound:"+v2.Digest, "first event's binding: the updated agent's")
	wantEq(t, first.Agent.ModuleDigest, v2.Digest, "Dispatch.Agent")
}

// testClaimFirstDeferred: First.Defer reads the first turn in the claim's
// transaction as a deferred NextDelivery would — the event, the session
// at the claim's epoch, no state yet, the tail — and writes nothing of it:
// no frame, the event open and unattempted, the activation idle. Its
// deferred commit then writes the turn whole.
func testClaimFirstDeferred(t *testing.T, b *bundle) {
	key := b.session()
	one := b.message(key, "one")
	p := b.claimFirstParams(key, b.epochOf(key)+1)
	p.First.Defer = true
	head := b.stream(key).Head
	act, err := b.s.ClaimActivation(b.ctx, p)
	noErr(t, err, "ClaimActivation with a deferred First")
	if act.First == nil {
		t.Fatalf("ClaimActivation with a deferred First and an event due: Activation.First = nil")
	}
	d := *act.First
	wantEq(t, d.Deferred, true, "Dispatch.Deferred")
	wantEq(t, d.Event.ID, one.ID, "first event")
	wantEq(t, d.Delivery.ID, p.First.DeliveryID, "first delivery id")
	wantEq(t, d.Delivery.ActorEpoch, act.ActorEpoch, "first delivery's epoch")
	wantEq(t, d.Delivery.Binding, b.agent.ModuleDigest, "first delivery's binding")
	wantEq(t, d.Attempt, 1, "Attempt")
	wantEq(t, d.Session.ActorKey, key, "Session")
	wantEq(t, d.Session.ActorEpoch, act.ActorEpoch, "Session's epoch: the claim's")
	wantBytes(t, d.State, nil, "State: none was committed")
	if h := b.stream(key).Head; h != head {
		t.Fatalf("a deferred first turn wrote frames: head %d, was %d", h, head)
	}
	if e := b.event(key, one.ID); e.Status != store.EventOpen || e.Attempts != 0 || e.Binding != "" {
		t.Fatalf("event after a deferred first turn: %+v, want open, unattempted, unbound", e)
	}
	b.wantIdle(act, "after a deferred first turn")
	turn, err := b.commitDeferred(act, *p.First, d, "r1")
	noErr(t, err, "deferred commit of the first turn")
	wantMessages(t, turn.Messages, abi.RoleUser, "one", abi.RoleAssistant, "r1")
	wantEq(t, turn.TurnNo, int64(1), "TurnNo")
	wantStatus(t, b, key, one.ID, store.EventDone)
}

// testClaimFirstDeferredClaimsEpoch: a deferred first turn asked without an
// epoch (a caller that did not read the session) is read at the epoch the
// claim gives — two earlier activations put it at 3 — and commits like any.
func testClaimFirstDeferredClaimsEpoch(t *testing.T, b *bundle) {
	key := b.session()
	for range 2 {
		noErr(t, b.s.StopActivation(b.ctx, b.claim(key, LongTTL).Ref()), "StopActivation")
	}
	one := b.message(key, "one")
	p := b.claimFirstParams(key, 0)
	p.First.Defer = true
	head := b.stream(key).Head
	act, err := b.s.ClaimActivation(b.ctx, p)
	noErr(t, err, "ClaimActivation with a deferred First without an epoch")
	wantEq(t, act.ActorEpoch, int64(3), "the claim's epoch")
	if act.First == nil {
		t.Fatalf("ClaimActivation with a deferred First without an epoch and an event due: Activation.First = nil")
	}
	d := *act.First
	wantEq(t, d.Deferred, true, "Dispatch.Deferred")
	wantEq(t, d.Event.ID, one.ID, "first event")
	wantEq(t, d.Delivery.ActorEpoch, act.ActorEpoch, "first delivery's epoch: the claim's")
	wantEq(t, d.Delivery.ActivationUID, act.UID, "first delivery's activation")
	wantEq(t, d.Session.ActorEpoch, act.ActorEpoch, "Session's epoch: the claim's")
	if h := b.stream(key).Head; h != head {
		t.Fatalf("a deferred first turn wrote frames: head %d, was %d", h, head)
	}
	// Outside a claim, epoch 0 names no activation: both drivers refuse it
	// before reading (store.CheckNextDelivery), so a caller cannot take a
	// turn without knowing the activation's epoch.
	zero := *p.First
	if _, err := b.s.NextDelivery(b.ctx, zero); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("NextDelivery at epoch 0 outside a claim: %v, want ErrInvalid", err)
	}
	first := *p.First
	first.Activation.ActorEpoch = act.ActorEpoch
	turn, err := b.commitDeferred(act, first, d, "r1")
	noErr(t, err, "deferred commit of the first turn")
	wantMessages(t, turn.Messages, abi.RoleUser, "one", abi.RoleAssistant, "r1")
	wantStatus(t, b, key, one.ID, store.EventDone)
}

// testClaimFirstDeferredUpdatedAgent: an agent updated since the caller's
// expectation is not read deferred under the old one: no First, nothing
// written, and the event's dispatch binds the new agent.
func testClaimFirstDeferredUpdatedAgent(t *testing.T, b *bundle) {
	key, one, v2, bind, p := b.updatedAgentClaim(true)
	head := b.stream(key).Head
	act, err := b.s.ClaimActivation(b.ctx, p)
	noErr(t, err, "ClaimActivation with a deferred First expecting the old agent")
	if act.First != nil {
		t.Fatalf("Activation.First = %+v under an agent updated since the expectation", act.First)
	}
	if h := b.stream(key).Head; h != head {
		t.Fatalf("a deferred first turn not taken wrote frames: head %d, was %d", h, head)
	}
	if e := b.event(key, one.ID); e.Status != store.EventOpen || e.Attempts != 0 || e.Binding != "" {
		t.Fatalf("event after a deferred first turn not taken: %+v, want open, unattempted, unbound", e)
	}
	d, err := b.s.NextDelivery(b.ctx, store.NextDeliveryParams{Activation: act.Ref(), DeliveryID: uuid.NewString(),
		MarkSent: true, Bind: bind, ExpectDue: true})
	noErr(t, err, "NextDelivery after the claim")
	wantEq(t, d.Event.ID, one.ID, "first event")
	wantEq(t, d.Delivery.Binding, "bound:"+v2.Digest, "first event's binding: the updated agent's")
}
