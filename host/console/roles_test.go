package console_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/host/service"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// TestAReaderTokenSeesPagesButEveryActionIs403: the login form takes a
// stored token; a reader sees the pages, and each action answers a 403
// page and writes nothing (no audit row either); an operator's destroy
// is audited with its token id; revoking a token ends its console login.
func TestAReaderTokenSeesPagesButEveryActionIs403(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, "boot")
	notes := e.agent("notes", wasmtest.Notes)
	x := e.session(notes, "")
	admin := service.WithCaller(ctx, service.Caller{TokenID: service.BootstrapTokenID, Role: service.RoleAdmin})
	reader, err := e.svc.CreateToken(admin, service.CreateTokenParams{Role: "reader"})
	if err != nil {
		t.Fatal(err)
	}
	operator, err := e.svc.CreateToken(admin, service.CreateTokenParams{Role: "operator"})
	if err != nil {
		t.Fatal(err)
	}
	e.token = reader.Value
	b := e.browser()
	b.login()
	sp := sessionPath(notes, x)
	for _, p := range []string{"/ui/", "/ui/agents", sp} {
		if resp, body := b.get(p); resp.StatusCode != http.StatusOK {
			t.Fatalf("reader GET %s: %d\n%s", p, resp.StatusCode, body)
		}
	}
	audit := func() int {
		rows, _, err := e.svc.ListAudit(admin, service.AuditPage{})
		if err != nil {
			t.Fatal(err)
		}
		return len(rows)
	}
	before := audit()
	for _, a := range []struct {
		path string
		form url.Values
	}{
		{"/ui/agents/notes/sessions", url.Values{}},
		{sp + "/signal", url.Values{"message": {"hi"}}},
		{sp + "/destroy", url.Values{"confirm": {"yes"}}},
	} {
		a.form.Set("csrf", b.csrf(sp))
		resp, body := b.post(a.path, a.form)
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "role") {
			t.Errorf("reader POST %s: %d, want a 403 page\n%s", a.path, resp.StatusCode, body)
		}
	}
	if now, err := e.st.GetSession(ctx, x.ActorKey); err != nil || now.Status == store.SessionDestroyed || now.EventCount != x.EventCount {
		t.Fatalf("after refused actions: %+v %v", now, err)
	}
	if got := audit(); got != before {
		t.Fatalf("refused actions wrote %d audit rows", got-before)
	}

	// An operator destroys; the row names its token.
	e.token = operator.Value
	ob := e.browser()
	ob.login()
	resp, body := ob.post(sp+"/destroy", url.Values{"csrf": {ob.csrf(sp)}, "confirm": {"yes"}})
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("operator destroy: %d\n%s", resp.StatusCode, body)
	}
	rows, _, _ := e.svc.ListAudit(admin, service.AuditPage{Limit: 1})
	if len(rows) != 1 || rows[0].TokenID != operator.ID || rows[0].Action != "session.destroy" || rows[0].Result != "ok" {
		t.Fatalf("audit after the destroy: %+v", rows)
	}

	// Revoked: the reader's login ends at its next page.
	if _, err := e.svc.RevokeToken(admin, reader.ID); err != nil {
		t.Fatal(err)
	}
	if resp, _ := b.get("/ui/"); resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/ui/login") {
		t.Fatalf("revoked token's login: %d %q", resp.StatusCode, resp.Header.Get("Location"))
	}
}
