package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/host/api"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// nsEnv is a host declaring namespaces a and b, with, in namespace a, the
// notes module, agent notes, a session of key k1 holding one open event,
// a plugin worker tool and a secret KEY.
type nsEnv struct {
	*stillEnv
	digest, agentUID, session string
	sealed                    []byte
}

func newNSEnv(t *testing.T) *nsEnv {
	t.Helper()
	e := &nsEnv{stillEnv: newStillEnv(t, func(p *host.Policy) {
		p.Namespaces = map[string]host.NamespacePolicy{"a": {}, "b": {}}
	}, testSealer(t, bytes.Repeat([]byte{7}, 32)))}
	_, wasm := wasmtest.BuildExample(t, wasmtest.Notes)
	code, m := e.do("POST", "/v1/modules?namespace=a", "application/wasm", wasm)
	if code != 201 {
		t.Fatalf("upload to a: %d %v", code, m)
	}
	e.digest = m["digest"].(string)
	code, m = e.json("POST", "/v1/agents?namespace=a", fmt.Sprintf(`{"name":"notes","module":%q}`, e.digest))
	if code != 201 || m["namespace"] != "a" {
		t.Fatalf("create agent in a: %d %v", code, m)
	}
	e.agentUID = m["uid"].(string)
	code, m = e.json("POST", "/v1/agents/notes/sessions?namespace=a", `{"key":"k1"}`)
	if code != 201 {
		t.Fatalf("session in a: %d %v", code, m)
	}
	e.session = m["session_id"].(string)
	if code, m = e.json("POST", "/v1/agents/notes/sessions/"+e.session+"/signals?namespace=a", `{"message":"hi"}`); code != 202 && code != 201 && code != 200 {
		t.Fatalf("signal in a: %d %v", code, m)
	}
	if _, _, err := e.st.PutPluginWorker(context.Background(), store.PluginWorker{Namespace: "a", Name: "tool",
		Path: "/opt/tool", SHA256: strings.Repeat("0", 64), Processes: 1}); err != nil {
		t.Fatal(err)
	}
	if code, m = e.json("PUT", "/v1/secrets/KEY?namespace=a", `{"value":"a's value"}`); code != 201 {
		t.Fatalf("secret in a: %d %v", code, m)
	}
	var err error
	if e.sealed, err = e.st.SealedSecret(context.Background(), "a", "KEY"); err != nil {
		t.Fatal(err)
	}
	return e
}

// state is what namespace a holds, read from the store: it must not change
// when other namespaces address a's objects.
func (e *nsEnv) state() string {
	e.t.Helper()
	ctx := context.Background()
	a, err := e.st.GetAgent(ctx, "a", "notes")
	if err != nil {
		e.t.Fatal(err)
	}
	x, err := e.st.GetSession(ctx, store.ActorKey{AgentUID: a.UID, SessionID: e.session})
	if err != nil {
		e.t.Fatal(err)
	}
	evs, err := e.st.ListEvents(ctx, store.ListEventsParams{Key: x.ActorKey, Limit: 100})
	if err != nil {
		e.t.Fatal(err)
	}
	var es []string
	for _, ev := range evs {
		es = append(es, fmt.Sprintf("%d:%s:%s", ev.ID, ev.Kind, ev.Status))
	}
	sealed, err := e.st.SealedSecret(ctx, "a", "KEY")
	if err != nil || !bytes.Equal(sealed, e.sealed) {
		e.t.Fatalf("a's secret after the requests: changed or gone (%v)", err)
	}
	w, err := e.st.GetPluginWorker(ctx, "a", "tool")
	if err != nil {
		e.t.Fatal(err)
	}
	all, err := e.st.ListAgents(ctx, store.AnyNamespace)
	if err != nil {
		e.t.Fatal(err)
	}
	return fmt.Sprintf("agent %s %s %s %s %v; session %s %d %v; events %v; plugin %s; agents %d",
		a.UID, a.Kind, a.ModuleDigest, a.CrashPolicy, a.UpdatedAt, x.Status, x.EventCount, x.DestroyTS, es,
		w.Path, len(all))
}

// TestEveryRouteKeepsNamespacesApart: every /v1 route (api.Routes) that
// addresses an object of namespace a — by name, and by the uid, session id
// and digest copied from a — answers 404 from namespace b and from the
// default namespace, like a missing object, and writes nothing; the
// collections of b are empty; an agent of b cannot bind a's module
// (docs/DESIGN.md "Namespaces").
func TestEveryRouteKeepsNamespacesApart(t *testing.T) {
	t.Parallel()
	e := newNSEnv(t)

	// What each route gets from another namespace: 404 with that code,
	// 200 with an empty list under that key, or exempt (a creation in
	// the caller's own namespace, checked below).
	type want struct {
		status int
		code   string // 404: the error code; 200: the list's key
		body   string
	}
	notFound := func(code string) want { return want{404, code, ""} }
	agentNF := notFound("agent_not_found")
	wants := map[string]want{
		"POST /v1/modules":                                                  {}, // exempt: uploads to the caller's namespace
		"GET /v1/modules":                                                   {200, "modules", ""},
		"GET /v1/modules/{digest}":                                          notFound("module_not_found"),
		"POST /v1/plugins":                                                  {}, // exempt: registers in the caller's namespace
		"GET /v1/plugins":                                                   {200, "plugins", ""},
		"GET /v1/plugins/{plugin}":                                          notFound("plugin_not_found"),
		"GET /v1/sessions":                                                  {200, "sessions", ""},
		"POST /v1/agents":                                                   {400, "unknown_module", `{"name":"notes","module":"{digest}"}`},
		"GET /v1/agents":                                                    {200, "agents", ""},
		"GET /v1/agents/{agent}":                                            agentNF,
		"PUT /v1/agents/{agent}":                                            {404, "agent_not_found", `{"module":"{digest}","crash_policy":"destroy"}`},
		"POST /v1/agents/{agent}/sessions":                                  {404, "agent_not_found", `{}`},
		"PUT /v1/agents/{agent}/sessions":                                   {404, "agent_not_found", `{"key":"k1"}`},
		"GET /v1/agents/{agent}/sessions":                                   agentNF,
		"GET /v1/agents/{agent}/dead-letters":                               agentNF,
		"GET /v1/agents/{agent}/sessions-by-key/{key}":                      agentNF,
		"GET /v1/agents/{agent}/sessions/{session}":                         agentNF,
		"DELETE /v1/agents/{agent}/sessions/{session}":                      agentNF,
		"POST /v1/agents/{agent}/sessions/{session}/signals":                {404, "agent_not_found", `{"message":"from elsewhere"}`},
		"GET /v1/agents/{agent}/sessions/{session}/events":                  agentNF,
		"GET /v1/agents/{agent}/sessions/{session}/events/{event}":          agentNF,
		"POST /v1/agents/{agent}/sessions/{session}/events/{event}/redrive": agentNF,
		"POST /v1/agents/{agent}/sessions/{session}/events/{event}/discard": agentNF,
		"POST /v1/agents/{agent}/sessions/{session}/events/{event}/cancel":  agentNF,
		"GET /v1/agents/{agent}/sessions/{session}/dead-letters":            agentNF,
		"GET /v1/agents/{agent}/sessions/{session}/alarms":                  agentNF,
		"GET /v1/agents/{agent}/sessions/{session}/transcript":              agentNF,
		"GET /v1/agents/{agent}/sessions/{session}/stream":                  agentNF,
		"GET /v1/agents/{agent}/sessions/{session}/waits":                   agentNF,
		"GET /v1/agents/{agent}/sessions/{session}/waits/{wait}":            agentNF,
		"POST /v1/agents/{agent}/sessions/{session}/waits/{wait}":           {404, "agent_not_found", `{"approved":true}`},
		"GET /v1/agents/{agent}/waits":                                      agentNF,
		"GET /v1/secrets":                                                   {200, "secrets", ""},
		"PUT /v1/secrets/{name}":                                            {}, // exempt: sets the caller's namespace's own secret
		"DELETE /v1/secrets/{name}":                                         notFound("secret_not_found"),
		"POST /v1/tokens":                                                   {}, // exempt: a token of the caller's namespace
		"GET /v1/tokens":                                                    {200, "tokens", ""},
		"DELETE /v1/tokens/{id}":                                            notFound("token_not_found"),
		"GET /v1/audit":                                                     {200, "entries", ""},
	}
	// A token of namespace a, and a's audit rows (its setup's writes).
	// (An open host makes no token through the API: stored directly.)
	const tokenID = "a1b2c3d4e5f60718"
	if _, err := e.st.CreateToken(context.Background(), store.CreateTokenParams{ID: tokenID, Namespace: "a", Role: "reader",
		CreatedBy: "test", Hash: bytes.Repeat([]byte{1}, 32)}); err != nil {
		t.Fatal(err)
	}
	if code, m := e.json("GET", "/v1/audit?namespace=a", ""); code != 200 || len(m["entries"].([]any)) == 0 {
		t.Fatalf("a's audit rows: %d %v, want some", code, m)
	}
	before := e.state()
	seen := 0
	for _, r := range api.Routes() {
		if !strings.HasPrefix(r.Path, "/v1/") || r.Path == "/v1/openapi.yaml" {
			continue
		}
		w, ok := wants[r.Method+" "+r.Path]
		if !ok {
			t.Fatalf("route %s %s is not in this test's table: say what another namespace gets from it", r.Method, r.Path)
		}
		seen++
		if w.status == 0 {
			continue
		}
		// The agent by name and by the uid copied from a.
		refs := []string{"notes"}
		if strings.Contains(r.Path, "{agent}") {
			refs = append(refs, e.agentUID)
		}
		for _, agentRef := range refs {
			path := strings.NewReplacer("{agent}", url.PathEscape(agentRef), "{session}", e.session, "{key}", "k1",
				"{event}", "1", "{wait}", "w1", "{digest}", e.digest, "{plugin}", "tool", "{name}", "KEY", "{id}", tokenID).Replace(r.Path)
			body := strings.ReplaceAll(w.body, "{digest}", e.digest)
			for _, ns := range []string{"?namespace=b", ""} {
				code, m := e.json(r.Method, path+ns, body)
				what := fmt.Sprintf("%s %s%s", r.Method, path, ns)
				switch {
				case w.status == 200 && w.code == "entries":
					// Other namespaces' requests of this very test are
					// audited in theirs; none of a's rows may show.
					list, _ := m[w.code].([]any)
					for _, row := range list {
						if ns, _ := row.(map[string]any)["namespace"].(string); code != 200 || ns == "a" {
							t.Errorf("%s = %d, lists a row of namespace a: %v", what, code, row)
						}
					}
				case w.status == 200:
					list, _ := m[w.code].([]any)
					if code != 200 || len(list) != 0 {
						t.Errorf("%s = %d %v, want 200 and no %s", what, code, m, w.code)
					}
				default:
					if got, _, _ := errorOf(m); code != w.status || got != w.code {
						t.Errorf("%s = %d %v, want %d %s", what, code, m, w.status, w.code)
					}
				}
			}
		}
	}
	if seen != len(wants) {
		t.Fatalf("the table names %d routes, api.Routes has %d of them", len(wants), seen)
	}

	// The creations act in the caller's namespace only.
	if code, m := e.json("PUT", "/v1/secrets/KEY?namespace=b", `{"value":"b's value"}`); code != 201 {
		t.Fatalf("b's own secret KEY: %d %v", code, m)
	}
	if after := e.state(); after != before {
		t.Fatalf("namespace a changed while others addressed it:\nbefore %s\nafter  %s", before, after)
	}
	// b's agent of the same name, once b has the module.
	_, wasm := wasmtest.BuildExample(t, wasmtest.Notes)
	if code, m := e.do("POST", "/v1/modules?namespace=b", "application/wasm", wasm); code != 201 {
		t.Fatalf("upload to b: %d %v (the module is new to b)", code, m)
	}
	if code, m := e.json("POST", "/v1/agents?namespace=b", fmt.Sprintf(`{"name":"notes","module":%q}`, e.digest)); code != 201 || m["uid"] == e.agentUID {
		t.Fatalf("agent notes in b: %d %v", code, m)
	}
	if code, m := e.json("GET", "/v1/agents/notes/sessions/"+e.session+"?namespace=b", ""); code != 404 {
		t.Fatalf("a's session under b's agent of the same name: %d %v", code, m)
	}
}

// TestNamespaceParameter: a malformed ?namespace= is 400 invalid_parameter
// (field namespace), an undeclared one 404 namespace_not_found, on every
// /v1 route, before anything is read or written.
func TestNamespaceParameter(t *testing.T) {
	t.Parallel()
	e := newNSEnv(t)
	before := e.state()
	for _, c := range []struct {
		query, code string
		status      int
	}{
		{"namespace=Bad!", "invalid_parameter", 400},
		{"namespace=", "invalid_parameter", 400},
		{"namespace=a&namespace=b", "invalid_parameter", 400},
		{"namespace=nowhere", "namespace_not_found", 404},
	} {
		for _, r := range api.Routes() {
			if !strings.HasPrefix(r.Path, "/v1/") || r.Path == "/v1/openapi.yaml" {
				continue
			}
			path := strings.NewReplacer("{agent}", "notes", "{session}", e.session, "{key}", "k1",
				"{event}", "1", "{wait}", "w1", "{digest}", e.digest, "{plugin}", "tool", "{name}", "KEY", "{id}", "0123456789abcdef").Replace(r.Path)
			code, m := e.json(r.Method, path+"?"+c.query, `{}`)
			got, field, _ := errorOf(m)
			if code != c.status || got != c.code || field != "namespace" {
				t.Errorf("%s %s?%s = %d %v, want %d %s (field namespace)", r.Method, path, c.query, code, m, c.status, c.code)
			}
		}
	}
	if after := e.state(); after != before {
		t.Fatalf("namespace a changed:\nbefore %s\nafter  %s", before, after)
	}
	// "default" is always there, and named explicitly is the same as not.
	code, m := e.json("GET", "/v1/agents?namespace=default", "")
	if list, _ := m["agents"].([]any); code != 200 || len(list) != 0 {
		t.Fatalf("GET /v1/agents?namespace=default = %d %v", code, m)
	}
	code, m = e.json("GET", "/v1/agents?namespace=a", "")
	if list, _ := m["agents"].([]any); code != 200 || len(list) != 1 {
		t.Fatalf("GET /v1/agents?namespace=a = %d %v", code, m)
	}
}

// TestQuotasAnswer429WithRetryAfter: over a namespace's live_sessions or
// signals_per_minute quota, new work is 429 quota_exceeded (field: the
// quota) with Retry-After, nothing is written, and what exists still
// answers (a get-or-create of an existing key; reads).
func TestQuotasAnswer429WithRetryAfter(t *testing.T) {
	t.Parallel()
	e := &nsEnv{stillEnv: newStillEnv(t, func(p *host.Policy) {
		p.Namespaces = map[string]host.NamespacePolicy{"q": {Quotas: host.Quotas{LiveSessions: 1, SignalsPerMinute: 2}}}
	}, nil)}
	_, wasm := wasmtest.BuildExample(t, wasmtest.Notes)
	code, m := e.do("POST", "/v1/modules?namespace=q", "application/wasm", wasm)
	if code != 201 {
		t.Fatalf("upload: %d %v", code, m)
	}
	if code, m = e.json("POST", "/v1/agents?namespace=q", fmt.Sprintf(`{"name":"notes","module":%q}`, m["digest"])); code != 201 {
		t.Fatalf("agent: %d %v", code, m)
	}
	code, m = e.json("PUT", "/v1/agents/notes/sessions?namespace=q", `{"key":"only"}`)
	if code != 201 {
		t.Fatalf("first session: %d %v", code, m)
	}
	id := m["session_id"].(string)
	over := func(method, path, body, quota string) {
		t.Helper()
		req, _ := http.NewRequest(method, e.url+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&out)
		code, field, _ := errorOf(out)
		if resp.StatusCode != 429 || code != "quota_exceeded" || field != quota || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("%s %s = %d %v (Retry-After %q), want 429 quota_exceeded %s with Retry-After",
				method, path, resp.StatusCode, out, resp.Header.Get("Retry-After"), quota)
		}
	}
	over("POST", "/v1/agents/notes/sessions?namespace=q", `{}`, "live_sessions")
	over("PUT", "/v1/agents/notes/sessions?namespace=q", `{"key":"other"}`, "live_sessions")
	if code, m = e.json("PUT", "/v1/agents/notes/sessions?namespace=q", `{"key":"only"}`); code != 200 || m["session_id"] != id {
		t.Fatalf("get-or-create of the existing key over the quota: %d %v", code, m)
	}
	if code, m = e.json("GET", "/v1/sessions?namespace=q", ""); code != 200 {
		t.Fatalf("browse: %d %v", code, m)
	} else if list, _ := m["sessions"].([]any); len(list) != 1 {
		t.Fatalf("sessions of q after the refusals: %v", m)
	}

	sig := "/v1/agents/notes/sessions/" + id + "/signals?namespace=q"
	for i := range 2 {
		if code, m = e.json("POST", sig, fmt.Sprintf(`{"message":"m%d"}`, i)); code >= 300 {
			t.Fatalf("signal %d: %d %v", i, code, m)
		}
	}
	over("POST", sig, `{"message":"one too many"}`, "signals_per_minute")
	evs, err := e.st.ListEvents(context.Background(), store.ListEventsParams{
		Key: store.ActorKey{AgentUID: mustAgent(t, e, "q", "notes"), SessionID: id}, Limit: 10})
	if err != nil || len(evs) != 2 {
		t.Fatalf("events after the refused signal: %d, %v (want the 2 accepted)", len(evs), err)
	}
	// Each refusal is counted by namespace and quota.
	resp, err := http.Get(e.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`paddock_quota_refused_total{namespace="q",quota="live_sessions"} 2`,
		`paddock_quota_refused_total{namespace="q",quota="signals_per_minute"} 1`,
	} {
		if !strings.Contains(string(raw), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func mustAgent(t *testing.T, e *nsEnv, ns, name string) string {
	t.Helper()
	a, err := e.st.GetAgent(context.Background(), ns, name)
	if err != nil {
		t.Fatal(err)
	}
	return a.UID
}
