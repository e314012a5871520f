package wasm_test

// Hostile hand-written guests against the fuel check (interrupt.Instrument):
// every way to spin must stop at the turn's deadline.

import (
	"context"
	"errors"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/wasm"
)

func cat(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

// Spin guests count a local down from spinCount: long enough (seconds)
// that a guest the fuel check missed overruns the deadline plainly, short
// enough that such a failing test still ends.
const spinCount = 1 << 33

// Local indices of paddock_turn (params ptr, len; then the locals).
const (
	turnCounter = 2 // i64
	turnScratch = 3 // i32
)

var turnLocals = []byte{tI64, tI32}

// countDown leaves on the stack whether the counter, decremented, is
// still non-zero (i32).
var countDown = []byte{0x20, turnCounter, 0x42, 0x01, 0x7d, 0x22, turnCounter, 0x50, 0x45}

// spinTurn is a paddock_turn whose body is body, then the fixed result.
func spinTurn(body []byte) wfunc { return spinTurnN(spinCount, body) }

// spinTurnN is spinTurn with the counter starting at n.
func spinTurnN(n int64, body []byte) wfunc {
	return wfunc{export: "paddock_turn", params: []byte{tI32, tI32}, results: []byte{tI64}, locals: turnLocals,
		body: cat(i64Const(n), []byte{0x21, turnCounter}, body, i64Const(fixedResultAt<<32))}
}

// treeCall is function 4 of a spin guest, f(n): if n { f(n-1); f(n-1) }
// through call (op 0x10) or call_indirect of table[0] (op 0x11): 2^n calls,
// never deeper than n.
func treeCall(op byte) wfunc {
	call := []byte{0x10, 4}
	if op == 0x11 {
		call = []byte{0x41, 0, 0x11, 4, 0}
	}
	rec := cat([]byte{0x20, 0, 0x41, 1, 0x6b}, call)
	return wfunc{params: []byte{tI32}, body: cat([]byte{0x20, 0, 0x04, 0x40}, rec, rec, []byte{0x0b})}
}

// A tree of calls of the same shape through two functions (4 and 5).
func mutual() []wfunc {
	f := func(other byte) wfunc {
		rec := []byte{0x20, 0, 0x41, 1, 0x6b, 0x10, other}
		return wfunc{params: []byte{tI32}, body: cat([]byte{0x20, 0, 0x04, 0x40}, rec, rec, []byte{0x0b})}
	}
	return []wfunc{f(5), f(4)}
}

type spinCase struct {
	name string
	mod  wmod
}

func spinCases() []spinCase {
	guest := func(turn wfunc, extra ...wfunc) wmod {
		m := fixedGuest(1, []byte("{}"), turn)
		m.funcs = append(m.funcs, extra...)
		return m
	}
	callTree := func(depth int32) wfunc { return spinTurn(cat(i32Const(depth), []byte{0x10, 4})) }
	v128Zero := cat([]byte{0xfd, 0x0c}, make([]byte, 16))
	cases := []spinCase{
		{"loop", guest(spinTurn(cat([]byte{0x03, 0x40}, countDown, []byte{0x0d, 0, 0x0b})))},
		{"loop in block in if", guest(spinTurn(cat(i32Const(1), []byte{0x04, 0x40, 0x02, 0x40, 0x03, 0x40}, countDown,
			[]byte{0x0d, 0, 0x0b, 0x0b, 0x0b})))},
		// block $out loop $l: br_table [$l] $out on (counter == 0).
		{"br_table back-edge", guest(spinTurn(cat([]byte{0x02, 0x40, 0x03, 0x40}, countDown, []byte{0x45, 0x0e, 1, 0, 1, 0x0b, 0x0b})))},
		// loop (param i32) (result i32) of type 1 (alloc's type).
		{"loop with a param", guest(spinTurn(cat(i32Const(7), []byte{0x03, 1, 0x1a}, i32Const(7), countDown,
			[]byte{0x0d, 0, 0x0b, 0x1a})))},
		// loop (param i32) (result i32 i32) of type 4 (function 4's).
		{"multi-value loop", guest(spinTurn(cat(i32Const(7), []byte{0x03, 4, 0x1a}, i32Const(7), countDown,
			[]byte{0x0d, 0}, i32Const(8), []byte{0x0b, 0x1a, 0x1a})),
			wfunc{params: []byte{tI32}, results: []byte{tI32, tI32}, body: cat(i32Const(1), i32Const(2))})},
		{"recursion", guest(callTree(40), treeCall(0x10))},
		{"mutual recursion", guest(callTree(40), mutual()...)},
		// Instrument reads a SIMD sub-opcode as a LEB128 number, wazero as
		// one byte: 0xfd 0x80 0x02 is one instruction to the first,
		// i16x8.abs then block to the second, which then finds a loop where
		// the first saw two memory.grow.
		{"SIMD opcode hiding a loop", guest(spinTurn(cat(v128Zero, []byte{0xfd, 0x80, 0x02, 0x40, 0x03, 0x40, 0x01}, countDown,
			[]byte{0x0d, 0, 0x0b, 0x0b, 0x1a})))},
		// A block of result (ref null 2) reads a heap type after 0x63; read
		// as a one-byte block type, the heap type 2 is a block whose block
		// type is the loop opcode.
		{"ref block type hiding a loop", guest(spinTurn(cat([]byte{0x02, 0x63, 0x02, 0x03, 0x40, 0x01}, countDown,
			[]byte{0x0d, 0, 0x0b, 0x00, 0x0b, 0x1a})))},
		// select (result (ref null func)) with the heap type -16 in five
		// bytes, the last with its continuation bit set: wazero stops
		// there, a LEB128 reader reads on through the loop opcode.
		{"typed select hiding a loop", guest(spinTurn(cat([]byte{0xd0, 0x70, 0xd0, 0x70}, i32Const(0),
			[]byte{0x1c, 0x01, 0x63, 0xf0, 0xff, 0xff, 0xff, 0xbf, 0x03, 0x40, 0x01}, countDown, []byte{0x0d, 0, 0x0b, 0x1a})))},
		// The same in its canonical form: wazero's compiler skips two
		// bytes after 0x1c, so it compiled 0x70 as i32.rem_u and panicked
		// in its own goroutine, killing the host.
		{"typed select of (ref null func)", guest(spinTurn(cat([]byte{0xd0, 0x70, 0xd0, 0x70}, i32Const(0),
			[]byte{0x1c, 0x01, 0x63, 0x70, 0x1a})))},
	}
	indirect := guest(callTree(40), treeCall(0x11))
	indirect.table = []uint32{4}
	cases = append(cases, spinCase{"call_indirect recursion", indirect})
	// Bulk memory: one instruction, and one fuel, per 16 MiB (some
	// thousands take seconds).
	const pages, bulkSpins = 256, 3000
	fill := guest(spinTurnN(bulkSpins, cat([]byte{0x03, 0x40}, i32Const(0), i32Const(0), i32Const(pages<<16), []byte{0xfc, 11, 0},
		countDown, []byte{0x0d, 0, 0x0b})))
	fill.memPages = pages
	cases = append(cases, spinCase{"memory.fill in a loop", fill})
	cp := guest(spinTurnN(bulkSpins, cat([]byte{0x03, 0x40}, i32Const(0), i32Const(pages<<15), i32Const(pages<<15), []byte{0xfc, 10, 0, 0},
		countDown, []byte{0x0d, 0, 0x0b})))
	cp.memPages = pages
	cases = append(cases, spinCase{"memory.copy in a loop", cp})
	return cases
}

// TestFuelStopsHostileSpins: each hostile guest is refused at Load or its
// turn stops at its deadline, promptly.
func TestFuelStopsHostileSpins(t *testing.T) {
	t.Parallel()
	b := setup(t, wasm.Config{TurnTimeout: time.Minute})
	for _, c := range spinCases() {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			info, err := b.rt.Validate(ctx, c.mod.bytes())
			if err != nil {
				var me *wasm.ModuleError
				if !errors.As(err, &me) {
					t.Fatalf("Validate: %v", err)
				}
				t.Logf("refused: %v", err) // refused is as good as stopped
				return
			}
			inst, err := b.rt.Instantiate(ctx, info.Digest)
			if err != nil {
				t.Fatal(err)
			}
			defer inst.Close(ctx)
			tctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			defer cancel()
			start := time.Now()
			_, err = inst.Turn(tctx, request("spin", nil, 1))
			if took := time.Since(start); took > 2*time.Second {
				t.Errorf("the turn stopped %s after its start, its deadline 100 ms", took)
			}
			turnError(t, err, wasm.KindTimeout)
		})
	}
}

// A spinning start function or _initialize stops at InitTimeout: Validate
// (whose probe instantiates the module) refuses the module promptly.
func TestFuelStopsSpinningInitialisers(t *testing.T) {
	t.Parallel()
	b := setup(t, wasm.Config{InitTimeout: 200 * time.Millisecond})
	spin := wfunc{locals: []byte{tI64}, body: cat(i64Const(spinCount), []byte{0x21, 0, 0x03, 0x40},
		[]byte{0x20, 0, 0x42, 0x01, 0x7d, 0x22, 0, 0x50, 0x45, 0x0d, 0, 0x0b})}
	start := fixedGuest(1, []byte("{}"))
	start.funcs = append(start.funcs, spin)
	start.start = len(start.funcs) // index 4, plus one
	initialize := fixedGuest(1, []byte("{}"))
	spin.export = wasm.ExportInitialize
	initialize.funcs = append(initialize.funcs, spin)
	for name, m := range map[string]wmod{"start": start, "_initialize": initialize} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			begin := time.Now()
			_, err := b.rt.Validate(context.Background(), m.bytes())
			if took := time.Since(begin); took > 3*time.Second {
				t.Errorf("Validate returned %s after its start, InitTimeout 200 ms", took)
			}
			var me *wasm.ModuleError
			if !errors.As(err, &me) || me.Reason != wasm.ReasonInitFailed {
				t.Fatalf("Validate: %v, want a ModuleError of reason %s", err, wasm.ReasonInitFailed)
			}
			var te *wasm.TurnError
			if !errors.As(err, &te) || te.Kind != wasm.KindTimeout {
				t.Errorf("Validate: %v, want an init timeout", err)
			}
		})
	}
}

// Code that names the fuel's global index (one past the module's globals)
// or a function index past the module's (the yield import's, once
// instrumented, is below them: a defined function's) is refused.
func TestFuelOutOfReach(t *testing.T) {
	t.Parallel()
	b := shared(t)
	for name, body := range map[string][]byte{
		"global.set of the fuel":  cat(i32Const(0), []byte{0x24, 0}, i64Const(0)),
		"global.get of the fuel":  cat([]byte{0x23, 0, 0x1a}, i64Const(0)),
		"call past the functions": cat([]byte{0x10, 4}, i64Const(0)),
	} {
		m := fixedGuest(1, []byte("{}"), wfunc{export: "paddock_turn", params: []byte{tI32, tI32}, results: []byte{tI64}, body: body})
		_, err := b.rt.Validate(context.Background(), m.bytes())
		var me *wasm.ModuleError
		if !errors.As(err, &me) || me.Reason != wasm.ReasonInvalidWasm {
			t.Errorf("%s: %v, want a ModuleError of reason %s", name, err, wasm.ReasonInvalidWasm)
		}
	}
}

// signalLog is a slog.Handler that closes seen at the first record whose
// message is msg.
type signalLog struct {
	msg  string
	once sync.Once
	seen chan struct{}
}

func (l *signalLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *signalLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *signalLog) WithGroup(string) slog.Handler            { return l }
func (l *signalLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message == l.msg {
		l.once.Do(func() { close(l.seen) })
	}
	return nil
}

// spinForever is a guest that logs "spinning" (paddock.log) and then
// loops forever, in paddock_turn or in _initialize.
func spinForever(inInitialize bool) wmod {
	const at = 2048
	body := cat(i32Const(0), i32Const(at), i32Const(8), []byte{0x10, 0, 0x03, 0x40, 0x0c, 0, 0x0b})
	m := fixedGuest(1, []byte("{}"))
	m.imports = []wimport{{module: wasm.HostModule, name: wasm.HostLog, params: []byte{tI32, tI32, tI32}}}
	m.data = append(m.data, wdata{at, []byte("spinning")})
	if inInitialize {
		m.funcs = append(m.funcs, wfunc{export: wasm.ExportInitialize, body: body})
	} else {
		m.funcs[3].body = cat(body, i64Const(0))
	}
	return m
}

func newSignalRuntime(t *testing.T, cfg wasm.Config) (*wasm.Runtime, *signalLog) {
	t.Helper()
	log := &signalLog{msg: "spinning", seen: make(chan struct{})}
	rt, err := wasm.New(context.Background(), cfg, slog.New(log))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close(context.Background()) })
	return rt, log
}

// Runtime.Close while a guest spins in a turn: a GC completes meanwhile,
// Close returns, and the turn fails as cancelled.
func TestRuntimeCloseStopsSpinningTurn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rt, log := newSignalRuntime(t, wasm.Config{TurnTimeout: time.Minute})
	info, err := rt.Validate(ctx, spinForever(false).bytes())
	if err != nil {
		t.Fatal(err)
	}
	inst, err := rt.Instantiate(ctx, info.Digest)
	if err != nil {
		t.Fatal(err)
	}
	turnDone := make(chan error, 1)
	go func() {
		_, err := inst.Turn(ctx, request("spin", nil, 1))
		turnDone <- err
	}()
	<-log.seen // the guest is in its loop
	gcDone := make(chan struct{})
	go func() { runtime.GC(); close(gcDone) }()
	select {
	case <-gcDone:
	case <-time.After(10 * time.Second):
		t.Fatal("a GC did not complete within 10 s while the guest spun")
	}
	closed := make(chan error, 1)
	go func() { closed <- rt.Close(ctx) }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Runtime.Close did not return within 10 s of a spinning guest")
	}
	err = <-turnDone
	if !errors.Is(err, wasm.ErrClosed) {
		turnError(t, err, wasm.KindCanceled)
	}
}

// Runtime.Close while a module's _initialize spins (in Validate's probe):
// Close returns and Validate fails with ErrClosed.
func TestRuntimeCloseStopsSpinningInitialize(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rt, log := newSignalRuntime(t, wasm.Config{InitTimeout: time.Minute})
	validated := make(chan error, 1)
	go func() {
		_, err := rt.Validate(ctx, spinForever(true).bytes())
		validated <- err
	}()
	<-log.seen
	closed := make(chan error, 1)
	go func() { closed <- rt.Close(ctx) }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Runtime.Close did not return within 10 s of a spinning _initialize")
	}
	if err := <-validated; !errors.Is(err, wasm.ErrClosed) {
		t.Errorf("Validate: %v, want ErrClosed", err)
	}
}

// table.grow past 2^20 elements (the table's total) fails as out of
// memory (-1) instead of allocating it: one grow of 2^31 elements asked
// wazero for 16 GiB. Growing within the bound still works, and a table
// declared larger is refused.
func TestTableGrowIsBounded(t *testing.T) {
	t.Parallel()
	b := shared(t)
	ctx := context.Background()
	// paddock_turn traps unless grow(2^31-1) = -1, grow(1000) = 1 (the
	// old size), grow(2^20) = -1 (the total would pass 2^20).
	grow := func(n int32, want int32) []byte {
		return cat([]byte{0xd0, 0x70}, i32Const(n), []byte{0xfc, 15, 0}, i32Const(want), []byte{0x47, 0x04, 0x40, 0x00, 0x0b})
	}
	m := fixedGuest(1, []byte("{}"), wfunc{export: "paddock_turn", params: []byte{tI32, tI32}, results: []byte{tI64},
		body: cat(grow(1<<31-1, -1), grow(1000, 1), grow(1<<20, -1), i64Const(fixedResultAt<<32|2))})
	m.table = []uint32{0}
	info, err := b.rt.Validate(ctx, m.bytes())
	if err != nil {
		t.Fatal(err)
	}
	inst, err := b.rt.Instantiate(ctx, info.Digest)
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Close(ctx)
	_, err = inst.Turn(ctx, request("grow", nil, 1))
	turnError(t, err, wasm.KindInvalidResult) // "{}" is no result, but the guest returned
	big := fixedGuest(1, []byte("{}"))
	big.table = make([]uint32, 1<<20+1)
	if _, err := b.rt.Validate(ctx, big.bytes()); err == nil || !strings.Contains(err.Error(), "table of 1048577 elements") {
		t.Errorf("a table of 2^20+1 elements: %v, want it refused", err)
	}
}
