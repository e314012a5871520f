package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/host/api"
	"github.com/paddock-dev/paddock/host/runner"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/store/pgtest"
	"github.com/paddock-dev/paddock/store/postgres"
	"github.com/paddock-dev/paddock/store/sqlite"
	"github.com/paddock-dev/paddock/wasm"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var (
	rtOnce sync.Once
	rt     *wasm.Runtime
	rtErr  error
)

// runtime returns one wasm runtime shared by the tests of this binary.
func runtime(t *testing.T) *wasm.Runtime {
	rtOnce.Do(func() {
		rt, rtErr = wasm.New(context.Background(), wasm.Config{
			CacheDir: wasmtest.CacheDir(t), MemoryLimitPages: 1024, TurnTimeout: time.Minute,
		}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	})
	if rtErr != nil {
		t.Fatal(rtErr)
	}
	return rt
}

type env struct {
	t   *testing.T
	st  store.Store
	url string
}

func newEnv(t *testing.T, driver, token string, tweak ...func(*api.Options)) *env {
	t.Helper()
	var st store.Store
	var err error
	if driver == "postgres" {
		st, err = postgres.Open(context.Background(), pgtest.DSN(t))
	} else {
		st, err = sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "p.db"))
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	wr := runner.NewWasm(runtime(t), st)
	pol := host.DefaultPolicy()
	pol.IdleTimeout, pol.ScanInterval, pol.LeaseTTL = time.Second, 100*time.Millisecond, 3*time.Second
	pol.BackoffMin, pol.BackoffMax, pol.MaxAttempts = 20*time.Millisecond, 100*time.Millisecond, 2
	h, err := host.New(host.Options{Store: st, Runner: wr, Policy: pol, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = h.Run(ctx); close(done) }()
	opts := api.Options{
		Host: h, Modules: wr, AuthToken: token, MaxBodyBytes: 4096, MaxModuleBytes: 32 << 20,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	for _, f := range tweak {
		f(&opts)
	}
	srv := httptest.NewServer(api.New(opts))
	t.Cleanup(func() { srv.Close(); cancel(); <-done })
	return &env{t: t, st: st, url: srv.URL}
}

// do sends a request and returns the status and decoded JSON body.
func (e *env) do(method, path, contentType string, body []byte, hdr ...string) (int, map[string]any) {
	e.t.Helper()
	req, err := http.NewRequest(method, e.url+path, bytes.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	raw, _ := io.ReadAll(resp.Body)
	if len(raw) > 0 && strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		if err := json.Unmarshal(raw, &out); err != nil {
			e.t.Fatalf("%s %s: response is not JSON: %s", method, path, raw)
		}
	}
	return resp.StatusCode, out
}

func (e *env) json(method, path, body string) (int, map[string]any) {
	return e.do(method, path, "application/json", []byte(body))
}

// errorOf returns the error object of a response.
func errorOf(body map[string]any) (code, field, msg string) {
	eo, _ := body["error"].(map[string]any)
	code, _ = eo["code"].(string)
	field, _ = eo["field"].(string)
	msg, _ = eo["message"].(string)
	return
}

// setup uploads the notes example and registers agent "notes".
func (e *env) setup() {
	e.t.Helper()
	_, b := wasmtest.BuildExample(e.t, wasmtest.Notes)
	code, m := e.do("POST", "/v1/modules", "application/wasm", b)
	if code != 201 {
		e.t.Fatalf("upload: %d %v", code, m)
	}
	code, m = e.json("POST", "/v1/agents", fmt.Sprintf(`{"name":"notes","module":%q}`, m["digest"]))
	if code != 201 {
		e.t.Fatalf("create agent: %d %v", code, m)
	}
}

func eachDriver(t *testing.T, f func(t *testing.T, driver string)) {
	t.Parallel()
	for _, d := range []string{"sqlite", "postgres"} {
		t.Run(d, func(t *testing.T) {
			t.Parallel()
			f(t, d)
		})
	}
}

func TestWalkthroughThreeSignalsGiveThreeTurnsInOrder(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		e := newEnv(t, driver, "")
		e.setup()
		code, s := e.json("POST", "/v1/agents/notes/sessions", `{}`)
		if code != 201 || s["crash_policy"] != "restart" || s["status"] != "active" {
			t.Fatalf("create session: %d %v", code, s)
		}
		id := s["session_id"].(string)
		base := "/v1/agents/notes/sessions/" + id
		for _, m := range []string{"note buy milk", "note call mum", "list"} {
			if code, r := e.json("POST", base+"/signals", fmt.Sprintf(`{"message":%q}`, m)); code != 202 || r["created"] != true {
				t.Fatalf("signal %q: %d %v", m, code, r)
			}
		}
		var turns []any
		deadline := time.Now().Add(time.Minute)
		after := 0
		for len(turns) < 3 && time.Now().Before(deadline) {
			_, tr := e.json("GET", fmt.Sprintf("%s/transcript?after=%d&wait=5s", base, after), "")
			got, _ := tr["turns"].([]any)
			turns = append(turns, got...)
			after = int(tr["next_after"].(float64))
		}
		if len(turns) != 3 {
			t.Fatalf("got %d turns, want 3", len(turns))
		}
		last := turns[2].(map[string]any)["messages"].([]any)
		reply := last[len(last)-1].(map[string]any)["content"].(string)
		if !strings.Contains(reply, "buy milk") || !strings.Contains(reply, "call mum") {
			t.Errorf("list reply %q does not carry both notes across turns", reply)
		}
		_, s = e.json("GET", base, "")
		if s["turn_count"] != float64(3) || s["event_count"] != float64(3) || s["open_events"] != float64(0) {
			t.Errorf("session counters: %v", s)
		}
	})
}

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
			{"bad agent name", "POST", "/v1/agents", "application/json", []byte(`{"name":"Bad Name","module":"sha256:00"}`), 400, "invalid_field", "name", "Bad Name"},
			{"bad crash policy", "POST", "/v1/agents/notes/sessions", "application/json", []byte(`{"crash_policy":"reboot"}`), 400, "invalid_field", "crash_policy", "reboot"},
			{"get-or-create without key", "PUT", "/v1/agents/notes/sessions", "application/json", []byte(`{}`), 400, "missing_field", "key", "key"},
			{"bad limit", "GET", "/v1/agents/notes/sessions?limit=0", "", nil, 400, "invalid_parameter", "limit", "limit"},
			{"unknown route", "GET", "/v1/nothing", "", nil, 404, "route_not_found", "", "/v1/nothing"},
			{"wrong method", "PATCH", "/v1/agents/notes", "application/json", []byte(`{}`), 405, "method_not_allowed", "", "GET"},
			{"null body", "POST", sig, "application/json", []byte(`null`), 400, "malformed_json", "", "JSON object"},
			{"array body", "POST", sig, "application/json", []byte(`[]`), 400, "malformed_json", "", "an array"},
			{"field name in another case", "POST", sig, "application/json", []byte(`{"Message":"x"}`), 400, "unknown_field", "Message", "Message"},
			{"null data and no message", "POST", sig, "application/json", []byte(`{"data":null}`), 400, "missing_field", "message", "message"},
			{"NUL in a message", "POST", sig, "application/json", []byte(`{"message":"a\u0000b"}`), 400, "invalid_field", "message", "NUL"},
		}
		for _, c := range cases {
			status, body := e.do(c.method, c.path, c.ct, c.body)
			code, field, msg := errorOf(body)
			if status != c.status || code != c.code || field != c.field || !strings.Contains(msg, c.text) {
				t.Errorf("%s: got %d %s field=%q %q; want %d %s field=%q mentioning %q", c.name, status, code, field, msg, c.status, c.code, c.field, c.text)
			}
		}
		// Nothing was written by any of them.
		mods, _ := e.st.ListModules(context.Background())
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

// setupFaulty uploads the faulty example and registers agent "faulty".
func (e *env) setupFaulty() {
	e.t.Helper()
	_, b := wasmtest.BuildExample(e.t, wasmtest.Faulty)
	code, m := e.do("POST", "/v1/modules", "application/wasm", b)
	if code != 201 && code != 200 {
		e.t.Fatalf("upload: %d %v", code, m)
	}
	if code, m = e.json("POST", "/v1/agents", fmt.Sprintf(`{"name":"faulty","module":%q}`, m["digest"])); code != 201 {
		e.t.Fatalf("create agent: %d %v", code, m)
	}
}

func (e *env) waitSession(path, what string, cond func(map[string]any) bool) map[string]any {
	e.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		_, s := e.json("GET", path, "")
		if cond(s) {
			return s
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out waiting for %s: %v", what, s)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestCrashPoliciesDeadLettersRedriveAndDestroyThroughTheAPI(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		e := newEnv(t, driver, "")
		e.setupFaulty()
		newSession := func(policy string) string {
			code, s := e.json("POST", "/v1/agents/faulty/sessions", fmt.Sprintf(`{"crash_policy":%q}`, policy))
			if code != 201 || s["crash_policy"] != policy {
				t.Fatalf("create %s session: %d %v", policy, code, s)
			}
			return "/v1/agents/faulty/sessions/" + s["session_id"].(string)
		}

		// restart: retries, then a dead letter with its error chain; redrive
		// re-opens it; discard is only for dead letters.
		r := newSession("restart")
		if c, b := e.json("POST", r+"/signals", `{"message":"error"}`); c != 202 {
			t.Fatalf("signal: %d %v", c, b)
		}
		e.waitSession(r, "a dead letter", func(s map[string]any) bool { return s["dead_letters"] == float64(1) })
		for _, path := range []string{"/v1/agents/faulty/dead-letters", r + "/dead-letters"} {
			_, dl := e.json("GET", path, "")
			list, _ := dl["dead_letters"].([]any)
			if len(list) != 1 {
				t.Fatalf("GET %s: %v", path, dl)
			}
			ev := list[0].(map[string]any)["event"].(map[string]any)
			if chain, _ := ev["errors"].([]any); len(chain) != 2 {
				t.Errorf("GET %s: error chain %v, want 2 attempts", path, ev["errors"])
			}
		}
		_, evs := e.json("GET", r+"/events?status=dead_letter", "")
		id := int(evs["events"].([]any)[0].(map[string]any)["event_id"].(float64))
		if c, b := e.json("POST", fmt.Sprintf("%s/events/%d/redrive", r, id), ""); c != 200 || b["status"] != "open" {
			t.Errorf("redrive: %d %v", c, b)
		}
		e.waitSession(r, "the redriven event to dead-letter again", func(s map[string]any) bool { return s["dead_letters"] == float64(1) && s["open_events"] == float64(0) })
		if c, b := e.json("POST", fmt.Sprintf("%s/events/%d/discard", r, id), ""); c != 200 || b["status"] != "discarded" {
			t.Errorf("discard: %d %v", c, b)
		}
		if c, b := e.json("POST", fmt.Sprintf("%s/events/%d/discard", r, id), ""); c != 409 {
			t.Errorf("discard of a discarded event: %d %v, want 409", c, b)
		}

		// sleep: the session parks with sleep_ts; a signal wakes it.
		sl := newSession("sleep")
		e.json("POST", sl+"/signals", `{"message":"error"}`)
		s := e.waitSession(sl, "the session to sleep", func(s map[string]any) bool { return s["status"] == "sleeping" })
		if s["sleep_ts"] == nil || s["sleep_reason"] != "crash" {
			t.Errorf("sleeping session: %v", s)
		}
		if c, b := e.json("POST", sl+"/signals", `{"kind":"wake"}`); c != 202 || b["status"] != "active" {
			t.Errorf("wake: %d %v", c, b)
		}

		// destroy: the crash destroys the session; signals then get 410.
		d := newSession("destroy")
		e.json("POST", d+"/signals", `{"message":"error"}`)
		e.waitSession(d, "the session to be destroyed", func(s map[string]any) bool { return s["status"] == "destroyed" })
		c, b := e.json("POST", d+"/signals", `{"message":"hello?"}`)
		if code, _, _ := errorOf(b); c != 410 || code != "session_destroyed" {
			t.Errorf("signal to a destroyed session: %d %v, want 410 session_destroyed", c, b)
		}

		// DELETE destroys explicitly (idempotent).
		x := newSession("restart")
		for range 2 {
			if c, b := e.json("DELETE", x, ""); c != 200 || b["status"] != "destroyed" || b["destroy_ts"] == nil {
				t.Errorf("DELETE: %d %v", c, b)
			}
		}
		if c, _ := e.json("POST", x+"/signals", `{"message":"hi"}`); c != 410 {
			t.Errorf("signal after DELETE: %d, want 410", c)
		}
	})
}

func TestSteerCancelAndWakeSignalsThroughTheAPI(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		e := newEnv(t, driver, "")
		e.setupFaulty()
		_, s := e.json("POST", "/v1/agents/faulty/sessions", `{}`)
		base := "/v1/agents/faulty/sessions/" + s["session_id"].(string)
		if c, b := e.json("POST", base+"/signals", `{"kind":"cancel"}`); c != 409 {
			t.Errorf("cancel with nothing in flight: %d %v, want 409", c, b)
		}
		e.json("POST", base+"/signals", `{"message":"think 20000"}`)
		e.waitSession(base+"/events", "the turn to start", func(m map[string]any) bool {
			evs, _ := m["events"].([]any)
			return len(evs) == 1 && evs[0].(map[string]any)["binding"] != nil
		})
		time.Sleep(200 * time.Millisecond)
		c, b := e.json("POST", base+"/signals", `{"kind":"steer","message":"stop thinking"}`)
		if c != 202 || b["in_flight"] != true {
			t.Fatalf("steer: %d %v", c, b)
		}
		var reply string
		deadline := time.Now().Add(time.Minute)
		for reply == "" && time.Now().Before(deadline) {
			_, tr := e.json("GET", base+"/transcript?wait=5s", "")
			if ts, _ := tr["turns"].([]any); len(ts) == 1 {
				ms := ts[0].(map[string]any)["messages"].([]any)
				reply = ms[len(ms)-1].(map[string]any)["content"].(string)
			}
		}
		if reply != "steered: stop thinking" {
			t.Errorf("reply after the steer: %q", reply)
		}

		// cancel a turn in flight
		e.json("POST", base+"/signals", `{"message":"think 20000"}`)
		time.Sleep(300 * time.Millisecond)
		if c, b := e.json("POST", base+"/signals", `{"kind":"cancel"}`); c != 202 || b["in_flight"] != true {
			t.Errorf("cancel: %d %v", c, b)
		}
		e.waitSession(base, "the cancelled turn", func(m map[string]any) bool { return m["open_events"] == float64(0) })
		_, tr := e.json("GET", base+"/transcript?after=1", "")
		ts, _ := tr["turns"].([]any)
		if len(ts) != 1 || ts[0].(map[string]any)["outcome"] != "cancelled" {
			t.Errorf("transcript after cancel: %v", tr)
		}
		for _, bad := range []string{`{"kind":"reboot"}`, `{"kind":"cancel","message":"x"}`, `{"kind":"wake","event_id":3}`, `{"kind":"steer"}`} {
			if c, b := e.json("POST", base+"/signals", bad); c != 400 {
				t.Errorf("%s: %d %v, want 400", bad, c, b)
			}
		}
	})
}

// TestRefusalsNameTheEventAndTheDestroyedSession checks two refusals: a
// redrive or discard of an event that is not dead-lettered answers 409
// not_dead_letter naming the event and its status (the store's conflict
// carries them), and a cancel in a destroyed session answers 410
// session_destroyed like every other signal, while a live session with no
// turn in flight still gets 409 nothing_in_flight.
func TestRefusalsNameTheEventAndTheDestroyedSession(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		e := newEnv(t, driver, "")
		e.setupFaulty()
		code, s := e.json("POST", "/v1/agents/faulty/sessions", `{"crash_policy":"restart"}`)
		if code != 201 {
			t.Fatalf("create session: %d %v", code, s)
		}
		r := "/v1/agents/faulty/sessions/" + s["session_id"].(string)
		if c, b := e.json("POST", r+"/signals", `{"message":"error"}`); c != 202 {
			t.Fatalf("signal: %d %v", c, b)
		}
		e.waitSession(r, "a dead letter", func(s map[string]any) bool { return s["dead_letters"] == float64(1) })
		_, evs := e.json("GET", r+"/events?status=dead_letter", "")
		id := int(evs["events"].([]any)[0].(map[string]any)["event_id"].(float64))
		if c, b := e.json("POST", fmt.Sprintf("%s/events/%d/discard", r, id), ""); c != 200 || b["status"] != "discarded" {
			t.Fatalf("discard: %d %v", c, b)
		}
		want := fmt.Sprintf("event %d is discarded, not dead_letter", id)
		for _, op := range []string{"discard", "redrive"} {
			c, b := e.json("POST", fmt.Sprintf("%s/events/%d/%s", r, id, op), "")
			if code, field, msg := errorOf(b); c != 409 || code != "not_dead_letter" || field != "event" || msg != want {
				t.Errorf("%s of a discarded event: %d %v, want 409 not_dead_letter %q", op, c, b, want)
			}
		}

		if c, b := e.json("POST", r+"/signals", `{"kind":"cancel"}`); c != 409 {
			t.Errorf("cancel with nothing in flight: %d %v, want 409", c, b)
		} else if code, _, _ := errorOf(b); code != "nothing_in_flight" {
			t.Errorf("cancel with nothing in flight: %v, want nothing_in_flight", b)
		}
		if c, b := e.json("DELETE", r, ""); c != 200 || b["status"] != "destroyed" {
			t.Fatalf("DELETE: %d %v", c, b)
		}
		for _, req := range [][2]string{
			{r + "/signals", `{"kind":"cancel"}`},
			{r + "/signals", fmt.Sprintf(`{"kind":"cancel","event_id":%d}`, id)},
			{fmt.Sprintf("%s/events/%d/cancel", r, id), ""},
		} {
			c, b := e.json("POST", req[0], req[1])
			if code, _, _ := errorOf(b); c != 410 || code != "session_destroyed" {
				t.Errorf("POST %s %s in a destroyed session: %d %v, want 410 session_destroyed", req[0], req[1], c, b)
			}
		}
		if c, b := e.json("POST", "/v1/agents/faulty/sessions/nope/signals", `{"kind":"cancel"}`); c != 404 {
			t.Errorf("cancel in an unknown session: %d %v, want 404", c, b)
		}
	})
}

// A signal whose encoded message exceeds MaxEventPayloadBytes is refused
// at acceptance (413, naming the field), even when api.max_body_bytes
// would let it in: accepted, it could only fail every attempt as a turn
// request too large. One just under the limit made of '<' (six bytes each
// under HTML escaping) is accepted and its turn commits.
func TestSignalsTooLargeForATurnAreRefusedAtAcceptance(t *testing.T) {
	eachDriver(t, func(t *testing.T, driver string) {
		e := newEnv(t, driver, "", func(o *api.Options) { o.MaxBodyBytes = 8 << 20 })
		e.setup()
		_, s := e.json("POST", "/v1/agents/notes/sessions", `{"crash_policy":"destroy"}`)
		id := s["session_id"].(string)
		sig := "/v1/agents/notes/sessions/" + id + "/signals"
		big, _ := json.Marshal(map[string]string{"message": strings.Repeat("x", api.MaxEventPayloadBytes)})
		status, body := e.do("POST", sig, "application/json", big)
		code, field, msg := errorOf(body)
		if status != 413 || code != "signal_too_large" || field != "message" || !strings.Contains(msg, fmt.Sprint(api.MaxEventPayloadBytes)) {
			t.Fatalf("oversized signal: %d %s field=%q %q; want 413 signal_too_large naming the limit", status, code, field, msg)
		}
		// 'note ' and then '<'s: the notes agent stores it; the turn must commit.
		fits, _ := json.Marshal(map[string]string{"message": "note " + strings.Repeat("<", api.MaxEventPayloadBytes-64)})
		if status, body := e.do("POST", sig, "application/json", fits); status != 202 {
			t.Fatalf("signal of %d bytes of '<': %d %v, want 202", len(fits), status, body)
		}
		deadline := time.Now().Add(time.Minute)
		for {
			_, got := e.json("GET", "/v1/agents/notes/sessions/"+id, "")
			if got["turn_count"] == float64(1) && got["status"] == "active" {
				break
			}
			if time.Now().After(deadline) || got["status"] == "destroyed" {
				_, evs := e.json("GET", "/v1/agents/notes/sessions/"+id+"/events", "")
				t.Fatalf("the '<' signal's turn did not commit: session %v; events %.600v", got, evs)
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
}
