package main

import (
	"bytes"
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/host/config"
	"github.com/paddock-dev/paddock/host/runner"
	"github.com/paddock-dev/paddock/host/service"
	"github.com/paddock-dev/paddock/store/sqlite"
	"github.com/paddock-dev/paddock/wasm"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// TestConfigSeedsButNeverRollsBackAnAPIChange: an agent re-bound through
// the API keeps its binding when a host (re)starts with the config that
// declared it, or a second host joins; the difference is logged.
func TestConfigSeedsButNeverRollsBackAnAPIChange(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "p.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	rt, err := wasm.New(ctx, wasm.Config{CacheDir: wasmtest.CacheDir(t), MemoryLimitPages: 1024, TurnTimeout: time.Minute}, log)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	faultyPath, _ := wasmtest.BuildExample(t, wasmtest.Faulty)
	_, notes := wasmtest.BuildExample(t, wasmtest.Notes)
	cfg := config.Default()
	cfg.Agents = []config.AgentSpec{{Name: "faulty", ModuleFile: faultyPath}}
	// start is one serve start's registration on the shared store.
	start := func() *service.Service {
		wr := runner.NewWasm(rt, st)
		h, err := host.New(host.Options{Store: st, Runner: wr, Policy: host.DefaultPolicy(), Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		svc := service.New(h, wr, nil)
		if err := registerAgents(ctx, cfg, svc, log); err != nil {
			t.Fatal(err)
		}
		return svc
	}
	svc := start()
	a, err := svc.GetAgent(ctx, "faulty")
	if err != nil {
		t.Fatal(err)
	}
	m, _, err := svc.UploadModule(ctx, notes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.UpdateAgent(ctx, a, service.Binding{Module: m.Digest}); err != nil {
		t.Fatal(err)
	}
	for range 2 { // a restart, then a second host joining
		svc = start()
		if got, err := svc.GetAgent(ctx, "faulty"); err != nil || got.ModuleDigest != m.Digest || got.UID != a.UID {
			t.Fatalf("after a start with the config: agent %+v, %v; want the API's module %s kept", got, err, m.Digest)
		}
	}
	if !strings.Contains(logs.String(), "differs from the config") || !strings.Contains(logs.String(), "differs=module") {
		t.Errorf("the difference is not logged:\n%s", logs.String())
	}
}
