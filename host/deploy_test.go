package host_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/host/runner"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/wasm"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// TestAgentUpdateReachesTheLiveActivation: after the agent's module is
// replaced while its session's activation is live (well short of the idle
// timeout), the next event runs the new module on a fresh instance, and
// the first event keeps the binding recorded when it ran (docs/DESIGN.md
// invariant 10).
func TestAgentUpdateReachesTheLiveActivation(t *testing.T) {
	_, notes := wasmtest.BuildExample(t, wasmtest.Notes)
	_, faulty := wasmtest.BuildExample(t, wasmtest.Faulty)
	ctx := context.Background()
	rt, err := wasm.New(ctx, wasm.Config{
		CacheDir: wasmtest.CacheDir(t), MemoryLimitPages: 1024, MaxResultBytes: 4 << 20, TurnTimeout: time.Minute,
	}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close(context.Background()) })
	notesInfo, err := rt.Validate(ctx, notes)
	if err != nil {
		t.Fatal(err)
	}
	faultyInfo, err := rt.Validate(ctx, faulty)
	if err != nil {
		t.Fatal(err)
	}
	eachDriver(t, func(t *testing.T, st store.Store) {
		for _, scope := range []host.InstanceScope{host.ScopeSession, host.ScopeAgent} {
			t.Run(string(scope), func(t *testing.T) { deployWhileLive(t, st, rt, scope, notesInfo, faultyInfo, notes, faulty) })
		}
	})
}

// deployWhileLive runs TestAgentUpdateReachesTheLiveActivation's scenario
// on a host whose agents reuse wasm instances per scope.
func deployWhileLive(t *testing.T, st store.Store, rt *wasm.Runtime, scope host.InstanceScope, notesInfo, faultyInfo wasm.ModuleInfo, notes, faulty []byte) {
	ctx := context.Background()
	pol := testPolicy()
	pol.InstanceReuse = scope
	pol.TurnTimeout = time.Minute
	pol.LeaseTTL = 30 * time.Second
	pol.IdleTimeout = 10 * time.Minute // the activation outlives the test
	h, err := host.New(host.Options{Store: st, Runner: runner.NewWasm(rt, st), Policy: pol, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- h.Run(runCtx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("host.Run: %v", err)
		}
	})
	f := &fixture{t: t, st: st, h: h}
	for _, m := range []struct {
		digest string
		body   []byte
	}{{notesInfo.Digest, notes}, {faultyInfo.Digest, faulty}} {
		if _, _, err := st.PutModule(ctx, store.PutModuleParams{Digest: m.digest, ABIVersion: abi.Version, Bytes: m.body}); err != nil {
			t.Fatal(err)
		}
	}
	name := "deploy-" + uuid.NewString()[:8]
	a, err := st.CreateAgent(ctx, store.CreateAgentParams{UID: uuid.NewString(), Name: name, ModuleDigest: notesInfo.Digest, CrashPolicy: store.CrashRestart})
	if err != nil {
		t.Fatal(err)
	}
	key := f.session(a)
	first := f.signal(key, "note before the deploy")
	f.waitFor("the first turn", func() bool { return f.get(key).TurnCount == 1 })

	if _, err := st.CreateAgent(ctx, store.CreateAgentParams{UID: uuid.NewString(), Name: name, ModuleDigest: faultyInfo.Digest, CrashPolicy: store.CrashRestart, Upsert: true}); err != nil {
		t.Fatal(err)
	}
	second := f.signal(key, "after the deploy")
	f.waitFor("the second turn", func() bool { return f.get(key).TurnCount == 2 })

	turns := f.transcript(key)
	if len(turns) != 2 {
		t.Fatalf("transcript has %d turns, want 2", len(turns))
	}
	if turns[0].ActorEpoch != turns[1].ActorEpoch {
		t.Fatalf("the turns ran under epochs %d and %d: the activation was not live across the deploy", turns[0].ActorEpoch, turns[1].ActorEpoch)
	}
	reply := func(tr store.Turn) string {
		var b strings.Builder
		for _, m := range tr.Messages {
			if m.Role == abi.RoleAssistant {
				b.WriteString(m.Content)
			}
		}
		return b.String()
	}
	if got := reply(turns[1]); got != "ok: after the deploy" {
		t.Errorf("second turn's reply = %q, want the new module's (faulty) %q", got, "ok: after the deploy")
	}
	if got := reply(turns[0]); strings.HasPrefix(got, "ok: ") {
		t.Errorf("first turn's reply = %q: it ran faulty, want notes", got)
	}
	for _, e := range f.events(key) {
		switch e.ID {
		case first.ID:
			if e.Binding != notesInfo.Digest {
				t.Errorf("first event's binding = %q, want the notes module %q", e.Binding, notesInfo.Digest)
			}
		case second.ID:
			if e.Binding != faultyInfo.Digest {
				t.Errorf("second event's binding = %q, want the faulty module %q", e.Binding, faultyInfo.Digest)
			}
		}
	}
}
