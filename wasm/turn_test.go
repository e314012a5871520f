package wasm_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/examples/notes"
	"github.com/paddock-dev/paddock/wasm"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// TestNotesRoundTripsState: the notes agent's state goes out with each
// result and comes back with the next request, across instances — as it
// does across host restarts, since the host stores it.
func TestNotesRoundTripsState(t *testing.T) {
	t.Parallel()
	b := shared(t)
	ctx := context.Background()
	inst := b.instance(t, b.notes(t))

	var state []byte // nil: a new session
	turn := func(inst *wasm.Instance, msg string) string {
		t.Helper()
		req := request(msg, state, 1)
		res, err := inst.Turn(ctx, req)
		got := replyOf(t, res, err)
		if res.TurnRef != req.TurnRef {
			t.Fatalf("turn_ref %v, want %v", res.TurnRef, req.TurnRef)
		}
		if res.State != nil {
			state = res.State
		}
		return got
	}
	if got := turn(inst, "note buy milk"); got != "noted (1)" {
		t.Fatalf("reply %q", got)
	}
	if got := turn(inst, "note call Ada"); got != "noted (2)" {
		t.Fatalf("reply %q", got)
	}
	// A new instance knows only what the state carries.
	inst.Close(ctx)
	inst2 := b.instance(t, b.notes(t))
	if got := turn(inst2, "list"); got != "1. buy milk\n2. call Ada" {
		t.Fatalf("list reply %q", got)
	}
	if got := turn(inst2, "count"); got != "2 notes, 4 turns" {
		t.Fatalf("count reply %q", got)
	}
	s, err := notes.DecodeState(state)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Notes) != 2 || s.Turns != 4 {
		t.Fatalf("state %+v", s)
	}
	if inst2.Turns() != 2 {
		t.Fatalf("Turns() = %d, want 2", inst2.Turns())
	}
}

// TestFaultyModesFailTheTurn: every way a guest can die is a *TurnError of
// the right kind, the instance is closed afterwards, and the Runtime keeps
// serving other instances.
func TestFaultyModesFailTheTurn(t *testing.T) {
	t.Parallel()
	// The timeout cases get a short turn timeout of their own; the others a
	// long one, so that a loaded machine cannot turn them into timeouts.
	short := setup(t, wasm.Config{TurnTimeout: time.Second, InitTimeout: time.Minute, MaxResultBytes: 2 << 20})
	b := setup(t, wasm.Config{TurnTimeout: time.Minute, MaxResultBytes: 2 << 20})
	cases := []struct {
		msg, kind string
		check     func(t *testing.T, te *wasm.TurnError)
	}{
		{"trap", wasm.KindTrap, func(t *testing.T, te *wasm.TurnError) {
			if !strings.Contains(te.Error(), "out of bounds memory access") {
				t.Errorf("error %q does not name the trap", te)
			}
		}},
		{"crash", wasm.KindTrap, func(t *testing.T, te *wasm.TurnError) {
			if !strings.Contains(te.Output, "panic: faulty: crash requested") {
				t.Errorf("output %q lacks the panic message", te.Output)
			}
		}},
		{"exit", wasm.KindExit, func(t *testing.T, te *wasm.TurnError) {
			if te.ExitCode != 3 {
				t.Errorf("exit code %d, want 3", te.ExitCode)
			}
		}},
		{"exit 0", wasm.KindExit, nil},
		{"loop", wasm.KindTimeout, nil},
		{"nap 600000", wasm.KindTimeout, nil},
		{"oom", wasm.KindOOM, func(t *testing.T, te *wasm.TurnError) {
			if !strings.Contains(te.Output, "out of memory") {
				t.Errorf("output %q", te.Output)
			}
		}},
		{"big 2200000", wasm.KindOversized, nil},
		{"bigstate", wasm.KindInvalidResult, func(t *testing.T, te *wasm.TurnError) {
			if !errors.Is(te, abi.ErrInvalidResult) {
				t.Errorf("error %v does not wrap abi.ErrInvalidResult", te)
			}
		}},
	}
	for _, c := range cases {
		t.Run(strings.ReplaceAll(c.msg, " ", "_"), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := b
			if c.kind == wasm.KindTimeout {
				b = short
			}
			inst := b.instance(t, b.faulty(t))
			req := request(c.msg, nil, 1)
			start := time.Now()
			res, err := inst.Turn(ctx, req)
			if res != nil {
				t.Fatalf("got a result %+v", res)
			}
			te := turnError(t, err, c.kind)
			t.Logf("%s after %s: %v", c.msg, time.Since(start).Round(time.Millisecond), firstLine(te.Error()))
			if te.TurnRef != req.TurnRef.String() || te.Digest != b.faulty(t) {
				t.Errorf("error tagged %q %q", te.TurnRef, te.Digest)
			}
			if c.check != nil {
				c.check(t, te)
			}
			if !inst.Closed() || !inst.ShouldRecycle() || inst.MemoryBytes() != 0 {
				t.Errorf("instance not closed after a failed turn")
			}
			if _, err := inst.Turn(ctx, request("hello", nil, 2)); !errors.Is(err, wasm.ErrInstanceClosed) {
				t.Errorf("turn on a failed instance: %v, want ErrInstanceClosed", err)
			}
			// The Runtime still serves: a fresh instance of the same module
			// and one of another module.
			for _, d := range []string{b.faulty(t), b.notes(t)} {
				fresh := b.instance(t, d)
				reply(t)(fresh.Turn(ctx, request("count", nil, 2)))
			}
		})
	}
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// TestFaultyOutcomesKeepTheInstance: an error outcome, a recovered panic
// and slow turns are results, not failures; the instance stays usable.
func TestFaultyOutcomesKeepTheInstance(t *testing.T) {
	t.Parallel()
	b := shared(t)
	ctx := context.Background()
	inst := b.instance(t, b.faulty(t))

	res, err := inst.Turn(ctx, request("error", nil, 1))
	if err != nil || res.Outcome != abi.OutcomeError || !strings.Contains(res.Error, "error requested") {
		t.Fatalf("error mode: %+v, %v", res, err)
	}
	res, err = inst.Turn(ctx, request("panic", nil, 1))
	if err != nil || res.Outcome != abi.OutcomeError || !strings.Contains(res.Error, "agent panic") {
		t.Fatalf("panic mode: %+v, %v", res, err)
	}
	for attempt := 1; attempt <= 3; attempt++ {
		res, err := inst.Turn(ctx, request("flaky 3", nil, attempt))
		if err != nil {
			t.Fatal(err)
		}
		if want := attempt < 3; (res.Outcome == abi.OutcomeError) != want {
			t.Fatalf("flaky 3, attempt %d: outcome %s", attempt, res.Outcome)
		}
	}
	start := time.Now()
	if got := reply(t)(inst.Turn(ctx, request("sleep 50", nil, 1))); got != "slept 50 ms" {
		t.Fatalf("sleep reply %q", got)
	}
	if got := reply(t)(inst.Turn(ctx, request("nap 50", nil, 1))); got != "napped 50 ms" {
		t.Fatalf("nap reply %q", got)
	}
	if el := time.Since(start); el < 100*time.Millisecond {
		t.Fatalf("sleep 50 + nap 50 took %s: guest clocks are not real", el)
	}
	if got := reply(t)(inst.Turn(ctx, request("hello", nil, 1))); got != "ok: hello" {
		t.Fatalf("reply %q", got)
	}
	if res.State != nil {
		t.Fatalf("faulty keeps state, got %q", res.State)
	}
	if inst.Closed() || inst.Turns() != 8 {
		t.Fatalf("closed=%v turns=%d", inst.Closed(), inst.Turns())
	}
}

// TestTurnStopsOnCallerContext: the caller's deadline and cancellation stop
// a guest that spins or sleeps, and Close from another goroutine stops a
// running turn.
func TestTurnStopsOnCallerContext(t *testing.T) {
	t.Parallel()
	b := setup(t, wasm.Config{TurnTimeout: time.Minute})

	t.Run("deadline", func(t *testing.T) {
		t.Parallel()
		inst := b.instance(t, b.faulty(t))
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		_, err := inst.Turn(ctx, request("loop", nil, 1))
		turnError(t, err, wasm.KindTimeout)
	})
	t.Run("cancel", func(t *testing.T) {
		t.Parallel()
		inst := b.instance(t, b.faulty(t))
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(200*time.Millisecond, cancel)
		_, err := inst.Turn(ctx, request("nap 600000", nil, 1))
		turnError(t, err, wasm.KindCanceled)
	})
	t.Run("spin leaves the GC free", func(t *testing.T) {
		// wazero's native code has no preemption point: a guest that never
		// left it would block the GC's stop-the-world, and every goroutine
		// with it, until the turn's end. The fuel check's yields let a GC
		// finish while the guest still spins.
		t.Parallel()
		inst := b.instance(t, b.faulty(t))
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		turnDone := make(chan error, 1)
		go func() {
			_, err := inst.Turn(ctx, request("loop", nil, 1))
			turnDone <- err
		}()
		time.Sleep(100 * time.Millisecond) // let the guest spin
		for range 3 {
			gcDone := make(chan struct{})
			go func() { runtime.GC(); close(gcDone) }()
			select {
			case <-gcDone:
			case err := <-turnDone:
				t.Fatalf("the turn ended (%v) before a GC started while it spun could finish", err)
			}
		}
		select {
		case err := <-turnDone:
			t.Fatalf("the spinning turn ended by itself: %v", err)
		default:
		}
		cancel()
		turnError(t, <-turnDone, wasm.KindCanceled)
	})
	t.Run("close", func(t *testing.T) {
		t.Parallel()
		inst := b.instance(t, b.faulty(t))
		time.AfterFunc(200*time.Millisecond, func() { inst.Close(context.Background()) })
		_, err := inst.Turn(context.Background(), request("loop", nil, 1))
		turnError(t, err, wasm.KindCanceled)
	})
}

// TestGuestOutputGoesToHostLog: the log import, stdout and stderr reach
// the host logger tagged with module digest and turn_ref.
func TestGuestOutputGoesToHostLog(t *testing.T) {
	t.Parallel()
	b := shared(t)
	req := request("", nil, 1)
	marker := fmt.Sprintf("hello-from-guest-%d", req.Event.ID) // unique in the shared log
	req.Event.Message = "log " + marker
	reply(t)(b.instance(t, b.faulty(t)).Turn(context.Background(), req))
	for _, source := range []string{"log", "stdout", "stderr"} {
		var found bool
		for _, r := range b.logs.find(marker) {
			if attr(r, "source") == source {
				found = true
				if attr(r, "module") != b.faulty(t) || attr(r, "turn_ref") != req.TurnRef.String() {
					t.Errorf("%s record not tagged: module=%q turn_ref=%q", source, attr(r, "module"), attr(r, "turn_ref"))
				}
			}
		}
		if !found {
			t.Errorf("no %s record of the guest's output", source)
		}
	}
}

// TestGuestLogBudget: output past MaxLogBytesPerTurn is dropped and counted.
func TestGuestLogBudget(t *testing.T) {
	t.Parallel()
	b := setup(t, wasm.Config{MaxLogBytesPerTurn: 100})
	reply(t)(b.instance(t, b.faulty(t)).Turn(context.Background(), request("log "+strings.Repeat("z", 80), nil, 1)))
	if len(b.logs.find("zzzz")) != 1 {
		t.Errorf("want only the first of three 80-byte lines logged, got %d", len(b.logs.find("zzzz")))
	}
	if len(b.logs.find("over budget dropped")) != 1 {
		t.Error("no record of dropped output")
	}
}

// TestHandwrittenGuest runs a non-Go guest (no _initialize, fixed result)
// and checks every result rule the host enforces.
func TestHandwrittenGuest(t *testing.T) {
	t.Parallel()
	b := setup(t, wasm.Config{MaxResultBytes: 1 << 20})
	ctx := context.Background()
	req := request("hi", nil, 1)
	req.TurnRef = abi.TurnRef{DeliveryID: "d", ActivationUID: "a", ActorEpoch: 1, ActorEventID: 2, AgentUID: "g", SessionID: "s"}
	ref := `{"delivery_id":"d","activation_uid":"a","actor_epoch":1,"actor_event_id":2,"revision":0,"agent_uid":"g","session_id":"s"}`
	otherRef := strings.Replace(ref, `"actor_epoch":1`, `"actor_epoch":0`, 1)

	cases := []struct {
		name  string
		mod   wmod
		kind  string // "" for success
		inErr string
	}{
		{"ok", fixedGuest(1, []byte(`{"turn_ref":`+ref+`,"outcome":"sleep","messages":[{"role":"assistant","content":"hi"}],"future_field":true}`)), "", ""},
		{"malformed", fixedGuest(1, []byte(`{"turn_ref":`)), wasm.KindInvalidResult, "malformed result JSON"},
		{"bad ref", fixedGuest(1, []byte(`{"turn_ref":`+otherRef+`,"outcome":"error","error":"oops"}`)), wasm.KindInvalidResult, "does not echo"},
		{"bad outcome", fixedGuest(1, []byte(`{"turn_ref":`+ref+`,"outcome":"done"}`)), wasm.KindInvalidResult, "outcome"},
		{"null alloc", fixedGuest(1, nil, wfunc{export: "paddock_alloc", params: []byte{tI32}, results: []byte{tI32}, body: i32Const(0)}),
			wasm.KindInvalidResult, "paddock_alloc"},
		{"result out of bounds", fixedGuest(1, nil, wfunc{export: "paddock_turn", params: []byte{tI32, tI32}, results: []byte{tI64},
			body: i64Const(0x7fff0000<<32 | 100)}), wasm.KindInvalidResult, "outside"},
		{"oversized", fixedGuest(1, nil, wfunc{export: "paddock_turn", params: []byte{tI32, tI32}, results: []byte{tI64},
			body: i64Const(1024<<32 | 2<<20)}), wasm.KindOversized, "limit"},
		{"trap", fixedGuest(1, nil, wfunc{export: "paddock_turn", params: []byte{tI32, tI32}, results: []byte{tI64},
			body: []byte{opUnreachable}}), wasm.KindTrap, "unreachable"},
	}
	for _, c := range cases {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			t.Parallel()
			info, err := b.rt.Validate(ctx, c.mod.bytes())
			if err != nil {
				t.Fatal(err)
			}
			inst, err := b.rt.Instantiate(ctx, info.Digest)
			if err != nil {
				t.Fatal(err)
			}
			defer inst.Close(ctx)
			res, err := inst.Turn(ctx, req)
			if c.kind == "" {
				if err != nil || res.Outcome != abi.OutcomeSleep || res.TurnRef != req.TurnRef {
					t.Fatalf("%+v, %v", res, err)
				}
				return
			}
			te := turnError(t, err, c.kind)
			if !strings.Contains(te.Error(), c.inErr) {
				t.Fatalf("error %q does not mention %q", te, c.inErr)
			}
		})
	}
}

// TestRequestTooLarge: an oversized request is refused before the guest
// runs; the instance stays usable.
func TestRequestTooLarge(t *testing.T) {
	t.Parallel()
	b := shared(t)
	inst := b.instance(t, b.notes(t))
	_, err := inst.Turn(context.Background(), request("count", make([]byte, abi.MaxRequestBytes), 1))
	if !errors.Is(err, wasm.ErrRequestTooLarge) {
		t.Fatalf("got %v, want ErrRequestTooLarge", err)
	}
	reply(t)(inst.Turn(context.Background(), request("count", nil, 1)))
}

// TestShouldRecycle: the recycling signal follows the memory high-water
// mark and the turn count.
func TestShouldRecycle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// A 3 MB reply takes seconds on a loaded machine under -race: no
	// timeout case here, so a long turn timeout.
	b := setup(t, wasm.Config{RecycleMemoryBytes: 8 << 20, RecycleAfterTurns: 3, TurnTimeout: time.Minute})
	inst := b.instance(t, b.faulty(t))
	before := inst.MemoryBytes()
	if before == 0 || before >= 8<<20 || inst.ShouldRecycle() {
		t.Fatalf("fresh instance: %d bytes, recycle %v", before, inst.ShouldRecycle())
	}
	reply(t)(inst.Turn(ctx, request("big 3000000", nil, 1)))
	if after := inst.MemoryBytes(); after < 8<<20 || !inst.ShouldRecycle() {
		t.Fatalf("after a 3 MB reply: %d bytes (was %d), recycle %v", after, before, inst.ShouldRecycle())
	}

	inst2 := b.instance(t, b.notes(t))
	for i := range 3 {
		if inst2.ShouldRecycle() {
			t.Fatalf("recycle after %d turns", i)
		}
		reply(t)(inst2.Turn(ctx, request("count", nil, 1)))
	}
	if !inst2.ShouldRecycle() {
		t.Fatal("no recycle after RecycleAfterTurns turns")
	}
}

// TestConcurrentInstances hammers one Runtime from many goroutines, each
// with its own instance, mixing good and failing turns.
func TestConcurrentInstances(t *testing.T) {
	t.Parallel()
	b := shared(t)
	ctx := context.Background()
	notesDigest, faultyDigest := b.notes(t), b.faulty(t)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			inst, err := b.rt.Instantiate(ctx, notesDigest)
			if err != nil {
				t.Error(err)
				return
			}
			defer inst.Close(ctx)
			var state []byte
			for i := range 5 {
				res, err := inst.Turn(ctx, request("note n", state, 1))
				if err != nil {
					t.Error(err)
					return
				}
				state = res.State
				if want := "noted (" + string(rune('1'+i)) + ")"; res.Messages[0].Content != want {
					t.Errorf("goroutine %d turn %d: %q", g, i, res.Messages[0].Content)
				}
			}
			f, err := b.rt.Instantiate(ctx, faultyDigest)
			if err != nil {
				t.Error(err)
				return
			}
			defer f.Close(ctx)
			if _, err := f.Turn(ctx, request("trap", nil, 1)); err == nil {
				t.Error("trap did not fail")
			}
		})
	}
	wg.Wait()
}

// TestRuntimeClose: after Close, nothing new starts and old instances fail
// cleanly instead of hanging.
func TestRuntimeClose(t *testing.T) {
	t.Parallel()
	b := setup(t, wasm.Config{})
	ctx := context.Background()
	digest := b.notes(t)
	inst := b.instance(t, digest)
	if err := b.rt.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.rt.Instantiate(ctx, digest); !errors.Is(err, wasm.ErrClosed) {
		t.Errorf("Instantiate after Close: %v", err)
	}
	_, body := wasmtest.BuildExample(t, wasmtest.Notes)
	if _, err := b.rt.Validate(ctx, body); !errors.Is(err, wasm.ErrClosed) {
		t.Errorf("Validate after Close: %v", err)
	}
	if _, err := inst.Turn(ctx, request("count", nil, 1)); err == nil {
		t.Error("turn on an instance of a closed runtime succeeded")
	}
}
