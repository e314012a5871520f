package rivetapi_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRivetClient drives the actors API with Rivet's own generated
// TypeScript client (npm @rivetkit/engine-api-full, the version pinned in
// testdata/rivet-client/package-lock.json) under Node's built-in test
// runner: create, get-or-create raced by 20 clients, list by id, by name
// and key and by name with paging, destroy, Rivet's errors, and each crash
// policy applied to a failing turn. The package is installed with npm ci
// into a temporary directory (npm's cache under os.TempDir(), kept between
// runs). Without node and npm the test is skipped, unless
// REQUIRE_NODE_TEST=1 (CI) makes that a failure.
func TestRivetClient(t *testing.T) {
	t.Parallel()
	node, errNode := exec.LookPath("node")
	npm, errNpm := exec.LookPath("npm")
	if errNode != nil || errNpm != nil {
		msg := "node and npm are needed to run Rivet's TypeScript client (Debian: apt-get install nodejs npm)"
		if os.Getenv("REQUIRE_NODE_TEST") == "1" {
			t.Fatal(msg + "; REQUIRE_NODE_TEST=1")
		}
		t.Skip(msg)
	}
	dir := t.TempDir()
	for _, f := range []string{"package.json", "package-lock.json", "actors.test.mjs"} {
		b, err := os.ReadFile(filepath.Join("testdata", "rivet-client", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cache := filepath.Join(os.TempDir(), "paddock-npm-cache")
	install := exec.CommandContext(ctx, npm, "ci", "--cache", cache, "--prefer-offline", "--no-audit", "--no-fund", "--loglevel=error")
	install.Dir = dir
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("npm ci: %v\n%s", err, out)
	}

	e := newEnv(t)
	run := exec.CommandContext(ctx, node, "--test", "--test-reporter=spec", "actors.test.mjs")
	run.Dir = dir
	run.Env = append(os.Environ(), "PADDOCK_URL="+e.url, "PADDOCK_TOKEN="+token, "NO_COLOR=1")
	out, err := run.CombinedOutput()
	if err != nil {
		t.Fatalf("node --test: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "pass 8") || strings.Contains(string(out), "fail 1") {
		t.Fatalf("node --test did not pass all 8 tests:\n%s", out)
	}
	t.Logf("node --test:\n%s", out)
}
