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

	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/host/api"
	"github.com/paddock-dev/paddock/host/api/client"
	"github.com/paddock-dev/paddock/host/calls"
	"github.com/paddock-dev/paddock/host/runner"
	"github.com/paddock-dev/paddock/host/service"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/store/sqlite"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// syncBuffer is a log sink safe for the server's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// stillEnv is the real API of a host on SQLite that is built but not run:
// no controller claims a session, so a test can claim an activation and
// write journal rows itself under its live delivery.
type stillEnv struct {
	*env
	logs *syncBuffer
	api  *client.Client
}

// newStillEnv starts it. policy, if set, tunes the host's policy; sealer,
// if set, makes the service seal secrets with it. Every log line of the
// API and the host goes to logs, at debug level.
func newStillEnv(t *testing.T, policy func(*host.Policy), sealer service.Sealer) *stillEnv {
	t.Helper()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "p.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	logs := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	wr := runner.NewWasm(runtime(t), st)
	pol := host.DefaultPolicy()
	if policy != nil {
		policy(&pol)
	}
	h, err := host.New(host.Options{Store: st, Runner: wr, Policy: pol, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	svc := service.New(h, wr, nil)
	if sealer != nil {
		svc = svc.WithSecrets(sealer)
	}
	srv := httptest.NewServer(api.New(api.Options{Host: h, Modules: wr, Service: svc, MaxBodyBytes: 4096, MaxModuleBytes: 32 << 20, Logger: log}))
	t.Cleanup(srv.Close)
	return &stillEnv{env: &env{t: t, st: st, url: srv.URL}, logs: logs, api: client.New(srv.URL)}
}

// raw sends a request and returns the status and the body as sent.
func (e *stillEnv) raw(method, path, body string) (int, string) {
	e.t.Helper()
	req, err := http.NewRequest(method, e.url+path, strings.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func testSealer(t *testing.T, key []byte) *calls.Secrets {
	t.Helper()
	s, err := calls.NewSecrets(calls.SecretsConfig{
		Declared:  map[string]calls.SecretSource{"FROM_CONFIG": {Env: "PADDOCK_TEST_UNSET"}},
		Key:       key,
		LookupEnv: func(string) (string, bool) { return "", false },
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestSecretsCRUDNeverShowTheValue sets, replaces, lists and deletes a
// secret through the API with a real sealer, and refuses bad requests;
// the planted value appears in no response body and no log line.
func TestSecretsCRUDNeverShowTheValue(t *testing.T) {
	t.Parallel()
	const planted = "planted-s3cr3t-VALUE-7f3a"
	e := newStillEnv(t, nil, testSealer(t, bytes.Repeat([]byte{7}, 32)))
	var bodies []string
	req := func(method, path, body string, wantStatus int, wantCode string) string {
		t.Helper()
		status, got := e.raw(method, path, body)
		bodies = append(bodies, got)
		if status != wantStatus {
			t.Fatalf("%s %s: %d %s, want %d", method, path, status, got, wantStatus)
		}
		if wantCode != "" {
			var eb client.ErrorBody
			if err := json.Unmarshal([]byte(got), &eb); err != nil || eb.Error == nil || eb.Error.Code != wantCode {
				t.Fatalf("%s %s: %s, want code %s", method, path, got, wantCode)
			}
		}
		return got
	}
	body := fmt.Sprintf(`{"value":%q}`, planted)

	created := req("PUT", "/v1/secrets/API_KEY", body, 201, "")
	var sec client.Secret
	if err := json.Unmarshal([]byte(created), &sec); err != nil || sec.Name != "API_KEY" || sec.CreatedAt.IsZero() || sec.UpdatedAt.IsZero() {
		t.Fatalf("created: %s %v", created, err)
	}
	var fields map[string]any
	_ = json.Unmarshal([]byte(created), &fields)
	if len(fields) != 3 {
		t.Fatalf("a secret is answered with name, created_at and updated_at only: %s", created)
	}
	time.Sleep(5 * time.Millisecond)
	replaced := req("PUT", "/v1/secrets/API_KEY", fmt.Sprintf(`{"value":%q}`, planted+"-2"), 200, "")
	var again client.Secret
	_ = json.Unmarshal([]byte(replaced), &again)
	if !again.CreatedAt.Equal(sec.CreatedAt) || again.UpdatedAt.Before(sec.UpdatedAt) {
		t.Fatalf("replaced: %+v, first %+v", again, sec)
	}
	req("PUT", "/v1/secrets/OTHER", body, 201, "")

	list, err := e.api.ListSecrets(context.Background())
	if err != nil || len(list) != 2 || list[0].Name != "API_KEY" || list[1].Name != "OTHER" {
		t.Fatalf("list: %+v %v", list, err)
	}
	bodies = append(bodies, req("GET", "/v1/secrets", "", 200, ""))

	// Refusals: none quotes the value.
	req("PUT", "/v1/secrets/FROM_CONFIG", body, 409, "secret_declared")
	req("PUT", "/v1/secrets/bad%20name", body, 400, "invalid_parameter")
	req("PUT", "/v1/secrets/EMPTY", `{"value":""}`, 400, "missing_field")
	req("PUT", "/v1/secrets/X", `{"value":"`+planted, 400, "malformed_json")
	req("PUT", "/v1/secrets/X", `{"value":"`+planted+`"}{}`, 400, "malformed_json")
	req("PUT", "/v1/secrets/X", `{"value":"`+planted+`\q"}`, 400, "malformed_json")
	req("PUT", "/v1/secrets/X", `{"value":"`+planted+`","other":1}`, 400, "unknown_field")
	req("PUT", "/v1/secrets/X", `["`+planted+`"]`, 400, "malformed_json")
	req("PUT", "/v1/secrets/X", fmt.Sprintf(`{"value":%q}`, planted+strings.Repeat("x", service.MaxSecretBytes)), 413, "secret_too_large")
	// A value that could never fill a header (found in review: invalid
	// UTF-8 was stored as U+FFFD, and NUL, CR and LF were taken).
	req("PUT", "/v1/secrets/X", `{"value":"`+planted+"\xff\xfe"+`"}`, 400, "malformed_json")
	for _, esc := range []string{`\u0000`, `\r\n`, `\n`, `\u007f`} {
		if got := req("PUT", "/v1/secrets/X", `{"value":"`+planted+esc+`x"}`, 400, "invalid_field"); !strings.Contains(got, "control character") {
			t.Errorf("a value with %s: %s, want the control character named", esc, got)
		}
	}
	req("PUT", "/v1/secrets/TABBED", `{"value":"`+planted+`\tx"}`, 201, "")
	req("DELETE", "/v1/secrets/TABBED", "", 204, "")
	req("DELETE", "/v1/secrets/NOPE", "", 404, "secret_not_found")
	req("DELETE", "/v1/secrets/bad%20name", "", 400, "invalid_parameter")

	// The client's typed methods.
	if _, created, err := e.api.PutSecret(context.Background(), "VIA_CLIENT", planted); err != nil || !created {
		t.Fatalf("PutSecret: %v %v", created, err)
	}
	if _, created, err := e.api.PutSecret(context.Background(), "VIA_CLIENT", planted); err != nil || created {
		t.Fatalf("PutSecret again: %v %v", created, err)
	}
	if err := e.api.DeleteSecret(context.Background(), "VIA_CLIENT"); err != nil {
		t.Fatal(err)
	}
	req("DELETE", "/v1/secrets/OTHER", "", 204, "")
	if err := e.api.DeleteSecret(context.Background(), "OTHER"); !client.IsNotFound(err) {
		t.Fatalf("delete twice: %v", err)
	}
	if list, _ := e.api.ListSecrets(context.Background()); len(list) != 1 {
		t.Fatalf("after deletes: %+v", list)
	}

	// The stored bytes are sealed, not the value.
	sealed, err := e.st.SealedSecret(context.Background(), store.DefaultNamespace, "API_KEY")
	if err != nil || bytes.Contains(sealed, []byte("planted")) {
		t.Fatalf("stored: %q %v", sealed, err)
	}

	for _, b := range bodies {
		if strings.Contains(b, "planted") || strings.Contains(b, "s3cr3t") {
			t.Errorf("a response holds the value: %s", b)
		}
	}
	if logs := e.logs.String(); strings.Contains(logs, "planted") || strings.Contains(logs, "s3cr3t") {
		t.Errorf("a log line holds the value:\n%s", logs)
	}
}

// TestSecretsDisabled: a host without a sealer, or whose sealer has no
// key, answers 501 secrets_disabled; listing and deleting still work.
func TestSecretsDisabled(t *testing.T) {
	t.Parallel()
	for name, sealer := range map[string]service.Sealer{"no sealer": nil, "no key": testSealer(t, nil)} {
		t.Run(name, func(t *testing.T) {
			e := newStillEnv(t, nil, sealer)
			_, _, err := e.api.PutSecret(context.Background(), "K", "planted-value")
			if !client.IsCode(err, "secrets_disabled") || client.AsError(err).Status != 501 || strings.Contains(err.Error(), "planted") {
				t.Fatalf("put: %v", err)
			}
			if list, err := e.api.ListSecrets(context.Background()); err != nil || len(list) != 0 {
				t.Fatalf("list: %v %v", list, err)
			}
			if err := e.api.DeleteSecret(context.Background(), "K"); !client.IsNotFound(err) {
				t.Fatalf("delete: %v", err)
			}
		})
	}
}

// notesAgent uploads the notes example and registers it as agent notes.
func (e *stillEnv) notesAgent() client.Agent {
	e.t.Helper()
	_, b := wasmtest.BuildExample(e.t, wasmtest.Notes)
	m, err := e.api.UploadModule(context.Background(), b)
	if err != nil {
		e.t.Fatal(err)
	}
	a, err := e.api.CreateAgent(context.Background(), client.CreateAgentRequest{Name: "notes", Module: m.Digest})
	if err != nil {
		e.t.Fatal(err)
	}
	return a
}

// TestAgentsShowTheirCapabilities: create, get, list and update answer an
// agent with its capabilities as the host's policy sets them (secret
// names only); an agent without grants shows empty lists.
func TestAgentsShowTheirCapabilities(t *testing.T) {
	t.Parallel()
	caps := calls.Capabilities{
		HTTP: []calls.HTTPRule{
			{Scheme: "https", Host: "api.example.com", Methods: []string{"GET", "POST"}, Secrets: []string{"API_KEY"}},
			{Scheme: "http", Host: "10.0.0.5", Port: 8080},
		},
		Models:  []string{"anthropic"},
		Secrets: []string{"API_KEY"},
		Limits:  calls.Limits{CallsPerTurn: 8, ResponseBytesPerTurn: 1 << 20, TokensPerTurn: 5000, TokensPerDay: 100000},
	}
	e := newStillEnv(t, func(p *host.Policy) {
		ap := p.For("notes")
		ap.Capabilities = caps
		p.Agents = map[string]host.AgentPolicy{"notes": ap}
	}, nil)
	want := client.Capabilities{
		HTTP: []client.HTTPRule{
			{Scheme: "https", Host: "api.example.com", Methods: []string{"GET", "POST"}, Secrets: []string{"API_KEY"}},
			{Scheme: "http", Host: "10.0.0.5", Port: 8080},
		},
		Models: []string{"anthropic"}, Secrets: []string{"API_KEY"},
		Limits:   client.Limits{CallsPerTurn: 8, ResponseBytesPerTurn: 1 << 20, TokensPerTurn: 5000, TokensPerDay: 100000},
		Approval: client.ApprovalRules{HTTP: []client.ApprovalHTTPRule{}, Models: []string{}},
	}
	check := func(what string, got client.Capabilities) {
		t.Helper()
		g, _ := json.Marshal(got)
		w, _ := json.Marshal(want)
		if !bytes.Equal(g, w) {
			t.Fatalf("%s: capabilities\n got %s\nwant %s", what, g, w)
		}
	}
	a := e.notesAgent()
	check("create", a.Capabilities)
	got, err := e.api.GetAgent(context.Background(), "notes")
	if err != nil {
		t.Fatal(err)
	}
	check("get", got.Capabilities)
	list, err := e.api.ListAgents(context.Background())
	if err != nil || len(list) != 1 {
		t.Fatalf("list: %v %v", list, err)
	}
	check("list", list[0].Capabilities)

	// Another agent has no grants: empty lists, not null.
	if _, err := e.api.CreateAgent(context.Background(), client.CreateAgentRequest{Name: "bare", Module: a.Module}); err != nil {
		t.Fatal(err)
	}
	_, body := e.raw("GET", "/v1/agents/bare", "")
	if !strings.Contains(body, `"capabilities":{"http":[],"models":[],"secrets":[],"limits":{"calls_per_turn":0,"response_bytes_per_turn":0,"tokens_per_turn":0,"tokens_per_day":0},"approval":{"http":[],"models":[]}}`) {
		t.Fatalf("bare agent: %s", body)
	}
}

// TestEventShowsItsJournal writes journal rows through the store under a
// live activation's delivery of an event, and reads them back with the
// event: without results by default, with them on ?include=results,
// set-aside and replayed rows marked; an event without calls has none,
// and a bad include is refused.
func TestEventShowsItsJournal(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newStillEnv(t, nil, nil)
	a := e.notesAgent()
	s, err := e.api.CreateSession(ctx, "notes", client.SessionRequest{})
	if err != nil {
		t.Fatal(err)
	}
	sig, err := e.api.SendSignal(ctx, "notes", s.SessionID, client.Signal{Message: "call things"})
	if err != nil {
		t.Fatal(err)
	}
	key := store.ActorKey{AgentUID: a.UID, SessionID: s.SessionID}
	act, err := e.st.ClaimActivation(ctx, store.ClaimActivationParams{Key: key, UID: uuid.NewString(), LeaseID: uuid.NewString(), HostID: "test", LeaseTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	d, err := e.st.NextDelivery(ctx, store.NextDeliveryParams{Activation: act.Ref(), DeliveryID: uuid.NewString(), Binding: a.Module, MarkSent: true})
	if err != nil {
		t.Fatal(err)
	}
	if d.Event.ID != sig.EventID {
		t.Fatalf("delivered event %d, sent %d", d.Event.ID, sig.EventID)
	}
	ref := d.Delivery.TurnRef()
	start := time.Now().Add(-time.Second).UTC().Truncate(time.Millisecond)
	modelResult := `{"seq":1,"model":{"text":"hi","stop_reason":"end_turn","model":"m","usage":{"input_tokens":1200,"output_tokens":345}}}`
	record := func(c store.HostCall, setAsideFrom int) {
		t.Helper()
		if _, err := e.st.RecordHostCall(ctx, store.RecordHostCallParams{Ref: ref, Call: c, SetAsideFrom: setAsideFrom}); err != nil {
			t.Fatal(err)
		}
	}
	record(store.HostCall{Seq: 1, Kind: string(abi.CallKindModel), Destination: "anthropic/claude", RequestDigest: "sha256:aa",
		Result: []byte(modelResult), StartedAt: start, DurationMS: 120, InputTokens: 1200, OutputTokens: 345}, 0)
	record(store.HostCall{Seq: 2, Kind: string(abi.CallKindHTTP), Destination: "GET https://example.com:443/\x1b]0;x\x07",
		RequestDigest: "sha256:bb", Result: []byte(`{"seq":2,"error":{"code":"upstream","message":"bad gateway","status":502}}`),
		ErrorCode: "upstream", Status: 502, StartedAt: start, DurationMS: 40}, 0)
	if err := e.st.ReplayHostCall(ctx, ref, 1); err != nil {
		t.Fatal(err)
	}
	// The attempt diverges at seq 2: the old row is set aside, a new one
	// takes its place.
	record(store.HostCall{Seq: 2, Kind: string(abi.CallKindHTTP), Destination: "GET https://example.com:443/y",
		RequestDigest: "sha256:cc", Result: []byte(`{"seq":2,"http":{"status":200}}`), Status: 200, StartedAt: start, DurationMS: 30}, 2)

	path := fmt.Sprintf("/v1/agents/notes/sessions/%s/events/%d", s.SessionID, sig.EventID)
	_, body := e.raw("GET", path, "")
	if strings.Contains(body, `"result"`) {
		t.Fatalf("results without include=results: %s", body)
	}
	ev, err := e.api.GetEvent(ctx, "notes", s.SessionID, sig.EventID)
	if err != nil {
		t.Fatal(err)
	}
	if len(ev.Calls) != 3 {
		t.Fatalf("calls: %+v", ev.Calls)
	}
	c1 := ev.Calls[0]
	if c1.Seq != 1 || c1.Kind != "model" || c1.Destination != "anthropic/claude" || c1.RequestDigest != "sha256:aa" ||
		c1.InputTokens != 1200 || c1.OutputTokens != 345 || c1.DurationMS != 120 || !c1.StartedAt.Equal(start) ||
		c1.ActorEpoch != act.ActorEpoch || c1.Replays != 1 || c1.ReplayedEpoch != act.ActorEpoch || c1.SetAside {
		t.Errorf("call 1: %+v", c1)
	}
	var aside, live client.HostCall
	for _, c := range ev.Calls[1:] {
		if c.SetAside {
			aside = c
		} else {
			live = c
		}
	}
	if aside.Seq != 2 || aside.Status != 502 || aside.ErrorCode != "upstream" || aside.RequestDigest != "sha256:bb" ||
		aside.Destination != "GET https://example.com:443/\x1b]0;x\x07" || aside.ErrorMessage != "bad gateway" {
		t.Errorf("set-aside call: %+v", aside)
	}
	if live.Seq != 2 || live.Status != 200 || live.RequestDigest != "sha256:cc" || live.Replays != 0 {
		t.Errorf("live call 2: %+v", live)
	}

	full, err := e.api.GetEventWith(ctx, "notes", s.SessionID, sig.EventID, client.GetEventOptions{IncludeResults: true})
	if err != nil {
		t.Fatal(err)
	}
	var got, want any
	_ = json.Unmarshal(full.Calls[0].Result, &got)
	_ = json.Unmarshal([]byte(modelResult), &want)
	if g, w := fmt.Sprint(got), fmt.Sprint(want); g != w {
		t.Errorf("include=results: %s, want %s", full.Calls[0].Result, modelResult)
	}
	for _, c := range full.Calls {
		if len(c.Result) == 0 {
			t.Errorf("include=results: seq %d has no result", c.Seq)
		}
	}

	if code, b := e.raw("GET", path+"?include=secrets", ""); code != 400 || !strings.Contains(b, "invalid_parameter") {
		t.Errorf("include=secrets: %d %s", code, b)
	}
	// An event without calls: no calls field.
	sig2, err := e.api.SendSignal(ctx, "notes", s.SessionID, client.Signal{Message: "no calls"})
	if err != nil {
		t.Fatal(err)
	}
	if _, b := e.raw("GET", fmt.Sprintf("/v1/agents/notes/sessions/%s/events/%d", s.SessionID, sig2.EventID), ""); strings.Contains(b, `"calls"`) {
		t.Errorf("event without calls: %s", b)
	}
	if code, _ := e.raw("GET", fmt.Sprintf("/v1/agents/notes/sessions/%s/events/999", s.SessionID), ""); code != 404 {
		t.Errorf("unknown event: %d", code)
	}
}
