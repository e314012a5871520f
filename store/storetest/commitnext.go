package storetest

import (
	"errors"
	"fmt"
	"testing"

	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

// The next turn taken in a commit's transaction (CommitTurnParams.Next).

func commitNextCases() []testCase {
	return []testCase{
		{"CommitNext/TakesTheNextTurnAsNextDeliveryWould", testCommitNextTakes},
		{"CommitNext/NothingDueTakesNothingAndLeavesTheActivationIdle", testCommitNextNothingDue},
		{"CommitNext/ARefusedCommitTakesNothing", testCommitNextRefused},
		{"CommitNext/ABindErrorLeavesTheCommitStanding", testCommitNextBindError},
		{"CommitNext/AnotherActivationsNextIsInvalid", testCommitNextOtherActivation},
		{"CommitNext/AnUpdatedAgentIsNeverTakenUnderTheOldBinding", testCommitNextUpdatedAgent},
	}
}

// commitWithNext commits d's turn (reply, state) asking for the next turn
// with next.
func (b *bundle) commitWithNext(d store.Dispatch, reply, state string, next store.NextDeliveryParams) (store.Turn, error) {
	return b.s.CommitTurn(b.ctx, store.CommitTurnParams{
		Ref: d.Delivery.TurnRef(), Messages: []abi.Message{{Role: abi.RoleAssistant, Content: reply}},
		State: []byte(state), Outcome: abi.OutcomeOK, Payloads: []string{string(d.Event.Payload)}, Next: &next,
	})
}

// nextOf are the NextDelivery parameters a controller passes after d was
// dispatched under act: Expect is what d ran.
func (b *bundle) nextOf(act store.Activation, d store.Dispatch) store.NextDeliveryParams {
	return store.NextDeliveryParams{
		Activation: act.Ref(), DeliveryID: uuid.NewString(), Binding: b.agent.ModuleDigest, MarkSent: true,
		TailMessages: 10, ExpectDue: true, Expect: &store.ExpectedBinding{Agent: d.Agent, Binding: d.Delivery.Binding},
	}
}

func testCommitNextTakes(t *testing.T, b *bundle) {
	key := b.session()
	b.message(key, "one")
	two := b.message(key, "two")
	b.message(key, "three")
	act := b.claim(key, LongTTL)
	d1 := b.next(act)
	np := b.nextOf(act, d1)
	turn, err := b.commitWithNext(d1, "r1", "s1", np)
	noErr(t, err, "CommitTurn with Next")
	wantMessages(t, turn.Messages, abi.RoleUser, "one", abi.RoleAssistant, "r1")
	if turn.Next == nil {
		t.Fatalf("CommitTurn with Next and an event due: Turn.Next = nil")
	}
	wantEq(t, turn.NextOpen, true, "NextOpen")
	d2 := *turn.Next
	wantEq(t, d2.Event.ID, two.ID, "next event")
	wantEq(t, d2.Delivery.ID, np.DeliveryID, "next delivery id")
	wantEq(t, d2.Delivery.EventID, two.ID, "next delivery's event")
	wantEq(t, d2.Delivery.ActorEpoch, act.ActorEpoch, "next delivery's epoch")
	wantEq(t, d2.Delivery.State, store.DeliverySent, "next delivery's state")
	wantEq(t, d2.Delivery.Binding, d1.Delivery.Binding, "next delivery's binding")
	wantEq(t, d2.Event.Binding, d1.Delivery.Binding, "next event's recorded binding")
	wantEq(t, d2.Attempt, 1, "next Attempt")
	wantEq(t, d2.Agent, d1.Agent, "next Dispatch.Agent")
	wantEq(t, d2.Session.ActorKey, key, "next Session")
	wantBytes(t, d2.State, []byte("s1"), "next State: the commit's")
	wantEq(t, fmt.Sprint(d2.Tail), fmt.Sprint([]abi.Message{{Role: abi.RoleUser, Content: "one"}, {Role: abi.RoleAssistant, Content: "r1"}}),
		"next Tail: with the turn just committed")
	frames := b.stream(key).Frames
	if len(frames) < 2 {
		t.Fatalf("frames after the commit: %d, want at least 2", len(frames))
	}
	wantEq(t, frames[len(frames)-2].Kind, store.FrameTurnCommitted, "next to last frame")
	wantEq(t, frames[len(frames)-1].Kind, store.FrameTurnStarted, "last frame")
	wantEq(t, frames[len(frames)-1].EventID, two.ID, "turn.started's event")
	// The activation is busy with it: NextDelivery takes nothing more.
	if _, err := b.tryNext(act, true, b.agent.ModuleDigest); !errors.Is(err, store.ErrNotLive) {
		t.Fatalf("NextDelivery after the commit took the next turn: %v, want ErrNotLive", err)
	}
	// The taken turn commits under its own ref, and takes the third.
	turn, err = b.commitWithNext(d2, "r2", "s2", b.nextOf(act, d2))
	noErr(t, err, "commit of the taken turn")
	wantMessages(t, turn.Messages, abi.RoleUser, "two", abi.RoleAssistant, "r2")
	if turn.Next == nil {
		t.Fatalf("second CommitTurn with Next: Turn.Next = nil")
	}
	b.commit(turn.Next.Delivery.TurnRef(), "r3", "s3")
	turns := b.transcript(key)
	wantEq(t, len(turns), 3, "turns")
	for i, want := range []string{"r1", "r2", "r3"} {
		wantEq(t, turns[i].Messages[len(turns[i].Messages)-1].Content, want, fmt.Sprintf("turn %d's reply", i+1))
	}
}

func testCommitNextNothingDue(t *testing.T, b *bundle) {
	key := b.session()
	b.message(key, "only")
	act := b.claim(key, LongTTL)
	d := b.next(act)
	turn, err := b.commitWithNext(d, "r", "s", b.nextOf(act, d))
	noErr(t, err, "CommitTurn with Next and nothing due")
	if turn.Next != nil {
		t.Fatalf("Turn.Next = event %d with nothing open", turn.Next.Event.ID)
	}
	wantEq(t, len(b.transcript(key)), 1, "turns")
	var nd *store.NoDueEventError
	if _, err := b.tryNext(act, true, b.agent.ModuleDigest); !errors.As(err, &nd) {
		t.Fatalf("NextDelivery after a commit that took nothing: %v, want *NoDueEventError (the activation idle and live)", err)
	}
	// The next signal runs under the same activation.
	late := b.message(key, "later")
	wantEq(t, b.next(act).Event.ID, late.ID, "the later event")
}

func testCommitNextRefused(t *testing.T, b *bundle) {
	key := b.session()
	b.message(key, "one")
	b.message(key, "two")
	act := b.claim(key, LongTTL)
	d := b.next(act)
	b.commit(d.Delivery.TurnRef(), "r1", "s1")
	// A replay of the committed turn, asking for the next: refused, and
	// the next event stays open and undelivered.
	before := b.streamSnapshot(key)
	_, err := b.commitWithNext(d, "MUST NOT BE WRITTEN", "x", b.nextOf(act, d))
	wantFence(t, err, store.FenceSupersededDelivery, "replayed commit with Next")
	if after := b.streamSnapshot(key); after != before {
		t.Fatalf("a refused commit with Next wrote:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	d2 := b.next(act)
	wantEq(t, d2.Attempt, 1, "the next event's attempt after the refused commit")
}

func testCommitNextBindError(t *testing.T, b *bundle) {
	key := b.session()
	b.message(key, "one")
	two := b.message(key, "two")
	act := b.claim(key, LongTTL)
	d := b.next(act)
	np := b.nextOf(act, d)
	// Without an expectation every driver binds the next event with Bind,
	// which fails here.
	np.Expect = nil
	np.Bind = func(store.AgentBinding) (string, error) { return "", errors.New("no runner for it") }
	turn, err := b.commitWithNext(d, "r1", "s1", np)
	noErr(t, err, "CommitTurn whose next dispatch's Bind fails")
	if turn.Next != nil {
		t.Fatalf("Turn.Next = event %d though Bind failed", turn.Next.Event.ID)
	}
	turns := b.transcript(key)
	wantEq(t, len(turns), 1, "turns: the commit stands")
	st, err := b.s.SessionState(b.ctx, key)
	noErr(t, err, "SessionState")
	wantEq(t, string(st), "s1", "state: the commit's")
	d2 := b.next(act)
	wantEq(t, d2.Event.ID, two.ID, "the next event, dispatched afterwards")
	wantEq(t, d2.Attempt, 1, "its attempt")
}

func testCommitNextOtherActivation(t *testing.T, b *bundle) {
	key := b.session()
	b.message(key, "one")
	b.message(key, "two")
	act := b.claim(key, LongTTL)
	d := b.next(act)
	np := b.nextOf(act, d)
	np.Activation.UID = uuid.NewString()
	before := b.streamSnapshot(key)
	_, err := b.commitWithNext(d, "r1", "s1", np)
	if !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("CommitTurn asking the next turn of another activation: %v, want ErrInvalid", err)
	}
	if after := b.streamSnapshot(key); after != before {
		t.Fatalf("an invalid commit wrote:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

func testCommitNextUpdatedAgent(t *testing.T, b *bundle) {
	v1 := b.module("next v1")
	a := b.newAgent("next-"+uuid.NewString()[:8], v1.Digest, store.CrashRestart)
	key := b.sessionOf(a.UID, store.CrashRestart)
	bind := func(ab store.AgentBinding) (string, error) { return "bound:" + ab.ModuleDigest, nil }
	b.message(key, "one")
	two := b.message(key, "two")
	act := b.claim(key, LongTTL)
	d, err := b.s.NextDelivery(b.ctx, store.NextDeliveryParams{Activation: act.Ref(), DeliveryID: uuid.NewString(),
		MarkSent: true, Bind: bind})
	noErr(t, err, "NextDelivery")
	v2 := b.module("next v2")
	_, err = b.s.CreateAgent(b.ctx, store.CreateAgentParams{UID: a.UID, Name: a.Name, ModuleDigest: v2.Digest,
		CrashPolicy: store.CrashRestart, Upsert: true})
	noErr(t, err, "update the agent")
	// The caller still expects v1: the next event is either left to
	// NextDelivery or bound to what the agent runs now, never to v1.
	np := store.NextDeliveryParams{Activation: act.Ref(), DeliveryID: uuid.NewString(), MarkSent: true, Bind: bind,
		ExpectDue: true, Expect: &store.ExpectedBinding{Agent: d.Agent, Binding: "bound:" + v1.Digest}}
	turn, err := b.commitWithNext(d, "r1", "", np)
	noErr(t, err, "CommitTurn with Next expecting the old agent")
	next := turn.Next
	if next == nil {
		n, err := b.s.NextDelivery(b.ctx, store.NextDeliveryParams{Activation: act.Ref(), DeliveryID: uuid.NewString(),
			MarkSent: true, Bind: bind, ExpectDue: true, Expect: np.Expect})
		noErr(t, err, "NextDelivery after the commit")
		next = &n
	}
	wantEq(t, next.Event.ID, two.ID, "next event")
	wantEq(t, next.Delivery.Binding, "bound:"+v2.Digest, "next event's binding: the updated agent's")
	wantEq(t, next.Agent.ModuleDigest, v2.Digest, "Dispatch.Agent")
}
