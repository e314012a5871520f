package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/host/calls"
	"github.com/paddock-dev/paddock/host/config"
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
	// the in-process CLI), with the environment's module proxy: the module
	// cache holds what this checkout's build needed, but not always every
	// go.mod of the new module's graph (a fresh machine lacked
	// go-colorable v0.1.9's, which go.sum vouches for).
	ran := 0
	for line := range strings.SplitSeq(blocks[4], "\n") {
		line, _, _ = strings.Cut(line, " #")
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "paddock ") {
			continue
		}
		if line == "go mod tidy" {
			// Without a proxy, tidy cannot look up the modules only
			// the dependencies' own tests import; -e lets it go past
			// them.
			line = "go mod tidy -e"
		}
		cmd := exec.Command("sh", "-c", line)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
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

// TestREADMEHostCalls checks README.md's "Host calls" section against the
// configuration `make run` uses: its YAML excerpts are examples/paddock.yaml
// verbatim, and each `make run` line's environment loads into the model
// endpoint it says (the config's validation and the host-call executor
// accept it), with the key's secret read from CHAT_API_KEY.
func TestREADMEHostCalls(t *testing.T) {
	blocks := readmeBlocks(t, "## Host calls: models and the web")
	if len(blocks) != 6 {
		t.Fatalf("want 6 code blocks (the chat commands, the make run lines, the two YAML excerpts, the approval rules, the secret commands), got %d", len(blocks))
	}
	if !strings.Contains(blocks[4], "approval:") {
		t.Errorf("the fifth block does not show approval rules:\n%s", blocks[4])
	}
	if !strings.Contains(blocks[5], "paddock secret set") || strings.Contains(blocks[5], "sk-") {
		t.Errorf("the last block does not set a secret from standard input:\n%s", blocks[5])
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	yamlFile, err := os.ReadFile(filepath.Join(root, "examples", "paddock.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range blocks[2:4] {
		if !strings.Contains(string(yamlFile), b) {
			t.Errorf("README's YAML excerpt is not in examples/paddock.yaml as written:\n%s", b)
		}
	}
	if !strings.Contains(blocks[0], "bin/paddock session create chat") {
		t.Errorf("the first block does not create a chat session:\n%s", blocks[0])
	}

	// The config's relative paths (the worker key) are the repository's.
	t.Chdir(root)
	want := map[string]calls.Endpoint{
		"":          {Provider: "openai", BaseURL: "http://127.0.0.1:11434/v1", Models: []string{"llama3.2"}},
		"openai":    {Provider: "openai", BaseURL: "https://api.openai.com/v1", Models: []string{"gpt-4o-mini"}, Secret: "chat_key"},
		"anthropic": {Provider: "anthropic", BaseURL: "https://api.anthropic.com", Models: []string{"claude-3-5-haiku-latest"}, Secret: "chat_key"},
	}
	seen := 0
	for line := range strings.SplitSeq(blocks[1], "\n") {
		line, _, _ = strings.Cut(line, " #")
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		var environ []string
		for len(fields) > 0 && strings.Contains(fields[0], "=") {
			environ = append(environ, fields[0])
			fields = fields[1:]
		}
		if strings.Join(fields, " ") != "make run" {
			t.Errorf("line %q: want environment assignments, then make run", line)
			continue
		}
		cfg, err := config.Load(config.Sources{File: "examples/paddock.yaml", Environ: environ})
		if err != nil {
			t.Errorf("line %q: %v", line, err)
			continue
		}
		var provider string
		for _, kv := range environ {
			if v, ok := strings.CutPrefix(kv, "PADDOCK_MODELS__CHAT__PROVIDER="); ok {
				provider = v
			}
		}
		w, ok := want[provider]
		if !ok {
			t.Errorf("line %q: provider %q is not one the README shows", line, provider)
			continue
		}
		seen++
		got := cfg.ModelEndpoints()["chat"]
		got.Timeout = 0
		if fmt.Sprint(got) != fmt.Sprint(w) {
			t.Errorf("line %q: endpoint chat = %+v, want %+v", line, got, w)
		}
		if _, err := calls.New(calls.Config{Endpoints: cfg.ModelEndpoints()}); err != nil {
			t.Errorf("line %q: the executor refuses the endpoints: %v", line, err)
		}
		if src := cfg.SecretSources()["chat_key"]; src.Env != "CHAT_API_KEY" {
			t.Errorf("secret chat_key = %+v, want env CHAT_API_KEY", src)
		}
		if w.Secret != "" && !strings.Contains(line, "CHAT_API_KEY=") {
			t.Errorf("line %q names the key's secret but does not set CHAT_API_KEY", line)
		}
		if caps := cfg.AgentCapabilities("chat"); !slices.Contains(caps.Models, "chat") || len(caps.HTTP) == 0 {
			t.Errorf("agent chat's capabilities %+v: want the endpoint chat and http rules", caps)
		}
	}
	if seen != len(want) {
		t.Errorf("%d make run lines checked, want %d (Ollama, OpenAI, Anthropic)", seen, len(want))
	}
}
