package main_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/plugins/pluginhost"
	"github.com/paddock-dev/paddock/plugins/plugintest"
	"github.com/paddock-dev/paddock/wasm"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// script is the scripted conversation both worker kinds must answer alike.
var script = []abi.Event{
	{Kind: abi.EventMessage, Message: "note buy milk"},
	{Kind: abi.EventMessage, Message: "note call mum"},
	{Kind: abi.EventMessage, Message: "list"},
	{Kind: abi.EventMessage, Message: "remind 60 stretch"},
	{Kind: abi.EventMessage, Message: "every 3600 digest"},
	{Kind: abi.EventAlarm, Alarm: &abi.AlarmFired{Name: "remind-1", Data: json.RawMessage(`{"text":"stretch"}`)}},
	{Kind: abi.EventAlarm, Alarm: &abi.AlarmFired{Name: "digest"}},
	{Kind: abi.EventMessage, Message: "stop digest"},
	{Kind: abi.EventSteer, Message: "count"},
	{Kind: abi.EventMessage, Message: "what now?"},
}

// turner is what both worker kinds offer.
type turner interface {
	Turn(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error)
}

// run drives the script through w the way the host does: the state and
// transcript of each turn feed the next. It returns every result as JSON.
func run(t *testing.T, w turner) []string {
	t.Helper()
	var state []byte
	var transcript []abi.Message
	var out []string
	at := time.Date(2026, 11, 30, 3, 0, 0, 0, time.UTC)
	for i, ev := range script {
		ev.ID = int64(i + 1)
		ev.AcceptedAt = at.Add(time.Duration(i) * time.Second)
		if ev.Alarm != nil {
			ev.Alarm.DueAt = ev.AcceptedAt
		}
		req := &abi.TurnRequest{
			ABIVersion: abi.Version,
			TurnRef: abi.TurnRef{DeliveryID: fmt.Sprintf("d%d", i), ActivationUID: "act", ActorEpoch: 1,
				ActorEventID: ev.ID, AgentUID: "agt_notes", SessionID: "ses_1"},
			Session:    abi.Session{AgentName: "notes", SessionID: "ses_1"},
			Event:      ev,
			State:      state,
			Transcript: transcript,
			Attempt:    1,
		}
		res, err := w.Turn(context.Background(), req)
		if err != nil {
			t.Fatalf("turn %d (%s %q): %v", i, ev.Kind, ev.Message, err)
		}
		b, err := json.Marshal(res)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, string(b))
		if res.State != nil {
			state = res.State
		}
		if ev.Message != "" {
			transcript = append(transcript, abi.Message{Role: abi.RoleUser, Content: ev.Message})
		}
		transcript = append(transcript, res.Messages...)
	}
	return out
}

// TestConformance: the notes agent as a wasm module and as a plugin
// worker answer the same conversation with identical results and states.
func TestConformance(t *testing.T) {
	ctx := context.Background()
	_, mod := wasmtest.BuildExample(t, wasmtest.Notes)
	rt, err := wasm.New(ctx, wasm.Config{CacheDir: wasmtest.CacheDir(t)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	digest := wasm.Digest(mod)
	if _, err := rt.Load(ctx, digest, mod); err != nil {
		t.Fatal(err)
	}
	wi, err := rt.Instantiate(ctx, digest)
	if err != nil {
		t.Fatal(err)
	}
	defer wi.Close(ctx)

	m := pluginhost.NewManager(nil, pluginhost.Options{})
	defer m.Close(ctx)
	path, sum := plugintest.Build(t, plugintest.Notes)
	if err := m.Register(ctx, pluginhost.Config{Name: "notes", Path: path, SHA256: sum}); err != nil {
		t.Fatal(err)
	}
	pi, err := m.Instance(ctx, "notes", sum)
	if err != nil {
		t.Fatal(err)
	}

	fromWasm, fromPlugin := run(t, wi), run(t, pi)
	for i := range fromWasm {
		if fromWasm[i] != fromPlugin[i] {
			t.Errorf("turn %d differs:\nwasm   %s\nplugin %s", i, fromWasm[i], fromPlugin[i])
		}
	}
	t.Logf("last result (both kinds): %s", fromPlugin[len(fromPlugin)-1])
}
