package service_test

import (
	"context"
	"errors"
	"testing"

	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/host/service"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// TestOperationsActInTheirNamespace: the service creates in the namespace
// of the context, and an object of another namespace — by name, by uid, by
// session id — is a NotFoundError like a missing one; an undeclared
// namespace is refused before anything is read or written.
func TestOperationsActInTheirNamespace(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	pol := *f.h.Policy()
	pol.Namespaces = map[string]host.NamespacePolicy{"team-a": {}}
	f.h.SetPolicy(pol)
	ctx := context.Background()
	inA := service.WithNamespace(ctx, "team-a")

	// The default namespace's module is not visible in team-a until uploaded there.
	if _, err := f.svc.CreateAgent(inA, "notes", service.Binding{Module: f.agent.ModuleDigest}); !isNotFound(err, service.ResourceModule) {
		t.Fatalf("binding default's module in team-a: %v, want an unknown module", err)
	}
	_, b := wasmtest.BuildExample(t, wasmtest.Notes)
	if _, created, err := f.svc.UploadModule(inA, b); err != nil || !created {
		t.Fatalf("upload to team-a: created %v, %v", created, err)
	}
	a, err := f.svc.CreateAgent(inA, "notes", service.Binding{Module: f.agent.ModuleDigest})
	if err != nil || a.Namespace != "team-a" || a.UID == f.agent.UID {
		t.Fatalf("notes in team-a: %+v, %v", a, err)
	}
	x, err := f.svc.CreateSession(inA, a, service.SessionParams{})
	if err != nil {
		t.Fatal(err)
	}

	// From the default namespace: team-a's agent by uid, its session by id.
	if _, err := f.svc.GetAgent(ctx, a.UID); !isNotFound(err, service.ResourceAgent) {
		t.Fatalf("team-a's agent by uid from default: %v", err)
	}
	if got, err := f.svc.GetAgent(ctx, "notes"); err != nil || got.UID != f.agent.UID {
		t.Fatalf("notes in default: %+v, %v", got, err)
	}
	if _, _, err := f.svc.FindSession(ctx, x.SessionID); !isNotFound(err, service.ResourceSession) {
		t.Fatalf("team-a's session by id from default: %v", err)
	}
	if got, found, err := f.svc.FindSession(inA, x.SessionID); err != nil || got.UID != a.UID || found.SessionID != x.SessionID {
		t.Fatalf("team-a's session from team-a: %v", err)
	}
	if _, err := f.svc.UpdateAgent(ctx, a, service.Binding{Module: f.agent.ModuleDigest}); !isNotFound(err, service.ResourceAgent) {
		t.Fatalf("updating team-a's agent from default: %v", err)
	}
	as, err := f.svc.ListAgents(inA)
	if err != nil || len(as) != 1 || as[0].UID != a.UID {
		t.Fatalf("team-a's agents: %+v, %v", as, err)
	}
	page, err := f.svc.BrowseSessions(ctx, service.SessionFilter{})
	if err != nil || len(page.Sessions) != 0 {
		t.Fatalf("default's sessions: %+v, %v", page.Sessions, err)
	}

	// An undeclared namespace: refused, nothing written.
	nowhere := service.WithNamespace(ctx, "nowhere")
	if _, err := f.svc.CreateAgent(nowhere, "x", service.Binding{Module: f.agent.ModuleDigest}); !isNotFound(err, service.ResourceNamespace) {
		t.Fatalf("create in an undeclared namespace: %v", err)
	}
	if all, _ := f.st.ListAgents(ctx, store.AnyNamespace); len(all) != 2 {
		t.Fatalf("agents of every namespace: %d, want 2", len(all))
	}
	// Undeclaring it (a reload) makes team-a unreachable, its data kept.
	pol.Namespaces = nil
	f.h.SetPolicy(pol)
	if _, err := f.svc.GetAgent(inA, "notes"); !isNotFound(err, service.ResourceNamespace) {
		t.Fatalf("team-a after it was undeclared: %v", err)
	}
}

func isNotFound(err error, r service.Resource) bool {
	var nf *service.NotFoundError
	return errors.As(err, &nf) && nf.Resource == r
}
