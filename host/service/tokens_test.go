package service_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/host/service"
)

// TestTokenRulesOfTheService: a caller of one namespace creates tokens
// of that namespace only and never of a role above its own; it lists and
// revokes only its namespace's tokens (another's is not found); a created
// token authenticates as its role and namespace until it is revoked; the
// value is "pdk_<id>_<secret>" and the store holds no part of it.
func TestTokenRulesOfTheService(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	f.svc.WithAuthToken("boot")
	boot, err := f.svc.Authenticate(ctx, "boot")
	if err != nil || boot != (service.Caller{TokenID: "bootstrap", Role: service.RoleAdmin}) {
		t.Fatalf("bootstrap: %+v %v", boot, err)
	}
	asBoot := service.WithCaller(ctx, boot)
	adm, err := f.svc.CreateToken(asBoot, service.CreateTokenParams{Role: "admin", Name: "default admin"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(adm.Value, "pdk_"+adm.ID+"_") || len(adm.Value) != len("pdk_")+16+1+43 || adm.Namespace != "default" || adm.CreatedBy != "bootstrap" {
		t.Fatalf("created %+v", adm)
	}
	stored, err := f.st.GetToken(ctx, adm.ID)
	if err != nil || strings.Contains(string(stored.Hash), adm.Value[len(adm.Value)-43:]) {
		t.Fatalf("stored %+v %v", stored, err)
	}
	c, err := f.svc.Authenticate(ctx, adm.Value)
	if err != nil || c != (service.Caller{TokenID: adm.ID, Role: service.RoleAdmin, Namespace: "default"}) {
		t.Fatalf("authenticate: %+v %v", c, err)
	}

	// A caller of namespace team-a (as the namespaces change declares
	// them) may not create tokens of default.
	teamA := service.WithCaller(ctx, service.Caller{TokenID: "aaaaaaaaaaaaaaaa", Role: service.RoleAdmin, Namespace: "team-a"})
	var forbidden *service.ForbiddenError
	if _, err := f.svc.CreateToken(teamA, service.CreateTokenParams{Namespace: "default", Role: "reader"}); !errors.As(err, &forbidden) {
		t.Errorf("team-a admin creates a default token: %v", err)
	}
	// An operator may create no token (and so none above its role).
	asOp := service.WithCaller(ctx, service.Caller{TokenID: "bbbbbbbbbbbbbbbb", Role: service.RoleOperator, Namespace: "default"})
	if _, err := f.svc.CreateToken(asOp, service.CreateTokenParams{Role: "reader"}); !errors.As(err, &forbidden) || forbidden.Need != service.RoleAdmin {
		t.Errorf("operator creates a token: %v", err)
	}
	// team-a's admin lists none of default's tokens and cannot revoke one.
	if ts, err := f.svc.ListTokens(service.WithNamespace(teamA, "team-a")); err != nil || len(ts) != 0 {
		t.Errorf("team-a lists %v %v", ts, err)
	}
	var nf *service.NotFoundError
	if _, err := f.svc.RevokeToken(service.WithNamespace(teamA, "team-a"), adm.ID); !errors.As(err, &nf) {
		t.Errorf("team-a revokes default's token: %v", err)
	}
	if ts, err := f.svc.ListTokens(asBoot); err != nil || len(ts) != 1 || ts[0].Hash != nil {
		t.Errorf("bootstrap lists %+v %v", ts, err)
	}
	// Revoked: no longer authenticates; revoking again is harmless.
	for range 2 {
		if r, err := f.svc.RevokeToken(asBoot, adm.ID); err != nil || r.RevokedAt == nil {
			t.Fatalf("revoke: %+v %v", r, err)
		}
	}
	var un *service.UnauthenticatedError
	if _, err := f.svc.Authenticate(ctx, adm.Value); !errors.As(err, &un) || strings.Contains(err.Error(), adm.Value) {
		t.Errorf("revoked token authenticates: %v", err)
	}
	if err := f.svc.CheckCaller(ctx, c); !errors.As(err, &un) {
		t.Errorf("CheckCaller of a revoked token: %v", err)
	}
}

// TestEveryOpOfTheTableIsUnique: the operation table names each op once,
// with a role, and public ops mutate nothing.
func TestEveryOpOfTheTableIsUnique(t *testing.T) {
	t.Parallel()
	seen := map[service.Op]bool{}
	for _, r := range service.OpRules() {
		if seen[r.Op] {
			t.Errorf("op %s twice", r.Op)
		}
		seen[r.Op] = true
		if r.Role == service.RoleNone && r.Mutates {
			t.Errorf("public op %s mutates", r.Op)
		}
	}
	if _, ok := service.Op("nope").Rule(); ok {
		t.Error("an unknown op has a rule")
	}
	if err := (&service.Service{}).Authorize(context.Background(), "nope"); err == nil {
		t.Error("Authorize passes an unknown op")
	}
}
