package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// TestNamespacesEndToEnd runs a real `paddock serve` whose config declares
// namespace team-a and registers agent notes in both namespaces, with
// PADDOCK_NAMESPACE set in its environment (a CLI variable serve must not
// take as configuration). The CLI acts in PADDOCK_NAMESPACE or
// --namespace; a session of team-a is not found from default by its id.
// Not parallel: it sets PADDOCK_NAMESPACE for the processes it starts.
func TestNamespacesEndToEnd(t *testing.T) {
	notes, _ := wasmtest.BuildExample(t, wasmtest.Notes)
	dir := t.TempDir()
	addr := freePort(t)
	cfg := filepath.Join(dir, "paddock.yaml")
	body := fmt.Sprintf("listen: %s\ndata_dir: %s\nwasm:\n  cache_dir: %s\nnamespaces:\n  team-a: {}\nagents:\n  - {name: notes, module_file: %s}\n  - {name: team-a/notes, module_file: %s, policy: {crash_policy: sleep}}\n",
		addr, filepath.Join(dir, "data"), e2eCacheDir(t), notes, notes)
	if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PADDOCK_NAMESPACE", "team-a")
	srv := startServer(t, cfg, addr)

	out := srv.cli("--output", "json", "agent", "list")
	if !strings.Contains(out, `"namespace": "team-a"`) || strings.Contains(out, `"namespace": "default"`) {
		t.Fatalf("agent list with PADDOCK_NAMESPACE=team-a:\n%s", out)
	}
	if out = srv.cli("-n", "default", "--output", "json", "agent", "list"); !strings.Contains(out, `"namespace": "default"`) || strings.Contains(out, "team-a") {
		t.Fatalf("agent list -n default:\n%s", out)
	}
	// team-a's notes has its own policy (config key team-a/notes).
	out = srv.cli("--output", "json", "session", "create", "notes")
	if !strings.Contains(out, `"crash_policy": "sleep"`) {
		t.Fatalf("session of team-a/notes: %s", out)
	}
	i := strings.Index(out, `"session_id": "`)
	id := out[i+len(`"session_id": "`):]
	id = id[:strings.Index(id, `"`)]
	if out := srv.cli("session", "get", "notes", id); !strings.Contains(out, id) {
		t.Fatalf("session get in team-a: %s", out)
	}
	for _, args := range [][]string{
		{"-n", "default", "session", "get", "notes", id},
		{"--namespace", "nowhere", "agent", "list"},
	} {
		cmd := exec.Command(paddockBin(t), append([]string{"--server", "http://" + addr}, args...)...)
		var errb bytes.Buffer
		cmd.Stderr = &errb
		if err := cmd.Run(); err == nil || !strings.Contains(errb.String(), "HTTP 404") {
			t.Fatalf("paddock %s: %v %s, want a 404", strings.Join(args, " "), err, errb.String())
		}
	}
}
