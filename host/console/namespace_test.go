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

// TestConsoleActsInTheNamespaceItNames: the bootstrap admin switches to
// namespace a with ?namespace=, sees a's agents and sessions and not
// default's, every link and form of the page carries the namespace (the
// live transcript's stream URL too), and an action posted from a's
// session page acts on a's session and is audited in a. A malformed
// namespace is a 400 page, an undeclared one a 404 page, and a session of
// a is not found from default.
func TestConsoleActsInTheNamespaceItNames(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnvNS(t, "boot", "a", "b")
	dnotes := e.agentIn("default", "dnotes", wasmtest.Notes)
	xd := e.session(dnotes, "dkey")
	anotes := e.agentIn("a", "anotes", wasmtest.Notes)
	xa := e.session(anotes, "akey")
	b := e.browser()
	b.login()

	// No namespace named: default, with a switcher of every namespace.
	resp, body := b.get("/ui/agents")
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "dnotes") || strings.Contains(body, "anotes") ||
		!strings.Contains(body, `id="namespace">default<`) || !strings.Contains(body, `id="namespace-switch"`) ||
		!strings.Contains(body, "<option selected>default</option><option>a</option><option>b</option>") {
		t.Fatalf("agents of default: %d\n%s", resp.StatusCode, body)
	}

	// Namespace a: a's agents and sessions only, links and forms in a.
	resp, body = b.get("/ui/agents?namespace=a")
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `href="/ui/agents/anotes?namespace=a"`) || strings.Contains(body, "dnotes") ||
		!strings.Contains(body, `id="namespace">a<`) || !strings.Contains(body, "<option>default</option><option selected>a</option>") {
		t.Fatalf("agents of a: %d\n%s", resp.StatusCode, body)
	}
	for _, p := range []string{"/ui/?namespace=a", "/ui/agents?namespace=a", "/ui/sessions?namespace=a", "/ui/dead-letters?namespace=a", "/ui/modules?namespace=a"} {
		if !strings.Contains(body, `href="`+p+`"`) {
			t.Errorf("the nav bar of a's page has no link to %s", p)
		}
	}
	resp, body = b.get("/ui/sessions?namespace=a")
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `href="`+sessionPath(anotes, xa)+`?namespace=a"`) || strings.Contains(body, xd.SessionID) ||
		!strings.Contains(body, `<input type="hidden" name="namespace" value="a">`) {
		t.Fatalf("sessions of a: %d\n%s", resp.StatusCode, body)
	}
	resp, body = b.get("/ui/sessions?namespace=default")
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, xd.SessionID) || strings.Contains(body, xa.SessionID) {
		t.Fatalf("sessions of default: %d\n%s", resp.StatusCode, body)
	}
	sp := sessionPath(anotes, xa)
	resp, body = b.get(sp + "?namespace=a")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("a's session page: %d\n%s", resp.StatusCode, body)
	}
	// Every form posts the namespace; the stream URL names it.
	if forms, ns := strings.Count(body, `<form method="post"`), strings.Count(body, `name="namespace" value="a"`); forms == 0 || ns != forms {
		t.Errorf("a's session page: %d post forms, %d carry the namespace", forms, ns)
	}
	if !strings.Contains(body, `data-stream="/v1/agents/anotes/sessions/`+xa.SessionID+`/stream?namespace=a"`) ||
		!strings.Contains(body, `href="`+sp+`/destroy?namespace=a"`) {
		t.Errorf("a's session page: the stream or the destroy link does not name the namespace\n%s", body)
	}
	// From default, a's session is not found; so is an action on it.
	if resp, _ := b.get(sp); resp.StatusCode != http.StatusNotFound {
		t.Errorf("a's session from default: %d, want 404", resp.StatusCode)
	}
	csrf := b.csrf("/ui/agents")
	if resp, _ := b.post(sp+"/destroy", url.Values{"csrf": {csrf}, "confirm": {"yes"}}); resp.StatusCode != http.StatusNotFound {
		t.Errorf("destroy of a's session from default: %d, want 404", resp.StatusCode)
	}

	// Malformed, undeclared, given twice: refused, nothing written.
	for p, want := range map[string]int{
		"/ui/agents?namespace=Bad%21":                       http.StatusBadRequest,
		"/ui/agents?namespace=":                             http.StatusBadRequest,
		"/ui/agents?namespace=a&namespace=b":                http.StatusBadRequest,
		"/ui/agents?namespace=nowhere":                      http.StatusNotFound,
		sp + "?namespace=nowhere":                           http.StatusNotFound,
		"/ui/sessions?namespace=" + strings.Repeat("x", 64): http.StatusBadRequest,
	} {
		if resp, body := b.get(p); resp.StatusCode != want || !strings.Contains(body, `id="error"`) || !strings.Contains(body, "namespace") {
			t.Errorf("GET %s: %d, want a %d error page\n%s", p, resp.StatusCode, want, body)
		}
	}
	resp, _ = b.post(sp+"/signal", url.Values{"csrf": {csrf}, "kind": {"wake"}, "namespace": {"Bad!"}})
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("signal with a malformed namespace: %d, want 400", resp.StatusCode)
	}

	// Actions from a's session page act on a's session.
	resp, body = b.post(sp+"/signal", url.Values{"csrf": {csrf}, "namespace": {"a"}, "kind": {"message"}, "message": {"note from a"}})
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != sp+"?namespace=a" {
		t.Fatalf("signal in a: %d %q\n%s", resp.StatusCode, resp.Header.Get("Location"), body)
	}
	if now, err := e.st.GetSession(ctx, xa.ActorKey); err != nil || now.EventCount != xa.EventCount+1 {
		t.Fatalf("a's session after the signal: %+v %v", now, err)
	}
	resp, body = b.post(sp+"/destroy", url.Values{"csrf": {csrf}, "namespace": {"a"}, "confirm": {"yes"}})
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != sp+"?namespace=a" {
		t.Fatalf("destroy in a: %d %q\n%s", resp.StatusCode, resp.Header.Get("Location"), body)
	}
	if now, err := e.st.GetSession(ctx, xa.ActorKey); err != nil || now.Status != store.SessionDestroyed {
		t.Fatalf("a's session after the destroy: %+v %v", now, err)
	}
	if now, err := e.st.GetSession(ctx, xd.ActorKey); err != nil || now.Status == store.SessionDestroyed || now.EventCount != xd.EventCount {
		t.Fatalf("default's session after a's actions: %+v %v", now, err)
	}
	admin := service.WithNamespace(service.WithCaller(ctx, service.Caller{TokenID: service.BootstrapTokenID, Role: service.RoleAdmin}), "a")
	rows, _, err := e.svc.ListAudit(admin, service.AuditPage{Limit: 2})
	if err != nil || len(rows) != 2 || rows[0].Action != "session.destroy" || rows[1].Action != "signal.send" ||
		rows[0].Namespace != "a" || rows[0].TokenID != service.BootstrapTokenID || rows[0].Result != "ok" {
		t.Fatalf("audit of a: %+v %v", rows, err)
	}
	// The dead-letter page's forms and links stay in a too.
	if _, body := b.get("/ui/dead-letters?namespace=a"); !strings.Contains(body, `<input type="hidden" name="namespace" value="a">`) {
		t.Errorf("dead letters of a: the agent filter does not carry the namespace\n%s", body)
	}
}

// TestANamespaceTokenSeesOnlyItsNamespace: a reader token of namespace a
// logs in and sees a's pages (its namespace implied, or named), without a
// switcher; naming another namespace — declared or not — is a 403 page;
// the overview names no agent of another namespace.
func TestANamespaceTokenSeesOnlyItsNamespace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnvNS(t, "boot", "a", "b")
	dnotes := e.agentIn("default", "dnotes", wasmtest.Notes)
	e.session(dnotes, "dkey")
	anotes := e.agentIn("a", "anotes", wasmtest.Notes)
	xa := e.session(anotes, "akey")
	admin := service.WithCaller(ctx, service.Caller{TokenID: service.BootstrapTokenID, Role: service.RoleAdmin})
	reader, err := e.svc.CreateToken(admin, service.CreateTokenParams{Role: "reader", Namespace: "a"})
	if err != nil {
		t.Fatal(err)
	}
	// A host-wide figure labelled by agent (as a replayed host call of
	// default's agent would leave): the admin's overview shows it, the
	// reader of a's does not.
	e.h.Metrics().HostCallsReplayed.WithLabelValues("dnotes").Inc()
	ab := e.browser()
	ab.login()
	if _, body := ab.get("/ui/"); !strings.Contains(body, "agent=dnotes") {
		t.Fatalf("the admin's overview does not show the agent-labelled figure\n%s", body)
	}
	e.token = reader.Value
	b := e.browser()
	b.login()
	for _, p := range []string{"/ui/agents", "/ui/agents?namespace=a"} {
		resp, body := b.get(p)
		if resp.StatusCode != http.StatusOK || !strings.Contains(body, `href="/ui/agents/anotes?namespace=a"`) || strings.Contains(body, "dnotes") ||
			!strings.Contains(body, `id="namespace">a<`) || strings.Contains(body, "namespace-switch") {
			t.Fatalf("reader of a, GET %s: %d\n%s", p, resp.StatusCode, body)
		}
	}
	for _, p := range []string{"/ui/", "/ui/sessions", "/ui/dead-letters", "/ui/modules", sessionPath(anotes, xa)} {
		resp, body := b.get(p)
		if resp.StatusCode != http.StatusOK || strings.Contains(body, "dnotes") || strings.Contains(body, "dkey") {
			t.Errorf("reader of a, GET %s: %d (or it names default's agent or session)\n%s", p, resp.StatusCode, body)
		}
	}
	for _, p := range []string{"/ui/agents?namespace=default", "/ui/agents?namespace=b", "/ui/sessions?namespace=nowhere", "/ui/?namespace=default"} {
		resp, body := b.get(p)
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "belongs to namespace") {
			t.Errorf("reader of a, GET %s: %d, want a 403 page\n%s", p, resp.StatusCode, body)
		}
		// The refusal page stays in the token's namespace.
		if strings.Contains(body, `id="namespace">default<`) {
			t.Errorf("reader of a, GET %s: the refusal page shows namespace default", p)
		}
	}
}
