package fabric

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/examples/notes"
	"github.com/paddock-dev/paddock/fabric/internal/workerhooks"
	"github.com/paddock-dev/paddock/fabric/worker"
	"github.com/paddock-dev/paddock/plugins/pluginhost"
	"github.com/paddock-dev/paddock/plugins/plugintest"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// A wasm turn runs on a remote worker: the module is fetched from the host
// by digest, cached on disk, and the session state flows through the
// turns. A worker restarted on the same cache directory does not fetch it
// again.
func TestWasmTurnsRunOnRemoteWorkerAndModuleIsCached(t *testing.T) {
	e := newEnv(t)
	digest := e.module(wasmtest.Notes)
	cache := t.TempDir()
	w := e.startWorker("w1", func(c *worker.Config) { c.CacheDir = cache })

	var state []byte
	session := "notes-1"
	for i, msg := range []string{"note buy milk", "note call mum", "list"} {
		req := e.request(session, msg)
		req.State = state
		start := time.Now()
		res, err := e.turn(digest, req)
		got := reply(t, res, err)
		if res.TurnRef != req.TurnRef {
			t.Fatalf("result echoes %s, want %s", res.TurnRef, req.TurnRef)
		}
		if res.State != nil {
			state = res.State
		}
		t.Logf("turn %d (%s) → %q in %s", i, msg, got, time.Since(start))
		if i == 2 && !strings.Contains(got, "buy milk") {
			t.Fatalf("list = %q", got)
		}
	}
	var st notes.State
	if err := json.Unmarshal(state, &st); err != nil || len(st.Notes) != 2 {
		t.Fatalf("state %s: %v", state, err)
	}
	stats := e.b.Stats()
	if stats.ModuleChunks == 0 || e.fetches.Load() == 0 {
		t.Fatalf("module not fetched: %+v", stats)
	}
	if _, err := os.Stat(filepath.Join(cache, "modules", strings.TrimPrefix(digest, "sha256:")+".wasm")); err != nil {
		t.Fatalf("module not cached on disk: %v", err)
	}

	// Round trip over the fabric, warm instance.
	const n = 50
	start := time.Now()
	for range n {
		req := e.request(session, "count")
		req.State = state
		e.mustReply("p", digest, req)
	}
	figure(t, "fabric: wasm notes turn round trip over loopback zmq4 (warm remote instance, -race=%v): %s per turn (mean of %d)",
		raceEnabled, (time.Since(start) / n).Round(10*time.Microsecond), n)

	// A new worker process on the same cache directory loads the module
	// from disk (verified by sha256), without asking the host.
	w.stop(t)
	chunks := e.b.Stats().ModuleChunks
	e.startWorker("w1", func(c *worker.Config) { c.CacheDir = cache })
	e.mustReply("p", digest, e.request("", "count"))
	if got := e.b.Stats().ModuleChunks; got != chunks {
		t.Fatalf("module fetched again: %d chunks, was %d", got, chunks)
	}

	// A corrupted cache file is detected and fetched again.
	path := filepath.Join(cache, "modules", strings.TrimPrefix(digest, "sha256:")+".wasm")
	if err := os.WriteFile(path, []byte("not wasm"), 0o600); err != nil {
		t.Fatal(err)
	}
	e.startWorker("w2", func(c *worker.Config) { c.CacheDir = cache; c.Pools = []string{"q"} })
	e.mustReply("q", digest, e.request("", "count"))
	if got := e.b.Stats().ModuleChunks; got == chunks {
		t.Fatal("corrupted cache entry was used")
	}
}

// A plugin registered on the worker's machine runs turns; a binding of
// another sha256 is refused without counting an attempt; the conversation
// produces the same replies and state as the wasm module (cross-kind
// conformance through the fabric).
func TestPluginTurnsAndCrossKindConformance(t *testing.T) {
	e := newEnv(t)
	digest := e.module(wasmtest.Notes)
	pc, binding := e.plugin("notes", plugintest.Notes)
	e.startWorker("w1", func(c *worker.Config) { c.Plugins = []pluginhost.Config{pc} })

	script := []string{"note buy milk", "note call mum", "list", "count", "remind 60 water plants", "list"}
	run := func(binding, session string) (replies []string, state []byte) {
		for _, msg := range script {
			req := e.request(session, msg)
			req.State = state
			res, err := e.turn(binding, req)
			replies = append(replies, reply(t, res, err))
			if res.State != nil {
				state = res.State
			}
		}
		return replies, state
	}
	wr, ws := run(digest, "conf-wasm")
	pr, ps := run(binding, "conf-plugin")
	if strings.Join(wr, "\n") != strings.Join(pr, "\n") || string(ws) != string(ps) {
		t.Fatalf("transcripts differ:\nwasm   %q %s\nplugin %q %s", wr, ws, pr, ps)
	}

	other := pluginhost.Binding("notes", strings.Repeat("0", 64))
	_, err := e.turn(other, e.request("", "list"))
	te := turnError(t, err)
	if te.Kind != KindNoWorker || te.TurnSent() {
		t.Fatalf("unknown plugin version: %v", err)
	}
}

// Workers of one pool are scheduled by free capacity; when every one is
// full, the turn fails without being sent.
func TestSchedulesByFreeCapacity(t *testing.T) {
	e := newEnv(t)
	digest := e.module(wasmtest.Faulty)
	e.startWorker("w1", func(c *worker.Config) { c.Capacity = 3 })
	e.startWorker("w2", func(c *worker.Config) { c.Capacity = 1 })

	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Each turn spins until cancelled; after each, the broker's in-flight
	// counts say where it went: free 3 vs 1 → w1, 2 vs 1 → w1, 1 vs 1 →
	// the one picked least recently (w2), then w1.
	want := [][2]int{{1, 0}, {2, 0}, {2, 1}, {3, 1}}
	for i, w := range want {
		wg.Add(1)
		go func() {
			defer wg.Done()
			inst, _ := e.b.Instance("p", digest)
			_, _ = inst.Turn(ctx, e.request("", "loop"))
		}()
		e.waitFor("turn dispatched", 10*time.Second, func() bool { return e.inflight("w1")+e.inflight("w2") == i+1 })
		if got := [2]int{e.inflight("w1"), e.inflight("w2")}; got != w {
			t.Fatalf("after turn %d: in flight w1,w2 = %v, want %v", i+1, got, w)
		}
	}
	_, err := e.turn(digest, e.request("", "hello"))
	if te := turnError(t, err); te.Kind != KindBusy || te.TurnSent() {
		t.Fatalf("full pool: %v", err)
	}
}

// A worker that answers BUSY (its real capacity is below what it
// announced) is skipped, and the turn runs on another worker; BUSY is not
// an attempt.
func TestBusyWorkerIsSkipped(t *testing.T) {
	e := newEnv(t)
	digest := e.module(wasmtest.Faulty)
	e.startHookedWorker("w1", func(h *workerhooks.Hooks) { h.Capacity = 3 }, func(c *worker.Config) { c.Capacity = 1 })
	e.startWorker("w2", func(c *worker.Config) { c.Capacity = 1 })

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		inst, _ := e.b.Instance("p", digest)
		_, _ = inst.Turn(ctx, e.request("", "loop")) // w1: announced free 3
	}()
	defer func() { cancel(); <-done }()
	e.waitFor("first turn on w1", 10*time.Second, func() bool { return e.inflight("w1") == 1 })

	// The broker believes w1 has 2 free slots against w2's 1, so it tries
	// w1 first; w1 answers BUSY; the turn runs on w2.
	got := e.mustReply("p", digest, e.request("", "hello"))
	if got != "ok: hello" {
		t.Fatalf("reply %q", got)
	}
	if s := e.b.Stats(); s.Busy != 1 {
		t.Fatalf("busy answers: %d, want 1", s.Busy)
	}
}

// Steers reach the running remote turn: the faulty agent's think polls
// them and ends with the steer, echoing its turn_ref.
func TestSteerReachesRemoteTurn(t *testing.T) {
	e := newEnv(t)
	digest := e.module(wasmtest.Faulty)
	pc, pbinding := e.plugin("faulty", "./examples/faulty/plugin")
	e.startWorker("w1", func(c *worker.Config) { c.Plugins = []pluginhost.Config{pc} })

	for _, binding := range []string{digest, pbinding} {
		req := e.request("", "think 10000")
		steers := make(chan abi.Steer, 1)
		newRef := req.TurnRef
		newRef.DeliveryID += "-steer"
		newRef.Revision++
		inst, _ := e.b.Instance("p", binding)
		ctx, cancel := context.WithTimeout(abi.WithSteers(context.Background(), steers), turnDeadline)
		go func() {
			e.waitFor("turn running", 10*time.Second, func() bool { return e.inflight("w1") == 1 })
			time.Sleep(100 * time.Millisecond)
			steers <- abi.Steer{TurnRef: newRef, EventID: req.Event.ID + 1000, Message: "turn left"}
		}()
		start := time.Now()
		res, err := inst.Turn(ctx, req)
		cancel()
		if got := reply(t, res, err); got != "steered: turn left" {
			t.Fatalf("%s: reply %q", binding, got)
		}
		if res.TurnRef != newRef {
			t.Fatalf("%s: result echoes %s, want the steer's %s", binding, res.TurnRef, newRef)
		}
		// The reply proves the steer reached the running turn (unsteered,
		// "think" answers otherwise); how long it took includes a cold
		// module compile on a loaded machine, so it is only logged.
		t.Logf("%s: steered turn took %s", binding, time.Since(start))
	}
}

// Cancelling the caller's ctx sends CANCEL: the remote turn stops at once
// (its capacity is free again long before the agent would have finished),
// and the error says the turn was accepted.
func TestCancelReachesRemoteTurn(t *testing.T) {
	e := newEnv(t)
	digest := e.module(wasmtest.Faulty)
	e.startWorker("w1", func(c *worker.Config) { c.Capacity = 1 })

	inst, _ := e.b.Instance("p", digest)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		e.waitFor("turn running", 10*time.Second, func() bool { return e.inflight("w1") == 1 })
		time.Sleep(200 * time.Millisecond)
		cancel()
	}()
	_, err := inst.Turn(ctx, e.request("", "think 15000"))
	te := turnError(t, err)
	if te.Kind != KindCanceled || !te.TurnSent() {
		t.Fatalf("cancelled turn: %v (sent %v)", err, te.TurnSent())
	}
	// The worker has capacity 1: the next turn runs only once the
	// cancelled one really stopped (until then the worker answers BUSY,
	// which is not an attempt).
	start := time.Now()
	for {
		res, err := e.turn(digest, e.request("", "after cancel"))
		if err == nil {
			if got := reply(t, res, err); got != "ok: after cancel" {
				t.Fatalf("reply %q", got)
			}
			break
		}
		if te := turnError(t, err); te.Kind != KindBusy || te.TurnSent() || time.Since(start) > 5*time.Second {
			t.Fatalf("turn after cancel (after %s): %v", time.Since(start), err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("the cancelled turn's capacity was free again after %s", time.Since(start))
}
