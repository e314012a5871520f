package notes_test

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/examples/notes"
	"github.com/paddock-dev/paddock/wasm"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// step is one event of a conversation: a message (msg; a queued steer if
// steer is set), or the firing of an alarm (alarm); reply and alarms are
// what the agent must answer.
type step struct {
	msg    string
	steer  bool
	alarm  *abi.AlarmFired
	reply  string
	alarms []abi.AlarmOp
}

// fired is the alarm event of name with data.
func fired(name, data string) *abi.AlarmFired {
	a := &abi.AlarmFired{Name: name, DueAt: time.Unix(1_800_000_100, 0).UTC()}
	if data != "" {
		a.Data = json.RawMessage(data)
	}
	return a
}

// script is a conversation and the replies the notes agent must give.
var script = []step{
	{msg: "count", reply: "0 notes, 1 turns"},
	{msg: "list", reply: "no notes"},
	{msg: "note buy milk", reply: "noted (1)"},
	{msg: "note   call Ada  ", reply: "noted (2)"},
	{msg: "note", reply: "usage: note <text>"},
	{msg: "LIST", reply: "1. buy milk\n2. call Ada"},
	{msg: "hello there", reply: "2 notes, 7 turns"},
	{msg: "remind 30 call  Ada back", reply: "reminder remind-1 set in 30 s",
		alarms: []abi.AlarmOp{{Name: "remind-1", InMs: 30_000, Data: json.RawMessage(`{"text":"call  Ada back"}`)}}},
	{msg: "remind 5 tea", reply: "reminder remind-2 set in 5 s",
		alarms: []abi.AlarmOp{{Name: "remind-2", InMs: 5_000, Data: json.RawMessage(`{"text":"tea"}`)}}},
	{alarm: fired("remind-2", `{"text":"tea"}`), reply: "reminder: tea"},
	{msg: "every 60 hourly check", reply: "tick hourly check every 60 s",
		alarms: []abi.AlarmOp{{Name: "hourly check", InMs: 60_000, EveryMs: 60_000}}},
	{alarm: fired("hourly check", ""), reply: "tick hourly check"},
	{alarm: fired("hourly check", ""), reply: "tick hourly check"},
	{msg: "stop hourly check", reply: "stopped hourly check",
		alarms: []abi.AlarmOp{{Name: "hourly check", Clear: true}}},
	{alarm: fired("remind-1", `{"text":"call  Ada back"}`), reply: "reminder: call  Ada back"},
	{msg: "remind soon tea", reply: "usage: remind <seconds 1-31622400> <text>"},
	{msg: "remind 0 tea", reply: "usage: remind <seconds 1-31622400> <text>"},
	{msg: "remind 10", reply: "usage: remind <seconds 1-31622400> <text>"},
	{msg: "every 10", reply: "usage: every <seconds 1-31622400> <name of 1-100 bytes>"},
	{msg: "every 10 " + strings.Repeat("n", 101), reply: "usage: every <seconds 1-31622400> <name of 1-100 bytes>"},
	{msg: "every 99999999999 x", reply: "usage: every <seconds 1-31622400> <name of 1-100 bytes>"},
	{msg: "stop", reply: "usage: stop <name>"},
	{msg: "note oat milk", steer: true, reply: "noted (3)"},
	{msg: "count", reply: "3 notes, 24 turns"},
}

func request(i int, st step, state []byte) *abi.TurnRequest {
	ev := abi.Event{ID: int64(i), Kind: abi.EventMessage, Message: st.msg, AcceptedAt: time.Unix(1_800_000_000, 0).UTC()}
	switch {
	case st.alarm != nil:
		ev.Kind, ev.Alarm = abi.EventAlarm, st.alarm
	case st.steer:
		ev.Kind = abi.EventSteer
	}
	return &abi.TurnRequest{
		ABIVersion: abi.Version,
		TurnRef:    abi.TurnRef{DeliveryID: "d", ActivationUID: "a", ActorEpoch: 1, ActorEventID: int64(i), AgentUID: "g", SessionID: "s"},
		Session:    abi.Session{AgentName: "notes", SessionID: "s"},
		Event:      ev,
		State:      state,
		Attempt:    1,
	}
}

// play runs the script through turn, carrying the state like the host
// does, and returns every result.
func play(t *testing.T, turn func(*abi.TurnRequest) (*abi.TurnResult, error)) []*abi.TurnResult {
	t.Helper()
	var state []byte
	var out []*abi.TurnResult
	for i, step := range script {
		res, err := turn(request(i, step, state))
		if err != nil {
			t.Fatalf("turn %d %q: %v", i, step.msg, err)
		}
		if res.Outcome != abi.OutcomeOK || len(res.Messages) != 1 || res.Messages[0].Role != abi.RoleAssistant {
			t.Fatalf("turn %d %q: %+v", i, step.msg, res)
		}
		if got := res.Messages[0].Content; got != step.reply {
			t.Fatalf("turn %d %q: reply %q, want %q", i, step.msg, got, step.reply)
		}
		if !reflect.DeepEqual(res.Alarms, step.alarms) {
			t.Fatalf("turn %d %q: alarms %+v, want %+v", i, step.msg, res.Alarms, step.alarms)
		}
		if err := res.Validate(); err != nil {
			t.Fatalf("turn %d %q: %v", i, step.msg, err)
		}
		if res.State != nil {
			state = res.State
		}
		out = append(out, res)
	}
	return out
}

func TestScript(t *testing.T) {
	t.Parallel()
	results := play(t, func(req *abi.TurnRequest) (*abi.TurnResult, error) {
		return abi.Run(context.Background(), notes.Turn, req), nil
	})
	s, err := notes.DecodeState(results[len(results)-1].State)
	if err != nil {
		t.Fatal(err)
	}
	if want := (notes.State{Notes: []string{"buy milk", "call Ada", "oat milk"}, Turns: len(script), Reminders: 2}); !reflect.DeepEqual(s, want) {
		t.Fatalf("state %+v, want %+v", s, want)
	}
}

func TestCorruptStateFailsTheTurn(t *testing.T) {
	t.Parallel()
	res := abi.Run(context.Background(), notes.Turn, request(1, step{msg: "count"}, []byte("not json")))
	if res.Outcome != abi.OutcomeError || res.Error == "" {
		t.Fatalf("%+v", res)
	}
}

// TestModuleMatchesLogic: the wasm module gives the same results as the
// logic run in-process (docs/DESIGN.md "Workers": one agent, the same transcript on every
// worker kind).
func TestModuleMatchesLogic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, body := wasmtest.BuildExample(t, wasmtest.Notes)
	rt, err := wasm.New(ctx, wasm.Config{CacheDir: wasmtest.CacheDir(t)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	info, err := rt.Validate(ctx, body)
	if err != nil {
		t.Fatal(err)
	}
	inst, err := rt.Instantiate(ctx, info.Digest)
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Close(ctx)
	inWasm := play(t, func(req *abi.TurnRequest) (*abi.TurnResult, error) { return inst.Turn(ctx, req) })
	inProcess := play(t, func(req *abi.TurnRequest) (*abi.TurnResult, error) {
		return abi.Run(ctx, notes.Turn, req), nil
	})
	if !reflect.DeepEqual(inWasm, inProcess) {
		t.Fatalf("wasm and in-process results differ:\n%+v\n%+v", inWasm, inProcess)
	}
}

// TestLongReminderIsRefused: a reminder text past the alarm data limit is
// answered with a message, never with an alarm the host would refuse.
func TestLongReminderIsRefused(t *testing.T) {
	t.Parallel()
	res := abi.Run(context.Background(), notes.Turn, request(1, step{msg: "remind 5 " + strings.Repeat("x", 70_000)}, nil))
	if res.Outcome != abi.OutcomeOK || res.Messages[0].Content != "reminder text too long" || res.Alarms != nil {
		t.Fatalf("%+v", res.Messages)
	}
}

// TestAskOpensAWaitAndNotesTheAnswer: "ask" ends the turn with outcome
// wait (wait ask-<n>, the question, an optional timeout); the wait's
// resolution or expiry is stored as a note.
func TestAskOpensAWaitAndNotesTheAnswer(t *testing.T) {
	ctx := context.Background()
	var state []byte
	turn := func(ev abi.Event) *abi.TurnResult {
		t.Helper()
		res, err := notes.Turn(ctx, &abi.TurnRequest{Event: ev, State: state})
		if err != nil {
			t.Fatal(err)
		}
		state = res.State
		return res
	}
	res := turn(abi.Event{ID: 1, Kind: abi.EventMessage, Message: "ask your name?"})
	if res.Outcome != abi.OutcomeWait || res.Wait == nil || !reflect.DeepEqual(*res.Wait, abi.WaitSpec{ID: "ask-1", For: "your name?"}) || res.Validate() != nil {
		t.Fatalf("ask: %+v %+v", res, res.Wait)
	}
	res = turn(abi.Event{ID: 2, Kind: abi.EventMessage, Message: "ask 90s lunch?"})
	if res.Wait == nil || !reflect.DeepEqual(*res.Wait, abi.WaitSpec{ID: "ask-2", For: "lunch?", TimeoutMs: 90_000}) {
		t.Fatalf("ask with a timeout: %+v", res.Wait)
	}
	if res := turn(abi.Event{ID: 3, Kind: abi.EventMessage, Message: "ask"}); res.Wait != nil || res.Outcome != abi.OutcomeOK {
		t.Fatalf("ask without a question: %+v", res)
	}
	turn(abi.Event{ID: 4, Kind: abi.EventWaitResolved, Wait: &abi.WaitEvent{ID: "ask-1", For: "your name?", Data: json.RawMessage(`"Ada"`)}})
	turn(abi.Event{ID: 5, Kind: abi.EventWaitExpired, Wait: &abi.WaitEvent{ID: "ask-2", For: "lunch?"}})
	if got := turn(abi.Event{ID: 6, Kind: abi.EventMessage, Message: "list"}).Messages[0].Content; got != "1. your name? → Ada\n2. lunch? → (no answer: the wait expired)" {
		t.Fatalf("list: %q", got)
	}
}
