package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// readmeBlocks returns the fenced code blocks of README.md's section
// titled title, in order.
func readmeBlocks(t *testing.T, title string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n"+title+"\n")
	if !ok {
		t.Fatalf("README.md has no section %q", title)
	}
	if i := strings.Index(section, "\n#"); i >= 0 {
		section = section[:i]
	}
	var blocks []string
	for {
		_, rest, ok := strings.Cut(section, "```")
		if !ok {
			return blocks
		}
		_, rest, _ = strings.Cut(rest, "\n") // the info string
		block, after, ok := strings.Cut(rest, "```")
		if !ok {
			t.Fatalf("README.md section %q: unclosed code block", title)
		}
		blocks = append(blocks, block)
		section = after
	}
}

// TestREADMEExternalAgent builds the external agent of README.md's "An
// agent in its own repository" as it says — its go.mod (the replace
// directive pointed at this checkout) and files in a temporary directory,
// then its go commands — and runs the wasm module it built through the
// CLI against the real API.
func TestREADMEExternalAgent(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module and a plugin binary")
	}
	blocks := readmeBlocks(t, "### An agent in its own repository")
	if len(blocks) != 5 {
		t.Fatalf("want 5 code blocks (go.mod, turn.go, wasm/main.go, plugin/main.go, commands), got %d", len(blocks))
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "myagent")
	gomod := blocks[0]
	if !strings.Contains(gomod, "=> ../paddock\n") {
		t.Fatalf("the go.mod has no replace directive => ../paddock:\n%s", gomod)
	}
	for name, content := range map[string]string{
		"go.mod":         strings.Replace(gomod, "=> ../paddock", "=> "+root, 1),
		"turn.go":        blocks[1],
		"wasm/main.go":   blocks[2],
		"plugin/main.go": blocks[3],
	} {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Offline, the checksum database cannot vouch for the dependencies:
	// this checkout's go.sum does (tidy keeps the lines it needs).
	sums, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.sum"), sums, 0o644); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(blocks[2], "guest.Handle(") || !strings.Contains(blocks[3], "plugins.Serve(") {
		t.Fatal("the wasm and plugin blocks are not where this test expects them")
	}

	// The go commands, as written (`paddock` lines are run below through
	// the in-process CLI). GOPROXY=off: the SDKs' dependencies are this
	// checkout's, already in the module cache.
	ran := 0
	for line := range strings.SplitSeq(blocks[4], "\n") {
		line, _, _ = strings.Cut(line, " #")
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "paddock ") {
			continue
		}
		if line == "go mod tidy" {
			// Offline, tidy cannot look up the modules only the
			// dependencies' own tests import; -e lets it go past them.
			line = "go mod tidy -e"
		}
		cmd := exec.Command("sh", "-c", line)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOPROXY=off", "GOWORK=off", "GOFLAGS=-mod=mod")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", line, err, out)
		}
		ran++
	}
	if ran != 3 {
		t.Errorf("ran %d go commands, want 3 (tidy, the wasm build, the plugin build)", ran)
	}
	for _, f := range []string{"myagent.wasm", "myagent-plugin"} {
		if fi, err := os.Stat(filepath.Join(dir, f)); err != nil || fi.Size() == 0 {
			t.Errorf("%s was not built: %v", f, err)
		}
	}

	ctx := context.Background()
	ra := startRealAPI(t, 32<<20)
	if out, err := ra.run(ctx, "agent", "create", "myagent", "--module", filepath.Join(dir, "myagent.wasm")); err != nil {
		t.Fatalf("agent create: %v\n%s", err, out)
	}
	s, err := ra.run(ctx, "session", "create", "myagent")
	if err != nil {
		t.Fatal(err)
	}
	out, err := ra.run(ctx, "signal", "send", "myagent", strings.TrimSpace(s), "hi", "--wait")
	if err != nil || out != "assistant: got: hi\n" {
		t.Errorf("signal send --wait to the external agent: %q %v, want its reply", out, err)
	}
}
