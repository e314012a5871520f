package storetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

func turnCases() []testCase {
	return []testCase{
		{"Invariant3/CommitAppendsTurnReplacesStateClosesEventClearsCurrent", testCommit},
		{"Commit/EventWithoutMessageAddsNoUserMessage", testCommitNoMessage},
		{"Commit/WithTheDispatchedPayloadsTheSameTurn", testCommitPayloads},
		{"Invariant4/ReplayedCommitIsRejected", testCommitOnce},
		{"Invariant4/EveryEventEndsInExactlyOneTerminalStatus", testTerminalStatus},
		{"Invariant5/NextDeliveryYieldsOldestOpenEvent", testOldestFirst},
		{"Invariant5/NotDueOldestEventBlocksLaterOnes", testNotDueBlocks},
		{"Invariant9/MarkDeliverySentGuardsCreatedToSent", testMarkSent},
		{"Invariant10/RetriesKeepTheFirstAttemptsBinding", testBinding},
		{"Deploys/BindSeesTheAgentAsUpdatedWhileTheActivationIsLive", testBindCurrentAgent},
		{"Dispatch/WithAnExpectedAgentTheSameDispatchAsWithBind", testDispatchExpect},
		{"FailAttempt/DeadLetterAtMaxAttemptsThenNextEvent", testDeadLetter},
		{"FailAttempt/UncountedFailureKeepsAttempts", testUncounted},
		{"Transcript/PagesTurnsWithMessagesInOrder", testTranscriptPaging},
		{"SessionState/NilUntilACommitSetsItThenTheCommittedBytes", testSessionState},
		{"SessionState/EmptyStateIsKeptEmptyNotNil", testEmptyState},
	}
}

func testSessionState(t *testing.T, b *bundle) {
	key := b.session()
	st, err := b.s.SessionState(b.ctx, key)
	noErr(t, err, "SessionState before any turn")
	if st != nil {
		t.Fatalf("state before any turn = %q, want nil", st)
	}
	b.message(key, "one")
	act := b.claim(key, LongTTL)
	b.commit(b.next(act).Delivery.TurnRef(), "r1", "s-after-1")
	st, err = b.s.SessionState(b.ctx, key)
	noErr(t, err, "SessionState")
	wantEq(t, string(st), "s-after-1", "state after a commit")
	_, err = b.s.SessionState(b.ctx, store.ActorKey{AgentUID: key.AgentUID, SessionID: "no-such-session"})
	if !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("SessionState of an unknown session: %v, want ErrNotFound", err)
	}
}

// testEmptyState: a commit of State []byte{} (abi: `state: ""`) stores an
// empty state, which reads back as non-nil empty (the next request carries
// `""`), not as nil (never set, `null`); State nil without KeepState
// removes the state (nil again).
func testEmptyState(t *testing.T, b *bundle) {
	key := b.session()
	b.message(key, "one")
	act := b.claim(key, LongTTL)
	b.commit(b.next(act).Delivery.TurnRef(), "r1", "s-1")
	b.message(key, "two")
	d := b.next(act)
	_, err := b.s.CommitTurn(b.ctx, store.CommitTurnParams{Ref: d.Delivery.TurnRef(), State: []byte{}, Outcome: abi.OutcomeOK})
	noErr(t, err, "CommitTurn with an empty state")
	st, err := b.s.SessionState(b.ctx, key)
	noErr(t, err, "SessionState")
	if st == nil || len(st) != 0 {
		t.Fatalf("SessionState after an empty state was committed = %#v, want []byte{} (not nil)", st)
	}
	b.message(key, "three")
	d = b.next(act)
	if d.State == nil || len(d.State) != 0 {
		t.Fatalf("Dispatch.State after an empty state was committed = %#v, want []byte{} (not nil)", d.State)
	}
	// KeepState keeps the empty state.
	_, err = b.s.CommitTurn(b.ctx, store.CommitTurnParams{Ref: d.Delivery.TurnRef(), KeepState: true, Outcome: abi.OutcomeOK})
	noErr(t, err, "CommitTurn KeepState")
	b.message(key, "four")
	d = b.next(act)
	if d.State == nil || len(d.State) != 0 {
		t.Fatalf("Dispatch.State after KeepState of an empty state = %#v, want []byte{}", d.State)
	}
	// State nil without KeepState: no state, as never set.
	_, err = b.s.CommitTurn(b.ctx, store.CommitTurnParams{Ref: d.Delivery.TurnRef(), Outcome: abi.OutcomeOK})
	noErr(t, err, "CommitTurn State nil")
	st, err = b.s.SessionState(b.ctx, key)
	noErr(t, err, "SessionState after State nil")
	if st != nil {
		t.Fatalf("SessionState after a commit of State nil = %#v, want nil", st)
	}
	b.message(key, "five")
	if d = b.next(act); d.State != nil {
		t.Fatalf("Dispatch.State after a commit of State nil = %#v, want nil", d.State)
	}
	// A new session's state is nil on both reads.
	other := b.session()
	b.message(other, "hi")
	if d = b.next(b.claim(other, LongTTL)); d.State != nil {
		t.Fatalf("Dispatch.State of a new session = %#v, want nil", d.State)
	}
}

func testCommit(t *testing.T, b *bundle) {
	key := b.session()
	ev := b.message(key, "hello")
	act := b.claim(key, LongTTL)
	d := b.next(act)
	ref := d.Delivery.TurnRef()
	turn, err := b.s.CommitTurn(b.ctx, store.CommitTurnParams{
		Ref: ref,
		Messages: []abi.Message{
			{Role: abi.RoleAssistant, Content: "hi there"},
			{Role: abi.RoleTool, Content: `{"ok":true}`},
		},
		State:   []byte("state-1"),
		Outcome: abi.OutcomeSleep,
	})
	noErr(t, err, "CommitTurn")
	wantEq(t, turn.ActorKey, key, "Turn key")
	wantEq(t, turn.TurnNo, int64(1), "TurnNo")
	wantEq(t, turn.EventID, ev.ID, "EventID")
	wantEq(t, turn.DeliveryID, ref.DeliveryID, "DeliveryID")
	wantEq(t, turn.ActorEpoch, act.ActorEpoch, "ActorEpoch")
	wantEq(t, turn.Outcome, abi.OutcomeSleep, "Outcome")
	if turn.CommittedAt.IsZero() {
		t.Fatalf("CommittedAt is zero")
	}
	wantMessages(t, turn.Messages, abi.RoleUser, "hello", abi.RoleAssistant, "hi there", abi.RoleTool, `{"ok":true}`)

	turns := b.transcript(key)
	if len(turns) != 1 {
		t.Fatalf("transcript has %d turns, want 1", len(turns))
	}
	got := turns[0]
	wantEq(t, got.TurnNo, turn.TurnNo, "transcript TurnNo")
	wantEq(t, got.EventID, turn.EventID, "transcript EventID")
	wantEq(t, got.DeliveryID, turn.DeliveryID, "transcript DeliveryID")
	wantEq(t, got.Outcome, turn.Outcome, "transcript Outcome")
	wantEq(t, got.ActorEpoch, turn.ActorEpoch, "transcript ActorEpoch")
	wantEq(t, got.ActorKey, key, "transcript key")
	wantMessages(t, got.Messages, abi.RoleUser, "hello", abi.RoleAssistant, "hi there", abi.RoleTool, `{"ok":true}`)

	closed := b.event(key, ev.ID)
	wantEq(t, closed.Status, store.EventDone, "event status")
	if closed.ClosedAt == nil {
		t.Fatalf("done event has no ClosedAt")
	}
	s := b.getSession(key)
	wantEq(t, s.TurnCount, int64(1), "TurnCount")
	wantEq(t, s.OpenEvents, int64(0), "OpenEvents")
	wantEq(t, s.EventCount, int64(1), "EventCount")

	// The current event is cleared: the activation takes the next one (or
	// reports none) and can stop.
	_, err = b.tryNext(act, true, "")
	nd := wantNoDue(t, err, "NextDelivery after the commit")
	if !nd.NextDueAt.IsZero() {
		t.Fatalf("NextDueAt = %v with no open event", nd.NextDueAt)
	}
	b.message(key, "again")
	d2 := b.next(act)
	wantBytes(t, d2.State, []byte("state-1"), "state after the commit")
	if len(d2.Tail) != 3 || d2.Tail[0] != (abi.Message{Role: abi.RoleUser, Content: "hello"}) ||
		d2.Tail[2] != (abi.Message{Role: abi.RoleTool, Content: `{"ok":true}`}) {
		t.Fatalf("Tail = %+v", d2.Tail)
	}
	b.commit(d2.Delivery.TurnRef(), "again and again", "state-2")
	noErr(t, b.s.StopActivation(b.ctx, act.Ref()), "StopActivation after the commits")

	// The tail is the last N messages, oldest first.
	act = b.claim(key, LongTTL)
	b.message(key, "three")
	d3, err := b.s.NextDelivery(b.ctx, store.NextDeliveryParams{Activation: act.Ref(), DeliveryID: uuid.NewString(), MarkSent: true, TailMessages: 2})
	noErr(t, err, "NextDelivery")
	want := []abi.Message{{Role: abi.RoleUser, Content: "again"}, {Role: abi.RoleAssistant, Content: "again and again"}}
	if fmt.Sprint(d3.Tail) != fmt.Sprint(want) {
		t.Fatalf("Tail(2) = %+v, want %+v", d3.Tail, want)
	}
	wantBytes(t, d3.State, []byte("state-2"), "state after the second commit")
	// KeepState keeps it.
	_, err = b.s.CommitTurn(b.ctx, store.CommitTurnParams{Ref: d3.Delivery.TurnRef(), KeepState: true, State: []byte("ignored"), Outcome: abi.OutcomeOK})
	noErr(t, err, "CommitTurn KeepState")
	b.message(key, "four")
	wantBytes(t, b.next(act).State, []byte("state-2"), "state after a KeepState commit")
}

func testCommitNoMessage(t *testing.T, b *bundle) {
	key := b.session()
	_, _, err := b.s.AppendEvent(b.ctx, store.AppendEventParams{Key: key, Kind: "wake", Payload: json.RawMessage(`{"data":{"why":"alarm"}}`)})
	noErr(t, err, "AppendEvent")
	act := b.claim(key, LongTTL)
	d := b.next(act)
	wantEq(t, d.Event.Kind, "wake", "Kind")
	turn := b.commit(d.Delivery.TurnRef(), "woke", "")
	wantMessages(t, turn.Messages, abi.RoleAssistant, "woke")
	wantMessages(t, b.transcript(key)[0].Messages, abi.RoleAssistant, "woke")
}

// testCommitPayloads: a commit given the payloads its dispatch carried
// (CommitTurnParams.Payloads) writes the turn a commit without them writes:
// the same transcript, a next-open hint that is true while an event waits
// and false once none does (host/wakedispatch.go builds on it); and one with a steer
// attached since the dispatch is refused (stale revision), nothing written.
func testCommitPayloads(t *testing.T, b *bundle) {
	key := b.session()
	b.message(key, "one")
	b.message(key, "two")
	act := b.claim(key, LongTTL)
	d := b.next(act)
	turn, err := b.s.CommitTurn(b.ctx, store.CommitTurnParams{Ref: d.Delivery.TurnRef(), Outcome: abi.OutcomeOK,
		Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "r1"}}, State: []byte("s1"),
		Payloads: []string{string(d.Event.Payload)}})
	noErr(t, err, "CommitTurn with payloads")
	wantMessages(t, turn.Messages, abi.RoleUser, "one", abi.RoleAssistant, "r1")
	wantEq(t, turn.NextOpen, true, "NextOpen with an event waiting")
	d = b.next(act)
	wantBytes(t, d.State, []byte("s1"), "state")
	turn, err = b.s.CommitTurn(b.ctx, store.CommitTurnParams{Ref: d.Delivery.TurnRef(), Outcome: abi.OutcomeOK,
		Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "r2"}}, KeepState: true})
	noErr(t, err, "CommitTurn without payloads")
	wantMessages(t, turn.Messages, abi.RoleUser, "two", abi.RoleAssistant, "r2")
	wantEq(t, turn.NextOpen, false, "NextOpen with nothing else open")
	turns := b.transcript(key)
	wantEq(t, len(turns), 2, "turns")
	wantMessages(t, turns[0].Messages, abi.RoleUser, "one", abi.RoleAssistant, "r1")
	wantMessages(t, turns[1].Messages, abi.RoleUser, "two", abi.RoleAssistant, "r2")

	// A steer attached after the dispatch: the payloads the caller passes
	// are no longer the event's whole input, and the fence refuses.
	b.message(key, "three")
	d = b.next(act)
	_, err = b.s.Steer(b.ctx, store.SteerParams{Key: key, Payload: json.RawMessage(`{"message":"steer"}`), DeliveryID: uuid.NewString()})
	noErr(t, err, "Steer")
	before := b.snapshot(key)
	_, err = b.s.CommitTurn(b.ctx, store.CommitTurnParams{Ref: d.Delivery.TurnRef(), Outcome: abi.OutcomeOK,
		Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "MUST NOT BE WRITTEN"}}, KeepState: true,
		Payloads: []string{string(d.Event.Payload)}})
	wantFence(t, err, store.FenceStaleRevision, "commit with the payloads of before a steer")
	b.sameSnapshot(key, before, "refused commit with payloads")
}

func testCommitOnce(t *testing.T, b *bundle) {
	key := b.session()
	b.message(key, "once")
	act := b.claim(key, LongTTL)
	ref := b.next(act).Delivery.TurnRef()
	params := store.CommitTurnParams{Ref: ref, Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "only once"}}, State: []byte("s"), Outcome: abi.OutcomeOK}
	_, err := b.s.CommitTurn(b.ctx, params)
	noErr(t, err, "first CommitTurn")
	before := b.snapshot(key)
	for i := range 3 {
		_, err = b.s.CommitTurn(b.ctx, params)
		wantFence(t, err, store.FenceSupersededDelivery, fmt.Sprintf("replay %d of a committed turn", i+1))
		b.sameSnapshot(key, before, "replayed commit")
	}
	// Even with the next event current, the old reply cannot commit it.
	b.message(key, "next")
	b.next(act)
	before = b.snapshot(key)
	_, err = b.s.CommitTurn(b.ctx, params)
	wantFence(t, err, store.FenceSupersededDelivery, "replay while the next event is in flight")
	b.sameSnapshot(key, before, "replay while the next event is in flight")
	wantEq(t, len(b.transcript(key)), 1, "turns")
}

func testTerminalStatus(t *testing.T, b *bundle) {
	key := b.session()
	done := b.message(key, "will be done")
	dead := b.message(key, "will be dead lettered")
	open := b.message(key, "stays open")

	act := b.claim(key, LongTTL)
	b.commit(b.next(act).Delivery.TurnRef(), "ok", "")
	fr := b.fail(b.next(act).Delivery.TurnRef(), true, 0, 1)
	wantEq(t, fr.DeadLettered, true, "dead lettered at MaxAttempts 1")

	want := map[int64]store.EventStatus{done.ID: store.EventDone, dead.ID: store.EventDeadLetter, open.ID: store.EventOpen}
	seen := map[int64]store.EventStatus{}
	for _, st := range []store.EventStatus{store.EventOpen, store.EventDone, store.EventCancelled, store.EventDeadLetter, store.EventDiscarded} {
		evs, err := b.s.ListEvents(b.ctx, store.ListEventsParams{Key: key, Status: st})
		noErr(t, err, "ListEvents "+string(st))
		for _, ev := range evs {
			if prev, dup := seen[ev.ID]; dup {
				t.Fatalf("event %d listed as both %s and %s", ev.ID, prev, st)
			}
			wantEq(t, ev.Status, st, "listed status")
			if (ev.ClosedAt == nil) != (st == store.EventOpen) {
				t.Fatalf("event %d is %s with ClosedAt %v", ev.ID, st, ev.ClosedAt)
			}
			seen[ev.ID] = st
		}
	}
	if fmt.Sprint(seen) != fmt.Sprint(want) {
		t.Fatalf("statuses = %v, want %v", seen, want)
	}

	a2 := b.claim(key, LongTTL)
	d := b.next(a2)
	wantEq(t, d.Event.ID, open.ID, "the open event runs after the dead letter")
	b.commit(d.Delivery.TurnRef(), "ok", "")
	for _, ev := range b.events(key) {
		if ev.Status == store.EventOpen {
			t.Fatalf("event %d still open", ev.ID)
		}
	}
	wantEq(t, b.getSession(key).OpenEvents, int64(0), "OpenEvents")
	wantEq(t, b.getSession(key).TurnCount, int64(2), "TurnCount")
}

func testOldestFirst(t *testing.T, b *bundle) {
	key := b.session()
	var evs []store.Event
	for i := range 3 {
		evs = append(evs, b.message(key, fmt.Sprintf("m%d", i)))
	}
	act := b.claim(key, LongTTL)
	for i := range 5 {
		d := b.next(act)
		wantEq(t, d.Event.ID, evs[i].ID, fmt.Sprintf("delivery %d event", i))
		wantEq(t, d.Event.Seq, int64(i+1), fmt.Sprintf("delivery %d seq", i))
		if i == 1 { // accepted while a turn runs: still after the older ones
			evs = append(evs, b.message(key, "m3"), b.message(key, "m4"))
		}
		turn := b.commit(d.Delivery.TurnRef(), "ok", "")
		wantEq(t, turn.TurnNo, int64(i+1), "TurnNo follows acceptance order")
	}
	_, err := b.tryNext(act, true, "")
	wantNoDue(t, err, "after every event")
	for i, turn := range b.transcript(key) {
		wantEq(t, turn.EventID, evs[i].ID, fmt.Sprintf("turn %d event", i+1))
	}
}

func testNotDueBlocks(t *testing.T, b *bundle) {
	key := b.session()
	first := b.message(key, "failing")
	later := b.message(key, "waiting")
	act := b.claim(key, LongTTL)
	d := b.next(act)
	wantEq(t, d.Event.ID, first.ID, "first delivery")
	fr := b.fail(d.Delivery.TurnRef(), true, time.Hour, 5)
	wantEq(t, fr.EventID, first.ID, "FailResult.EventID")
	wantEq(t, fr.Attempts, 1, "FailResult.Attempts")
	wantEq(t, fr.DeadLettered, false, "FailResult.DeadLettered")
	ev := b.event(key, first.ID)
	if d := ev.NextAttemptAt.Sub(ev.AcceptedAt); d < 59*time.Minute || d > 61*time.Minute {
		t.Fatalf("NextAttemptAt is %v after acceptance, want about the 1 h backoff", d)
	}
	wantEq(t, ev.NextAttemptAt.Sub(fr.NextAttemptAt).Abs() <= time.Millisecond, true, "FailResult.NextAttemptAt matches the event")
	wantEq(t, ev.Attempts, 1, "Attempts")
	wantEq(t, ev.LastError, "worker crashed", "LastError")
	wantEq(t, ev.Status, store.EventOpen, "Status")

	runnable, err := b.s.RunnableSessions(b.ctx, store.RunnableSessionsParams{Limit: 100})
	noErr(t, err, "RunnableSessions")
	for _, k := range runnable {
		if k == key {
			t.Fatalf("a session whose oldest event is not due is runnable")
		}
	}

	a2 := b.claim(key, LongTTL)
	_, err = b.tryNext(a2, true, "")
	nd := wantNoDue(t, err, "NextDelivery with the oldest event backing off")
	if nd.NextDueAt.Sub(ev.NextAttemptAt).Abs() > time.Millisecond {
		t.Fatalf("NextDueAt = %v, want the oldest event's %v", nd.NextDueAt, ev.NextAttemptAt)
	}
	wantEq(t, b.event(key, later.ID).Status, store.EventOpen, "the later event waits")
	wantEq(t, b.event(key, later.ID).Binding, "", "the later event was never attempted")
}

func testMarkSent(t *testing.T, b *bundle) {
	key := b.session()
	b.message(key, "send me")
	act := b.claim(key, LongTTL)
	d, err := b.tryNext(act, false, b.agent.ModuleDigest)
	noErr(t, err, "NextDelivery without MarkSent")
	wantEq(t, d.Delivery.State, store.DeliveryCreated, "Delivery.State")
	ref := d.Delivery.TurnRef()

	before := b.snapshot(key)
	_, err = b.s.CommitTurn(b.ctx, store.CommitTurnParams{Ref: ref, Outcome: abi.OutcomeOK})
	wantFence(t, err, store.FenceSupersededDelivery, "commit of a delivery never marked sent")
	b.sameSnapshot(key, before, "commit of a created delivery")

	bad := ref
	bad.DeliveryID = uuid.NewString()
	wantFence(t, b.s.MarkDeliverySent(b.ctx, bad), store.FenceUnknownDelivery, "MarkDeliverySent unknown")
	bad = ref
	bad.ActorEpoch++
	wantFence(t, b.s.MarkDeliverySent(b.ctx, bad), store.FenceStaleEpoch, "MarkDeliverySent other epoch")
	bad = ref
	bad.SessionID = b.session().SessionID
	wantFence(t, b.s.MarkDeliverySent(b.ctx, bad), store.FenceWrongActorKey, "MarkDeliverySent other session")

	noErr(t, b.s.MarkDeliverySent(b.ctx, ref), "MarkDeliverySent")
	wantFence(t, b.s.MarkDeliverySent(b.ctx, ref), store.FenceSupersededDelivery, "second MarkDeliverySent")
	b.commit(ref, "sent and done", "")
}

func testBinding(t *testing.T, b *bundle) {
	key := b.session()
	ev := b.message(key, "bound")
	a1 := b.claim(key, LongTTL)
	d1, err := b.tryNext(a1, true, "sha256:v1")
	noErr(t, err, "first NextDelivery")
	wantEq(t, d1.Delivery.Binding, "sha256:v1", "first attempt's binding")
	wantEq(t, d1.Event.Binding, "sha256:v1", "event binding recorded at the first attempt")
	b.fail(d1.Delivery.TurnRef(), true, 0, 5)

	a2 := b.claim(key, LongTTL)
	d2, err := b.tryNext(a2, true, "sha256:v2")
	noErr(t, err, "retry NextDelivery")
	wantEq(t, d2.Event.ID, ev.ID, "retry event")
	wantEq(t, d2.Delivery.Binding, "sha256:v1", "a retry keeps the first attempt's binding")
	wantEq(t, b.event(key, ev.ID).Binding, "sha256:v1", "event binding after the retry")
	b.commit(d2.Delivery.TurnRef(), "ok", "")

	b.message(key, "new module")
	d3, err := b.tryNext(a2, true, "sha256:v2")
	noErr(t, err, "next event's NextDelivery")
	wantEq(t, d3.Delivery.Binding, "sha256:v2", "a new event takes the current binding")
}

// testBindCurrentAgent: NextDelivery's Bind gets what the agent runs now —
// also after an update made while the activation is live — and a retry
// keeps the binding recorded at its first attempt without asking Bind
// (docs/DESIGN.md invariant 10). A Bind error writes nothing.
// testDispatchExpect: NextDelivery given what the agent ran at the last
// dispatch (NextDeliveryParams.Expect, which a driver may use to take the
// event in one round trip) dispatches what it dispatches without: the
// event, binding, state, tail, steers, attempt and turn.started frame; a
// retry keeps its recorded binding whatever is expected; an agent updated
// since is bound anew by Bind; nothing due and not live are answered as
// usual.
func testDispatchExpect(t *testing.T, b *bundle) {
	v1 := b.module("expect v1")
	a := b.newAgent("expect-"+uuid.NewString()[:8], v1.Digest, store.CrashRestart)
	key := b.sessionOf(a.UID, store.CrashRestart)
	binds := 0
	bind := func(ab store.AgentBinding) (string, error) {
		binds++
		return "bound:" + ab.ModuleDigest, nil
	}
	next := func(act store.Activation, expect *store.ExpectedBinding) (store.Dispatch, error) {
		return b.s.NextDelivery(b.ctx, store.NextDeliveryParams{
			Activation: act.Ref(), DeliveryID: uuid.NewString(), MarkSent: true, Bind: bind,
			TailMessages: 10, ExpectDue: true, Expect: expect,
		})
	}
	b.message(key, "zero")
	act := b.claim(key, LongTTL)
	d0, err := next(act, nil)
	noErr(t, err, "NextDelivery without Expect")
	v1Agent := store.AgentBinding{Namespace: store.DefaultNamespace, Kind: store.KindWasm, ModuleDigest: v1.Digest}
	wantEq(t, d0.Agent, v1Agent, "Dispatch.Agent")
	b.commit(d0.Delivery.TurnRef(), "r0", "s0")
	expectV1 := &store.ExpectedBinding{Agent: v1Agent, Binding: "bound:" + v1.Digest}

	one := b.message(key, "one")
	framesBefore := len(b.stream(key).Frames)
	d1, err := next(act, expectV1)
	noErr(t, err, "NextDelivery with Expect")
	wantEq(t, d1.Event.ID, one.ID, "event")
	wantEq(t, d1.Event.Binding, "bound:"+v1.Digest, "event's recorded binding")
	wantEq(t, d1.Delivery.Binding, "bound:"+v1.Digest, "delivery's binding")
	wantEq(t, d1.Delivery.EventID, one.ID, "delivery's event")
	wantEq(t, d1.Delivery.ActorEpoch, act.ActorEpoch, "delivery's epoch")
	wantEq(t, d1.Delivery.State, store.DeliverySent, "delivery's state")
	wantEq(t, d1.Attempt, 1, "Attempt")
	wantEq(t, d1.Agent, v1Agent, "Dispatch.Agent")
	wantEq(t, d1.Session.ActorKey, key, "Session")
	wantBytes(t, d1.State, []byte("s0"), "State")
	wantEq(t, fmt.Sprint(d1.Tail), fmt.Sprint([]abi.Message{{Role: abi.RoleUser, Content: "zero"}, {Role: abi.RoleAssistant, Content: "r0"}}), "Tail")
	frames := b.stream(key).Frames
	wantEq(t, len(frames), framesBefore+1, "frames after the dispatch")
	last := frames[len(frames)-1]
	wantEq(t, last.Kind, store.FrameTurnStarted, "frame kind")
	wantEq(t, last.EventID, one.ID, "turn.started's event")
	wantEq(t, last.Attempt, 1, "turn.started's attempt")
	// The activation is busy: another look takes nothing.
	_, err = next(act, expectV1)
	if !errors.Is(err, store.ErrNotLive) {
		t.Fatalf("NextDelivery with Expect while a turn is in flight: %v, want ErrNotLive", err)
	}

	// A steer, then the attempt fails; the agent is updated before the
	// retry, which keeps v1 whatever is expected and brings the steer.
	sr := b.steer(key, "a twist", "")
	b.fail(sr.Ref, true, 0, 5)
	v2 := b.module("expect v2")
	_, err = b.s.CreateAgent(b.ctx, store.CreateAgentParams{UID: a.UID, Name: a.Name, ModuleDigest: v2.Digest, CrashPolicy: store.CrashRestart, Upsert: true})
	noErr(t, err, "update the agent")
	act = b.claim(key, LongTTL)
	asked := binds
	d2, err := next(act, expectV1)
	noErr(t, err, "retry with Expect")
	wantEq(t, d2.Event.ID, one.ID, "retry event")
	wantEq(t, d2.Attempt, 2, "retry Attempt")
	wantEq(t, d2.Delivery.Binding, "bound:"+v1.Digest, "a retry keeps its first attempt's binding")
	wantEq(t, binds, asked, "Bind calls for a retry")
	wantEq(t, fmt.Sprint(steerIDs(d2.Steers)), fmt.Sprint([]int64{sr.Event.ID}), "Steers on the retry")
	turn := b.commit(d2.Delivery.TurnRef(), "twisted", "")
	wantMessages(t, turn.Messages, abi.RoleUser, "one", abi.RoleUser, "a twist", abi.RoleAssistant, "twisted")

	// A new event with v1 still expected: Bind binds it to v2.
	two := b.message(key, "two")
	d3, err := next(act, expectV1)
	noErr(t, err, "NextDelivery with a stale Expect")
	wantEq(t, d3.Event.ID, two.ID, "event")
	wantEq(t, d3.Delivery.Binding, "bound:"+v2.Digest, "a new event takes the updated agent")
	if binds == asked {
		t.Fatalf("Bind was not asked for an agent changed since the expectation")
	}
	wantEq(t, d3.Agent.ModuleDigest, v2.Digest, "Dispatch.Agent after the update")
	b.commit(d3.Delivery.TurnRef(), "r3", "")

	// Nothing due, then not live.
	expectV2 := &store.ExpectedBinding{Agent: d3.Agent, Binding: "bound:" + v2.Digest}
	_, err = next(act, expectV2)
	wantNoDue(t, err, "NextDelivery with Expect and nothing open")
	noErr(t, b.s.StopActivation(b.ctx, act.Ref()), "StopActivation")
	b.message(key, "three")
	_, err = next(act, expectV2)
	if !errors.Is(err, store.ErrNotLive) {
		t.Fatalf("NextDelivery with Expect of a stopped activation: %v, want ErrNotLive", err)
	}
}

func testBindCurrentAgent(t *testing.T, b *bundle) {
	v1 := b.module("bind v1")
	a := b.newAgent("bind-"+uuid.NewString()[:8], v1.Digest, store.CrashRestart)
	key := b.sessionOf(a.UID, store.CrashRestart)
	var seen []store.AgentBinding
	next := func(act store.Activation) (store.Dispatch, error) {
		return b.s.NextDelivery(b.ctx, store.NextDeliveryParams{
			Activation: act.Ref(), DeliveryID: uuid.NewString(), MarkSent: true, Binding: "unused",
			Bind: func(ab store.AgentBinding) (string, error) {
				seen = append(seen, ab)
				if ab.ModuleDigest == "" {
					return "", errors.New("no module")
				}
				return "bound:" + ab.ModuleDigest, nil
			},
		})
	}
	first := b.message(key, "one")
	act := b.claim(key, LongTTL)
	d, err := next(act)
	noErr(t, err, "NextDelivery")
	wantEq(t, d.Event.ID, first.ID, "first event")
	wantEq(t, d.Delivery.Binding, "bound:"+v1.Digest, "first event's binding")
	wantEq(t, seen[len(seen)-1], store.AgentBinding{Namespace: store.DefaultNamespace, Kind: store.KindWasm, ModuleDigest: v1.Digest}, "Bind's input")
	b.fail(d.Delivery.TurnRef(), true, 0, 5)

	// The agent is updated while a new activation is live; the retry keeps
	// v1 and Bind is not asked for it.
	v2 := b.module("bind v2")
	_, err = b.s.CreateAgent(b.ctx, store.CreateAgentParams{UID: a.UID, Name: a.Name, ModuleDigest: v2.Digest, CrashPolicy: store.CrashRestart, Upsert: true})
	noErr(t, err, "update the agent")
	act = b.claim(key, LongTTL)
	asked := len(seen)
	d, err = next(act)
	noErr(t, err, "retry NextDelivery")
	wantEq(t, d.Event.ID, first.ID, "retry event")
	wantEq(t, d.Delivery.Binding, "bound:"+v1.Digest, "a retry keeps its first attempt's binding")
	wantEq(t, len(seen), asked, "Bind calls for a retry")
	b.commit(d.Delivery.TurnRef(), "ok", "")

	second := b.message(key, "two")
	d, err = next(act)
	noErr(t, err, "next event's NextDelivery under the same activation")
	wantEq(t, d.Event.ID, second.ID, "second event")
	wantEq(t, d.Delivery.Binding, "bound:"+v2.Digest, "a new event under the live activation takes the updated agent")
	b.commit(d.Delivery.TurnRef(), "ok", "")

	// A plugin agent: Bind sees the plugin and its registered binary.
	w := b.pluginWorker("bind-" + uuid.NewString()[:8])
	pa := b.pluginAgent("bindp-"+uuid.NewString()[:8], w.Name, store.CrashRestart)
	pkey := b.sessionOf(pa.UID, store.CrashRestart)
	b.message(pkey, "p")
	pact := b.claim(pkey, LongTTL)
	before := b.snapshot(pkey)
	_, err = next(pact)
	if err == nil || !strings.Contains(err.Error(), "no module") {
		t.Fatalf("NextDelivery with a failing Bind: %v, want its error", err)
	}
	wantEq(t, seen[len(seen)-1], store.AgentBinding{Namespace: store.DefaultNamespace, Kind: store.KindPlugin, Plugin: w.Name, PluginSHA256: w.SHA256}, "Bind's input for a plugin agent")
	b.sameSnapshot(pkey, before, "NextDelivery refused by Bind")
}

func testDeadLetter(t *testing.T, b *bundle) {
	key := b.session()
	poison := b.message(key, "poison")
	after := b.message(key, "after")
	const maxAttempts = 3
	for i := 1; i <= maxAttempts; i++ {
		act := b.claim(key, LongTTL)
		d := b.next(act)
		wantEq(t, d.Event.ID, poison.ID, fmt.Sprintf("attempt %d event", i))
		wantEq(t, d.Attempt, i, "Attempt")
		wantEq(t, d.Event.Attempts, i-1, "Event.Attempts")
		fr, err := b.s.FailAttempt(b.ctx, store.FailAttemptParams{
			Ref: d.Delivery.TurnRef(), Error: fmt.Sprintf("crash %d", i), Counted: true, MaxAttempts: maxAttempts,
		})
		noErr(t, err, "FailAttempt")
		wantEq(t, fr.Attempts, i, "FailResult.Attempts")
		wantEq(t, fr.DeadLettered, i == maxAttempts, fmt.Sprintf("dead lettered after attempt %d", i))
	}
	ev := b.event(key, poison.ID)
	wantEq(t, ev.Status, store.EventDeadLetter, "Status")
	wantEq(t, ev.Attempts, maxAttempts, "Attempts")
	wantEq(t, ev.LastError, "crash 3", "LastError")
	if ev.ClosedAt == nil {
		t.Fatalf("a dead letter has no ClosedAt")
	}
	wantEq(t, b.getSession(key).OpenEvents, int64(1), "OpenEvents")
	wantEq(t, len(b.transcript(key)), 0, "a dead letter commits no turn")

	act := b.claim(key, LongTTL)
	d := b.next(act)
	wantEq(t, d.Event.ID, after.ID, "the session moves on to its next event")
	wantEq(t, d.Attempt, 1, "next event's attempt")
}

func testUncounted(t *testing.T, b *bundle) {
	key := b.session()
	ev := b.message(key, "unlucky transport")
	for range 3 {
		act := b.claim(key, LongTTL)
		d := b.next(act)
		wantEq(t, d.Attempt, 1, "Attempt after uncounted failures")
		fr, err := b.s.FailAttempt(b.ctx, store.FailAttemptParams{
			Ref: d.Delivery.TurnRef(), Error: "no route", Counted: false, MaxAttempts: 1,
		})
		noErr(t, err, "FailAttempt uncounted")
		wantEq(t, fr.Attempts, 0, "FailResult.Attempts")
		wantEq(t, fr.DeadLettered, false, "uncounted failures never dead letter")
	}
	got := b.event(key, ev.ID)
	wantEq(t, got.Attempts, 0, "Attempts")
	wantEq(t, got.Status, store.EventOpen, "Status")
	wantEq(t, got.LastError, "no route", "LastError")

	// A delivery that was never sent can be failed, uncounted.
	act := b.claim(key, LongTTL)
	d, err := b.tryNext(act, false, "")
	noErr(t, err, "NextDelivery without MarkSent")
	fr := b.fail(d.Delivery.TurnRef(), false, 0, 1)
	wantEq(t, fr.Attempts, 0, "attempts after failing a created delivery")
	act = b.claim(key, LongTTL)
	wantEq(t, b.next(act).Attempt, 1, "attempt after failing a created delivery")
}

func testTranscriptPaging(t *testing.T, b *bundle) {
	key := b.session()
	act := b.claim(key, LongTTL)
	for i := 1; i <= 5; i++ {
		b.message(key, fmt.Sprintf("q%d", i))
		d := b.next(act)
		_, err := b.s.CommitTurn(b.ctx, store.CommitTurnParams{
			Ref: d.Delivery.TurnRef(), Outcome: abi.OutcomeOK,
			Messages: []abi.Message{{Role: abi.RoleAssistant, Content: fmt.Sprintf("a%d", i)}, {Role: abi.RoleAssistant, Content: fmt.Sprintf("b%d", i)}},
		})
		noErr(t, err, "CommitTurn")
	}
	var got []string
	after := int64(0)
	pages := 0
	for {
		page, err := b.s.Transcript(b.ctx, store.TranscriptParams{Key: key, AfterTurn: after, Limit: 2})
		noErr(t, err, "Transcript")
		if len(page) == 0 {
			break
		}
		if len(page) > 2 {
			t.Fatalf("page of %d turns with limit 2", len(page))
		}
		pages++
		for _, turn := range page {
			wantEq(t, turn.TurnNo, after+1, "TurnNo")
			after = turn.TurnNo
			wantMessages(t, turn.Messages, abi.RoleUser, fmt.Sprintf("q%d", turn.TurnNo),
				abi.RoleAssistant, fmt.Sprintf("a%d", turn.TurnNo), abi.RoleAssistant, fmt.Sprintf("b%d", turn.TurnNo))
			got = append(got, fmt.Sprint(turn.TurnNo))
		}
	}
	wantEq(t, pages, 3, "pages")
	wantEq(t, fmt.Sprint(got), "[1 2 3 4 5]", "turns")
	other, err := b.s.Transcript(b.ctx, store.TranscriptParams{Key: b.session()})
	noErr(t, err, "Transcript of another session")
	wantEq(t, len(other), 0, "turns of another session")
}
