package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// TestPoliciesReloadWithoutRestartAndABadChangeIsRefused edits the config
// file of a running host: a valid policy change is swapped in (the effective
// crash policy of new sessions changes), an invalid one is refused and
// logged while the old policy stays.
func TestPoliciesReloadWithoutRestartAndABadChangeIsRefused(t *testing.T) {
	t.Parallel()
	notes, _ := wasmtest.BuildExample(t, wasmtest.Notes)
	dir := t.TempDir()
	addr := freePort(t)
	cfgPath := filepath.Join(dir, "paddock.yaml")
	write := func(policy string) {
		body := fmt.Sprintf("listen: %s\ndata_dir: %s\nwasm:\n  cache_dir: %s\npolicy:\n  crash_policy: %s\nagents:\n  - name: notes\n    module_file: %s\n",
			addr, filepath.Join(dir, "data"), e2eCacheDir(t), policy, notes)
		if err := os.WriteFile(cfgPath+".tmp", []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(cfgPath+".tmp", cfgPath); err != nil {
			t.Fatal(err)
		}
	}
	write("restart")
	srv := startServer(t, cfgPath, addr)
	policyOfNewSession := func() string {
		out := srv.cli("--output", "json", "session", "create", "notes")
		var i int
		if i = strings.Index(out, `"crash_policy": "`); i < 0 {
			t.Fatalf("no crash_policy in %s", out)
		}
		rest := out[i+len(`"crash_policy": "`):]
		return rest[:strings.Index(rest, `"`)]
	}
	if p := policyOfNewSession(); p != "restart" {
		t.Fatalf("initial policy %q", p)
	}
	write("sleep")
	waitUntil(t, "the reloaded policy", 10*time.Second, func() bool { return policyOfNewSession() == "sleep" })
	write("reboot") // invalid
	waitUntil(t, "the refusal in the log", 10*time.Second, func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return strings.Contains(srv.log.String(), "config reload refused") && strings.Contains(srv.log.String(), "reboot")
	})
	if p := policyOfNewSession(); p != "sleep" {
		t.Errorf("after a refused reload the policy is %q, want the old sleep", p)
	}
}
