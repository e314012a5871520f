package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/plugins/plugintest"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if dir, err := plugintest.Dir(); err == nil {
		_ = os.RemoveAll(dir)
	}
	os.Exit(code)
}

// TestChaosShort is the CI version of `make chaos`: the same run with a
// small N and a couple of faults of every kind (PostgreSQL restarted once,
// unless DATABASE_URL names the server, which the run then does not own).
// It asserts what the long run asserts — every check, lost = 0,
// duplicated = 0 — and that every kind of fault was injected.
func TestChaosShort(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL, three hosts and six workers (≈ 1–2 min)")
	}
	bin := buildPaddock(t)
	notes, _ := wasmtest.BuildExample(t, wasmtest.Notes)
	plugin, _ := plugintest.Build(t, plugintest.Notes)

	cfg := DefaultConfig()
	cfg.Paddock, cfg.NotesWasm, cfg.Plugin = bin, notes, plugin
	cfg.DatabaseURL = os.Getenv("DATABASE_URL")
	// WorkDir stays "": a failing run keeps its logs (the report names the
	// directory), a passing one removes them.
	// Compiled modules are kept between runs, as the e2e tests keep theirs.
	cfg.CacheDir = filepath.Join(os.TempDir(), "paddock-chaos-wasm-cache")
	cfg.Sessions, cfg.Signals = 6, 120
	cfg.Faults, cfg.FaultInterval = 3, 1200*time.Millisecond
	cfg.QuiesceTimeout = 2 * time.Minute
	var progress bytes.Buffer
	cfg.Progress = &progress

	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	rep, err := Run(ctx, cfg)
	var out bytes.Buffer
	if rep != nil {
		rep.Print(&out, err)
	}
	t.Logf("progress:\n%s", progress.String())
	t.Logf("report:\n%s", out.String())
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if !rep.OK() {
		t.Errorf("checks failed (%d failures), see the report", rep.failureCount())
	}
	if rep.Lost != 0 || rep.Duplicated != 0 {
		t.Errorf("lost = %d, duplicated = %d, want 0 and 0", rep.Lost, rep.Duplicated)
	}
	if rep.Accepted != cfg.Signals || rep.Committed+rep.DeadLettered != cfg.Signals {
		t.Errorf("accepted %d, committed %d, dead-lettered %d; want %d accepted, all committed or dead-lettered",
			rep.Accepted, rep.Committed, rep.DeadLettered, cfg.Signals)
	}
	for _, k := range AllKinds {
		if k == kindPGRestart && cfg.DatabaseURL != "" {
			continue // not our server to restart
		}
		if rep.Faults[k] < 1 {
			t.Errorf("no fault of kind %s injected", k)
		}
	}
	figure(t, "chaos (short): %s; %d signals committed, %d dead-lettered, fence rejections %s; lost %d, duplicated %d; %.0f s",
		rep.faultLine(), rep.Committed, rep.DeadLettered, mapLine(rep.FenceRejections), rep.Lost, rep.Duplicated, rep.Times.Total.Seconds())
}

// buildPaddock builds the paddock binary into a temp dir (a normal build:
// -race applies to this test binary, not to the processes it starts).
func buildPaddock(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "paddock")
	cmd := exec.Command("go", "build", "-o", path, "github.com/paddock-dev/paddock/cmd/paddock")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build paddock: %v\n%s", err, out)
	}
	return path
}

// figure records a measured figure: logged, and appended to the file named
// by FIGURES_FILE (make test prints it at the end).
func figure(t *testing.T, format string, args ...any) {
	t.Helper()
	line := fmt.Sprintf(format, args...)
	t.Log(line)
	if path := os.Getenv("FIGURES_FILE"); path != "" {
		if f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
			fmt.Fprintln(f, strings.TrimSpace(line))
			f.Close()
		}
	}
}
