package host_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/examples/faulty"
	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/host/config"
	"github.com/paddock-dev/paddock/host/runner"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/wasm"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// TestMaximalStateCommitsAndReturnsByteForByteOnWasm runs the faulty
// module under the host's default wasm configuration: a state of exactly
// abi.MaxStateBytes commits and the next turn receives it byte for byte;
// one byte more fails the attempt with an error naming the limit.
func TestMaximalStateCommitsAndReturnsByteForByteOnWasm(t *testing.T) {
	_, body := wasmtest.BuildExample(t, wasmtest.Faulty)
	ctx := context.Background()
	def := config.Default().Wasm
	rt, err := wasm.New(ctx, wasm.Config{
		CacheDir: wasmtest.CacheDir(t), MemoryLimitPages: def.MemoryLimitPages, MaxResultBytes: def.MaxResultBytes, TurnTimeout: time.Minute,
	}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close(context.Background()) })
	info, err := rt.Validate(ctx, body)
	if err != nil {
		t.Fatal(err)
	}
	eachDriver(t, func(t *testing.T, st store.Store) {
		pol := testPolicy()
		pol.TurnTimeout = time.Minute
		pol.LeaseTTL = 30 * time.Second
		pol.MaxAttempts = 1
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
		if _, _, err := st.PutModule(ctx, store.PutModuleParams{Digest: info.Digest, ABIVersion: abi.Version, Bytes: body}); err != nil {
			t.Fatal(err)
		}
		a, err := st.CreateAgent(ctx, store.CreateAgentParams{UID: uuid.NewString(), Name: "state-" + uuid.NewString()[:8], ModuleDigest: info.Digest, CrashPolicy: store.CrashRestart})
		if err != nil {
			t.Fatal(err)
		}
		checkStateLimit(t, f, f.session(a))
	})
}

// checkStateLimit drives a session of an agent that knows faulty's
// "state <n>" and "statesum" commands through the documented state limit.
func checkStateLimit(t *testing.T, f *fixture, key store.ActorKey) {
	t.Helper()
	set := f.signal(key, fmt.Sprintf("state %d", abi.MaxStateBytes))
	f.signal(key, "statesum")
	settled := func(id int64) store.Event {
		var ev store.Event
		f.waitFor(fmt.Sprintf("event %d to settle", id), func() bool {
			for _, e := range f.events(key) {
				if e.ID == id && e.Status != store.EventOpen {
					ev = e
					return true
				}
			}
			return false
		})
		return ev
	}
	if e := settled(set.ID); e.Status != store.EventDone {
		t.Fatalf("a state of exactly abi.MaxStateBytes (%d) ended %s: %s", abi.MaxStateBytes, e.Status, e.LastError)
	}
	f.waitFor("the maximal state and its check", func() bool { return f.get(key).TurnCount == 2 })
	turns := f.transcript(key)
	want := faulty.StateSum(faulty.StateOf(abi.MaxStateBytes))
	if got := lastReply(turns[1]); got != want {
		t.Fatalf("the turn after a maximal state saw %q, want %q", got, want)
	}

	over := f.signal(key, fmt.Sprintf("state %d", abi.MaxStateBytes+1))
	e := settled(over.ID)
	limit := fmt.Sprintf("state is %d bytes, limit %d", abi.MaxStateBytes+1, abi.MaxStateBytes)
	if e.Status != store.EventDeadLetter || !strings.Contains(e.LastError, limit) {
		t.Errorf("a state of %d bytes ended %s with %q, want a dead letter whose error names the state limit (%q)", abi.MaxStateBytes+1, e.Status, e.LastError, limit)
	}
	if n := f.get(key).TurnCount; n != 2 {
		t.Errorf("turn count = %d after the oversized state, want 2", n)
	}
}

// lastReply is the last assistant message of a turn.
func lastReply(tr store.Turn) string {
	r := ""
	for _, m := range tr.Messages {
		if m.Role == abi.RoleAssistant {
			r = m.Content
		}
	}
	return r
}
