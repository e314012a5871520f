package api_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/host/api"
	"github.com/paddock-dev/paddock/store"
)

// TestPluginEnvValuesAreNeverReturned: a plugin's env holds secrets; the
// API answers the names only.
func TestPluginEnvValuesAreNeverReturned(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "sqlite", "", func(o *api.Options) { o.Plugins = fuzzPlugins{} })
	sum := strings.Repeat("0", 64)
	code, reg := e.json("POST", "/v1/plugins", `{"name":"p","path":"/bin/true","sha256":"`+sum+`","env":{"API_KEY":"s3cret-value","B":"x"}}`)
	if code != 201 {
		t.Fatalf("register: %d %v", code, reg)
	}
	_, one := e.json("GET", "/v1/plugins/p", "")
	_, all := e.json("GET", "/v1/plugins", "")
	for what, body := range map[string]map[string]any{"register": reg, "get": one, "list": all} {
		raw, _ := json.Marshal(body)
		if strings.Contains(string(raw), "s3cret-value") || strings.Contains(string(raw), `"env":`) {
			t.Errorf("%s answers the env values: %s", what, raw)
		}
	}
	if names, _ := json.Marshal(one["env_names"]); string(names) != `["API_KEY","B"]` {
		t.Errorf("get: env_names = %s, want [\"API_KEY\",\"B\"]", names)
	}
	if p, _ := e.st.GetPluginWorker(t.Context(), store.DefaultNamespace, "p"); p.Env["API_KEY"] != "s3cret-value" {
		t.Errorf("stored env = %v, want the value kept", p.Env)
	}
}

// TestTheBearerSchemeIsCaseInsensitive (RFC 9110 11.1).
func TestTheBearerSchemeIsCaseInsensitive(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "sqlite", "tok")
	for _, h := range []string{"Bearer tok", "bearer tok", "BEARER tok"} {
		if code, b := e.do("GET", "/v1/agents", "", nil, "Authorization", h); code != 200 {
			t.Errorf("Authorization: %s: %d %v, want 200", h, code, b)
		}
	}
	for _, h := range []string{"Bearer tok2", "Basic tok", "bearertok", ""} {
		if code, _ := e.do("GET", "/v1/agents", "", nil, "Authorization", h); code != 401 {
			t.Errorf("Authorization: %s: %d, want 401", h, code)
		}
	}
}

// TestAnAgentNameShapedLikeAUIDIsRefused: the name would resolve to
// another agent under /v1/agents/{agent}.
func TestAnAgentNameShapedLikeAUIDIsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "sqlite", "")
	e.setup()
	_, notes := e.json("GET", "/v1/agents/notes", "")
	code, b := e.json("POST", "/v1/agents", `{"name":"`+notes["uid"].(string)+`","module":"`+notes["module"].(string)+`"}`)
	if c, f, _ := errorOf(b); code != 400 || c != "invalid_field" || f != "name" {
		t.Fatalf("name = another agent's uid: %d %v, want 400 invalid_field name", code, b)
	}
}

// TestHintsOfTheHTTPFrontDoor: the API, not the service, names the route
// that helps.
func TestHintsOfTheHTTPFrontDoor(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "sqlite", "")
	e.setup()
	_, notes := e.json("GET", "/v1/agents/notes", "")
	cases := []struct{ method, path, body, want string }{
		{"POST", "/v1/agents", `{"name":"notes","module":"` + notes["module"].(string) + `"}`, "PUT /v1/agents/notes"},
		{"POST", "/v1/agents", `{"name":"x","module":"sha256:00"}`, "POST /v1/modules"},
		{"PUT", "/v1/agents/notes/sessions", `{}`, "PUT"},
	}
	for _, c := range cases {
		_, b := e.json(c.method, c.path, c.body)
		if _, _, msg := errorOf(b); !strings.Contains(msg, c.want) {
			t.Errorf("%s %s: %q, want a hint naming %q", c.method, c.path, msg, c.want)
		}
	}
	e.json("POST", "/v1/agents/notes/sessions", `{"key":"k"}`)
	if _, b := e.json("POST", "/v1/agents/notes/sessions", `{"key":"k"}`); !strings.Contains(b["error"].(map[string]any)["message"].(string), "PUT") {
		t.Errorf("session exists: %v, want a hint naming PUT", b)
	}
}
