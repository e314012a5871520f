package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// TestNamespaceTokenEndToEnd runs a real `paddock serve` with an
// auth_token and a declared namespace a. The bootstrap admin creates a
// client token of a with `paddock token create`; with it, the CLI creates
// a session and sends a message in a (named, or implied by the token),
// while destroying (an operator's) and addressing default are 403;
// `paddock audit -n a` lists the client's rows under its token id (and no
// row for the refusals); `paddock token revoke` makes the token 401.
func TestNamespaceTokenEndToEnd(t *testing.T) {
	t.Parallel()
	notes, _ := wasmtest.BuildExample(t, wasmtest.Notes)
	dir := t.TempDir()
	addr := freePort(t)
	cfg := filepath.Join(dir, "paddock.yaml")
	body := fmt.Sprintf("listen: %s\ndata_dir: %s\nauth_token: boot-e2e\nwasm:\n  cache_dir: %s\nnamespaces:\n  a: {}\nagents:\n  - {name: notes, module_file: %s}\n  - {name: a/notes, module_file: %s}\n",
		addr, filepath.Join(dir, "data"), e2eCacheDir(t), notes, notes)
	if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	startServer(t, cfg, addr)
	// run runs the CLI with token and returns its stdout, or its stderr
	// and the error when it fails. Neither PADDOCK_TOKEN nor
	// PADDOCK_NAMESPACE of the test's environment reaches it.
	run := func(token string, args ...string) (string, error) {
		t.Helper()
		cmd := exec.Command(paddockBin(t), append([]string{"--server", "http://" + addr, "--token", token}, args...)...)
		var env []string
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "PADDOCK_") {
				env = append(env, kv)
			}
		}
		cmd.Env = env
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			return errb.String(), err
		}
		return strings.TrimSpace(out.String()), nil
	}
	must := func(token string, args ...string) string {
		t.Helper()
		out, err := run(token, args...)
		if err != nil {
			t.Fatalf("paddock %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	refused := func(want, token string, args ...string) {
		t.Helper()
		if out, err := run(token, args...); err == nil || !strings.Contains(out, want) {
			t.Errorf("paddock %s: %v %q, want %s", strings.Join(args, " "), err, out, want)
		}
	}

	out := must("boot-e2e", "token", "create", "--namespace", "a", "--role", "client", "--name", "e2e client")
	m := regexp.MustCompile(`^token ([0-9a-f]{16}) \(client of namespace a\) created; its value, shown this once:\n(pdk_\S+)$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("token create printed %q", out)
	}
	id, client := m[1], m[2]

	// In a, implied by the token: a session of a/notes.
	sid := must(client, "session", "create", "notes", "--key", "k1")
	if out := must("boot-e2e", "-n", "a", "session", "get", "notes", sid); !strings.Contains(out, sid) {
		t.Fatalf("the session is not a's: %s", out)
	}
	refused("session_not_found (HTTP 404)", "boot-e2e", "-n", "default", "session", "get", "notes", sid)
	// Named: a message, answered.
	if out := must(client, "--namespace", "a", "signal", "send", "notes", sid, "note from the client", "--wait"); out == "" {
		t.Fatal("signal send --wait printed no reply")
	}
	if out := must(client, "transcript", "notes", sid); !strings.Contains(out, "note from the client") {
		t.Fatalf("transcript in a: %s", out)
	}

	// Refused: a destroy needs an operator; default is not the token's.
	refused("forbidden (HTTP 403)", client, "session", "destroy", "notes", sid)
	refused("forbidden (HTTP 403)", client, "-n", "default", "agent", "list")
	refused("forbidden (HTTP 403)", client, "-n", "default", "session", "create", "notes")
	refused("forbidden (HTTP 403)", client, "-n", "nowhere", "agent", "list")
	if out := must(client, "session", "get", "notes", sid); !strings.Contains(out, sid) || strings.Contains(out, "destroyed") {
		t.Fatalf("the session after the refused destroy: %s", out)
	}

	// The audit log of a: the client's writes under its token id, none of
	// the refusals.
	out = must("boot-e2e", "audit", "-n", "a")
	var mine []string
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 5 && f[3] == id {
			if f[4] != "a" {
				t.Errorf("audit -n a: a row of namespace %q: %s", f[4], line)
			}
			mine = append(mine, line)
		}
	}
	if len(mine) != 2 || !strings.Contains(mine[0], "signal.send") || !strings.Contains(mine[1], "session.create") ||
		strings.Contains(out, "session.destroy") {
		t.Fatalf("audit -n a: the client's rows %q\n%s", mine, out)
	}
	for _, line := range strings.Split(must("boot-e2e", "audit"), "\n") {
		if f := strings.Fields(line); len(f) > 5 && f[3] == id {
			t.Fatalf("audit of default lists a row of the client of a: %s", line)
		}
	}

	// Revoked: 401 at once.
	if out := must("boot-e2e", "-n", "a", "token", "revoke", id); out != "token "+id+" revoked" {
		t.Fatalf("token revoke: %q", out)
	}
	refused("unauthenticated (HTTP 401)", client, "agent", "list")
	refused("unauthenticated (HTTP 401)", client, "-n", "a", "signal", "send", "notes", sid, "after the revoke")
}
