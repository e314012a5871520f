package service_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/host/service"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// removeAgent deletes agent uid's row as an operator would by hand: no
// store operation deletes an agent, and its sessions' foreign keys keep it
// while any session names it.
func (f *fixture) removeAgent(t *testing.T, uid string) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+f.path+"?_pragma=busy_timeout(10000)&_pragma=foreign_keys(1)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, q := range []string{`DELETE FROM agent_versions WHERE agent_uid = ?`, `DELETE FROM agents WHERE agent_uid = ?`} {
		if _, err := db.Exec(q, uid); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// TestASignalByNameFollowsAnAgentRegisteredAgainUnderItsName: SignalAgent
// resolves a name once; when the agent behind it is removed and a new one
// registered under the name (a new uid), a signal does not fail on the
// stale uid nor land on it: it reaches the new agent's session. An agent
// gone is an unknown agent; an unknown session stays one.
func TestASignalByNameFollowsAnAgentRegisteredAgainUnderItsName(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	old, err := f.svc.CreateAgent(ctx, "echo", service.Binding{Module: f.agent.ModuleDigest})
	if err != nil {
		t.Fatal(err)
	}
	// Resolved and cached: the session is unknown under the old uid.
	if _, err := f.svc.SignalAgent(ctx, "echo", "nosuch", service.SignalParams{Message: "x"}); !isNotFound(err, service.ResourceSession) {
		t.Fatalf("a signal to an unknown session: %v", err)
	}
	if got, err := f.svc.ResolveAgent(ctx, "echo"); err != nil || got.UID != old.UID || got.Namespace != service.DefaultNamespace || got.Name != "echo" {
		t.Fatalf("ResolveAgent(echo) = %+v, %v; want uid %s", got, err, old.UID)
	}

	f.removeAgent(t, old.UID)
	again, err := f.svc.CreateAgent(ctx, "echo", service.Binding{Module: f.agent.ModuleDigest})
	if err != nil || again.UID == old.UID {
		t.Fatalf("echo registered again: %+v, %v", again, err)
	}
	x, err := f.svc.CreateSession(ctx, again, service.SessionParams{})
	if err != nil {
		t.Fatal(err)
	}
	res, err := f.svc.SignalAgent(ctx, "echo", x.SessionID, service.SignalParams{Message: "to the new echo"})
	if err != nil || !res.Created || res.Event.AgentUID != again.UID || res.Event.SessionID != x.SessionID {
		t.Fatalf("signal to the new echo: %+v, %v", res.Event, err)
	}
	if es := f.events(t, x); len(es) != 1 || es[0].ID != res.Event.ID {
		t.Fatalf("the new echo's session holds %+v", es)
	}
	if got, err := f.svc.ResolveAgent(ctx, "echo"); err != nil || got.UID != again.UID {
		t.Fatalf("ResolveAgent(echo) after the signal = %+v, %v; want uid %s", got, err, again.UID)
	}
	// By its old uid, the agent is gone, cached or not.
	if _, err := f.svc.SignalAgent(ctx, old.UID, x.SessionID, service.SignalParams{Message: "x"}); !isNotFound(err, service.ResourceAgent) {
		t.Fatalf("a signal to the old uid: %v", err)
	}

	// Removed and not registered again: an unknown agent, nothing written.
	gone, err := f.svc.CreateAgent(ctx, "gone", service.Binding{Module: f.agent.ModuleDigest})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.svc.ResolveAgent(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	f.removeAgent(t, gone.UID)
	if _, err := f.svc.SignalAgent(ctx, "gone", x.SessionID, service.SignalParams{Message: "x"}); !isNotFound(err, service.ResourceAgent) {
		t.Fatalf("a signal to a removed agent: %v", err)
	}
	if es := f.events(t, x); len(es) != 1 {
		t.Fatalf("refused signals wrote events: %+v", es)
	}
}

// TestASignalByNameStaysInTheCallersNamespace: an agent's identity cached
// for one namespace is never what another namespace's address resolves
// to: a token of team-a is refused team-b's agent — by name, by uid, or by
// naming team-b — however warm the cache, and nothing is written.
func TestASignalByNameStaysInTheCallersNamespace(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	pol := *f.h.Policy()
	pol.Namespaces = map[string]host.NamespacePolicy{"team-a": {}, "team-b": {}}
	f.h.SetPolicy(pol)
	ctx := context.Background()
	inB := service.WithNamespace(ctx, "team-b")
	_, b := wasmtest.BuildExample(t, wasmtest.Notes)
	if _, _, err := f.svc.UploadModule(inB, b); err != nil {
		t.Fatal(err)
	}
	agentB, err := f.svc.CreateAgent(inB, "notes", service.Binding{Module: f.agent.ModuleDigest})
	if err != nil {
		t.Fatal(err)
	}
	x, err := f.svc.CreateSession(inB, agentB, service.SessionParams{})
	if err != nil {
		t.Fatal(err)
	}
	// Warm: team-b's notes resolved by name and by uid.
	for _, ref := range []string{"notes", agentB.UID} {
		if res, err := f.svc.SignalAgent(inB, ref, x.SessionID, service.SignalParams{Message: "from b"}); err != nil || res.Event.AgentUID != agentB.UID {
			t.Fatalf("signal to team-b's %s: %+v, %v", ref, res.Event, err)
		}
	}

	tokA := service.WithCaller(ctx, service.Caller{TokenID: "aaaaaaaaaaaaaaaa", Role: service.RoleAdmin, Namespace: "team-a"})
	// In its own namespace: team-a has no notes.
	if _, err := f.svc.SignalAgent(tokA, "notes", x.SessionID, service.SignalParams{Message: "x"}); !isNotFound(err, service.ResourceAgent) {
		t.Fatalf("team-a's token, notes by name: %v, want an unknown agent", err)
	}
	if _, err := f.svc.SignalAgent(tokA, agentB.UID, x.SessionID, service.SignalParams{Message: "x"}); !isNotFound(err, service.ResourceAgent) {
		t.Fatalf("team-a's token, team-b's agent by uid: %v, want an unknown agent", err)
	}
	var fe *service.ForbiddenError
	if _, err := f.svc.SignalAgent(service.WithNamespace(tokA, "team-b"), "notes", x.SessionID, service.SignalParams{Message: "x"}); !errors.As(err, &fe) {
		t.Fatalf("team-a's token naming team-b: %v, want a *ForbiddenError", err)
	}
	// The default namespace's notes is another agent again.
	if res, err := f.svc.SignalAgent(ctx, "notes", x.SessionID, service.SignalParams{Message: "x"}); !isNotFound(err, service.ResourceSession) {
		t.Fatalf("default's notes, team-b's session: %+v, %v, want an unknown session", res.Event, err)
	}
	es, err := f.st.ListEvents(ctx, store.ListEventsParams{Key: x.ActorKey, Limit: 10})
	if err != nil || len(es) != 2 {
		t.Fatalf("team-b's session holds %d events (%v), want the 2 of its own namespace", len(es), err)
	}
}
