package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	apiclient "github.com/paddock-dev/paddock/host/api/client"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// TestSignalSendWaitOnADestroyedSession runs `signal send --wait` for a
// message queued behind a long turn, against the real API, and destroys
// the session while it waits: the command fails saying the session was
// destroyed and how the event ended (discarded), not with an empty reason.
func TestSignalSendWaitOnADestroyedSession(t *testing.T) {
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
	if _, err := ra.api.SendSignal(ctx, "faulty", s.SessionID, apiclient.Signal{Message: "think 20000"}); err != nil {
		t.Fatal(err)
	}
	type result struct {
		out string
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := ra.run(ctx, "signal", "send", "faulty", s.SessionID, "queued", "--wait", "--wait-timeout", "2m")
		done <- result{out, err}
	}()
	// Wait until the queued message is accepted, then destroy the session.
	for deadline := time.Now().Add(time.Minute); ; {
		evs, err := ra.api.ListEvents(ctx, "faulty", s.SessionID, apiclient.ListEventsOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the queued message was not accepted: %+v", evs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := ra.api.DestroySession(ctx, "faulty", s.SessionID); err != nil {
		t.Fatal(err)
	}
	var r result
	select {
	case r = <-done:
	case <-time.After(time.Minute):
		t.Fatal("signal send --wait did not return after the session was destroyed")
	}
	var ee *EventEndedError
	if !errors.As(r.err, &ee) || ee.Status != store.EventDiscarded || !ee.SessionDestroyed || ee.DestroyedAt == nil {
		t.Fatalf("signal send --wait: %v (%#v), want an EventEndedError: discarded, session destroyed\n%s", r.err, r.err, r.out)
	}
	msg := r.err.Error()
	for _, want := range []string{"ended discarded", "the session was destroyed at "} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not say %q", msg, want)
		}
	}
	if strings.HasSuffix(msg, ": ") {
		t.Errorf("error %q ends with an empty reason", msg)
	}
}

// TestEventEndedErrorSaysWhy checks that every way an event ends without a
// turn reads with a reason.
func TestEventEndedErrorSaysWhy(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.Local)
	for _, c := range []struct {
		e    EventEndedError
		want string
	}{
		{EventEndedError{EventID: 1, Status: store.EventDeadLetter, LastError: "trap: unreachable\nstack"}, "event 1 ended dead_letter: trap: unreachable …"},
		{EventEndedError{EventID: 2, Status: store.EventDiscarded, SessionDestroyed: true, DestroyedAt: &at}, "event 2 ended discarded: the session was destroyed at 2026-01-02 03:04:05"},
		{EventEndedError{EventID: 3, Status: store.EventDiscarded, SessionDestroyed: true, LastError: "x"}, "event 3 ended discarded: the session was destroyed; last error: x"},
		{EventEndedError{EventID: 4, Status: store.EventCancelled}, "event 4 ended cancelled: cancelled by a cancel signal before its turn committed"},
		{EventEndedError{EventID: 5, Status: store.EventDiscarded}, "event 5 ended discarded (no error recorded; see `paddock event show`)"},
	} {
		if got := c.e.Error(); got != c.want {
			t.Errorf("%+v: %q, want %q", c.e, got, c.want)
		}
	}
}
