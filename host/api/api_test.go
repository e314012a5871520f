package api_test

import (
	"context"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/host/api"
	"github.com/paddock-dev/paddock/host/service"
	"github.com/paddock-dev/paddock/store"
)

func TestBadInputGetsA4xxNamingTheProblemAndWritesNothing(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		e := newEnv(t, driver, "")
		e.setup()
		_, s := e.json("POST", "/v1/agents/notes/sessions", `{}`)
		sig := "/v1/agents/notes/sessions/" + s["session_id"].(string) + "/signals"

		cases := []struct {
			name              string
			method, path, ct  string
			body              []byte
			status            int
			code, field, text string
		}{
			{"non-wasm upload", "POST", "/v1/modules", "application/wasm", []byte("#!/bin/sh\necho hi\n"), 400, "invalid_module", "", "wasm"},
			{"wasm without our exports", "POST", "/v1/modules", "application/wasm", []byte("\x00asm\x01\x00\x00\x00"), 400, "invalid_module", "", "paddock_turn"},
			{"signal to an unknown session", "POST", "/v1/agents/notes/sessions/nope/signals", "application/json", []byte(`{"message":"hi"}`), 404, "session_not_found", "session", "nope"},
			{"signal to an unknown agent", "POST", "/v1/agents/nobody/sessions/x/signals", "application/json", []byte(`{"message":"hi"}`), 404, "agent_not_found", "agent", "nobody"},
			{"malformed JSON", "POST", sig, "application/json", []byte(`{"message": "hi"`), 400, "malformed_json", "", "JSON"},
			{"unknown field", "POST", sig, "application/json", []byte(`{"message":"hi","mesage":"typo"}`), 400, "unknown_field", "mesage", "mesage"},
			{"wrong type", "POST", sig, "application/json", []byte(`{"message":42}`), 400, "invalid_field", "message", "message"},
			{"oversized body", "POST", sig, "application/json", []byte(`{"message":"` + strings.Repeat("x", 5000) + `"}`), 413, "body_too_large", "", "4096"},
			{"empty message", "POST", sig, "application/json", []byte(`{}`), 400, "missing_field", "message", "message"},
			{"two JSON values", "POST", sig, "application/json", []byte(`{"message":"a"}{"message":"b"}`), 400, "malformed_json", "", "more than one"},
			{"unknown module digest", "POST", "/v1/agents", "application/json", []byte(`{"name":"x","module":"sha256:00"}`), 400, "unknown_module", "module", "sha256:00"},
			{"unknown module names its namespace", "POST", "/v1/agents", "application/json", []byte(`{"name":"x","module":"sha256:00"}`), 400, "unknown_module", "module", `in namespace "default"`},
			{"unknown plugin names its namespace", "POST", "/v1/agents", "application/json", []byte(`{"name":"x","plugin":"nope"}`), 400, "unknown_plugin", "plugin", `no plugin worker named "nope" in namespace "default"`},
			{"bad agent name", "POST", "/v1/agents", "application/json", []byte(`{"name":"Bad Name","module":"sha256:00"}`), 400, "invalid_field", "name", "Bad Name"},
			{"bad crash policy", "POST", "/v1/agents/notes/sessions", "application/json", []byte(`{"crash_policy":"reboot"}`), 400, "invalid_field", "crash_policy", "reboot"},
			{"get-or-create without key", "PUT", "/v1/agents/notes/sessions", "application/json", []byte(`{}`), 400, "missing_field", "key", "key"},
			{"bad limit", "GET", "/v1/agents/notes/sessions?limit=0", "", nil, 400, "invalid_parameter", "limit", "limit"},
			{"a parameter given twice", "GET", "/v1/agents/notes/sessions?limit=5&after=1&limit=6", "", nil, 400, "invalid_parameter", "limit", "limit is given 2 times"},
			{"audit limit 0", "GET", "/v1/audit?limit=0", "", nil, 400, "invalid_parameter", "limit", "between 1 and"},
			{"a bad sessions cursor", "GET", "/v1/sessions?cursor=garbage", "", nil, 400, "invalid_parameter", "cursor", `page cursor "garbage"`},
			{"unknown route", "GET", "/v1/nothing", "", nil, 404, "route_not_found", "", "/v1/nothing"},
			{"wrong method", "PATCH", "/v1/agents/notes", "application/json", []byte(`{}`), 405, "method_not_allowed", "", "GET"},
			{"null body", "POST", sig, "application/json", []byte(`null`), 400, "malformed_json", "", "JSON object"},
			{"array body", "POST", sig, "application/json", []byte(`[]`), 400, "malformed_json", "", "an array"},
			{"text body", "POST", sig, "application/json", []byte(`note buy milk`), 400, "malformed_json", "", "not JSON (at byte"},
			{"bare word body", "POST", sig, "application/json", []byte(`nope`), 400, "malformed_json", "", "not JSON (at byte"},
			{"number body", "POST", sig, "application/json", []byte(`42`), 400, "malformed_json", "", "not a number"},
			{"field name in another case", "POST", sig, "application/json", []byte(`{"Message":"x"}`), 400, "unknown_field", "Message", "Message"},
			{"null data and no message", "POST", sig, "application/json", []byte(`{"data":null}`), 400, "missing_field", "message", "message"},
			{"NUL in a message", "POST", sig, "application/json", []byte(`{"message":"a\u0000b"}`), 400, "invalid_field", "message", "NUL"},
			{"a body that is not UTF-8", "POST", sig, "application/json", []byte("{\"message\":\"ab\xffc\"}"), 400, "malformed_json", "", "not valid UTF-8 (at byte 14)"},
		}
		for _, c := range cases {
			status, body := e.do(c.method, c.path, c.ct, c.body)
			code, field, msg := errorOf(body)
			if status != c.status || code != c.code || field != c.field || !strings.Contains(msg, c.text) {
				t.Errorf("%s: got %d %s field=%q %q; want %d %s field=%q mentioning %q", c.name, status, code, field, msg, c.status, c.code, c.field, c.text)
			}
		}
		// Nothing was written by any of them.
		mods, _ := e.st.ListModules(context.Background(), store.DefaultNamespace)
		if len(mods) != 1 {
			t.Errorf("%d modules stored, want only the notes example", len(mods))
		}
		_, got := e.json("GET", "/v1/agents/notes/sessions/"+s["session_id"].(string), "")
		if got["event_count"] != float64(0) {
			t.Errorf("event_count = %v after rejected signals, want 0", got["event_count"])
		}
		_, list := e.json("GET", "/v1/agents/notes/sessions", "")
		if n := len(list["sessions"].([]any)); n != 1 {
			t.Errorf("%d sessions, want 1", n)
		}
	})
}

func TestGetOrCreateAndIdempotentSignals(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		e := newEnv(t, driver, "")
		e.setup()
		c1, s1 := e.json("PUT", "/v1/agents/notes/sessions", `{"key":"user-42","crash_policy":"sleep"}`)
		c2, s2 := e.json("PUT", "/v1/agents/notes/sessions", `{"key":"user-42"}`)
		if c1 != 201 || c2 != 200 || s1["session_id"] != s2["session_id"] || s1["created"] != true || s2["created"] != false {
			t.Fatalf("get-or-create: %d %v / %d %v", c1, s1, c2, s2)
		}
		if s2["crash_policy"] != "sleep" {
			t.Errorf("effective crash policy echoed = %v, want the stored sleep", s2["crash_policy"])
		}
		if c, b := e.json("POST", "/v1/agents/notes/sessions", `{"key":"user-42"}`); c != 409 {
			t.Errorf("POST with a taken key: %d %v, want 409", c, b)
		}
		sig := "/v1/agents/notes/sessions/" + s1["session_id"].(string) + "/signals"
		_, a := e.json("POST", sig, `{"message":"note x","idempotency_key":"k1"}`)
		_, b := e.json("POST", sig, `{"message":"note x","idempotency_key":"k1"}`)
		if a["event_id"] != b["event_id"] || b["created"] != false {
			t.Errorf("re-sent signal: %v then %v; want the first event back", a, b)
		}
		c, r := e.json("POST", sig, `{"message":"note y","idempotency_key":"k1"}`)
		if code, field, _ := errorOf(r); c != 409 || code != "idempotency_key_reused" || field != "idempotency_key" {
			t.Errorf("the key reused for another message: %d %v, want 409 idempotency_key_reused", c, r)
		}
	})
}

func TestNonLoopbackAPIRequiresTheBearerToken(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "sqlite", "s3cret")
	if c, b := e.do("GET", "/v1/agents", "", nil); c != 401 {
		t.Errorf("no token: %d %v, want 401", c, b)
	}
	if c, b := e.do("GET", "/v1/agents", "", nil, "Authorization", "Bearer wrong"); c != 401 {
		t.Errorf("wrong token: %d %v, want 401", c, b)
	}
	if c, b := e.do("GET", "/v1/agents", "", nil, "Authorization", "Bearer s3cret"); c != 200 {
		t.Errorf("right token: %d %v, want 200", c, b)
	}
	if c, _ := e.do("GET", "/healthz", "", nil); c != 200 {
		t.Errorf("healthz needs no token: %d", c)
	}
}

func TestConsoleSessionCookieAuthorizesReadsOnly(t *testing.T) {
	t.Parallel()
	var svc *service.Service
	e := newEnv(t, "sqlite", "s3cret", func(o *api.Options) {
		svc = service.New(o.Host, o.Modules, nil)
		o.Service = svc
	})
	id, _, err := svc.ConsoleLogin(context.Background(), "s3cret")
	if err != nil {
		t.Fatal(err)
	}
	cookie := api.SessionCookie + "=" + id
	// EventSource (the console's live transcript) cannot send a header:
	// a GET takes the cookie.
	if c, b := e.do("GET", "/v1/agents", "", nil, "Cookie", cookie); c != 200 {
		t.Errorf("GET with the session cookie: %d %v, want 200", c, b)
	}
	if c, b := e.do("GET", "/v1/agents", "", nil, "Cookie", api.SessionCookie+"=forged-login-id"); c != 401 {
		t.Errorf("GET with a forged cookie: %d %v, want 401", c, b)
	}
	if c, b := e.do("GET", "/v1/agents", "", nil, "Cookie", api.SessionCookie+"=s3cret"); c != 401 {
		t.Errorf("GET with the raw token as cookie: %d %v, want 401", c, b)
	}
	// A write still needs the bearer token, and wrote nothing.
	if c, b := e.do("POST", "/v1/agents", "application/json", []byte(`{"name":"x","module":"sha256:00"}`), "Cookie", cookie); c != 401 {
		t.Errorf("POST with only the session cookie: %d %v, want 401", c, b)
	}
	if c, b := e.do("GET", "/v1/agents/x", "", nil, "Authorization", "Bearer s3cret"); c != 404 {
		t.Errorf("agent x after a refused create: %d %v, want 404", c, b)
	}
}
