package interrupt_test

import (
	"context"
	"encoding/binary"
	"errors"
	"runtime"
	"testing"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"

	"github.com/paddock-dev/paddock/wasm/internal/interrupt"
)

// A hand-encoded module (core spec 5.5), enough to reach every index the
// instrumenter renumbers.

func uleb(v uint64) []byte { return binary.AppendUvarint(nil, v) }

func name(s string) []byte { return append(uleb(uint64(len(s))), s...) }

func vec(items ...[]byte) []byte {
	b := uleb(uint64(len(items)))
	for _, it := range items {
		b = append(b, it...)
	}
	return b
}

func section(id byte, content []byte) []byte {
	return append(append([]byte{id}, uleb(uint64(len(content)))...), content...)
}

func cat(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

func body(locals []byte, code ...[]byte) []byte {
	b := cat(locals, cat(code...), []byte{0x0b})
	return append(uleb(uint64(len(b))), b...)
}

const (
	i32 = 0x7f
	// Function indices of testModule: imports first.
	fnImportA, fnImportB = 0, 1
	fnSum, fnTwice       = 2, 3 // exported "sum", "twice"
	fnStart              = 4    // start: sets global 1
	fnViaTable           = 5    // exported "via_table": call_indirect to table[1]
	fnStartedFlag        = 6    // exported "started": global 1
)

// testModule imports two functions and a global, defines five functions
// (a loop summing 1..n, a direct call, a start function, an indirect call
// through a table filled by two element segments — one of indices, one of
// ref.func expressions), a global initialised with ref.func, exports and a
// name section.
func testModule() []byte {
	types := section(1, vec(
		[]byte{0x60, 1, i32, 1, i32}, // 0: (i32) -> i32
		[]byte{0x60, 0, 0},           // 1: () -> ()
		[]byte{0x60, 0, 1, i32},      // 2: () -> i32
	))
	imports := section(2, vec(
		cat(name("env"), name("a"), []byte{0x00}, uleb(0)),
		cat(name("env"), name("b"), []byte{0x00}, uleb(1)),
		cat(name("env"), name("g"), []byte{0x03, i32, 0x00}),
	))
	funcs := section(3, vec(uleb(0), uleb(0), uleb(1), uleb(2), uleb(2)))
	table := section(4, vec([]byte{0x70, 0x00, 4}))
	memory := section(5, vec([]byte{0x00, 1}))
	globals := section(6, vec(
		[]byte{i32, 0x01, 0x41, 0x00, 0x0b},   // 1: started flag
		[]byte{0x70, 0x00, 0xd2, fnSum, 0x0b}, // 2: funcref = ref.func sum
	))
	exports := section(7, vec(
		cat(name("sum"), []byte{0x00}, uleb(fnSum)),
		cat(name("twice"), []byte{0x00}, uleb(fnTwice)),
		cat(name("via_table"), []byte{0x00}, uleb(fnViaTable)),
		cat(name("started"), []byte{0x00}, uleb(fnStartedFlag)),
		cat(name("memory"), []byte{0x02}, uleb(0)),
	))
	start := section(8, uleb(fnStart))
	elements := section(9, vec(
		cat([]byte{0x00, 0x41, 0x00, 0x0b}, vec(uleb(fnSum))),                                           // table[0] = sum
		cat([]byte{0x04, 0x41, 0x01, 0x0b}, vec([]byte{0xd2, fnTwice, 0x0b}, []byte{0xd0, 0x70, 0x0b})), // table[1] = twice, table[2] = null
	))
	code := section(10, vec(
		// sum(n): s = 0; loop { if n == 0 break; s += n; n-- }; s
		body(vec([]byte{1, i32}),
			[]byte{0x02, 0x40, 0x03, 0x40}, // block loop
			[]byte{0x20, 0, 0x45, 0x0d, 1}, // local.get 0; i32.eqz; br_if 1
			[]byte{0x20, 1, 0x20, 0, 0x6a, 0x21, 1},
			[]byte{0x20, 0, 0x41, 1, 0x6b, 0x21, 0},
			[]byte{0x0c, 0, 0x0b, 0x0b}, // br 0; end; end
			[]byte{0x20, 1}),
		// twice(n) = sum(n) * 2, by a direct call
		body(vec(), []byte{0x20, 0, 0x10, fnSum, 0x41, 2, 0x6c}),
		// start: global 1 = 1 (global 0 is the import)
		body(vec(), []byte{0x41, 1, 0x24, 1}),
		// via_table(): call_indirect (i32)->i32 table[1](10)
		body(vec(), cat([]byte{0x41, 10, 0x41, 1, 0x11, 0, 0})),
		// started(): global 1
		body(vec(), []byte{0x23, 1}),
	))
	names := section(0, cat(name("name"),
		[]byte{1}, func() []byte {
			m := vec(cat(uleb(fnImportA), name("imp_a")), cat(uleb(fnSum), name("summer")), cat(uleb(fnTwice), name("doubler")))
			return append(uleb(uint64(len(m))), m...)
		}()))
	return cat([]byte("\x00asm\x01\x00\x00\x00"), types, imports, funcs, table, memory, globals, exports, start, elements, code, names)
}

var yieldImport = interrupt.Module{Import: "paddock_interrupt", Name: "yield"}

// envModule is the "env" module testModule imports from: a(x) = x, b(),
// and the global g.
func envModule() []byte {
	return cat([]byte("\x00asm\x01\x00\x00\x00"),
		section(1, vec([]byte{0x60, 1, i32, 1, i32}, []byte{0x60, 0, 0})),
		section(3, vec(uleb(0), uleb(1))),
		section(6, vec([]byte{i32, 0x00, 0x41, 7, 0x0b})),
		section(7, vec(cat(name("a"), []byte{0x00}, uleb(0)), cat(name("b"), []byte{0x00}, uleb(1)), cat(name("g"), []byte{0x03}, uleb(0)))),
		section(10, vec(body(vec(), []byte{0x20, 0}), body(vec()))))
}

// run instantiates wasm (instrumented) after "env", with a yield that
// counts its calls and answers fuel.
func run(t *testing.T, wasm []byte, fuel int32) (api.Module, *int) {
	t.Helper()
	ctx := context.Background()
	rt := wazero.NewRuntime(ctx)
	t.Cleanup(func() { rt.Close(ctx) })
	yields := new(int)
	if _, err := rt.NewHostModuleBuilder(yieldImport.Import).NewFunctionBuilder().
		WithFunc(func() int32 { *yields++; return fuel }).Export(yieldImport.Name).Instantiate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.InstantiateWithConfig(ctx, envModule(), wazero.NewModuleConfig().WithName("env")); err != nil {
		t.Fatal(err)
	}
	mod, err := rt.InstantiateWithConfig(ctx, wasm, wazero.NewModuleConfig().WithName("m"))
	if err != nil {
		t.Fatalf("instantiate the instrumented module: %v", err)
	}
	return mod, yields
}

func call(t *testing.T, mod api.Module, fn string, args ...uint64) int32 {
	t.Helper()
	out, err := mod.ExportedFunction(fn).Call(context.Background(), args...)
	if err != nil {
		t.Fatalf("%s: %v", fn, err)
	}
	return api.DecodeI32(out[0])
}

// The instrumented module computes what the original does, through
// direct calls, a table filled by both kinds of element segment, the
// start function and exports, all renumbered; the yield runs about once
// per fuel's worth of loop iterations and function entries; the name
// section still names the same functions.
func TestInstrumentedModuleBehavesAsTheOriginal(t *testing.T) {
	orig := testModule()
	plain, _ := run(t, orig, 1) // the original has no yield import: nothing calls it
	const fuel = 10
	wasm, err := interrupt.Instrument(orig, yieldImport, fuel)
	if err != nil {
		t.Fatal(err)
	}
	inst, yields := run(t, wasm, fuel)
	for _, c := range []struct {
		fn   string
		args []uint64
		want int32
	}{
		{"sum", []uint64{100}, 5050},
		{"twice", []uint64{4}, 20},
		{"via_table", nil, 110},
		{"started", nil, 1},
	} {
		if got := call(t, plain, c.fn, c.args...); got != c.want {
			t.Fatalf("original %s = %d, want %d", c.fn, got, c.want)
		}
		if got := call(t, inst, c.fn, c.args...); got != c.want {
			t.Errorf("instrumented %s = %d, want %d", c.fn, got, c.want)
		}
	}
	// sum(100) alone: one entry and 101 loop heads, at one fuel each.
	before := *yields
	call(t, inst, "sum", 100)
	if got := *yields - before; got < 101/fuel || got > 102/fuel+1 {
		t.Errorf("sum(100) yielded %d times with fuel %d, want about %d", got, fuel, 102/fuel)
	}
	for fn, want := range map[string]string{"sum": "summer", "twice": "doubler"} {
		if got := inst.ExportedFunction(fn).Definition().Name(); got != want {
			t.Errorf("name of %s is %q after instrumenting, want %q", fn, got, want)
		}
	}
}

// Code of the original that names the global the fuel will be, or a
// function past the original ones, is refused: it could otherwise reset
// its own fuel. Malformed input is an error wrapping ErrMalformed, never a
// panic.
func TestInstrumentRefusesOutOfRangeIndices(t *testing.T) {
	m := testModule()
	// started() reads global 1; global 3 is one past the original's
	// (1 imported, 2 defined): the index the fuel would get.
	bad := replaceOnce(t, m, []byte{0x23, 1, 0x0b}, []byte{0x24, 3, 0x0b})
	if _, err := interrupt.Instrument(bad, yieldImport, 10); !errors.Is(err, interrupt.ErrMalformed) {
		t.Errorf("global.set of the fuel's index: %v, want ErrMalformed", err)
	}
	// Nor may it export the fuel's index.
	badExport := replaceOnce(t, m, cat(name("memory"), []byte{0x02, 0}), cat(name("memory"), []byte{0x03, 3}))
	if _, err := interrupt.Instrument(badExport, yieldImport, 10); !errors.Is(err, interrupt.ErrMalformed) {
		t.Errorf("export of global 3 of 3: %v, want ErrMalformed", err)
	}
	badCall := replaceOnce(t, m, []byte{0x10, fnSum}, []byte{0x10, 7})
	if _, err := interrupt.Instrument(badCall, yieldImport, 10); !errors.Is(err, interrupt.ErrMalformed) {
		t.Errorf("call of function 7 of 7: %v, want ErrMalformed", err)
	}
	// Cut anywhere but between two sections, the module is malformed.
	boundary := map[int]bool{8: true}
	for at := 8; at < len(m); {
		size, n := binary.Uvarint(m[at+1:])
		at += 1 + n + int(size)
		boundary[at] = true
	}
	for n := range len(m) {
		_, err := interrupt.Instrument(m[:n], yieldImport, 10)
		if err != nil && !errors.Is(err, interrupt.ErrMalformed) {
			t.Fatalf("truncated to %d bytes: %v does not wrap ErrMalformed", n, err)
		}
		if err == nil && !boundary[n] {
			t.Fatalf("truncated to %d bytes, inside a section: no error", n)
		}
	}
}

func replaceOnce(t *testing.T, b, old, new []byte) []byte {
	t.Helper()
	for i := 0; i+len(old) <= len(b); i++ {
		if string(b[i:i+len(old)]) == string(old) {
			return cat(b[:i], new, b[i+len(old):])
		}
	}
	t.Fatalf("%x not in module", old)
	return nil
}

// FuzzInstrument: any input either fails with ErrMalformed or gives a
// module, and a module wazero accepts stays one it accepts once
// instrumented.
func FuzzInstrument(f *testing.F) {
	f.Add(testModule())
	f.Add(envModule())
	f.Add(elementModule())
	f.Fuzz(func(t *testing.T, wasm []byte) {
		out, err := interrupt.Instrument(wasm, yieldImport, 100)
		if err != nil {
			if !errors.Is(err, interrupt.ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		if !small(wasm) {
			return // wazero's own allocations for a vector of millions kill the fuzz worker
		}
		ctx := context.Background()
		rt := wazero.NewRuntime(ctx)
		defer rt.Close(ctx)
		if _, err := rt.CompileModule(ctx, wasm); err != nil {
			return
		}
		if _, err := rt.CompileModule(ctx, out); err != nil {
			t.Fatalf("the original compiles, the instrumented module does not: %v", err)
		}
	})
}

// small reports whether every section of wasm (a module Instrument took)
// declares at most 1,000 entries and no LEB128 number of wasm can exceed
// 2^21 (none has more than three bytes: wazero allocates a vector of a
// declared length up front, e.g. a function type's results).
func small(wasm []byte) bool {
	run := 0
	for _, b := range wasm {
		if run = run + 1; b < 0x80 {
			run = 0
		}
		if run >= 3 {
			return false
		}
	}
	for at := 8; at < len(wasm); {
		size, n := binary.Uvarint(wasm[at+1:])
		if wasm[at] != 0 {
			if count, _ := binary.Uvarint(wasm[at+1+n:]); count > 1000 {
				return false
			}
		}
		at += 1 + n + int(size)
	}
	return true
}

// Encodings that wazero reads differently from the format (a SIMD or
// atomic sub-opcode as one byte, a block type's heap type, the fifth byte
// of an s33) are refused: read another way than wazero does, they would
// hide the instructions after them, a loop among them, from the fuel
// check.
func TestInstrumentRefusesEncodingsWazeroReadsOtherwise(t *testing.T) {
	module := func(code []byte) []byte {
		return cat([]byte("\x00asm\x01\x00\x00\x00"),
			section(1, vec([]byte{0x60, 0, 0})),
			section(3, vec(uleb(0))),
			section(10, vec(body(vec(), code))))
	}
	for name, code := range map[string][]byte{
		"SIMD opcode 256":              {0xfd, 0x80, 0x02},
		"SIMD opcode 12 in two bytes":  {0xfd, 0x8c, 0x00},
		"atomic opcode 0 in two bytes": {0xfe, 0x80, 0x00},
		"block type -29 in two bytes":  {0x02, 0xe3, 0x7f, 0x0b},
		"block type in five bytes":     {0x02, 0x80, 0x80, 0x80, 0x80, 0x00, 0x0b},
		"heap type in five bytes":      {0x02, 0x63, 0x80, 0x80, 0x80, 0x80, 0x00, 0x0b},
	} {
		if _, err := interrupt.Instrument(module(code), yieldImport, 10); !errors.Is(err, interrupt.ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
	}
	// A block of type (ref null func): the heap type is part of the block
	// type, and the loop inside is instrumented.
	wasm, err := interrupt.Instrument(module([]byte{0x02, 0x63, 0x70, 0x03, 0x40, 0x0b, 0xd0, 0x70, 0x0b, 0x1a}), yieldImport, 10)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	rt := wazero.NewRuntime(ctx)
	defer rt.Close(ctx)
	if _, err := rt.CompileModule(ctx, wasm); err != nil {
		t.Fatalf("the instrumented module does not compile: %v", err)
	}
}

// elementModule imports two functions (0, 1) and defines f2..f9 (each
// returning its index), a start function (10), call(i) = table 0[i]() (11),
// init (12: fills table 0's other slots) and started (13). Table 0 is
// filled by element segments of all eight forms, table.set of ref.func and
// of a global initialised with ref.func, and table.copy from table 1, whose
// own initialiser is ref.func 5. After init, call(i) is want[i].
func elementModule() []byte {
	types := section(1, vec(
		[]byte{0x60, 0, 1, i32},      // 0: () -> i32
		[]byte{0x60, 0, 0},           // 1: () -> ()
		[]byte{0x60, 1, i32, 1, i32}, // 2: (i32) -> i32
	))
	imports := section(2, vec(
		cat(name("env"), name("a"), []byte{0x00}, uleb(2)),
		cat(name("env"), name("b"), []byte{0x00}, uleb(1)),
	))
	funcs := section(3, vec(uleb(0), uleb(0), uleb(0), uleb(0), uleb(0), uleb(0), uleb(0), uleb(0), uleb(1), uleb(2), uleb(1), uleb(0)))
	tables := section(4, vec(
		[]byte{0x70, 0x00, 16},
		[]byte{0x40, 0x00, 0x70, 0x00, 1, 0xd2, 5, 0x0b}, // table 1: 1 slot, initialised with ref.func 5
	))
	globals := section(6, vec(
		[]byte{0x70, 0x00, 0xd2, 6, 0x0b}, // 0: ref.func 6
		[]byte{i32, 0x01, 0x41, 0, 0x0b},  // 1: started flag
	))
	exports := section(7, vec(
		cat(name("call"), []byte{0x00}, uleb(11)),
		cat(name("init"), []byte{0x00}, uleb(12)),
		cat(name("started"), []byte{0x00}, uleb(13)),
		cat(name("two"), []byte{0x00}, uleb(2)),
	))
	start := section(8, uleb(10))
	elements := section(9, vec(
		[]byte{0x00, 0x41, 0, 0x0b, 1, 2},                         // 0: active, table 0[0] = f2
		[]byte{0x01, 0x00, 1, 3},                                  // 1: passive, f3
		[]byte{0x02, 0x00, 0x41, 2, 0x0b, 0x00, 1, 4},             // 2: active, explicit table, [2] = f4
		[]byte{0x03, 0x00, 1, 7},                                  // 3: declarative, f7
		[]byte{0x04, 0x41, 4, 0x0b, 1, 0xd2, 5, 0x0b},             // 4: active, expressions, [4] = f5
		[]byte{0x05, 0x70, 1, 0xd2, 6, 0x0b},                      // 5: passive, expressions, f6
		[]byte{0x06, 0x00, 0x41, 6, 0x0b, 0x70, 1, 0xd2, 8, 0x0b}, // 6: active, explicit table, expressions, [6] = f8
		[]byte{0x07, 0x70, 1, 0xd2, 9, 0x0b},                      // 7: declarative, expressions, f9
	))
	var bodies [][]byte
	for f := byte(2); f <= 9; f++ {
		bodies = append(bodies, body(vec(), []byte{0x41, f}))
	}
	bodies = append(bodies,
		body(vec([]byte{1, i32}), []byte{0x41, 1, 0x24, 1}), // 10: start
		body(vec(), []byte{0x20, 0, 0x11, 0, 0}),            // 11: call
		body(vec(), []byte{0x41, 1, 0x41, 0, 0x41, 1, 0xfc, 12, 1, 0}, // 12: init: table.init seg 1 at [1]
			[]byte{0x41, 5, 0x41, 0, 0x41, 1, 0xfc, 12, 5, 0},  // seg 5 at [5]
			[]byte{0x41, 3, 0xd2, 7, 0x26, 0},                  // [3] = ref.func 7
			[]byte{0x41, 7, 0xd2, 9, 0x26, 0},                  // [7] = ref.func 9
			[]byte{0x41, 8, 0x23, 0, 0x26, 0},                  // [8] = global 0
			[]byte{0x41, 9, 0x41, 0, 0x41, 1, 0xfc, 14, 0, 1}), // [9] = table 1[0]
		body(vec(), []byte{0x23, 1}), // 13: started
	)
	code := section(10, vec(bodies...))
	names := section(0, cat(name("name"),
		[]byte{1}, func() []byte {
			m := vec(cat(uleb(2), name("two")), cat(uleb(10), name("starter")))
			return append(uleb(uint64(len(m))), m...)
		}(),
		[]byte{2}, func() []byte {
			m := vec(cat(uleb(10), vec(cat(uleb(0), name("x")))))
			return append(uleb(uint64(len(m))), m...)
		}()))
	return cat([]byte("\x00asm\x01\x00\x00\x00"), types, imports, funcs, tables, globals, exports, start, elements, code, names)
}

// Element segments of every form, table initialisers, ref.func in globals
// and code, the start function and the name section are renumbered: the
// instrumented module's table holds the functions the original's does.
func TestInstrumentRenumbersEveryElementForm(t *testing.T) {
	orig := elementModule()
	wasm, err := interrupt.Instrument(orig, yieldImport, 3)
	if err != nil {
		t.Fatal(err)
	}
	plain, _ := run(t, orig, 3)
	inst, _ := run(t, wasm, 3)
	want := []int32{2, 3, 4, 7, 5, 6, 8, 9, 6, 5}
	for _, mod := range []api.Module{plain, inst} {
		call(t, mod, "started") // the start function ran
		if _, err := mod.ExportedFunction("init").Call(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	for i, w := range want {
		if got := call(t, plain, "call", uint64(i)); got != w {
			t.Fatalf("original: call(%d) = %d, want %d", i, got, w)
		}
		if got := call(t, inst, "call", uint64(i)); got != w {
			t.Errorf("instrumented: call(%d) = %d, want %d", i, got, w)
		}
	}
	if got := call(t, inst, "started"); got != 1 {
		t.Errorf("started = %d after instrumenting", got)
	}
	if got := inst.ExportedFunction("two").Definition().Name(); got != "two" {
		t.Errorf("name of two is %q after instrumenting", got)
	}
}

// A name section declaring 2^26 local names it does not have costs
// Instrument no more than its size: it stops at the first missing name.
func TestInstrumentHugeNameCountIsCheap(t *testing.T) {
	m := cat(testModule(), section(0, cat(name("name"), []byte{2}, func() []byte {
		m := cat(uleb(1), uleb(fnSum), uleb(1<<26)) // function sum: 2^26 local names, none there
		return append(uleb(uint64(len(m))), m...)
	}())))
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := interrupt.Instrument(m, yieldImport, 10)
	runtime.ReadMemStats(&after)
	if err != nil && !errors.Is(err, interrupt.ErrMalformed) {
		t.Fatal(err)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 1<<20 {
		t.Errorf("Instrument of a %d-byte module allocated %d bytes", len(m), got)
	}
}

// Modules without some or all of the sections Instrument extends get them
// in their places: the output compiles, and a function of a module with
// no import, global or type section of its own yields.
func TestInstrumentMinimalModules(t *testing.T) {
	ctx := context.Background()
	rt := wazero.NewRuntime(ctx)
	defer rt.Close(ctx)
	header := []byte("\x00asm\x01\x00\x00\x00")
	for name, m := range map[string][]byte{
		"empty":       header,
		"memory only": cat(header, section(5, vec([]byte{0x00, 1}))),
		"name only":   cat(header, section(0, cat(name("name"), []byte{1, 1, 0}))),
	} {
		out, err := interrupt.Instrument(m, yieldImport, 10)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if _, err := rt.CompileModule(ctx, out); err != nil {
			t.Errorf("%s: the instrumented module does not compile: %v", name, err)
		}
	}
	// No import or global section: spin() loops 100 times.
	spin := cat(header,
		section(1, vec([]byte{0x60, 0, 1, i32})),
		section(3, vec(uleb(0))),
		section(7, vec(cat(name("spin"), []byte{0x00}, uleb(0)))),
		section(10, vec(body(vec([]byte{1, i32}),
			[]byte{0x41, 0xe4, 0x00, 0x21, 0, 0x03, 0x40, 0x20, 0, 0x41, 1, 0x6b, 0x22, 0, 0x0d, 0, 0x0b, 0x20, 0}))))
	// One entry and 100 loop heads: 101 fuel, the first fuel from the
	// global's initial value, then fuel at a time from each yield. 32 is
	// 64 zigzag-encoded, which read as an SLEB128 i32.const is -64.
	for _, fuel := range []int32{10, 32, 1000} {
		out, err := interrupt.Instrument(spin, yieldImport, fuel)
		if err != nil {
			t.Fatal(err)
		}
		mod, yields := run(t, out, fuel)
		if got := call(t, mod, "spin"); got != 0 {
			t.Errorf("spin() = %d", got)
		}
		want := 0
		if fuel < 101 {
			want = int((101-(fuel+1))/fuel) + 1
		}
		if *yields != want {
			t.Errorf("101 fuel checks at fuel %d yielded %d times, want %d", fuel, *yields, want)
		}
	}
}

// A function declaring more locals than maxLocals (50,000) is refused
// before wazero allocates them: 2^31 i32 locals in a 30-byte module asked
// wazero for 16 GiB.
func TestInstrumentRefusesHugeLocalCounts(t *testing.T) {
	module := func(groups ...[]byte) []byte {
		return cat([]byte("\x00asm\x01\x00\x00\x00"),
			section(1, vec([]byte{0x60, 0, 0})),
			section(3, vec(uleb(0))),
			section(10, vec(body(vec(groups...)))))
	}
	for name, m := range map[string][]byte{
		"2^31 in one group":  module(cat(uleb(1<<31), []byte{i32})),
		"2 groups of 30,000": module(cat(uleb(30000), []byte{i32}), cat(uleb(30000), []byte{0x7e})),
	} {
		if _, err := interrupt.Instrument(m, yieldImport, 10); !errors.Is(err, interrupt.ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
	}
	if _, err := interrupt.Instrument(module(cat(uleb(50000), []byte{i32})), yieldImport, 10); err != nil {
		t.Errorf("50,000 locals: %v", err)
	}
}

// TestACallOfAHostFunctionSpendsTheFuel: a host function's work is not
// counted by the fuel, and one call can be long (a WASI random_get or
// fd_write of tens of MiB: found in review, a guest looping over such
// calls ran past its deadline, since it yielded once per 65,536 of
// them). So every call of an imported function — directly, or by
// call_indirect when an import is in a table — spends the fuel, and the
// guest yields at its next check: at least once per host call.
func TestACallOfAHostFunctionSpendsTheFuel(t *testing.T) {
	const n = 1000
	types := section(1, vec([]byte{0x60, 0, 0}, []byte{0x60, 1, i32, 0}))
	imports := section(2, vec(cat(name("env"), name("slow"), []byte{0x00}, uleb(0))))
	funcs := section(3, vec(uleb(1)))
	exports := section(7, vec(cat(name("loop"), []byte{0x00}, uleb(1))))
	// loop(n): while n != 0 { <call>; n-- }
	loop := func(call []byte) []byte {
		return section(10, vec(body(vec(),
			[]byte{0x02, 0x40, 0x03, 0x40},
			[]byte{0x20, 0, 0x45, 0x0d, 1},
			call,
			[]byte{0x20, 0, 0x41, 1, 0x6b, 0x21, 0},
			[]byte{0x0c, 0, 0x0b, 0x0b})))
	}
	direct := cat([]byte("\x00asm\x01\x00\x00\x00"), types, imports, funcs, exports, loop([]byte{0x10, 0}))
	table := section(4, vec([]byte{0x70, 0x00, 1}))
	elements := section(9, vec(cat([]byte{0x00, 0x41, 0x00, 0x0b}, vec(uleb(0))))) // table[0] = the import
	indirect := cat([]byte("\x00asm\x01\x00\x00\x00"), types, imports, funcs, table, exports, elements,
		loop([]byte{0x41, 0, 0x11, 0, 0})) // call_indirect type 0, table 0
	for name, wasm := range map[string][]byte{"call": direct, "call_indirect": indirect} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			rt := wazero.NewRuntime(ctx)
			defer rt.Close(ctx)
			yields, calls := 0, 0
			if _, err := rt.NewHostModuleBuilder(yieldImport.Import).NewFunctionBuilder().
				WithFunc(func() int32 { yields++; return 1 << 16 }).Export(yieldImport.Name).Instantiate(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := rt.NewHostModuleBuilder("env").NewFunctionBuilder().
				WithFunc(func() { calls++ }).Export("slow").Instantiate(ctx); err != nil {
				t.Fatal(err)
			}
			out, err := interrupt.Instrument(wasm, yieldImport, 1<<16)
			if err != nil {
				t.Fatal(err)
			}
			mod, err := rt.Instantiate(ctx, out)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := mod.ExportedFunction("loop").Call(ctx, n); err != nil {
				t.Fatal(err)
			}
			if calls != n || yields < n {
				t.Errorf("%d host calls made %d yields, want one at least per call", calls, yields)
			}
		})
	}
}
