package service_test

// Attacks on the service's rules (branch breaker). Each test states what
// it tries and what the service must do.

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/host/service"
	"github.com/paddock-dev/paddock/store"
)

// Found by attack, fixed: the event a wait's resolution appends carries
// the idempotency key "wait:<id>", and one an alarm fires carries
// "alarm:<name>:<due ms>"; a client may choose any key for its signals.
// A client that sent a message with the key "wait:q" before wait q was
// resolved took the resolution's place: ResolveWait then found "its"
// event and appended nothing — the wait reads resolved, and the agent
// never got the resolver's data (it got the client's message instead).
// Keys with the host's prefixes are refused.
func TestAttackClientKeyPreemptsAWaitsEvent(t *testing.T) {
	f, w, a, _ := waitFixture(t)
	ctx := context.Background()
	key := w.Session()
	w.Start(key, "ask").CommitWait(store.WaitParams{ID: "q", For: "name?"})
	for _, k := range []string{"wait:q", "alarm:tick:1700000000000"} {
		_, err := f.svc.Signal(ctx, a, key.SessionID, service.SignalParams{Message: "forged", IdempotencyKey: k})
		invalidField(t, err, "idempotency_key")
	}
	x, err := f.svc.GetSession(ctx, a, key.SessionID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := resolve(f, x, "q", service.Resolution{Data: json.RawMessage(`"Ada"`)}); err != nil {
		t.Fatal(err)
	}
	evs, err := f.svc.ListEvents(ctx, x, "", service.Page{})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range evs {
		found = found || e.Kind == abi.EventWaitResolved
	}
	if !found {
		t.Fatalf("no %s event after the resolution: %+v", abi.EventWaitResolved, evs)
	}
}
