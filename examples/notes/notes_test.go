package notes_test

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/examples/notes"
	"github.com/paddock-dev/paddock/wasm"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// script is a conversation and the replies the notes agent must give.
var script = []struct{ msg, reply string }{
	{"count", "0 notes, 1 turns"},
	{"list", "no notes"},
	{"note buy milk", "noted (1)"},
	{"note   call Ada  ", "noted (2)"},
	{"note", "usage: note <text>"},
	{"LIST", "1. buy milk\n2. call Ada"},
	{"hello there", "2 notes, 7 turns"},
}

func request(i int, msg string, state []byte) *abi.TurnRequest {
	return &abi.TurnRequest{
		ABIVersion: abi.Version,
		TurnRef:    abi.TurnRef{DeliveryID: "d", ActivationUID: "a", ActorEpoch: 1, ActorEventID: int64(i), AgentUID: "g", SessionID: "s"},
		Session:    abi.Session{AgentName: "notes", SessionID: "s"},
		Event:      abi.Event{ID: int64(i), Kind: abi.EventMessage, Message: msg, AcceptedAt: time.Unix(1_800_000_000, 0).UTC()},
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
		res, err := turn(request(i, step.msg, state))
		if err != nil {
			t.Fatalf("turn %d %q: %v", i, step.msg, err)
		}
		if res.Outcome != abi.OutcomeOK || len(res.Messages) != 1 || res.Messages[0].Role != abi.RoleAssistant {
			t.Fatalf("turn %d %q: %+v", i, step.msg, res)
		}
		if got := res.Messages[0].Content; got != step.reply {
			t.Fatalf("turn %d %q: reply %q, want %q", i, step.msg, got, step.reply)
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
	if want := (notes.State{Notes: []string{"buy milk", "call Ada"}, Turns: 7}); !reflect.DeepEqual(s, want) {
		t.Fatalf("state %+v, want %+v", s, want)
	}
}

func TestCorruptStateFailsTheTurn(t *testing.T) {
	t.Parallel()
	res := abi.Run(context.Background(), notes.Turn, request(1, "count", []byte("not json")))
	if res.Outcome != abi.OutcomeError || res.Error == "" {
		t.Fatalf("%+v", res)
	}
}

// TestModuleMatchesLogic: the wasm module gives the same results as the
// logic run in-process (DESIGN: one agent, the same transcript on every
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
