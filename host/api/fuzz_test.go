package api_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/host/api"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/store/sqlite"
)

// Fuzz targets of the API's request decoders, through the real handler on
// a SQLite store. The host is never run, so accepted signals are persisted
// but no turn runs. Every response must be a 2xx, or a 4xx whose JSON
// error has a stable code and a message; nothing may answer 5xx or panic;
// what was accepted must read back as it was sent.

// fuzzEnv is the API over a fresh store with agent "fz" (module fzModule),
// its session "s1" and plugin worker "p1".
type fuzzEnv struct {
	st  store.Store
	srv *api.Server
	a   store.Agent
}

var fzModule = "sha256:" + strings.Repeat("ab", 32)

// fuzzModules accepts any body as a module (the wasm checks have their own
// fuzz target); the digest is the bytes' sha256.
type fuzzModules struct{}

func (fuzzModules) Inspect(_ context.Context, b []byte) (string, int, error) {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:]), abi.Version, nil
}

// fuzzPlugins refuses a plugin whose path is not absolute, as a real check
// (which starts the binary) would.
type fuzzPlugins struct{}

func (fuzzPlugins) CheckPlugin(_ context.Context, w store.PluginWorker) error {
	if !filepath.IsAbs(w.Path) {
		return fmt.Errorf("plugin %s: path %q is not absolute", w.Name, w.Path)
	}
	return nil
}

// noRunner is the host's runner; the host never runs, so it is never asked.
type noRunner struct{}

func (noRunner) Binding(store.AgentBinding, string) (string, error) { return "", nil }
func (noRunner) Instantiate(context.Context, string) (host.Instance, error) {
	return nil, fmt.Errorf("no runner")
}

func newFuzzEnv(f *testing.F) *fuzzEnv {
	f.Helper()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(f.TempDir(), "fuzz.db"))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { st.Close() })
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	h, err := host.New(host.Options{Store: st, Runner: noRunner{}, Policy: host.DefaultPolicy(), Logger: quiet})
	if err != nil {
		f.Fatal(err)
	}
	e := &fuzzEnv{st: st}
	e.srv = api.New(api.Options{Host: h, Modules: fuzzModules{}, Plugins: fuzzPlugins{}, MaxBodyBytes: 4096, MaxModuleBytes: 1 << 20, Logger: quiet})
	if _, _, err := st.PutModule(ctx, store.PutModuleParams{Digest: fzModule, ABIVersion: abi.Version, Bytes: []byte("\x00asm\x01\x00\x00\x00")}); err != nil {
		f.Fatal(err)
	}
	if _, _, err := st.PutPluginWorker(ctx, store.PluginWorker{Name: "p1", Path: "/bin/true", SHA256: strings.Repeat("0", 64), Processes: 1}); err != nil {
		f.Fatal(err)
	}
	e.a, err = st.CreateAgent(ctx, store.CreateAgentParams{UID: uuid.NewString(), Name: "fz", ModuleDigest: fzModule, CrashPolicy: store.CrashRestart})
	if err != nil {
		f.Fatal(err)
	}
	if _, _, err := st.CreateSession(ctx, store.CreateSessionParams{AgentUID: e.a.UID, SessionID: "s1", Key: "k1", CrashPolicy: store.CrashRestart}); err != nil {
		f.Fatal(err)
	}
	return e
}

// do serves one request and checks the response's shape: 2xx or 4xx, JSON,
// and for an error a stable code and a message. It returns the status and
// the decoded body.
func (e *fuzzEnv) do(t *testing.T, method, target string, body []byte) (int, map[string]any) {
	t.Helper()
	req := httptest.NewRequest(method, "/", bytes.NewReader(body))
	req.URL = &url.URL{Path: target}
	if p, q, ok := strings.Cut(target, "?"); ok {
		req.URL = &url.URL{Path: p, RawQuery: q}
	}
	req.RequestURI = ""
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	e.srv.ServeHTTP(rec, req)
	code := rec.Code
	if (code == http.StatusTemporaryRedirect || code == http.StatusMovedPermanently) && path.Clean(req.URL.Path) != req.URL.Path {
		return code, nil // the router's redirect to the clean path
	}
	if code >= 500 || code < 200 || (code >= 300 && code < 400) {
		t.Fatalf("%s %s %q: status %d: %s", method, target, body, code, rec.Body.Bytes())
	}
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("%s %s: Content-Type %q", method, target, ct)
	}
	var out map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
		t.Fatalf("%s %s: the response is not a JSON object: %v: %s", method, target, err, rec.Body.Bytes())
	}
	if code >= 400 {
		eo, ok := out["error"].(map[string]any)
		c, _ := eo["code"].(string)
		m, _ := eo["message"].(string)
		if !ok || c == "" || m == "" || strings.ToLower(c) != c || strings.ContainsAny(c, " .") {
			t.Fatalf("%s %s %q: %d with an error that has no stable code and message: %s", method, target, body, code, rec.Body.Bytes())
		}
		if _, ok := statusOfCode[c]; ok && statusOfCode[c] != code {
			t.Fatalf("error code %s came with status %d, want %d", c, code, statusOfCode[c])
		}
	}
	return code, out
}

// statusOfCode pins the status of the decoders' error codes.
var statusOfCode = map[string]int{
	"malformed_json": 400, "unknown_field": 400, "invalid_field": 400, "missing_field": 400, "invalid_parameter": 400,
	"body_too_large": 413, "signal_too_large": 413, "unknown_module": 400, "unknown_plugin": 400, "invalid_plugin": 400,
	"agent_exists": 409, "session_exists": 409, "idempotency_key_reused": 409, "nothing_in_flight": 409, "turn_in_flight": 409,
	"event_closed": 409, "agent_not_found": 404, "session_not_found": 404, "event_not_found": 404, "plugin_not_found": 404,
	"route_not_found": 404, "method_not_allowed": 405, "not_dead_letter": 409, "session_destroyed": 410,
}

// decodeLoose decodes body the way a client means it: a JSON object, or
// nil when it is not one.
func decodeLoose(body []byte) map[string]json.RawMessage {
	var m map[string]json.RawMessage
	if json.Unmarshal(body, &m) != nil {
		return nil
	}
	return m
}

func str(m map[string]json.RawMessage, k string) string {
	var s string
	_ = json.Unmarshal(m[k], &s)
	return s
}

// FuzzSignal fuzzes the body of POST …/sessions/{session}/signals (message,
// steer, cancel, wake). An accepted message or steer is stored with the
// message and data sent; sending it again with its idempotency key returns
// the same event.
func FuzzSignal(f *testing.F) {
	for _, s := range []string{
		`{"message":"note buy milk"}`, `{"kind":"steer","message":"louder"}`, `{"kind":"cancel"}`, `{"kind":"cancel","event_id":99}`,
		`{"kind":"wake"}`, `{"message":"x","data":{"a":[1,2,{"b":null}]},"idempotency_key":"k-1"}`, `{"data":null}`,
		`{"message":"<>&\u2028"}`, `{"message":"nul \u0000"}`, `{"kind":"alarm","message":"x"}`, `{"Message":"x"}`,
		`{"message":1}`, `{"message":"x"}{"message":"y"}`, `[1]`, ``, `{"message":"x","event_id":1}`,
		`{"message":"x","force_allocation":true}`, `{"data":1e400}`, `{"idempotency_key":"has space","message":"x"}`,
	} {
		f.Add([]byte(s))
	}
	e := newFuzzEnv(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		path := "/v1/agents/fz/sessions/s1/signals"
		code, out := e.do(t, "POST", path, body)
		if code != http.StatusAccepted {
			return
		}
		in := decodeLoose(body)
		if in == nil {
			t.Fatalf("accepted a body that is not a JSON object: %q", body)
		}
		kind := str(in, "kind")
		if kind == "" {
			kind = abi.EventMessage
		}
		if out["kind"] != kind {
			t.Fatalf("accepted kind %v, sent %q", out["kind"], kind)
		}
		if kind != abi.EventMessage && kind != abi.EventSteer {
			return
		}
		id := int64(out["event_id"].(float64))
		es, err := e.st.ListEvents(context.Background(), store.ListEventsParams{Key: store.ActorKey{AgentUID: e.a.UID, SessionID: "s1"}, After: id - 1, Limit: 1})
		if err != nil || len(es) != 1 || es[0].ID != id {
			t.Fatalf("accepted event %d does not read back: %v %+v", id, err, es)
		}
		var stored struct {
			Message string          `json:"message"`
			Data    json.RawMessage `json:"data"`
		}
		if err := json.Unmarshal(es[0].Payload, &stored); err != nil {
			t.Fatalf("stored payload %q does not decode: %v", es[0].Payload, err)
		}
		if want := str(in, "message"); stored.Message != want || abi.ValidText(stored.Message) != nil {
			t.Fatalf("stored message %q, sent %q", stored.Message, want)
		}
		if want := compact(in["data"]); !bytes.Equal(compact(stored.Data), want) && !(string(want) == "null" && stored.Data == nil) {
			t.Fatalf("stored data %s, sent %s", stored.Data, in["data"])
		}
		if es[0].Kind != kind {
			t.Fatalf("stored kind %q, sent %q", es[0].Kind, kind)
		}
		if str(in, "idempotency_key") != "" {
			code, again := e.do(t, "POST", path, body)
			if code != http.StatusAccepted || again["event_id"] != out["event_id"] || again["created"] != false {
				t.Fatalf("the same signal with its idempotency key again: %d %v, want the first event %v", code, again, out["event_id"])
			}
		}
	})
}

func compact(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	var buf bytes.Buffer
	if json.Compact(&buf, b) != nil {
		return b
	}
	return buf.Bytes()
}

// FuzzSession fuzzes the body of session create (POST) and get-or-create
// (PUT). An accepted session reads back with the key, input and crash
// policy sent (the agent's default policy when none was).
func FuzzSession(f *testing.F) {
	for _, s := range []string{
		`{}`, `{"key":"user-42"}`, `{"key":"k1"}`, `{"input":"AAEC","crash_policy":"sleep"}`, `{"crash_policy":"explode"}`,
		`{"input":"not base64!"}`, `{"key":"has space"}`, `{"key":""}`, `{"input":null,"key":null}`, `{"extra":1}`,
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	e := newFuzzEnv(f)
	f.Fuzz(func(t *testing.T, body []byte, put bool) {
		method := "POST"
		if put {
			method = "PUT"
		}
		code, out := e.do(t, method, "/v1/agents/fz/sessions", body)
		if code != http.StatusOK && code != http.StatusCreated {
			return
		}
		in := decodeLoose(body)
		id, _ := out["session_id"].(string)
		x, err := e.st.GetSession(context.Background(), store.ActorKey{AgentUID: e.a.UID, SessionID: id})
		if err != nil {
			t.Fatalf("accepted session %q does not read back: %v", id, err)
		}
		if key := str(in, "key"); x.Key != key {
			t.Fatalf("stored key %q, sent %q", x.Key, key)
		}
		if code == http.StatusCreated {
			var input []byte
			_ = json.Unmarshal(in["input"], &input)
			if !bytes.Equal(x.Input, input) {
				t.Fatalf("stored input %x, sent %x", x.Input, input)
			}
			want := store.CrashPolicy(str(in, "crash_policy"))
			if want == "" {
				want = e.a.CrashPolicy
			}
			if x.CrashPolicy != want {
				t.Fatalf("stored crash policy %q, want %q", x.CrashPolicy, want)
			}
		}
	})
}
