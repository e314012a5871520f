package rivetapi_test

import (
	"context"
	"testing"

	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/host/service"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// TestActorsOfAnotherNamespaceAreNotFound: Rivet's ?namespace= is
// Paddock's; an actor of team-a is neither listed nor destroyed from
// default by its id, and carries namespace_id team-a.
func TestActorsOfAnotherNamespaceAreNotFound(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pol := *e.h.Policy()
	pol.Namespaces = map[string]host.NamespacePolicy{"team-a": {}}
	e.h.SetPolicy(pol)
	ctx := service.WithNamespace(context.Background(), "team-a")
	_, b := wasmtest.BuildExample(t, wasmtest.Notes)
	m, _, err := e.svc.UploadModule(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.CreateAgent(ctx, "notes", service.Binding{Module: m.Digest}); err != nil {
		t.Fatal(err)
	}
	code, body := e.do("POST", "/actors?namespace=team-a", `{"name":"notes","key":"k","crash_policy":"sleep","runner_name_selector":"default"}`)
	if code != 200 {
		t.Fatalf("create in team-a: %d %v", code, body)
	}
	actor := body["actor"].(map[string]any)
	id := actor["actor_id"].(string)
	if actor["namespace_id"] != "team-a" {
		t.Fatalf("namespace_id = %v", actor["namespace_id"])
	}
	if code, body := e.do("GET", "/actors?namespace=default&actor_ids="+id, ""); code != 200 || len(body["actors"].([]any)) != 0 {
		t.Fatalf("team-a's actor listed from default: %d %v", code, body)
	}
	if code, body := e.do("DELETE", "/actors/"+id+"?namespace=default", ""); code != 400 || body["code"] != "not_found" {
		t.Fatalf("team-a's actor destroyed from default: %d %v", code, body)
	}
	if code, body := e.do("GET", "/actors?namespace=team-a&actor_ids="+id, ""); code != 200 || len(body["actors"].([]any)) != 1 {
		t.Fatalf("team-a's actor from team-a: %d %v", code, body)
	}
}
