package service_test

import (
	"context"
	"regexp"
	"testing"

	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/host/service"
)

// TestAnAgentNameShapedLikeAUIDIsRefused: /v1/agents/{agent} takes a name
// or a uid, so a name that looks like a uid could be another agent's.
func TestAnAgentNameShapedLikeAUIDIsRefused(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	_, err := f.svc.CreateAgent(ctx, f.agent.UID, service.Binding{Module: f.agent.ModuleDigest})
	invalidField(t, err, "name")
	_, err = f.svc.CreateAgent(ctx, uuid.NewString(), service.Binding{Module: f.agent.ModuleDigest})
	invalidField(t, err, "name")
	if a, err := f.svc.GetAgent(ctx, f.agent.UID); err != nil || a.Name != "notes" {
		t.Fatalf("GetAgent(uid) = %v, %v; want notes", a.Name, err)
	}
}

// TestACancelWithAnIdempotencyKeyBlamesThatField names idempotency_key,
// not message.
func TestACancelWithAnIdempotencyKeyBlamesThatField(t *testing.T) {
	f := newFixture(t)
	x := f.session(t)
	_, err := f.svc.Signal(context.Background(), f.agent, x.SessionID, service.SignalParams{Kind: service.SignalCancel, IdempotencyKey: "k"})
	invalidField(t, err, "idempotency_key")
	_, err = f.svc.Signal(context.Background(), f.agent, x.SessionID, service.SignalParams{Kind: service.SignalCancel, Message: "m"})
	invalidField(t, err, "message")
}

// TestServiceMessagesCarryNoHTTPWords: a second front door (not HTTP)
// shows the service's messages as they are.
func TestServiceMessagesCarryNoHTTPWords(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	x, err := f.svc.CreateSession(ctx, f.agent, service.SessionParams{Key: "k"})
	if err != nil {
		t.Fatal(err)
	}
	_ = x
	errs := map[string]error{}
	_, errs["agent exists"] = f.svc.CreateAgent(ctx, "notes", service.Binding{Module: f.agent.ModuleDigest})
	_, errs["unknown module"] = f.svc.CreateAgent(ctx, "other", service.Binding{Module: "sha256:00"})
	_, errs["unknown plugin"] = f.svc.CreateAgent(ctx, "other", service.Binding{Plugin: "nope"})
	_, _, errs["get-or-create without key"] = f.svc.GetOrCreateSession(ctx, f.agent, service.SessionParams{})
	_, errs["session exists"] = f.svc.CreateSession(ctx, f.agent, service.SessionParams{Key: "k"})
	http := regexp.MustCompile(`\b(GET|PUT|POST|DELETE)\b|/v1/`)
	for name, err := range errs {
		if err == nil {
			t.Errorf("%s: no error", name)
		} else if http.MatchString(err.Error()) {
			t.Errorf("%s: %q carries HTTP words", name, err)
		}
	}
}
