package wasm_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/wasm"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// steerFor returns a steer of req's turn: the next revision under a new
// delivery, as the host makes it when a steer supersedes the delivery.
func steerFor(req *abi.TurnRequest, msg string) abi.Steer {
	ref := req.TurnRef
	ref.DeliveryID += "-steered"
	ref.Revision++
	return abi.Steer{TurnRef: ref, EventID: req.Event.ID + 1, Message: msg}
}

// TestSteerReachesRunningTurn: a steer sent through abi.WithSteers while the
// guest runs reaches it through steer_poll, and the result echoes the
// steer's turn_ref (the new revision) and carries its message. The guest
// takes one steer per poll and never reads ahead.
func TestSteerReachesRunningTurn(t *testing.T) {
	t.Parallel()
	b := shared(t)
	for _, size := range []int{10, 10_000} { // the second needs a larger buffer than the SDK's first (-needed)
		t.Run(fmt.Sprintf("%d_bytes", size), func(t *testing.T) {
			t.Parallel()
			inst := b.instance(t, b.faulty(t))
			req := request("think 2000", nil, 1)
			steer := steerFor(req, "go left "+strings.Repeat("y", size))
			second := steerFor(req, "second")
			second.TurnRef.Revision++
			steers := make(chan abi.Steer) // unbuffered: only a poll of the running guest can take it
			done := make(chan struct{})
			defer close(done)
			go func() {
				time.Sleep(100 * time.Millisecond) // the turn is running by then
				for _, s := range []abi.Steer{steer, second} {
					select {
					case steers <- s:
					case <-done:
						return
					}
				}
			}()
			start := time.Now()
			res, err := inst.Turn(abi.WithSteers(context.Background(), steers), req)
			el := time.Since(start)
			if got := replyOf(t, res, err); got != "steered: "+steer.Message {
				t.Fatalf("reply %.60q…, want the steer's message", got)
			}
			if res.TurnRef != steer.TurnRef {
				t.Fatalf("result turn_ref %v, want the steer's %v", res.TurnRef, steer.TurnRef)
			}
			// The reply proves the steer ended the think early (an unsteered
			// think 2000 answers "thought for 2000 ms").
			t.Logf("steered think 2000 returned after %s", el)
			if inst.Closed() {
				t.Fatal("instance closed after a steered turn")
			}
			// The next turn of the instance starts clean: no steer left
			// over, the request's ref echoed.
			next := request("hello", nil, 1)
			res, err = inst.Turn(context.Background(), next)
			if replyOf(t, res, err) != "ok: hello" || res.TurnRef != next.TurnRef {
				t.Fatalf("next turn: %+v", res)
			}
		})
	}

	t.Run("one per poll", func(t *testing.T) {
		t.Parallel()
		inst := b.instance(t, b.faulty(t))
		req := request("think 2000", nil, 1)
		first, second := steerFor(req, "first"), steerFor(req, "second")
		second.TurnRef.Revision++
		steers := make(chan abi.Steer, 2)
		steers <- first
		steers <- second
		res, err := inst.Turn(abi.WithSteers(context.Background(), steers), req)
		if got := replyOf(t, res, err); got != "steered: first" || res.TurnRef != first.TurnRef {
			t.Fatalf("reply %q ref %v", got, res.TurnRef)
		}
		if len(steers) != 1 {
			t.Fatalf("%d steers left in the channel, want the second one", len(steers))
		}
	})
}

// TestTurnWithoutSteers: a turn that gets no steer is unchanged, with or
// without a steer channel, and so is a guest that never polls (notes does
// not import steer_poll): the steer stays in the channel for the host.
func TestTurnWithoutSteers(t *testing.T) {
	t.Parallel()
	b := shared(t)
	ctx := context.Background()
	inst := b.instance(t, b.faulty(t))
	for _, c := range []struct {
		name string
		ctx  context.Context
	}{
		{"no channel", ctx},
		{"empty channel", abi.WithSteers(ctx, make(chan abi.Steer))},
		{"closed channel", abi.WithSteers(ctx, closedSteers())},
		{"nil channel", abi.WithSteers(ctx, nil)},
	} {
		req := request("think 50", nil, 1)
		res, err := inst.Turn(c.ctx, req)
		if got := replyOf(t, res, err); got != "thought for 50 ms" || res.TurnRef != req.TurnRef {
			t.Fatalf("%s: reply %q ref %v, want the request's %v", c.name, got, res.TurnRef, req.TurnRef)
		}
	}

	notes := b.instance(t, b.notes(t))
	req := request("count", nil, 1)
	steers := make(chan abi.Steer, 1)
	steers <- steerFor(req, "ignored")
	res, err := notes.Turn(abi.WithSteers(ctx, steers), req)
	if replyOf(t, res, err); res.TurnRef != req.TurnRef {
		t.Fatalf("notes echoed %v, want the request's %v", res.TurnRef, req.TurnRef)
	}
	if len(steers) != 1 {
		t.Fatal("a guest that does not poll took a steer")
	}
}

func closedSteers() <-chan abi.Steer {
	ch := make(chan abi.Steer)
	close(ch)
	return ch
}

// TestSteerPollImportIsOptional: Go guests import paddock.steer_poll only
// when they call guest.PollSteer, and modules without it load and run.
func TestSteerPollImportIsOptional(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	imports := func(pkg string) map[string]bool {
		_, body := wasmtest.BuildExample(t, pkg)
		list, err := importedFunctions(body)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]bool{}
		for _, imp := range list {
			out[imp] = true
		}
		if !out["wasi_snapshot_preview1.fd_write"] {
			t.Fatalf("%s imports %v: the decoder missed fd_write", pkg, list)
		}
		return out
	}
	if imp := imports(wasmtest.Notes); imp["paddock.steer_poll"] {
		t.Errorf("notes imports %v: want no paddock.steer_poll", imp)
	}
	if imp := imports(wasmtest.Faulty); !imp["paddock.steer_poll"] || !imp["paddock.log"] {
		t.Errorf("faulty imports %v: want paddock.steer_poll and paddock.log", imp)
	}

	// A hand-written module with no imports at all runs a steered turn.
	b := setup(t, wasm.Config{})
	req := request("hi", nil, 1)
	ref, _ := json.Marshal(req.TurnRef)
	info, err := b.rt.Validate(ctx, fixedGuest(1, []byte(`{"turn_ref":`+string(ref)+`,"outcome":"ok"}`)).bytes())
	if err != nil {
		t.Fatal(err)
	}
	inst := b.instance(t, info.Digest)
	steers := make(chan abi.Steer, 1)
	steers <- steerFor(req, "unheard")
	res, err := inst.Turn(abi.WithSteers(ctx, steers), req)
	if err != nil || res.TurnRef != req.TurnRef {
		t.Fatalf("%+v, %v", res, err)
	}
}

// Instructions for hand-written steer_poll callers.
const (
	opCall     byte = 0x10
	opDrop     byte = 0x1a
	opIf       byte = 0x04
	opI32Ne    byte = 0x47
	blockEmpty byte = 0x40
)

// steerPollImport is paddock.steer_poll, function index 0 of a module that
// imports nothing else.
var steerPollImport = wimport{module: "paddock", name: "steer_poll", params: []byte{tI32, tI32}, results: []byte{tI32}}

// pollExpect is the wasm code "if steer_poll(ptr, capacity) != want:
// unreachable".
func pollExpect(ptr, capacity, want int32) []byte {
	code := append(i32Const(ptr), i32Const(capacity)...)
	code = append(code, opCall, 0x00)
	code = append(code, i32Const(want)...)
	return append(code, opI32Ne, opIf, blockEmpty, opUnreachable, opEnd)
}

// TestSteerPollABI drives steer_poll from a hand-written guest, as a guest
// in another language would: 0 when no steer waits, -n when the buffer is
// too small (the steer stays waiting), n when it was written, and a
// buffer outside memory fails the turn.
func TestSteerPollABI(t *testing.T) {
	t.Parallel()
	b := setup(t, wasm.Config{})
	ctx := context.Background()
	req := request("hi", nil, 1)
	steer := steerFor(req, "left")
	encoded, _ := json.Marshal(steer)
	n := int32(len(encoded))
	ref, _ := json.Marshal(req.TurnRef)
	result := []byte(`{"turn_ref":` + string(ref) + `,"outcome":"ok"}`)
	const buf = 8192 // in the first page, clear of the fixed result
	guest := func(code ...[]byte) []byte {
		var body []byte
		for _, c := range code {
			body = append(body, c...)
		}
		body = append(body, i64Const(fixedResultAt<<32|int64(len(result)))...)
		m := fixedGuest(1, result, wfunc{export: "paddock_turn", params: []byte{tI32, tI32}, results: []byte{tI64}, body: body})
		m.imports = []wimport{steerPollImport}
		return m.bytes()
	}
	run := func(t *testing.T, mod []byte, ctx context.Context) (*abi.TurnResult, error) {
		t.Helper()
		info, err := b.rt.Validate(context.Background(), mod)
		if err != nil {
			t.Fatal(err)
		}
		return b.instance(t, info.Digest).Turn(ctx, req)
	}
	oneSteer := func() context.Context {
		ch := make(chan abi.Steer, 1)
		ch <- steer
		return abi.WithSteers(ctx, ch)
	}

	t.Run("protocol", func(t *testing.T) {
		t.Parallel()
		mod := guest(
			pollExpect(0, 0, -n),      // a size probe
			pollExpect(buf, n-1, -n),  // one byte short: still waiting
			pollExpect(buf, n, n),     // written and taken in
			pollExpect(buf, 1<<20, 0), // nothing more
		)
		// The guest took the steer in but echoes the request's ref: a
		// valid result here; the store's fences reject it as stale.
		res, err := run(t, mod, oneSteer())
		if err != nil || res.TurnRef != req.TurnRef {
			t.Fatalf("%+v, %v", res, err)
		}
	})
	t.Run("no steers", func(t *testing.T) {
		t.Parallel()
		mod := guest(pollExpect(buf, 1<<20, 0), pollExpect(0, 0, 0))
		for _, c := range []context.Context{ctx, abi.WithSteers(ctx, make(chan abi.Steer))} {
			if _, err := run(t, mod, c); err != nil {
				t.Fatal(err)
			}
		}
	})
	t.Run("buffer outside memory", func(t *testing.T) {
		t.Parallel()
		call := append(append(i32Const(0x7fff0000), i32Const(1<<20)...), opCall, 0x00, opDrop)
		_, err := run(t, guest(call), oneSteer())
		te := turnError(t, err, wasm.KindInvalidResult)
		if !strings.Contains(te.Error(), "steer_poll") || !strings.Contains(te.Error(), "outside") {
			t.Fatalf("error %q does not name steer_poll and the buffer", te)
		}
	})
	t.Run("wrong signature", func(t *testing.T) {
		t.Parallel()
		m := fixedGuest(1, result)
		m.imports = []wimport{{module: "paddock", name: "steer_poll", params: []byte{tI32}, results: []byte{tI32}}}
		_, err := b.rt.Validate(ctx, m.bytes())
		var me *wasm.ModuleError
		if !errors.As(err, &me) || me.Reason != wasm.ReasonBadImports || !strings.Contains(me.Error(), "paddock.steer_poll") {
			t.Fatalf("got %v, want bad_imports naming paddock.steer_poll", err)
		}
	})
}

// TestCancelDuringThink: cancelling the turn's context while the guest
// thinks ends the turn promptly as canceled and closes the instance.
func TestCancelDuringThink(t *testing.T) {
	t.Parallel()
	b := shared(t)
	inst := b.instance(t, b.faulty(t))
	ctx, cancel := context.WithCancel(context.Background())
	steers := make(chan abi.Steer)
	const after = 200 * time.Millisecond
	time.AfterFunc(after, cancel)
	start := time.Now()
	_, err := inst.Turn(abi.WithSteers(ctx, steers), request("think 60000", nil, 1))
	turnError(t, err, wasm.KindCanceled)
	// Far below the 60 s think: the cancel ended it (generous for a
	// loaded machine).
	if lag := time.Since(start) - after; lag > 10*time.Second {
		t.Errorf("turn ended %s after the cancel", lag)
	}
	if !inst.Closed() {
		t.Error("instance not closed after a cancelled turn")
	}
}
