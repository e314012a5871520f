package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/host/api"
	apiclient "github.com/paddock-dev/paddock/host/api/client"
	"github.com/paddock-dev/paddock/host/runner"
	"github.com/paddock-dev/paddock/store/sqlite"
	"github.com/paddock-dev/paddock/wasm"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// TestEventsLabelsTheLastErrorOfADoneEvent runs `paddock events` against
// the real API with the faulty agent in a session whose crash policy is
// sleep: a done event's last error (from an earlier, failed attempt of
// "flaky 2") is labelled as such, an open event's (a trap put the session
// to sleep) is shown as it is, a done event that never failed shows none,
// and --output json prints the server's body unchanged.
func TestEventsLabelsTheLastErrorOfADoneEvent(t *testing.T) {
	ctx := context.Background()
	ra := startRealAPI(t, 32<<20, fastRetries)
	ra.faultyAgent(ctx, "ag")
	s, err := ra.api.CreateSession(ctx, "ag", apiclient.SessionRequest{CrashPolicy: "sleep"})
	if err != nil {
		t.Fatal(err)
	}
	send := func(sig apiclient.Signal) {
		t.Helper()
		if _, err := ra.api.SendSignal(ctx, "ag", s.SessionID, sig); err != nil {
			t.Fatal(err)
		}
	}
	// "flaky 2" fails its first attempt, which puts the session to sleep;
	// a wake retries it, and the second attempt succeeds.
	send(apiclient.Signal{Message: "flaky 2"})
	ra.waitEvents(ctx, "ag", s.SessionID, func(evs []apiclient.Event) bool {
		return len(evs) == 1 && evs[0].Status == "open" && evs[0].LastError != ""
	})
	send(apiclient.Signal{Kind: apiclient.SignalWake})
	ra.waitEvents(ctx, "ag", s.SessionID, func(evs []apiclient.Event) bool {
		return len(evs) == 1 && evs[0].Status == "done"
	})
	// "hi" succeeds at once; "trap" fails and the session sleeps again,
	// leaving the event open with its error.
	send(apiclient.Signal{Message: "hi"})
	send(apiclient.Signal{Message: "trap"})
	evs := ra.waitEvents(ctx, "ag", s.SessionID, func(evs []apiclient.Event) bool {
		return len(evs) == 3 && evs[0].Status == "done" && evs[1].Status == "done" && evs[2].Status == "open" && evs[2].LastError != ""
	})
	if evs[0].LastError == "" || evs[0].Attempts != 1 || evs[1].LastError != "" {
		t.Fatalf("the events are not the situation under test: %+v", evs)
	}
	run := func(args ...string) string {
		t.Helper()
		out, err := ra.run(ctx, args...)
		if err != nil {
			t.Fatalf("paddock %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}

	lines := strings.Split(strings.TrimSpace(run("events", "ag", s.SessionID)), "\n")
	if len(lines) != 4 {
		t.Fatalf("want a header and 3 rows, got:\n%s", strings.Join(lines, "\n"))
	}
	for i, want := range []struct{ has, hasNot string }{
		{"(earlier attempt) " + oneLine(evs[0].LastError, 100), ""},
		{"done", "(earlier attempt)"},
		{oneLine(evs[2].LastError, 100), "(earlier attempt)"},
	} {
		row := lines[i+1]
		if !strings.Contains(row, want.has) || (want.hasNot != "" && strings.Contains(row, want.hasNot)) {
			t.Errorf("row %d %q: want %q and not %q", i+1, row, want.has, want.hasNot)
		}
	}
	if !strings.Contains(lines[1], "faulty: error requested") || !strings.Contains(lines[3], "trap") {
		t.Errorf("the rows do not show the real errors:\n%s", strings.Join(lines, "\n"))
	}

	got := canonJSON(t, run("events", "ag", s.SessionID, "--output", "json"))
	if sent := ra.getJSON("/v1/agents/ag/sessions/" + s.SessionID + "/events?limit=1000"); !bytes.Equal(got, sent) {
		t.Errorf("--output json changed the body:\n got %s\nwant %s", got, sent)
	}
}

// TestClientCommandsAgainstTheRealAPI runs client commands in-process
// against the real API (a host on SQLite): --output json prints the
// server's body, and errors read "<code> (HTTP <status>): <message>
// [field <field>]", or name the server when it cannot be reached.
func TestClientCommandsAgainstTheRealAPI(t *testing.T) {
	ctx := context.Background()
	quiet := slog.New(slog.DiscardHandler)
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "p.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rt, err := wasm.New(ctx, wasm.Config{CacheDir: wasmtest.CacheDir(t), MemoryLimitPages: 1024, TurnTimeout: time.Minute}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	wr := runner.NewWasm(rt, st)
	h, err := host.New(host.Options{Store: st, Runner: wr, Policy: host.DefaultPolicy(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	hctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = h.Run(hctx); close(done) }()
	defer func() { cancel(); <-done }()
	srv := httptest.NewServer(api.New(api.Options{Host: h, Modules: wr, AuthToken: "tok", MaxBodyBytes: 1 << 20, MaxModuleBytes: 32 << 20, Logger: quiet}))
	defer srv.Close()
	run := func(args ...string) (string, error) {
		t.Helper()
		root := newRoot()
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&out)
		root.SetArgs(append([]string{"--server", srv.URL, "--token", "tok"}, args...))
		err := root.ExecuteContext(ctx)
		return out.String(), err
	}
	path, _ := wasmtest.BuildExample(t, wasmtest.Notes)
	digest, err := run("module", "upload", path)
	if err != nil || !strings.HasPrefix(digest, "sha256:") {
		t.Fatalf("module upload: %q %v", digest, err)
	}
	if out, err := run("agent", "create", "notes", "--module", strings.TrimSpace(digest)); err != nil || !strings.HasPrefix(out, "agent notes registered (module sha256:") {
		t.Fatalf("agent create: %q %v", out, err)
	}
	// A session without turns: its transcript says so (text), and is
	// empty in JSON lines.
	sid, err := run("session", "create", "notes")
	if err != nil {
		t.Fatal(err)
	}
	sid = strings.TrimSpace(sid)
	if out, err := run("transcript", "notes", sid); err != nil || out != "no turns\n" {
		t.Errorf("transcript of a session without turns: %q %v, want \"no turns\"", out, err)
	}
	if out, err := run("transcript", "notes", sid, "--output", "json"); err != nil || out != "" {
		t.Errorf("transcript --output json of a session without turns: %q %v, want nothing", out, err)
	}
	out, err := run("agent", "list", "--output", "json")
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(func() *http.Request {
		req, _ := http.NewRequest("GET", srv.URL+"/v1/agents", nil)
		req.Header.Set("Authorization", "Bearer tok")
		return req
	}())
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var indented bytes.Buffer
	_ = json.Indent(&indented, body, "", "  ")
	if out != indented.String()+"\n" {
		t.Errorf("agent list --output json:\n%s\nwant the server's body:\n%s", out, indented.String())
	}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"session", "get", "nope", "s1"}, `agent_not_found (HTTP 404): no agent named "nope" [field agent]`},
		{[]string{"session", "create", "notes", "--key", "has space"}, `invalid_field (HTTP 400): key must be 1–200 printable ASCII characters without spaces [field key]`},
		{[]string{"--token", "wrong", "agent", "list"}, `unauthenticated (HTTP 401): unknown, revoked or malformed bearer token`},
		{[]string{"--server", "http://127.0.0.1:1", "agent", "list"}, "cannot reach the Paddock API at http://127.0.0.1:1 (is `paddock serve` running there? --server or PADDOCK_SERVER names another address): "},
		{[]string{"--server", "127.0.0.1:1", "agent", "list"}, `--server "127.0.0.1:1" (or PADDOCK_SERVER): want the API's URL, such as http://127.0.0.1:8080`},
		{[]string{"--server", "localhost:1", "agent", "list"}, `--server "localhost:1" (or PADDOCK_SERVER): want the API's URL`},
		{[]string{"signal", "send", "notes", "s1"}, `accepts 3 arg(s), received 2; usage: paddock signal send AGENT SESSION MESSAGE`},
		// Refused before the send (a session that does not exist would
		// answer 404): refused after it, a retry sent the signal twice.
		{[]string{"signal", "send", "notes", "nosuch", "x", "--wait", "--wait-timeout", "-5s"}, `--wait-timeout -5s: want a positive duration`},
		{[]string{"signal", "send", "notes", "nosuch", "x", "--wait", "--wait-timeout", "0s"}, `--wait-timeout 0s: want a positive duration`},
		{[]string{"plugin", "register", "p", "--path", "/bin/true", "--sha256", strings.Repeat("0", 64), "--processes", "-5"}, `--processes -5: want a positive number`},
		{[]string{"module", "upload", "/bin/true", "--max-module-bytes", "-1"}, `--max-module-bytes -1: want 0`},
		{[]string{"secret", "set", "bad-name!"}, `secret name "bad-name!": 1 to`},
	} {
		_, err := run(c.args...)
		if err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("paddock %s: %v, want %s", strings.Join(c.args, " "), err, c.want)
		}
	}

	// --namespace (-n) and PADDOCK_NAMESPACE: the commands act in that
	// namespace; an undeclared one is refused.
	pol := *h.Policy()
	pol.Namespaces = map[string]host.NamespacePolicy{"team-a": {}}
	h.SetPolicy(pol)
	if _, err := run("-n", "team-a", "agent", "create", "notes", "--module", strings.TrimSpace(digest)); err == nil ||
		!strings.HasPrefix(err.Error(), "unknown_module (HTTP 400)") {
		t.Fatalf("agent create in team-a before the module was uploaded there: %v", err)
	}
	if _, err := run("--namespace", "team-a", "module", "upload", path); err != nil {
		t.Fatal(err)
	}
	if _, err := run("--namespace", "team-a", "agent", "create", "notes", "--module", strings.TrimSpace(digest)); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PADDOCK_NAMESPACE", "team-a")
	out, err = run("agent", "list", "--output", "json")
	if err != nil || !strings.Contains(out, `"namespace": "team-a"`) || strings.Contains(out, `"namespace": "default"`) {
		t.Fatalf("agent list with PADDOCK_NAMESPACE=team-a: %s %v", out, err)
	}
	if out, err = run("-n", "default", "agent", "list", "--output", "json"); err != nil || strings.Contains(out, "team-a") {
		t.Fatalf("agent list -n default: %s %v", out, err)
	}
	if _, err := run("-n", "nowhere", "agent", "list"); err == nil || !strings.HasPrefix(err.Error(), "namespace_not_found (HTTP 404)") {
		t.Fatalf("agent list -n nowhere: %v", err)
	}
}

// TestClientErrorHints runs the CLI against the real API: a 401 names
// --token and PADDOCK_TOKEN, and a 429 quota refusal (live_sessions of 1
// in namespace default) carries the answer's Retry-After, which the CLI
// prints in seconds.
func TestClientErrorHints(t *testing.T) {
	ctx := context.Background()
	ra := startRealAPI(t, 32<<20, func(p *host.Policy) {
		p.Namespaces = map[string]host.NamespacePolicy{"default": {Quotas: host.Quotas{LiveSessions: 1}}}
	})
	ra.faultyAgent(ctx, "ag")
	root := newRoot()
	root.SetOut(io.Discard)
	root.SetErr(io.Discard)
	root.SetArgs([]string{"--server", ra.url, "--token", "wrong", "agent", "list"})
	err := root.ExecuteContext(ctx)
	ae := apiclient.AsError(err)
	if ae == nil || ae.Status != http.StatusUnauthorized {
		t.Fatalf("a wrong token: %v, want a 401", err)
	}
	if msg := apiErrorMessage(ae); !strings.Contains(msg, "--token") || !strings.Contains(msg, "PADDOCK_TOKEN") || strings.Contains(msg, "wrong") {
		t.Errorf("the 401's message %q: want the hint, not the token", msg)
	}
	if _, err := ra.run(ctx, "session", "create", "ag"); err != nil {
		t.Fatal(err)
	}
	_, err = ra.run(ctx, "session", "create", "ag")
	ae = apiclient.AsError(err)
	if ae == nil || ae.Status != http.StatusTooManyRequests || ae.RetryAfter != time.Minute {
		t.Fatalf("over live_sessions: %v (%+v), want a 429 with Retry-After 60", err, ae)
	}
	if msg := apiErrorMessage(ae); !strings.Contains(msg, "quota_exceeded (HTTP 429)") || !strings.HasSuffix(msg, "(retry after 60 s)") {
		t.Errorf("the 429's message: %q", msg)
	}
}
