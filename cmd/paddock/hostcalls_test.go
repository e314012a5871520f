package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/host/api"
	apiclient "github.com/paddock-dev/paddock/host/api/client"
	"github.com/paddock-dev/paddock/host/calls"
	"github.com/paddock-dev/paddock/host/runner"
	"github.com/paddock-dev/paddock/host/service"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/store/sqlite"
	"github.com/paddock-dev/paddock/wasm"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// secretsAPI starts the real API of a host on SQLite whose service seals
// secrets with a real key, agent "notes" granted capabilities, and
// returns a runner of the CLI (stdin given) against it.
func secretsAPI(t *testing.T) (run func(stdin string, args ...string) (string, error), c *apiclient.Client) {
	t.Helper()
	ctx := context.Background()
	quiet := slog.New(slog.DiscardHandler)
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "p.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	rt, err := wasm.New(ctx, wasm.Config{CacheDir: wasmtest.CacheDir(t), MemoryLimitPages: 1024, TurnTimeout: time.Minute}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close(ctx) })
	wr := runner.NewWasm(rt, st)
	pol := host.DefaultPolicy()
	ap := pol.For("notes")
	ap.Capabilities = calls.Capabilities{
		HTTP:    []calls.HTTPRule{{Scheme: "https", Host: "api.example.com", Methods: []string{"POST"}, Secrets: []string{"API_KEY"}}},
		Models:  []string{"anthropic"},
		Secrets: []string{"API_KEY"},
		Limits:  calls.Limits{CallsPerTurn: 8, TokensPerDay: 100000},
		Approval: calls.ApprovalRules{HTTP: []calls.ApprovalHTTPRule{{Host: "api.example.com", Methods: []string{"POST"}, PathPrefix: "/v1/pay"}},
			Timeout: time.Hour},
	}
	pol.Agents = map[string]host.AgentPolicy{"notes": ap}
	h, err := host.New(host.Options{Store: st, Runner: wr, Policy: pol, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	sealer, err := calls.NewSecrets(calls.SecretsConfig{Key: bytes.Repeat([]byte{9}, 32)})
	if err != nil {
		t.Fatal(err)
	}
	svc := service.New(h, wr, nil).WithSecrets(sealer)
	srv := httptest.NewServer(api.New(api.Options{Host: h, Modules: wr, Service: svc, AuthToken: "tok", MaxBodyBytes: 1 << 20, MaxModuleBytes: 32 << 20, Logger: quiet}))
	t.Cleanup(srv.Close)
	run = func(stdin string, args ...string) (string, error) {
		t.Helper()
		root := newRoot()
		var out bytes.Buffer
		root.SetIn(strings.NewReader(stdin))
		root.SetOut(&out)
		root.SetErr(&out)
		root.SetArgs(append([]string{"--server", srv.URL, "--token", "tok"}, args...))
		err := root.ExecuteContext(ctx)
		return out.String(), err
	}
	return run, apiclient.New(srv.URL, apiclient.WithToken("tok"))
}

// TestSecretCommands sets a secret from stdin, a file and an environment
// variable, lists and deletes it; the value is never printed, and a value
// given as an argument is refused.
func TestSecretCommands(t *testing.T) {
	const planted = "planted-cli-s3cr3t"
	run, _ := secretsAPI(t)
	must := func(stdin string, args ...string) string {
		t.Helper()
		out, err := run(stdin, args...)
		if err != nil {
			t.Fatalf("paddock %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		if strings.Contains(out, planted) {
			t.Fatalf("paddock %s printed the value:\n%s", strings.Join(args, " "), out)
		}
		return out
	}
	if out := must(planted+"\n", "secret", "set", "API_KEY"); out != "secret API_KEY set\n" {
		t.Errorf("set from stdin: %q", out)
	}
	file := filepath.Join(t.TempDir(), "v")
	if err := os.WriteFile(file, []byte(planted+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out := must("", "secret", "set", "API_KEY", "--from-file", file); out != "secret API_KEY replaced\n" {
		t.Errorf("set from a file: %q", out)
	}
	t.Setenv("PADDOCK_TEST_SECRET", planted)
	if out := must("", "secret", "set", "OTHER", "--from-env", "PADDOCK_TEST_SECRET", "-o", "json"); !strings.Contains(out, `"name": "OTHER"`) {
		t.Errorf("set from env, json: %q", out)
	}
	out := must("", "secret", "list")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 3 || !strings.HasPrefix(lines[1], "API_KEY ") || !strings.HasPrefix(lines[2], "OTHER ") {
		t.Errorf("list:\n%s", out)
	}
	if out := must("", "secret", "delete", "OTHER"); out != "secret OTHER deleted\n" {
		t.Errorf("delete: %q", out)
	}
	for _, c := range []struct {
		stdin string
		args  []string
		want  string
	}{
		{"", []string{"secret", "delete", "OTHER"}, "secret_not_found (HTTP 404)"},
		{"", []string{"secret", "set", "EMPTY"}, "the secret's value is empty"},
		{"", []string{"secret", "set", "X", "--from-env", "PADDOCK_TEST_UNSET_VAR"}, "--from-env PADDOCK_TEST_UNSET_VAR: the variable is not set"},
		{"", []string{"secret", "set", "X", planted}, "accepts 1 arg(s)"},
		{"v", []string{"secret", "set", "bad name"}, `secret name "bad name": 1 to 128 characters`}, // refused before the value is read
	} {
		out, err := run(c.stdin, c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error()+out, planted) {
			t.Errorf("paddock %s: %v (%q), want %q", strings.Join(c.args, " "), err, out, c.want)
		}
	}
}

// TestAgentShowPrintsCapabilities registers an agent and shows its
// capabilities, as text and as the server's JSON.
func TestAgentShowPrintsCapabilities(t *testing.T) {
	run, api := secretsAPI(t)
	_, b := wasmtest.BuildExample(t, wasmtest.Notes)
	m, err := api.UploadModule(context.Background(), b)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := api.CreateAgent(context.Background(), apiclient.CreateAgentRequest{Name: "notes", Module: m.Digest}); err != nil {
		t.Fatal(err)
	}
	out, err := run("", "agent", "show", "notes")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"POST https://api.example.com (secrets API_KEY)",
		"models        anthropic",
		"secrets       API_KEY",
		"limits        calls/turn 8, response bytes/turn -, tokens/turn -, tokens/day 100000",
		"approval      http POST api.example.com path /v1/pay*\n",
		"approval ttl  1h0m0s\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("agent show: no %q in\n%s", want, out)
		}
	}
	out, err = run("", "agent", "show", "notes", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var a apiclient.Agent
	if err := json.Unmarshal([]byte(out), &a); err != nil || a.Capabilities.Limits.CallsPerTurn != 8 || len(a.Capabilities.HTTP) != 1 ||
		len(a.Capabilities.Approval.HTTP) != 1 || a.Capabilities.Approval.HTTP[0].PathPrefix != "/v1/pay" || a.Capabilities.Approval.TimeoutMs != 3600000 {
		t.Errorf("agent show -o json: %v\n%s", err, out)
	}
}

// TestPrintCallsEscapesAgentText renders a journal: one row per call with
// its result, duration, tokens, replays and set-aside mark, and a
// destination that carries terminal controls and a forged line shown
// inert.
func TestPrintCallsEscapesAgentText(t *testing.T) {
	var b bytes.Buffer
	printCalls(&b, []apiclient.HostCall{
		{Seq: 1, Kind: "model", Destination: "anthropic/claude", DurationMS: 1500, InputTokens: 1200, OutputTokens: 345, ActorEpoch: 1, Replays: 2, ReplayedEpoch: 3},
		{Seq: 2, Kind: "http", Destination: "GET https://x:443/\x1b]0;pwned\x07\n── turn 99", ErrorCode: "upstream", Status: 502, DurationMS: 40, ActorEpoch: 1, SetAside: true},
		{Seq: 2, Kind: "http", Destination: "GET https://x:443/y", Status: 200, DurationMS: 30, ActorEpoch: 3},
	})
	out := b.String()
	for _, want := range []string{
		"host calls (3):",
		"1\tmodel\tanthropic/claude\tok",
		"1.5s",
		"1200 in / 345 out",
		"replayed ×2 (last epoch 3)",
		`\x1b]0;pwned\x07 …`,
		"upstream (HTTP 502)",
		"set aside",
		"live",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
	if strings.ContainsAny(out, "\x1b\x07") || strings.Contains(out, "\n── turn") {
		t.Errorf("agent text not escaped:\n%s", out)
	}
	var none bytes.Buffer
	printCalls(&none, nil)
	if none.Len() != 0 {
		t.Errorf("no calls printed %q", none.String())
	}
}

// TestTurnHeaderShowsTokens: a turn's header names its tokens when it
// used any; --output json adds usage only then.
func TestTurnHeaderShowsTokens(t *testing.T) {
	if got := usageNote(abi.Usage{}); got != "" {
		t.Errorf("no usage: %q", got)
	}
	if got := usageNote(abi.Usage{InputTokens: 10, OutputTokens: 2}); got != ", tokens 10 in / 2 out" {
		t.Errorf("usage: %q", got)
	}
	b, _ := json.Marshal(toPrintedTurn(store.Turn{TurnNo: 1}))
	if strings.Contains(string(b), "usage") {
		t.Errorf("json without usage: %s", b)
	}
	b, _ = json.Marshal(toPrintedTurn(store.Turn{TurnNo: 1, Usage: abi.Usage{InputTokens: 10, OutputTokens: 2}}))
	if !strings.Contains(string(b), `"usage":{"input_tokens":10,"output_tokens":2}`) {
		t.Errorf("json with usage: %s", b)
	}
}
