package main

import (
	"context"
	"strings"
	"testing"
	"time"

	apiclient "github.com/paddock-dev/paddock/host/api/client"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// TestSignalSendMidTurn runs the README's `signal send --mid-turn`
// commands against the real API while the faulty agent's "think" turn
// runs: reject is refused (409 turn_in_flight, nothing written), interrupt
// cancels the turn and queues the message, steer hands the message to the
// running turn (and, with none running, says it waits as the next
// message), and a bad value is refused naming mid_turn.
func TestSignalSendMidTurn(t *testing.T) {
	ctx := context.Background()
	ra := startRealAPI(t, 32<<20)
	_, wasmBytes := wasmtest.BuildExample(t, wasmtest.Faulty)
	m, err := ra.api.UploadModule(ctx, wasmBytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ra.api.CreateAgent(ctx, apiclient.CreateAgentRequest{Name: "faulty", Module: m.Digest}); err != nil {
		t.Fatal(err)
	}
	s, err := ra.api.CreateSession(ctx, "faulty", apiclient.SessionRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// inFlight waits until the newest event's turn has started.
	inFlight := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(time.Minute); ; {
			evs, err := ra.api.ListEvents(ctx, "faulty", s.SessionID, apiclient.ListEventsOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(evs) == n && evs[n-1].Binding != "" {
				time.Sleep(200 * time.Millisecond) // the worker polls for steers
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("event %d's turn did not start: %+v", n, evs)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if out, err := ra.run(ctx, "signal", "send", "faulty", s.SessionID, "think 20000"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	inFlight(1)
	out, err := ra.run(ctx, "signal", "send", "faulty", s.SessionID, "not now", "--mid-turn", "reject")
	if err == nil || !strings.Contains(err.Error()+out, "turn_in_flight") {
		t.Fatalf("--mid-turn reject: %v\n%s, want turn_in_flight", err, out)
	}
	if evs, _ := ra.api.ListEvents(ctx, "faulty", s.SessionID, apiclient.ListEventsOptions{}); len(evs) != 1 {
		t.Fatalf("events after the refusal: %+v", evs)
	}
	out, err = ra.run(ctx, "signal", "send", "faulty", s.SessionID, "think 20000", "--mid-turn", "interrupt")
	if err != nil || !strings.Contains(out, "was cancelled") {
		t.Fatalf("--mid-turn interrupt: %v\n%s", err, out)
	}
	inFlight(2)
	out, err = ra.run(ctx, "signal", "send", "faulty", s.SessionID, "stop thinking", "--mid-turn", "steer", "--wait")
	if err != nil || !strings.Contains(out, "steered: stop thinking") {
		t.Fatalf("--mid-turn steer --wait: %v\n%s, want the steered turn's reply", err, out)
	}
	page, err := ra.api.Transcript(ctx, "faulty", s.SessionID, apiclient.TranscriptOptions{Wait: 30 * time.Second, After: 1})
	if err != nil {
		t.Fatal(err)
	}
	if tr := page.Turns; len(tr) != 1 || tr[0].Messages[len(tr[0].Messages)-1].Content != "steered: stop thinking" {
		t.Errorf("the interrupting message's turn: %+v", tr)
	}
	// Nothing runs now: a steer (or --mid-turn steer) waits as the next
	// message, and the CLI says so instead of claiming a hand-over.
	for _, args := range [][]string{{"signal", "steer", "faulty", s.SessionID, "late"},
		{"signal", "send", "faulty", s.SessionID, "later", "--mid-turn", "steer"}} {
		out, err = ra.run(ctx, args...)
		if err != nil || !strings.Contains(out, "no turn in flight to steer, so it waits as the session's next message") {
			t.Errorf("%v with no turn in flight: %v\n%s", args, err, out)
		}
	}
	out, err = ra.run(ctx, "signal", "send", "faulty", s.SessionID, "x", "--mid-turn", "later")
	if err == nil || !strings.Contains(err.Error()+out, "mid_turn") {
		t.Errorf("--mid-turn later: %v\n%s, want a refusal naming mid_turn", err, out)
	}
}
