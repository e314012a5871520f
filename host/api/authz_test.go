package api_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/host/api"
	"github.com/paddock-dev/paddock/host/service"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// authEnv is an API with a bootstrap token, a stored token of each role
// in namespace default, the notes agent and one session with an event.
type authEnv struct {
	*env
	log     *syncBuffer
	tokens  map[string]string // role → value
	ids     map[string]string // role → token id
	digest  string
	session string
	event   string
	// bodies collects every response body but token creations' (the
	// token value must appear in none).
	mu     sync.Mutex
	bodies bytes.Buffer
}

const bootstrap = "boot-s3cret"

func newAuthEnv(t *testing.T, driver string) *authEnv {
	t.Helper()
	logs := &syncBuffer{}
	e := &authEnv{log: logs, tokens: map[string]string{}, ids: map[string]string{}}
	e.env = newEnv(t, driver, bootstrap, func(o *api.Options) {
		o.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		o.MaxBodyBytes = 1 << 20
	})
	_, b := wasmtest.BuildExample(t, wasmtest.Notes)
	code, m := e.call("POST", "/v1/modules", bootstrap, b)
	if code != 201 {
		t.Fatalf("upload: %d %v", code, m)
	}
	e.digest = m["digest"].(string)
	if code, m = e.call("POST", "/v1/agents", bootstrap, fmt.Appendf(nil, `{"name":"notes","module":%q}`, e.digest)); code != 201 {
		t.Fatalf("create agent: %d %v", code, m)
	}
	if code, m = e.call("POST", "/v1/agents/notes/sessions", bootstrap, []byte(`{}`)); code != 201 {
		t.Fatalf("create session: %d %v", code, m)
	}
	e.session = m["session_id"].(string)
	if code, m = e.call("POST", "/v1/agents/notes/sessions/"+e.session+"/signals", bootstrap, []byte(`{"message":"hi"}`)); code != 202 {
		t.Fatalf("signal: %d %v", code, m)
	}
	e.event = fmt.Sprint(int64(m["event_id"].(float64)))
	for _, role := range []string{"reader", "client", "operator", "admin"} {
		code, raw, _ := e.raw("POST", "/v1/tokens", bootstrap, fmt.Appendf(nil, `{"role":%q,"name":"the %s"}`, role, role))
		var tok map[string]any
		_ = json.Unmarshal(raw, &tok)
		if code != 201 || !strings.HasPrefix(tok["token"].(string), "pdk_") {
			t.Fatalf("create %s token: %d %s", role, code, raw)
		}
		e.tokens[role], e.ids[role] = tok["token"].(string), tok["id"].(string)
	}
	return e
}

// raw sends a request with token (none when "") and returns the status,
// body and headers.
func (e *authEnv) raw(method, path, token string, body []byte) (int, []byte, http.Header) {
	e.t.Helper()
	req, err := http.NewRequest(method, e.url+path, bytes.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	switch {
	case path == "/v1/modules" && method == "POST":
		req.Header.Set("Content-Type", "application/wasm")
	case body != nil:
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30e9)
	defer cancel()
	resp, err := http.DefaultClient.Do(req.WithContext(ctx))
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if !(method == "POST" && path == "/v1/tokens") {
		e.mu.Lock()
		e.bodies.Write(raw)
		e.mu.Unlock()
	}
	return resp.StatusCode, raw, resp.Header
}

func (e *authEnv) call(method, path, token string, body []byte) (int, map[string]any) {
	e.t.Helper()
	code, raw, _ := e.raw(method, path, token, body)
	var m map[string]any
	_ = json.Unmarshal(raw, &m)
	return code, m
}

// state is a fingerprint of everything the API can write.
func (e *authEnv) state() string {
	e.t.Helper()
	ctx := context.Background()
	var b strings.Builder
	must := func(err error) {
		if err != nil {
			e.t.Fatal(err)
		}
	}
	agents, err := e.st.ListAgents(ctx, store.AnyNamespace)
	must(err)
	for _, a := range agents {
		fmt.Fprintf(&b, "agent %s %s %s;", a.Name, a.ModuleDigest, a.UpdatedAt)
		xs, err := e.st.ListSessions(ctx, store.ListSessionsParams{AgentUID: a.UID, Limit: 1000})
		must(err)
		for _, x := range xs {
			evs, err := e.st.ListEvents(ctx, store.ListEventsParams{Key: x.ActorKey, Limit: 1000})
			must(err)
			// The runtime moves statuses on by itself (turns commit,
			// idle sessions sleep): only what a person's call decides
			// counts.
			fmt.Fprintf(&b, "session %s destroyed %v events %d;", x.SessionID, x.Status == store.SessionDestroyed, len(evs))
			for _, ev := range evs {
				fmt.Fprintf(&b, "%d:%s:%v;", ev.ID, ev.Kind, ev.Status == store.EventCancelled || ev.Status == store.EventDiscarded)
			}
		}
	}
	mods, err := e.st.ListModules(ctx, store.AnyNamespace)
	must(err)
	secs, err := e.st.ListSecrets(ctx, store.AnyNamespace)
	must(err)
	toks, err := e.st.ListTokens(ctx, "")
	must(err)
	for _, t := range toks {
		fmt.Fprintf(&b, "token %s revoked %v;", t.ID, t.RevokedAt != nil)
	}
	audit, err := e.st.ListAudit(ctx, store.ListAuditParams{Limit: store.MaxAuditLimit})
	must(err)
	fmt.Fprintf(&b, "modules %d secrets %d audit %d", len(mods), len(secs), len(audit))
	return b.String()
}

// refused reads paddock_api_refused_total by reason from /metrics.
func (e *authEnv) refused() map[string]int {
	e.t.Helper()
	_, raw, _ := e.raw("GET", "/metrics", "", nil)
	out := map[string]int{}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		var reason string
		var n int
		if _, err := fmt.Sscanf(sc.Text(), `paddock_api_refused_total{reason=%q} %d`, &reason, &n); err == nil {
			out[reason] = n
		}
	}
	return out
}

// minRole is the spec of issue 16, written down independently of
// service.OpRules: the lowest role that may call each route ("" public).
var minRole = map[string]string{
	"GET /healthz": "", "GET /readyz": "", "GET /metrics": "",
	"GET /v1/openapi.yaml": "reader",
	"POST /v1/modules":     "admin", "GET /v1/modules": "reader", "GET /v1/modules/{digest}": "reader",
	"POST /v1/plugins": "cluster", "GET /v1/plugins": "reader", "GET /v1/plugins/{plugin}": "reader",
	"GET /v1/sessions": "reader",
	"POST /v1/agents":  "admin", "GET /v1/agents": "reader", "GET /v1/agents/{agent}": "reader", "PUT /v1/agents/{agent}": "admin",
	"POST /v1/agents/{agent}/sessions": "client", "PUT /v1/agents/{agent}/sessions": "client",
	"GET /v1/agents/{agent}/sessions": "reader", "GET /v1/agents/{agent}/dead-letters": "reader",
	"GET /v1/agents/{agent}/sessions-by-key/{key}":                      "reader",
	"GET /v1/agents/{agent}/sessions/{session}":                         "reader",
	"DELETE /v1/agents/{agent}/sessions/{session}":                      "operator",
	"POST /v1/agents/{agent}/sessions/{session}/signals":                "client",
	"GET /v1/agents/{agent}/sessions/{session}/events":                  "reader",
	"GET /v1/agents/{agent}/sessions/{session}/events/{event}":          "reader",
	"POST /v1/agents/{agent}/sessions/{session}/events/{event}/redrive": "operator",
	"POST /v1/agents/{agent}/sessions/{session}/events/{event}/discard": "operator",
	"POST /v1/agents/{agent}/sessions/{session}/events/{event}/cancel":  "operator",
	"GET /v1/agents/{agent}/sessions/{session}/dead-letters":            "reader",
	"GET /v1/agents/{agent}/sessions/{session}/alarms":                  "reader",
	"GET /v1/agents/{agent}/sessions/{session}/transcript":              "reader",
	"GET /v1/agents/{agent}/sessions/{session}/stream":                  "reader",
	"GET /v1/agents/{agent}/sessions/{session}/waits":                   "reader",
	"GET /v1/agents/{agent}/sessions/{session}/waits/{wait}":            "reader",
	"POST /v1/agents/{agent}/sessions/{session}/waits/{wait}":           "operator",
	"GET /v1/agents/{agent}/waits":                                      "reader",
	"GET /v1/secrets":                                                   "reader",
	"PUT /v1/secrets/{name}":                                            "admin",
	"DELETE /v1/secrets/{name}":                                         "admin",
	"POST /v1/tokens":                                                   "admin",
	"GET /v1/tokens":                                                    "admin",
	"DELETE /v1/tokens/{id}":                                            "admin",
	"GET /v1/audit":                                                     "admin",
}

// roleRank orders the spec's roles; "cluster" is an admin of every
// namespace (the auth_token): registering a plugin runs a binary of the
// host's machine, which no namespace's token may do.
var roleRank = map[string]int{"": 0, "reader": 1, "client": 2, "operator": 3, "admin": 4, "cluster": 5}

// request returns a request of route r: on the real objects (so that a
// refusal that failed would write), or, harmless, on objects that do not
// exist (so that an allowed write is answered without changing much).
func (e *authEnv) request(r api.Route, real bool) (path string, body []byte) {
	sub := map[string]string{
		"{agent}": "notes", "{session}": e.session, "{event}": e.event, "{wait}": "w-1", "{digest}": e.digest,
		"{plugin}": "p", "{key}": "k", "{name}": "API_KEY", "{id}": e.ids["reader"],
	}
	if !real {
		sub["{session}"], sub["{event}"], sub["{name}"], sub["{id}"] = "00000000-0000-4000-8000-000000000000", "999999", "NOSUCH", "ffffffffffffffff"
	}
	path = r.Path
	for k, v := range sub {
		path = strings.ReplaceAll(path, k, v)
	}
	switch r.Method + " " + r.Path {
	case "POST /v1/modules":
		_, body = wasmtest.BuildExample(e.t, wasmtest.Notes)
	case "POST /v1/plugins":
		body = []byte(`{"name":"p","path":"/bin/true","sha256":"00"}`)
	case "POST /v1/agents":
		body = fmt.Appendf(nil, `{"name":"other","module":%q}`, e.digest)
	case "PUT /v1/agents/{agent}":
		body = fmt.Appendf(nil, `{"module":%q,"crash_policy":"sleep"}`, e.digest)
	case "POST /v1/agents/{agent}/sessions", "PUT /v1/agents/{agent}/sessions":
		body = []byte(`{"key":"k2"}`)
	case "POST /v1/agents/{agent}/sessions/{session}/signals":
		body = []byte(`{"message":"again"}`)
	case "POST /v1/agents/{agent}/sessions/{session}/waits/{wait}":
		body = []byte(`{"decision":"approve"}`)
	case "PUT /v1/secrets/{name}":
		body = []byte(`{"value":"v"}`)
	case "POST /v1/tokens":
		body = []byte(`{"role":"reader"}`)
	default:
		if r.Method != "GET" && r.Method != "DELETE" {
			body = []byte(`{}`)
		}
	}
	return path, body
}

// TestEachRoleIsRefusedExactlyWhatItMayNotDoOnEveryRoute: for every route
// of api.Routes() and every role, the call is allowed (not 401/403) when
// the role is at least the route's (issue 16: reader reads; client also
// creates sessions and sends signals; operator also destroys, redrives,
// discards, cancels and resolves waits; admin also registers and manages
// tokens and the audit log), else 403 forbidden, counted, and nothing is
// written — not even an audit row.
func TestEachRoleIsRefusedExactlyWhatItMayNotDoOnEveryRoute(t *testing.T) {
	t.Parallel()
	e := newAuthEnv(t, "sqlite")
	routes := api.Routes()
	for _, r := range routes {
		want, ok := minRole[r.Method+" "+r.Path]
		if !ok {
			t.Fatalf("route %s %s has no expected role in this test's table: add it", r.Method, r.Path)
		}
		rule, ok := r.Op.Rule()
		if !ok {
			t.Fatalf("route %s %s: op %q is not in service.OpRules", r.Method, r.Path, r.Op)
		}
		if want == "cluster" {
			if !rule.Cluster || rule.Role != service.RoleAdmin {
				t.Errorf("route %s %s: op %s is not for a cluster admin only", r.Method, r.Path, r.Op)
			}
		} else if rule.Cluster || rule.Role.String() != want && !(want == "" && rule.Role == service.RoleNone) {
			t.Errorf("route %s %s: op %s needs %s, the spec says %q", r.Method, r.Path, r.Op, rule.Role, want)
		}
		if rule.Mutates != (r.Method != "GET") {
			t.Errorf("route %s %s: op %s mutates=%v", r.Method, r.Path, r.Op, rule.Mutates)
		}
	}
	if len(minRole) != len(routes) {
		t.Errorf("the spec names %d routes, the API serves %d", len(minRole), len(routes))
	}
	for _, role := range []string{"reader", "client", "operator", "admin"} {
		for _, r := range routes {
			need := minRole[r.Method+" "+r.Path]
			if need == "" || r.Path == "/v1/agents/{agent}/sessions/{session}/stream" && roleRank[role] >= roleRank[need] {
				continue // public; an allowed stream would stay open (see TestStream*)
			}
			allowed := roleRank[role] >= roleRank[need]
			path, body := e.request(r, !allowed)
			before, counts := e.state(), e.refused()
			code, raw, _ := e.raw(r.Method, path, e.tokens[role], body)
			if allowed {
				if code == 401 || code == 403 {
					t.Errorf("%s: %s %s = %d %s, want it allowed", role, r.Method, path, code, raw)
				}
				continue
			}
			var eb struct {
				Error struct{ Code string } `json:"error"`
			}
			_ = json.Unmarshal(raw, &eb)
			if code != 403 || eb.Error.Code != "forbidden" {
				t.Errorf("%s: %s %s = %d %s, want 403 forbidden", role, r.Method, path, code, raw)
				continue
			}
			if after := e.state(); after != before {
				t.Errorf("%s: refused %s %s wrote:\nbefore %s\nafter  %s", role, r.Method, path, before, after)
			}
			if got := e.refused(); got["role"] != counts["role"]+1 {
				t.Errorf("%s: refused %s %s: paddock_api_refused_total{reason=role} %d → %d", role, r.Method, path, counts["role"], got["role"])
			}
		}
	}
}

// TestSignalKindsNeedTheirRole: a client sends messages; a steer, cancel,
// wake, forced allocation or a mid_turn override that steers or
// interrupts needs an operator.
func TestSignalKindsNeedTheirRole(t *testing.T) {
	t.Parallel()
	e := newAuthEnv(t, "sqlite")
	sig := "/v1/agents/notes/sessions/" + e.session + "/signals"
	for _, body := range []string{
		`{"kind":"steer","message":"x"}`, `{"kind":"cancel"}`, `{"kind":"wake"}`,
		`{"message":"x","mid_turn":"interrupt"}`, `{"message":"x","mid_turn":"steer"}`, `{"message":"x","force_allocation":true}`,
	} {
		before := e.state()
		code, m := e.call("POST", sig, e.tokens["client"], []byte(body))
		if code != 403 {
			t.Errorf("client %s: %d %v, want 403", body, code, m)
		} else if msg := fmt.Sprint(m["error"].(map[string]any)["message"]); !strings.HasPrefix(msg, "signal.") ||
			!strings.Contains(msg, "needs role operator; the token's role is client") {
			// The refusal names the op the body made it (a message that
			// steers is signal.steer), not only the role.
			t.Errorf("client %s: refused with %q, want the op and the roles named", body, msg)
		}
		if after := e.state(); after != before {
			t.Errorf("refused %s wrote: %s → %s", body, before, after)
		}
		if code, m := e.call("POST", sig, e.tokens["operator"], []byte(body)); code == 403 || code == 401 {
			t.Errorf("operator %s: %d %v, want it allowed", body, code, m)
		}
	}
	if code, m := e.call("POST", sig, e.tokens["client"], []byte(`{"message":"x","mid_turn":"queue"}`)); code != 202 {
		t.Errorf("client message: %d %v", code, m)
	}
	// Each allowed signal is audited as what it did, not as the route's
	// signal.send: the operator's six, newest first, then the client's.
	_, b := e.call("GET", "/v1/audit?limit=7", e.tokens["admin"], nil)
	var got []string
	for _, row := range b["entries"].([]any) {
		got = append(got, row.(map[string]any)["action"].(string))
	}
	want := "signal.send signal.force signal.steer signal.cancel signal.wake signal.cancel signal.steer"
	if strings.Join(got, " ") != want {
		t.Errorf("audited actions %q, want %q", strings.Join(got, " "), want)
	}
}

// TestNoUnknownRevokedOrMalformedTokenIs401 answers 401 unauthenticated
// with WWW-Authenticate, counted, for each, and writes nothing.
func TestNoUnknownRevokedOrMalformedTokenIs401(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		e := newAuthEnv(t, driver)
		if code, m := e.call("DELETE", "/v1/tokens/"+e.ids["client"], bootstrap, nil); code != 200 || m["revoked_at"] == nil {
			t.Fatalf("revoke: %d %v", code, m)
		}
		// Revoking again changes nothing.
		if code, m := e.call("DELETE", "/v1/tokens/"+e.ids["client"], bootstrap, nil); code != 200 || m["revoked_at"] == nil {
			t.Fatalf("revoke again: %d %v", code, m)
		}
		good := e.tokens["operator"]
		id := e.ids["operator"]
		secret := good[len("pdk_")+len(id)+1:]
		wrongSecret := "pdk_" + id + "_" + base64.RawURLEncoding.EncodeToString(make([]byte, 32))
		for what, tok := range map[string]string{
			"no token":              "",
			"a revoked token":       e.tokens["client"],
			"an unknown id":         "pdk_0123456789abcdef_" + secret,
			"a wrong secret":        wrongSecret,
			"a malformed token":     "pdk_xyz",
			"a short secret":        "pdk_" + id + "_" + secret[:20],
			"the secret alone":      secret,
			"the bootstrap, cut":    bootstrap[:len(bootstrap)-1],
			"the bootstrap, longer": bootstrap + "x",
		} {
			before, counts := e.state(), e.refused()
			for _, rq := range [][2]string{{"GET", "/v1/agents"}, {"POST", "/v1/agents/notes/sessions"}} {
				code, raw, h := e.raw(rq[0], rq[1], tok, []byte(`{}`))
				if code != 401 || !strings.Contains(string(raw), `"unauthenticated"`) || h.Get("WWW-Authenticate") == "" {
					t.Errorf("%s: %s %s = %d %s (WWW-Authenticate %q), want 401 unauthenticated", what, rq[0], rq[1], code, raw, h.Get("WWW-Authenticate"))
				}
			}
			if after := e.state(); after != before {
				t.Errorf("%s wrote: %s → %s", what, before, after)
			}
			if got := e.refused(); got["unauthenticated"] != counts["unauthenticated"]+2 {
				t.Errorf("%s: unauthenticated refusals %d → %d, want +2", what, counts["unauthenticated"], got["unauthenticated"])
			}
		}
		if code, m := e.call("GET", "/v1/agents", good, nil); code != 200 {
			t.Errorf("the operator token: %d %v", code, m)
		}
		// The token sent without "Bearer ": 401 naming the header's form,
		// not the token.
		req, err := http.NewRequest("GET", e.url+"/v1/agents", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", good)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var answer struct {
			Error struct{ Code, Message string }
		}
		_ = json.Unmarshal(raw, &answer)
		if resp.StatusCode != 401 || answer.Error.Code != "unauthenticated" ||
			answer.Error.Message != `the Authorization header is not of the form "Bearer <token>"` || strings.Contains(string(raw), secret) {
			t.Errorf("a token without Bearer: %d %s, want 401 naming the header's form", resp.StatusCode, raw)
		}
		// A token of another namespace addressing this one: 403, counted
		// as a namespace refusal, nothing written.
		h := sha256.Sum256([]byte("team-a secret bytes, 32 of them!"))
		if _, err := e.st.CreateToken(context.Background(), store.CreateTokenParams{
			ID: "00000000000000aa", Namespace: "team-a", Role: "admin", CreatedBy: "test", Hash: h[:]}); err != nil {
			t.Fatal(err)
		}
		teamA := "pdk_00000000000000aa_" + base64.RawURLEncoding.EncodeToString([]byte("team-a secret bytes, 32 of them!"))
		for _, r := range api.Routes() {
			if minRole[r.Method+" "+r.Path] == "" {
				continue
			}
			path, body := e.request(r, true)
			sep := "?"
			if strings.Contains(path, "?") {
				sep = "&"
			}
			before, counts := e.state(), e.refused()
			code, raw, _ := e.raw(r.Method, path+sep+"namespace=default", teamA, body)
			if code != 403 || !strings.Contains(string(raw), "team-a") {
				t.Errorf("team-a token: %s %s?namespace=default = %d %s, want 403", r.Method, path, code, raw)
			}
			if after := e.state(); after != before {
				t.Errorf("team-a token: %s %s wrote", r.Method, path)
			}
			if got := e.refused(); got["namespace"] != counts["namespace"]+1 {
				t.Errorf("team-a token: %s %s: namespace refusals %d → %d", r.Method, path, counts["namespace"], got["namespace"])
			}
		}
	})
}

// TestMutationsAreAuditedWithTheirTokenAndResult: each mutating call that
// passed authorization appends one row (token id, op, object, result,
// status), readable by admins only, paged newest first; refused calls
// append none; no token value appears in any answer but its creation's,
// nor in the host's log.
func TestMutationsAreAuditedWithTheirTokenAndResult(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		e := newAuthEnv(t, driver)
		client, op := e.tokens["client"], e.tokens["operator"]
		code, m := e.call("POST", "/v1/agents/notes/sessions", client, []byte(`{"key":"audited"}`))
		if code != 201 {
			t.Fatalf("create session: %d %v", code, m)
		}
		sid := m["session_id"].(string)
		if code, m = e.call("POST", "/v1/agents/notes/sessions/nosuch/signals", client, []byte(`{"message":"x"}`)); code != 404 {
			t.Fatalf("signal to an unknown session: %d %v", code, m)
		}
		if code, _ = e.call("DELETE", "/v1/agents/notes/sessions/"+sid, client, nil); code != 403 {
			t.Fatalf("client destroy: %d", code)
		}
		if code, m = e.call("DELETE", "/v1/agents/notes/sessions/"+sid, op, nil); code != 200 {
			t.Fatalf("operator destroy: %d %v", code, m)
		}
		for _, role := range []string{"reader", "client", "operator"} {
			if code, _ := e.call("GET", "/v1/audit", e.tokens[role], nil); code != 403 {
				t.Errorf("%s reads the audit log: %d, want 403", role, code)
			}
		}
		code, m = e.call("GET", "/v1/audit?limit=3", e.tokens["admin"], nil)
		if code != 200 {
			t.Fatalf("audit: %d %v", code, m)
		}
		type row struct{ token, action, object, result string }
		var got []row
		for _, x := range m["entries"].([]any) {
			r := x.(map[string]any)
			got = append(got, row{r["token_id"].(string), r["action"].(string), r["object"].(string), r["result"].(string)})
		}
		want := []row{
			{e.ids["operator"], "session.destroy", "/v1/agents/notes/sessions/" + sid, "ok"},
			{e.ids["client"], "signal.send", "/v1/agents/notes/sessions/nosuch/signals", "session_not_found"},
			{e.ids["client"], "session.create", "/v1/agents/notes/sessions/" + sid, "ok"},
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("audit page:\n got %v\nwant %v", got, want)
		}
		next := int64(m["next_before"].(float64))
		code, m = e.call("GET", fmt.Sprintf("/v1/audit?limit=1000&before=%d", next), e.tokens["admin"], nil)
		if code != 200 {
			t.Fatalf("audit page 2: %d %v", code, m)
		}
		older := m["entries"].([]any)
		// newAuthEnv's own writes by the bootstrap token: module, agent,
		// session, signal, 4 tokens.
		if len(older) != 8 || older[0].(map[string]any)["action"] != "token.create" || older[7].(map[string]any)["token_id"] != "bootstrap" {
			t.Fatalf("audit page 2: %v", older)
		}
		if code, m = e.call("GET", "/v1/audit?limit=0x", e.tokens["admin"], nil); code != 400 {
			t.Errorf("audit limit=0x: %d %v", code, m)
		}
		// Tokens are listed without values.
		code, raw, _ := e.raw("GET", "/v1/tokens", e.tokens["admin"], nil)
		if code != 200 || strings.Contains(string(raw), "pdk_") || strings.Contains(string(raw), "hash") {
			t.Fatalf("list tokens: %d %s", code, raw)
		}
		e.mu.Lock()
		bodies := e.bodies.String()
		e.mu.Unlock()
		logs := e.log.String()
		for role, v := range e.tokens {
			secret := v[len("pdk_")+16+1:]
			if strings.Contains(bodies, secret) {
				t.Errorf("the %s token's value is in an API answer", role)
			}
			if strings.Contains(logs, secret) {
				t.Errorf("the %s token's value is in the log", role)
			}
		}
		if strings.Contains(logs, bootstrap) || strings.Contains(bodies, bootstrap) {
			t.Error("the bootstrap token is in the log or an answer")
		}
	})
}

// TestTokenCreationRules: a role the API does not know is refused; the
// creator is recorded; a revoked token of another namespace is not
// found; an open host (no auth_token) is the anonymous admin and checks
// no stored token.
func TestTokenCreationRules(t *testing.T) {
	t.Parallel()
	e := newAuthEnv(t, "sqlite")
	admin := e.tokens["admin"]
	if code, m := e.call("POST", "/v1/tokens", admin, []byte(`{"role":"root"}`)); code != 400 {
		t.Errorf("role root: %d %v", code, m)
	}
	if code, m := e.call("POST", "/v1/tokens", admin, []byte(`{}`)); code != 400 {
		t.Errorf("no role: %d %v", code, m)
	}
	if code, m := e.call("POST", "/v1/tokens", admin, []byte(`{"role":"reader","namespace":"nowhere"}`)); code != 404 && code != 403 {
		t.Errorf("undeclared namespace: %d %v", code, m)
	}
	// Two namespaces named, in the query and the body: refused, not one
	// of them chosen (found in review: the body's won silently).
	if code, m := e.call("POST", "/v1/tokens?namespace=default", admin, []byte(`{"role":"admin","namespace":"other"}`)); code != 400 ||
		!strings.Contains(fmt.Sprint(m), `names namespace "default" and the token namespace "other"`) {
		t.Errorf("two namespaces: %d %v, want 400 naming both", code, m)
	}
	if code, m := e.call("POST", "/v1/tokens?namespace=default", admin, []byte(`{"role":"reader","namespace":"default"}`)); code != 201 {
		t.Errorf("the same namespace twice: %d %v, want 201", code, m)
	}
	code, m := e.call("POST", "/v1/tokens", admin, []byte(`{"role":"client","name":"made by an admin token"}`))
	if code != 201 || m["created_by"] != e.ids["admin"] || m["namespace"] != "default" {
		t.Fatalf("create by a stored admin: %d %v", code, m)
	}
	if code, m := e.call("GET", "/v1/agents", m["token"].(string), nil); code != 200 {
		t.Errorf("the new token: %d %v", code, m)
	}
	if code, m := e.call("DELETE", "/v1/tokens/ffffffffffffffff", admin, nil); code != 404 {
		t.Errorf("revoke unknown: %d %v", code, m)
	}
	if code, m := e.call("DELETE", "/v1/tokens/bootstrap", admin, nil); code != 400 {
		t.Errorf("revoke bootstrap: %d %v, want 400 (not a token id)", code, m)
	}
	// A token's value given for its id: refused without echoing it, and
	// the audit row's path does not hold it either.
	val := m["token"].(string)
	code, m = e.call("DELETE", "/v1/tokens/"+val, admin, nil)
	if raw := fmt.Sprint(m); code != 400 || strings.Contains(raw, val[len(val)-20:]) {
		t.Errorf("revoke by value: %d %v, want 400 without the value", code, m)
	}
	_, b := e.call("GET", "/v1/audit", e.tokens["admin"], nil)
	if raw := fmt.Sprint(b); strings.Contains(raw, val[len(val)-20:]) || !strings.Contains(raw, "/v1/tokens/pdk_…") {
		t.Errorf("the audit log holds the token's value or not the redacted path: %v", b)
	}

	open := newEnv(t, "sqlite", "")
	if code, b := open.do("GET", "/v1/agents", "", nil, "Authorization", "Bearer pdk_whatever"); code != 200 {
		t.Errorf("open host with any token: %d %v", code, b)
	}
	// An open host checks no token, so it makes none (one made there
	// would hold once an auth_token is set).
	if code, b := open.json("POST", "/v1/tokens", `{"role":"reader"}`); code != 409 || fmt.Sprint(b["error"].(map[string]any)["code"]) != "host_open" {
		t.Errorf("open host creates a token: %d %v, want 409 host_open", code, b)
	}
	_, b = open.json("GET", "/v1/audit", "")
	if es := b["entries"].([]any); len(es) != 1 || es[0].(map[string]any)["token_id"] != "anonymous" {
		t.Errorf("open host audit: %v", b)
	}
}

// TestARevokedTokensOpenStreamEnds: a stream opened with a token ends
// once the token is revoked (its token is checked again every
// heartbeat), while the bootstrap token's stream stays open.
func TestARevokedTokensOpenStreamEnds(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "sqlite", bootstrap, func(o *api.Options) { o.StreamHeartbeat = 200 * time.Millisecond })
	do := func(method, path, token, body string) map[string]any {
		t.Helper()
		code, m := e.do(method, path, "application/json", []byte(body), "Authorization", "Bearer "+token)
		if code >= 300 {
			t.Fatalf("%s %s: %d %v", method, path, code, m)
		}
		return m
	}
	_, wasm := wasmtest.BuildExample(t, wasmtest.Notes)
	if code, m := e.do("POST", "/v1/modules", "application/wasm", wasm, "Authorization", "Bearer "+bootstrap); code != 201 {
		t.Fatalf("upload: %d %v", code, m)
	} else {
		do("POST", "/v1/agents", bootstrap, fmt.Sprintf(`{"name":"notes","module":%q}`, m["digest"]))
	}
	id := do("POST", "/v1/agents/notes/sessions", bootstrap, `{}`)["session_id"].(string)
	tok := do("POST", "/v1/tokens", bootstrap, `{"role":"reader"}`)
	open := func(token string) (*http.Response, context.CancelFunc) {
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, "GET", e.url+"/v1/agents/notes/sessions/"+id+"/stream", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("open the stream: %v %v", resp, err)
		}
		return resp, cancel
	}
	revoked, cancel1 := open(tok["token"].(string))
	defer cancel1()
	kept, cancel2 := open(bootstrap)
	defer cancel2()
	do("DELETE", "/v1/tokens/"+tok["id"].(string), bootstrap, "")

	ended := make(chan error, 1)
	go func() { _, err := io.Copy(io.Discard, revoked.Body); ended <- err }()
	select {
	case err := <-ended:
		if err != nil {
			t.Fatalf("the revoked token's stream ended with %v, want a clean end", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the revoked token's stream is still open 30 s after the revocation")
	}
	// The bootstrap token's stream still sends its heartbeats.
	buf := make([]byte, 64)
	if _, err := kept.Body.Read(buf); err != nil {
		t.Fatalf("the bootstrap token's stream: %v", err)
	}
}

// TestConcurrentSignalsEachFindTheirAuditRowOnceAnswered: signals sent at
// once (their audit rows may share a commit) each find their own row in
// the audit log as soon as their answer arrived; signals refused for the
// caller's role write none.
func TestConcurrentSignalsEachFindTheirAuditRowOnceAnswered(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		e := newAuthEnv(t, driver)
		const senders, each = 8, 5
		paths := make([]string, senders)
		for i := range paths {
			code, m := e.call("POST", "/v1/agents/notes/sessions", e.tokens["client"], []byte(`{}`))
			if code != 201 {
				t.Fatalf("create session: %d %v", code, m)
			}
			paths[i] = "/v1/agents/notes/sessions/" + m["session_id"].(string) + "/signals"
		}
		// rows counts the audit rows of path by token id.
		rows := func(path string) (map[string]int, error) {
			code, raw, _ := e.raw("GET", "/v1/audit?limit=1000", e.tokens["admin"], nil)
			var m struct {
				Entries []struct {
					TokenID string `json:"token_id"`
					Object  string `json:"object"`
				} `json:"entries"`
			}
			if err := json.Unmarshal(raw, &m); code != 200 || err != nil {
				return nil, fmt.Errorf("audit: %d %s", code, raw)
			}
			out := map[string]int{}
			for _, r := range m.Entries {
				if r.Object == path {
					out[r.TokenID]++
				}
			}
			return out, nil
		}
		var wg sync.WaitGroup
		for i, path := range paths {
			wg.Go(func() {
				for j := range each {
					if i%4 == 3 {
						// A reader may not signal: refused, no row.
						if code, raw, _ := e.raw("POST", path, e.tokens["reader"], []byte(`{"message":"x"}`)); code != 403 {
							t.Errorf("reader's signal: %d %s", code, raw)
						}
						continue
					}
					body := fmt.Appendf(nil, `{"message":"m%d","idempotency_key":"k%d"}`, j, j)
					if code, raw, _ := e.raw("POST", path, e.tokens["client"], body); code != 202 {
						t.Errorf("sender %d signal %d: %d %s", i, j, code, raw)
						return
					}
					got, err := rows(path)
					if err != nil || got[e.ids["client"]] != j+1 {
						t.Errorf("sender %d after signal %d: audit rows %v (%v), want %d of the client", i, j, got, err, j+1)
						return
					}
				}
			})
		}
		wg.Wait()
		for i, path := range paths {
			got, err := rows(path)
			want := map[string]int{e.ids["client"]: each}
			if i%4 == 3 {
				want = map[string]int{}
			}
			if err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("sender %d: audit rows %v (%v), want %v", i, got, err, want)
			}
		}
	})
}

// TestMessageSignalsAuditRowCommitsWithItsEvent: an accepted message
// signal's audit row is written with its event (one commit), exactly once;
// an idempotent re-send, a key reused for another message and a refused
// signal each get the one row of their own answer.
func TestMessageSignalsAuditRowCommitsWithItsEvent(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		e := newAuthEnv(t, driver)
		sig := "/v1/agents/notes/sessions/" + e.session + "/signals"
		send := func(body string, want int) {
			t.Helper()
			if code, m := e.call("POST", sig, e.tokens["client"], []byte(body)); code != want {
				t.Fatalf("signal %s: %d %v, want %d", body, code, m, want)
			}
		}
		send(`{"message":"one","idempotency_key":"k1"}`, 202)
		send(`{"message":"one","idempotency_key":"k1"}`, 202) // re-send: the first event
		send(`{"message":"two","idempotency_key":"k1"}`, 409) // the key, another message
		send(`{"message":"three"}`, 202)
		code, m := e.call("GET", "/v1/audit?limit=5", e.tokens["admin"], nil)
		if code != 200 {
			t.Fatalf("audit: %d %v", code, m)
		}
		var got []string
		for _, x := range m["entries"].([]any) {
			r := x.(map[string]any)
			if r["token_id"] != e.ids["client"] {
				break
			}
			got = append(got, fmt.Sprintf("%s %s %s %v", r["action"], r["object"], r["result"], r["status"]))
		}
		ok := "signal.send " + sig + " ok 202"
		want := []string{ok, "signal.send " + sig + " idempotency_key_reused 409", ok, ok}
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Fatalf("the client's audit rows, newest first:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	})
}
