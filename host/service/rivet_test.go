package service_test

import (
	"context"
	"errors"
	"testing"

	"github.com/paddock-dev/paddock/host/service"
	"github.com/paddock-dev/paddock/store"
)

// The operations behind Rivet's actors API (host/rivetapi), tested as any
// front door would call them.

func TestASessionsPoolMustBeItsAgentsPool(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	pol := *f.h.Policy()
	pol.Pools = map[string]int{"default": 64, "batch": 2}
	f.h.SetPolicy(pol)
	if _, err := f.svc.CreateSession(ctx, f.agent, service.SessionParams{Pool: "default"}); err != nil {
		t.Fatalf("the agent's pool: %v", err)
	}
	if got := f.svc.AgentPool(f.agent); got != "default" {
		t.Fatalf("AgentPool = %q", got)
	}
	_, err := f.svc.CreateSession(ctx, f.agent, service.SessionParams{Pool: "gpu"})
	if nf, ok := errors.AsType[*service.NotFoundError](err); !ok || nf.Resource != service.ResourcePool || !nf.Referenced || nf.Field != "pool" {
		t.Fatalf("a pool not configured: %v, want a referenced pool NotFoundError", err)
	}
	_, err = f.svc.CreateSession(ctx, f.agent, service.SessionParams{Pool: "batch"})
	if inv, ok := errors.AsType[*service.InvalidError](err); !ok || inv.Field != "pool" {
		t.Fatalf("another agent's pool: %v, want an InvalidError for pool", err)
	}
	xs, _, _ := f.svc.ListSessions(ctx, f.agent, "", 0)
	if len(xs) != 1 {
		t.Fatalf("refused creates wrote sessions: %d sessions", len(xs))
	}
}

func TestGetOrCreateWithExistingWinsReturnsTheExistingSession(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	first, created, err := f.svc.GetOrCreateSession(ctx, f.agent, service.SessionParams{Key: "k", CrashPolicy: "sleep", Input: []byte("a")})
	if err != nil || !created {
		t.Fatalf("first: %v %v", created, err)
	}
	// Without ExistingWins a differing policy is refused (the /v1 rule).
	if _, _, err := f.svc.GetOrCreateSession(ctx, f.agent, service.SessionParams{Key: "k", CrashPolicy: "destroy"}); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("differing policy: %v, want a conflict", err)
	}
	x, created, err := f.svc.GetOrCreateSession(ctx, f.agent, service.SessionParams{Key: "k", CrashPolicy: "destroy", Input: []byte("b"), ExistingWins: true})
	if err != nil || created || x.SessionID != first.SessionID || x.CrashPolicy != store.CrashSleep || string(x.Input) != "a" {
		t.Fatalf("existing wins: %+v created=%v err=%v", x, created, err)
	}
	// A create of a taken key names the session holding it.
	_, err = f.svc.CreateSession(ctx, f.agent, service.SessionParams{Key: "k"})
	if ce, ok := errors.AsType[*service.ConflictError](err); !ok || ce.Existing != first.SessionID {
		t.Fatalf("taken key: %v, want a ConflictError naming %s", err, first.SessionID)
	}
}

func TestFindSessionAndQuerySessions(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	keyed, _, err := f.svc.GetOrCreateSession(ctx, f.agent, service.SessionParams{Key: "k"})
	if err != nil {
		t.Fatal(err)
	}
	plain := f.session(t)
	gone := f.session(t)
	if _, err := f.svc.DestroySession(ctx, gone); err != nil {
		t.Fatal(err)
	}
	a, x, err := f.svc.FindSession(ctx, plain.SessionID)
	if err != nil || a.Name != "notes" || x.SessionID != plain.SessionID {
		t.Fatalf("FindSession: %v %v %v", a.Name, x.SessionID, err)
	}
	if _, _, err := f.svc.FindSession(ctx, "no-such-session"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unknown id: %v", err)
	}
	ids := func(q service.SessionQuery) map[string]bool {
		t.Helper()
		out := map[string]bool{}
		for {
			xs, next, err := f.svc.QuerySessions(ctx, f.agent, q)
			if err != nil {
				t.Fatal(err)
			}
			for _, x := range xs {
				out[x.SessionID] = true
			}
			if next == "" {
				return out
			}
			q.After = next
		}
	}
	if got := ids(service.SessionQuery{Limit: 1}); len(got) != 2 || got[gone.SessionID] {
		t.Fatalf("live sessions: %v", got)
	}
	if got := ids(service.SessionQuery{Limit: 1, IncludeDestroyed: true}); len(got) != 3 {
		t.Fatalf("with destroyed: %v", got)
	}
	if got := ids(service.SessionQuery{Key: "k"}); len(got) != 1 || !got[keyed.SessionID] {
		t.Fatalf("by key: %v", got)
	}
	if _, _, err := f.svc.QuerySessions(ctx, f.agent, service.SessionQuery{Limit: service.MaxSessionLimit + 1}); err == nil {
		t.Fatal("a limit over MaxSessionLimit was accepted")
	}
}

// TestOnlyDeclaredNamespacesExist: default always, others once the
// host's policy declares them (the config's namespaces:).
func TestOnlyDeclaredNamespacesExist(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	if err := f.svc.CheckNamespace(service.DefaultNamespace); err != nil {
		t.Fatal(err)
	}
	err := f.svc.CheckNamespace("acme")
	if nf, ok := errors.AsType[*service.NotFoundError](err); !ok || nf.Resource != service.ResourceNamespace {
		t.Fatalf("acme: %v, want a namespace NotFoundError", err)
	}
}
