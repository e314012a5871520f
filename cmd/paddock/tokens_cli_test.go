package main

import (
	"bytes"
	"context"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/host/api"
	"github.com/paddock-dev/paddock/host/runner"
	"github.com/paddock-dev/paddock/store/sqlite"
	"github.com/paddock-dev/paddock/wasm"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// TestTokenAndAuditCommands: `paddock token create` prints the value
// once, `token list` never shows it, the token works with its role, `token
// revoke` ends it, and `paddock audit` lists who did what, paged.
func TestTokenAndAuditCommands(t *testing.T) {
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
	pol := host.DefaultPolicy()
	pol.Namespaces = map[string]host.NamespacePolicy{"team-a": {}}
	h, err := host.New(host.Options{Store: st, Runner: wr, Policy: pol, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.New(api.Options{Host: h, Modules: wr, AuthToken: "boot", MaxBodyBytes: 1 << 20, MaxModuleBytes: 32 << 20, Logger: quiet}))
	defer srv.Close()
	run := func(token string, args ...string) (string, error) {
		t.Helper()
		root := newRoot()
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&out)
		root.SetArgs(append([]string{"--server", srv.URL, "--token", token}, args...))
		err := root.ExecuteContext(ctx)
		return out.String(), err
	}
	out, err := run("boot", "token", "create", "--namespace", "default", "--role", "client", "--name", "ci")
	if err != nil {
		t.Fatalf("token create: %v %s", err, out)
	}
	m := regexp.MustCompile(`^token ([0-9a-f]{16}) \(client of namespace default\) created; its value, shown this once:\n(pdk_[0-9a-f]{16}_[A-Za-z0-9_-]{43})\n$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("token create printed %q", out)
	}
	id, value := m[1], m[2]
	if _, err := run("boot", "token", "create", "--role", "root"); err == nil || !strings.Contains(err.Error(), "invalid_field") {
		t.Errorf("token create --role root: %v", err)
	}
	out, err = run("boot", "token", "list")
	if err != nil || !strings.Contains(out, id) || !strings.Contains(out, "ci") || strings.Contains(out, value[len(value)-43:]) {
		t.Fatalf("token list: %v\n%s", err, out)
	}
	out, err = run(value, "session", "create", "nope")
	if err == nil || !strings.Contains(err.Error(), "agent_not_found") {
		t.Fatalf("client token creates a session of an unknown agent: %v %s", err, out)
	}
	if _, err := run(value, "token", "list"); err == nil || !strings.Contains(err.Error(), "forbidden (HTTP 403)") {
		t.Errorf("client lists tokens: %v", err)
	}
	if out, err := run("boot", "token", "revoke", id); err != nil || out != "token "+id+" revoked\n" {
		t.Fatalf("token revoke: %v %q", err, out)
	}
	if _, err := run(value, "agent", "list"); err == nil || !strings.Contains(err.Error(), "unauthenticated (HTTP 401)") {
		t.Errorf("revoked token: %v", err)
	}
	// One --namespace/-n, the global one, for every subcommand: the
	// token is team-a's; with it and no namespace named, the CLI sends no
	// ?namespace= and the API acts in team-a (not default, where the
	// token would be refused 403).
	out, err = run("boot", "-n", "team-a", "token", "create", "--role", "client", "--name", "a")
	ma := regexp.MustCompile(`^token ([0-9a-f]{16}) \(client of namespace team-a\) created; its value, shown this once:\n(pdk_[0-9a-f]{16}_[A-Za-z0-9_-]{43})\n$`).FindStringSubmatch(out)
	if err != nil || ma == nil {
		t.Fatalf("-n team-a token create: %v %q", err, out)
	}
	if out, err := run(ma[2], "agent", "list"); err != nil || strings.TrimSpace(out) == "" {
		t.Fatalf("team-a token without -n: %v %q", err, out)
	}
	if _, err := run(ma[2], "-n", "default", "agent", "list"); err == nil || !strings.Contains(err.Error(), "HTTP 403") {
		t.Errorf("team-a token with -n default: %v, want 403", err)
	}
	// token revoke given the full value takes its id client-side.
	if out, err := run("boot", "-n", "team-a", "token", "revoke", ma[2]); err != nil || out != "token "+ma[1]+" revoked\n" {
		t.Fatalf("token revoke VALUE: %v %q", err, out)
	}
	if _, err := run("boot", "token", "revoke", "pdk_short_s3cr3t"); err == nil || strings.Contains(err.Error(), "s3cr3t") || !strings.Contains(err.Error(), "not a token value") {
		t.Errorf("token revoke of a malformed value: %v", err)
	}
	out, err = run("boot", "audit", "--limit", "2")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 || !strings.Contains(lines[1], "token.revoke") || !strings.Contains(lines[2], id) || !strings.Contains(lines[2], "agent_not_found") ||
		!strings.HasPrefix(lines[3], "(more: --before ") {
		t.Fatalf("audit --limit 2:\n%s", out)
	}
	before := strings.TrimSuffix(strings.TrimPrefix(lines[3], "(more: --before "), ")")
	out, err = run("boot", "audit", "--before", before)
	if err != nil || !strings.Contains(out, "token.create") || !strings.Contains(out, "bootstrap") || strings.Contains(out, "(more") {
		t.Fatalf("audit --before %s: %v\n%s", before, err, out)
	}
}
