// Package interrupt compiles a fuel check into a WebAssembly module, so
// that the host can stop a guest that spins without wazero's
// WithCloseOnContextDone, which makes every loop iteration an indirect call
// (wazero/wazero#2466: a JSON-bound Go guest turn ~4x slower, the bench's
// hasher turn ~5x).
//
// Instrument adds to the module two mutable i32 globals (the fuel and a
// scratch value) and one imported function, Module.Name (() -> i32), and
// inserts at the entry of every function and at the head of every loop:
//
//	global.get $fuel
//	i32.eqz
//	if
//	  call $yield      ;; the host: stop the guest, or answer new fuel
//	  global.set $fuel
//	end
//	global.get $fuel
//	i32.const 1
//	i32.sub
//	global.set $fuel
//
// Before every call of an imported function (a host function, WASI's
// among them), it spends the fuel (see spend): the fuel cannot see a host
// function's work, so the guest yields at its next check.
//
// Before every bulk instruction (memory.fill, memory.copy, memory.init,
// table.fill, table.copy, table.init, table.grow) it charges the fuel one
// per KiB (or 1024 elements) of the instruction's size (see charge), since
// one such instruction can take milliseconds. A table.grow that would take
// its table past maxTableSize elements fails (see clamp), and a larger
// table is refused: wazero allocates a table whole.
//
// A guest runs at most the fuel's worth of function entries, loop
// iterations and KiB of bulk instructions between two calls to the host
// (a spin that neither loops nor calls is bounded by its code size), so
// the host's yield function can stop it there (panic with a
// sys.ExitError) and, as important, the Go runtime gets a preemption
// point: native wazero code has none, so a guest that never left it would
// block the garbage collector's stop-the-world, and the whole host with
// it.
//
// The new import comes after the module's imported functions, so every
// defined function's index moves up by one: Instrument renumbers them in
// calls (call, return_call), ref.func, exports, the start function,
// element segments, table initialisers, constant expressions and the name
// section. The new globals are the last in the global index space, so no
// global moves; code
// that names a global or function index the original module does not have
// is refused, so that the original code can never reach the fuel. DWARF
// sections (.debug_*), whose code offsets no longer hold, are dropped.
//
// The module is not otherwise validated here: wazero validates the output.
// Instrument only reads as far as it must, and any malformed or unsupported
// input (an opcode it does not know, a truncated section) is an error,
// never a panic.
package interrupt

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"github.com/paddock-dev/paddock/wasm/internal/wasmbin"
)

// Section ids of the WebAssembly binary format (core spec 5.5).
const (
	secCustom   = 0
	secType     = 1
	secImport   = 2
	secFunction = 3
	secTable    = 4
	secGlobal   = 6
	secExport   = 7
	secStart    = 8
	secElement  = 9
	secCode     = 10
)

// sectionOrder is a known section's place in a module (the tag section,
// 13, comes between memory and global; data count, 12, before code), for
// where to insert a new one.
func sectionOrder(id byte) int {
	switch id {
	case 13:
		return 6
	case 6, 7, 8, 9:
		return int(id) + 1
	case 12:
		return 11
	case 10, 11:
		return int(id) + 2
	}
	return int(id)
}

// Module names the import Instrument adds.
type Module struct {
	// Import is the module name of the yield import, Name its field name.
	Import, Name string
}

// ErrMalformed wraps every error of Instrument: the input is not a module
// it can instrument (malformed, or using an encoding it does not know).
var ErrMalformed = errors.New("interrupt: cannot instrument module")

// counts is what Instrument learns of the index spaces.
type counts struct {
	importedFuncs, definedFuncs     uint32
	importedGlobals, definedGlobals uint32
	types                           uint32
}

func (c counts) funcs() uint32   { return c.importedFuncs + c.definedFuncs }
func (c counts) globals() uint32 { return c.importedGlobals + c.definedGlobals }

// section is one section of the input, its content unparsed.
type section struct {
	id      byte
	content []byte
}

// Instrument returns a copy of wasm (a binary module) with the fuel check
// described in the package doc; the yield import is m. initialFuel (> 0) is
// the fuel global's initial value. Errors wrap ErrMalformed.
func Instrument(wasm []byte, m Module, initialFuel int32) (out []byte, err error) {
	defer func() {
		if err != nil {
			err = fmt.Errorf("%w: %w", ErrMalformed, err)
		}
	}()
	if initialFuel <= 0 {
		return nil, fmt.Errorf("initial fuel %d, want > 0", initialFuel)
	}
	if len(wasm) < 8 || string(wasm[:4]) != "\x00asm" || binary.LittleEndian.Uint32(wasm[4:8]) != 1 {
		return nil, errors.New("not a version 1 WebAssembly binary")
	}
	var secs []section
	r := &wasmbin.Reader{B: wasm[8:]}
	for len(r.B) > 0 {
		id := r.Byte()
		n := r.U32()
		content := r.Bytes(int(n))
		if r.Err != nil {
			return nil, fmt.Errorf("section %d: %w", id, r.Err)
		}
		secs = append(secs, section{id, content})
	}
	var c counts
	for _, s := range secs {
		var err error
		switch s.id {
		case secType:
			c.types, err = vecCount(s.content)
		case secImport:
			c.importedFuncs, c.importedGlobals, err = countImports(s.content)
		case secFunction:
			c.definedFuncs, err = vecCount(s.content)
		case secGlobal:
			c.definedGlobals, err = vecCount(s.content)
		}
		if err != nil {
			return nil, fmt.Errorf("section %d: %w", s.id, err)
		}
	}
	yieldType := c.types
	yield := c.importedFuncs // the new import's function index
	fuel := c.globals()      // the new global's index
	rn := renumber{c: c, escaped: new(bool)}
	has := map[byte]bool{}
	for i, s := range secs {
		has[s.id] = true
		var content []byte
		var err error
		switch s.id {
		case secType:
			content, err = appendEntry(s.content, []byte{0x60, 0x00, 0x01, 0x7f})
		case secImport:
			content, err = appendEntry(s.content, importEntry(m, yieldType))
		case secTable:
			content, err = rn.tables(s.content)
		case secGlobal:
			content, err = rn.globals(s.content, initialFuel)
		case secExport:
			content, err = rn.exports(s.content)
		case secStart:
			content, err = rn.start(s.content)
		case secElement:
			content, err = rn.elements(s.content)
		case secCode:
			ins := instrumentation{check(fuel, yield), charge(fuel, fuel+1, yield), fuel + 1, spend(fuel), *rn.escaped}
			content, err = rn.code(s.content, ins)
			if err == nil && *rn.escaped && !ins.spendIndirect {
				// A ref.func of an import in the code: again, with every
				// call_indirect spending the fuel.
				ins.spendIndirect = true
				content, err = rn.code(s.content, ins)
			}
		case secCustom:
			content, err = rn.custom(s.content)
		default:
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("section %d: %w", s.id, err)
		}
		secs[i].content = content
	}
	if !has[secType] {
		secs = insertSection(secs, section{secType, []byte{1, 0x60, 0x00, 0x01, 0x7f}})
	}
	if !has[secImport] {
		secs = insertSection(secs, section{secImport, append([]byte{1}, importEntry(m, yieldType)...)})
	}
	if !has[secGlobal] {
		secs = insertSection(secs, section{secGlobal, append([]byte{2}, newGlobals(initialFuel)...)})
	}
	out = append(make([]byte, 0, len(wasm)+len(wasm)/8), wasm[:8]...)
	for _, s := range secs {
		if s.content == nil && s.id == secCustom {
			continue // dropped
		}
		out = append(out, s.id)
		out = binary.AppendUvarint(out, uint64(len(s.content)))
		out = append(out, s.content...)
	}
	return out, nil
}

// insertSection inserts s before the first known section that must follow
// it (custom sections keep their places).
func insertSection(secs []section, s section) []section {
	at := len(secs)
	for i, o := range secs {
		if o.id != secCustom && sectionOrder(o.id) > sectionOrder(s.id) {
			at = i
			break
		}
	}
	secs = append(secs, section{})
	copy(secs[at+1:], secs[at:])
	secs[at] = s
	return secs
}

// check is the instrumented sequence of the package doc.
func check(fuel, yield uint32) []byte {
	g := binary.AppendUvarint(nil, uint64(fuel))
	b := append([]byte{0x23}, g...)            // global.get $fuel
	b = append(b, 0x45, 0x04, 0x40, 0x10)      // i32.eqz; if; call
	b = binary.AppendUvarint(b, uint64(yield)) // $yield
	b = append(append(b, 0x24), g...)          // global.set $fuel
	b = append(b, 0x0b)                        // end
	b = append(append(b, 0x23), g...)          // global.get $fuel
	b = append(b, 0x41, 0x01, 0x6b)            // i32.const 1; i32.sub
	return append(append(b, 0x24), g...)       // global.set $fuel
}

func importEntry(m Module, typeIdx uint32) []byte {
	b := appendName(nil, m.Import)
	b = appendName(b, m.Name)
	b = append(b, 0x00) // func
	return binary.AppendUvarint(b, uint64(typeIdx))
}

// bulkShift: a bulk instruction of n bytes or elements costs n>>bulkShift
// fuel, one per KiB of memory: a loop iteration and a KiB of memory.fill
// take about as long, tens of nanoseconds.
const bulkShift = 10

// charge is the sequence inserted before a bulk instruction (memory.fill,
// memory.copy, memory.init, table.fill, table.copy, table.init,
// table.grow), whose last operand, on top of the stack, is its size n:
//
//	global.set $n
//	global.get $n  i32.const bulkShift  i32.shr_u   ;; cost
//	global.get $fuel
//	i32.ge_u
//	if                 ;; the fuel does not cover it: the host first
//	  call $yield
//	  global.set $fuel
//	else
//	  global.get $fuel  global.get $n  i32.const bulkShift  i32.shr_u  i32.sub
//	  global.set $fuel
//	end
//	global.get $n
//
// Without it a loop of 16 MiB fills ran 65536 of them (minutes) between
// two yields: one fuel each.
func charge(fuel, n, yield uint32) []byte {
	f := binary.AppendUvarint(nil, uint64(fuel))
	g := binary.AppendUvarint(nil, uint64(n))
	cost := append(append([]byte{0x23}, g...), 0x41, bulkShift, 0x76) // global.get $n; i32.const; i32.shr_u
	b := append([]byte{0x24}, g...)                                   // global.set $n
	b = append(b, cost...)
	b = append(append(b, 0x23), f...)          // global.get $fuel
	b = append(b, 0x4f, 0x04, 0x40, 0x10)      // i32.ge_u; if; call
	b = binary.AppendUvarint(b, uint64(yield)) // $yield
	b = append(append(b, 0x24), f...)          // global.set $fuel
	b = append(b, 0x05)                        // else
	b = append(append(b, 0x23), f...)          // global.get $fuel
	b = append(append(b, cost...), 0x6b)       // cost; i32.sub
	b = append(append(b, 0x24), f...)          // global.set $fuel
	b = append(b, 0x0b)                        // end
	return append(append(b, 0x23), g...)       // global.get $n
}

// maxLocals bounds the locals a function declares, as browsers' engines
// do: wazero allocates for each declared local up front (2^31 locals, a
// 30-byte module, asked for 16 GiB and killed the host).
const maxLocals = 50000

// oneByteValtype reports the value types of one byte: i32, i64, f32, f64,
// v128, funcref, externref.
func oneByteValtype(t byte) bool {
	switch t {
	case 0x7f, 0x7e, 0x7d, 0x7c, 0x7b, 0x70, 0x6f:
		return true
	}
	return false
}

// bulk reports the sub-opcodes of 0xfc charged by size: memory.init,
// memory.copy, memory.fill, table.init, table.copy, table.grow, table.fill.
func bulk(sub uint64) bool {
	switch sub {
	case 8, 10, 11, 12, 14, 15, 17:
		return true
	}
	return false
}

// maxTableSize bounds the elements of a table, at its definition and
// through table.grow: wazero allocates a table's slice whole, and one
// table.grow of 2^31 elements asked for 16 GiB (Go guests declare a few
// thousand functions' table, with no maximum).
const maxTableSize = 1 << 20

// instrumentation is what Instrument inserts into code.
type instrumentation struct {
	check  []byte // at function entries and loop heads
	charge []byte // before bulk instructions
	n      uint32 // the scratch global of charge
	// spend is inserted before every call of an imported function (and,
	// with spendIndirect, before every call_indirect): see spend.
	spend         []byte
	spendIndirect bool
}

// spend is the sequence inserted before a call of a host function:
//
//	i32.const 0
//	global.set $fuel
//
// The fuel counts guest work; a host function's work it cannot see, and
// one call can take a long time (a WASI random_get or fd_write of tens of
// MiB: found in review, a guest looping over such calls ran past its
// turn's deadline, its cancellation and the host's shutdown, since it
// yielded once per 65,536 of them). With its fuel spent, the guest yields
// at its next check, once per host call at most: a turn overruns its stop
// by one host call. A module that puts an imported function in a table
// (an element, a ref.func) could call it by call_indirect, so there every
// call_indirect spends the fuel too.
func spend(fuel uint32) []byte {
	return append([]byte{0x41, 0x00, 0x24}, binary.AppendUvarint(nil, uint64(fuel))...)
}

// clamp is the sequence inserted before table.grow of table (after its
// charge): a size that would take the table past maxTableSize becomes -1,
// which table.grow refuses (it answers -1, the guest's out of memory).
//
//	global.set $n
//	i32.const -1
//	global.get $n
//	table.size table  i64.extend_i32_u  global.get $n  i64.extend_i32_u  i64.add
//	i64.const maxTableSize
//	i64.gt_u
//	select
func (ins instrumentation) clamp(table uint32) []byte {
	g := binary.AppendUvarint(nil, uint64(ins.n))
	b := append(append([]byte{0x24}, g...), 0x41, 0x7f) // global.set $n; i32.const -1
	b = append(append(b, 0x23), g...)                   // global.get $n
	b = binary.AppendUvarint(append(b, 0xfc, 16), uint64(table))
	b = append(append(append(b, 0xad, 0x23), g...), 0xad, 0x7c) // i64.extend_i32_u; global.get $n; i64.extend_i32_u; i64.add
	b = appendSLEB(append(b, 0x42), maxTableSize)               // i64.const
	return append(b, 0x56, 0x1b)                                // i64.gt_u; select
}

// newGlobals are the globals Instrument adds: the fuel and the scratch
// global of charge.
func newGlobals(initial int32) []byte {
	b := []byte{0x7f, 0x01, 0x41} // i32, mutable, i32.const
	b = appendSLEB(b, int64(initial))
	return append(b, 0x0b, 0x7f, 0x01, 0x41, 0x00, 0x0b)
}

// appendSLEB appends v as a signed LEB128 number (binary.AppendVarint is
// zigzag: 32 became 64, which an i32.const reads as -64).
func appendSLEB(b []byte, v int64) []byte {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if (v == 0 && c&0x40 == 0) || (v == -1 && c&0x40 != 0) {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}

func appendName(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// vecCount reads the element count of a section that is one vector.
func vecCount(content []byte) (uint32, error) {
	r := &wasmbin.Reader{B: content}
	n := r.U32()
	return n, r.Err
}

// appendEntry returns the vector content with entry appended (its count
// plus one, the entries copied).
func appendEntry(content, entry []byte) ([]byte, error) {
	r := &wasmbin.Reader{B: content}
	n := r.U32()
	if r.Err != nil {
		return nil, r.Err
	}
	if n == ^uint32(0) {
		return nil, errors.New("vector too long")
	}
	b := binary.AppendUvarint(make([]byte, 0, len(content)+len(entry)+5), uint64(n+1))
	b = append(b, r.B...)
	return append(b, entry...), nil
}

// countImports counts the imported functions and globals.
func countImports(content []byte) (funcs, globals uint32, err error) {
	r := &wasmbin.Reader{B: content}
	n := r.U32()
	for range n {
		r.Name()
		r.Name()
		switch kind := r.Byte(); kind {
		case 0x00: // func: typeidx
			r.U32()
			funcs++
		case 0x01: // table: reftype, limits
			r.Valtype()
			r.Limits()
		case 0x02: // memory: limits
			r.Limits()
		case 0x03: // global: valtype, mut
			r.Valtype()
			r.Byte()
			globals++
		case 0x04: // tag: attribute, typeidx
			r.Byte()
			r.U32()
		default:
			r.Fail(fmt.Errorf("import kind %#x", kind))
		}
		if r.Err != nil {
			return 0, 0, r.Err
		}
	}
	if r.Err == nil && len(r.B) != 0 {
		r.Fail(errors.New("bytes after the last import"))
	}
	return funcs, globals, r.Err
}

// renumber rewrites function indices (≥ importedFuncs: +1) and refuses
// indices outside the original index spaces.
type renumber struct {
	c counts
	// escaped is set when an imported function's index is taken as a
	// value (an element segment, ref.func): the function can then be
	// called through a table, by call_indirect.
	escaped *bool
}

// fn maps an original function index to the instrumented module's.
func (rn renumber) fn(idx uint32) (uint32, error) {
	if idx >= rn.c.funcs() {
		return 0, fmt.Errorf("function index %d out of range (%d functions)", idx, rn.c.funcs())
	}
	if idx >= rn.c.importedFuncs {
		idx++
	}
	return idx, nil
}

// copyFunc copies one function index from r to w, renumbered.
func (rn renumber) copyFunc(r *wasmbin.Reader, w []byte) []byte {
	idx := r.U32()
	if r.Err != nil {
		return w
	}
	n, err := rn.fn(idx)
	if err != nil {
		r.Fail(err)
		return w
	}
	return binary.AppendUvarint(w, uint64(n))
}

// copyFuncRef is copyFunc for an index taken as a value (an element, a
// ref.func): an imported function's sets rn.escaped.
func (rn renumber) copyFuncRef(r *wasmbin.Reader, w []byte) []byte {
	if idx, n := binary.Uvarint(r.B); n > 0 && idx < uint64(rn.c.importedFuncs) {
		*rn.escaped = true
	}
	return rn.copyFunc(r, w)
}

// copyGlobal copies one global index from r to w, refusing one outside
// the original module's globals (the fuel's and charge's come after).
func (rn renumber) copyGlobal(r *wasmbin.Reader, w []byte) []byte {
	idx := r.U32()
	if r.Err == nil && idx >= rn.c.globals() {
		r.Fail(fmt.Errorf("global index %d out of range (%d globals)", idx, rn.c.globals()))
	}
	return binary.AppendUvarint(w, uint64(idx))
}

// constExpr copies a constant expression up to and including its end,
// renumbering ref.func and checking global.get.
func (rn renumber) constExpr(r *wasmbin.Reader, w []byte) []byte {
	for r.Err == nil {
		op := r.Byte()
		w = append(w, op)
		switch op {
		case 0x0b: // end
			return w
		case 0x41, 0x42: // i32.const, i64.const
			w = r.CopyLEB(w)
		case 0x43:
			w = append(w, r.Bytes(4)...)
		case 0x44:
			w = append(w, r.Bytes(8)...)
		case 0x23: // global.get
			w = rn.copyGlobal(r, w)
		case 0xd0: // ref.null heaptype
			w = r.CopyLEB(w)
		case 0xd2: // ref.func
			w = rn.copyFuncRef(r, w)
		case 0x6a, 0x6b, 0x6c, 0x7c, 0x7d, 0x7e: // extended-const add/sub/mul
		case 0xfd: // v128.const
			sub := r.U32()
			if r.Err == nil && sub != 12 {
				r.Fail(fmt.Errorf("opcode 0xfd %d in a constant expression", sub))
			}
			w = binary.AppendUvarint(w, uint64(sub))
			w = append(w, r.Bytes(16)...)
		default:
			r.Fail(fmt.Errorf("opcode %#x in a constant expression", op))
		}
	}
	return w
}

// globals copies the global section, renumbering its initialisers, and
// appends the fuel global.
func (rn renumber) globals(content []byte, initial int32) ([]byte, error) {
	r := &wasmbin.Reader{B: content}
	n := r.U32()
	if r.Err == nil && n >= ^uint32(0)-1 {
		r.Fail(errors.New("vector too long"))
	}
	w := binary.AppendUvarint(make([]byte, 0, len(content)+16), uint64(n+2))
	for range n {
		if r.Err != nil {
			break
		}
		w = r.CopyValtype(w)
		w = append(w, r.Byte()) // mut
		w = rn.constExpr(r, w)
	}
	if err := r.End(); err != nil {
		return nil, err
	}
	return append(w, newGlobals(initial)...), nil
}

// tables copies the table section, renumbering the ref.func of table
// initialisers (0x40 0x00 tabletype expr) and refusing a table of more
// than maxTableSize elements.
func (rn renumber) tables(content []byte) ([]byte, error) {
	r := &wasmbin.Reader{B: content}
	n := r.U32()
	w := binary.AppendUvarint(make([]byte, 0, len(content)+8), uint64(n))
	for range n {
		if r.Err != nil {
			break
		}
		init := len(r.B) > 0 && r.B[0] == 0x40
		if init {
			w = append(w, r.Byte())
			if reserved := r.Byte(); r.Err == nil && reserved != 0x00 {
				r.Fail(fmt.Errorf("table initialiser prefix 0x40 %#x", reserved))
			}
			w = append(w, 0x00)
		}
		w = r.CopyValtype(w)
		start := r.B
		r.Limits()
		if r.Err != nil {
			break
		}
		lr := &wasmbin.Reader{B: start[1:]}
		if min := lr.U32(); lr.Err != nil || min > maxTableSize {
			r.Fail(fmt.Errorf("table of %d elements (at most %d)", min, maxTableSize))
			break
		}
		w = append(w, start[:len(start)-len(r.B)]...)
		if init {
			w = rn.constExpr(r, w)
		}
	}
	if err := r.End(); err != nil {
		return nil, err
	}
	return w, nil
}

func (rn renumber) exports(content []byte) ([]byte, error) {
	r := &wasmbin.Reader{B: content}
	n := r.U32()
	w := binary.AppendUvarint(make([]byte, 0, len(content)+8), uint64(n))
	for range n {
		if r.Err != nil {
			break
		}
		nm := r.Name()
		w = appendName(w, nm)
		kind := r.Byte()
		w = append(w, kind)
		switch kind {
		case 0x00:
			w = rn.copyFunc(r, w)
		case 0x03: // global: not one Instrument adds
			w = rn.copyGlobal(r, w)
		default:
			w = r.CopyLEB(w)
		}
	}
	if err := r.End(); err != nil {
		return nil, err
	}
	return w, nil
}

func (rn renumber) start(content []byte) ([]byte, error) {
	r := &wasmbin.Reader{B: content}
	w := rn.copyFunc(r, nil)
	if err := r.End(); err != nil {
		return nil, err
	}
	return w, nil
}

// elements copies the element section (flags 0-7, core spec 5.5.12),
// renumbering function indices and ref.func.
func (rn renumber) elements(content []byte) ([]byte, error) {
	r := &wasmbin.Reader{B: content}
	n := r.U32()
	w := binary.AppendUvarint(make([]byte, 0, len(content)+8), uint64(n))
	for range n {
		if r.Err != nil {
			break
		}
		flags := r.U32()
		if r.Err == nil && flags > 7 {
			r.Fail(fmt.Errorf("element segment flags %d", flags))
			break
		}
		w = binary.AppendUvarint(w, uint64(flags))
		if flags&0x02 != 0 && flags&0x01 == 0 { // 2, 6: explicit table index
			w = r.CopyLEB(w)
		}
		if flags&0x01 == 0 { // active: offset
			w = rn.constExpr(r, w)
		}
		exprs := flags&0x04 != 0
		if flags&0x03 != 0 { // 1, 2, 3, 5, 6, 7: elemkind or reftype
			if exprs {
				w = r.CopyValtype(w)
			} else {
				w = append(w, r.Byte())
			}
		}
		count := r.U32()
		w = binary.AppendUvarint(w, uint64(count))
		for range count {
			if r.Err != nil {
				break
			}
			if exprs {
				w = rn.constExpr(r, w)
			} else {
				w = rn.copyFuncRef(r, w)
			}
		}
	}
	if err := r.End(); err != nil {
		return nil, err
	}
	return w, nil
}

// custom renumbers the name section's function-indexed maps and drops
// DWARF sections; others are kept as they are. A name section that does
// not parse is dropped (it is debug information: wazero names frames
// with it, nothing depends on it).
func (rn renumber) custom(content []byte) ([]byte, error) {
	r := &wasmbin.Reader{B: content}
	nm := r.Name()
	if r.Err != nil {
		return nil, r.Err
	}
	switch {
	case strings.HasPrefix(nm, ".debug_"):
		return nil, nil
	case nm != "name":
		return content, nil
	}
	w := appendName(make([]byte, 0, len(content)+16), nm)
	for len(r.B) > 0 && r.Err == nil {
		id := r.Byte()
		sub := &wasmbin.Reader{B: r.Bytes(int(r.U32()))}
		if r.Err != nil {
			break
		}
		var body []byte
		switch id {
		case 1: // function names: namemap
			body = rn.nameMap(sub, nil)
		case 2, 3: // local and label names: indirect namemap by function
			n := sub.U32()
			body = binary.AppendUvarint(nil, uint64(n))
			for range n {
				if sub.Err != nil {
					break
				}
				body = rn.copyFunc(sub, body)
				inner := sub.U32()
				body = binary.AppendUvarint(body, uint64(inner))
				for range inner {
					if sub.Err != nil {
						break
					}
					body = sub.CopyLEB(body)
					body = appendName(body, sub.Name())
				}
			}
		default:
			body = sub.B
			sub.B = nil
		}
		if err := sub.End(); err != nil {
			return nil, nil // malformed names: drop the section
		}
		w = append(w, id)
		w = binary.AppendUvarint(w, uint64(len(body)))
		w = append(w, body...)
	}
	if r.Err != nil {
		return nil, nil
	}
	return w, nil
}

func (rn renumber) nameMap(r *wasmbin.Reader, w []byte) []byte {
	n := r.U32()
	w = binary.AppendUvarint(w, uint64(n))
	for range n {
		if r.Err != nil {
			break
		}
		w = rn.copyFunc(r, w)
		w = appendName(w, r.Name())
	}
	return w
}

// code copies the code section with ins.check inserted at every
// function's entry and loop head and ins.charge before every bulk
// instruction, function indices renumbered.
func (rn renumber) code(content []byte, ins instrumentation) ([]byte, error) {
	r := &wasmbin.Reader{B: content}
	n := r.U32()
	if r.Err == nil && n != rn.c.definedFuncs {
		return nil, fmt.Errorf("%d function bodies for %d functions", n, rn.c.definedFuncs)
	}
	w := binary.AppendUvarint(make([]byte, 0, len(content)+len(content)/4), uint64(n))
	var body []byte
	for i := range n {
		size := r.U32()
		b := &wasmbin.Reader{B: r.Bytes(int(size))}
		if r.Err != nil {
			return nil, fmt.Errorf("function body %d: %w", i, r.Err)
		}
		var err error
		if body, err = rn.body(b, body[:0], ins); err != nil {
			return nil, fmt.Errorf("function body %d: %w", i, err)
		}
		w = binary.AppendUvarint(w, uint64(len(body)))
		w = append(w, body...)
	}
	if err := r.End(); err != nil {
		return nil, err
	}
	return w, nil
}

// body copies one function body: its locals, ins.check, then its instructions
// with ins.check after every loop's block type and ins.charge before
// every bulk instruction.
func (rn renumber) body(r *wasmbin.Reader, w []byte, ins instrumentation) ([]byte, error) {
	groups := r.U32()
	w = binary.AppendUvarint(w, uint64(groups))
	var locals uint64
	for range groups {
		if r.Err != nil {
			break
		}
		n := r.U32()
		if locals += uint64(n); r.Err == nil && locals > maxLocals {
			r.Fail(fmt.Errorf("more than %d locals", maxLocals))
		}
		w = binary.AppendUvarint(w, uint64(n))
		w = r.CopyValtype(w)
	}
	w = append(w, ins.check...)
	for len(r.B) > 0 && r.Err == nil {
		op := r.Byte()
		w = append(w, op)
		switch {
		case op == 0x03: // loop bt
			w = r.CopyBlockType(w)
			w = append(w, ins.check...)
		case op == 0x02, op == 0x04: // block, if: blocktype
			w = r.CopyBlockType(w)
		case op == 0x10, op == 0x12: // call, return_call
			if idx, n := binary.Uvarint(r.B); n > 0 && idx < uint64(rn.c.importedFuncs) {
				// A host function: the fuel is spent, so that the next
				// check yields (see spend).
				w = append(append(w[:len(w)-1], ins.spend...), op)
			}
			w = rn.copyFunc(r, w)
		case op == 0xd2: // ref.func
			w = rn.copyFuncRef(r, w)
		case op == 0x11, op == 0x13: // call_indirect, return_call_indirect: type, table
			if ins.spendIndirect {
				w = append(append(w[:len(w)-1], ins.spend...), op)
			}
			w = r.CopyLEB(w)
			w = r.CopyLEB(w)
		case op == 0x0c, op == 0x0d, op == 0x20, op == 0x21, op == 0x22, op == 0x25, op == 0x26,
			op == 0x3f, op == 0x40: // br, br_if, local.*, table.get/set, memory.size/grow
			w = r.CopyLEB(w)
		case op == 0x23, op == 0x24: // global.get/set
			w = rn.copyGlobal(r, w)
		case op == 0x0e: // br_table vec(label) label
			k := r.U32()
			w = binary.AppendUvarint(w, uint64(k))
			for range k {
				if r.Err != nil {
					break
				}
				w = r.CopyLEB(w)
			}
			w = r.CopyLEB(w)
		case op == 0x1c: // select t*
			// One value type of one byte: wazero's compiler skips two
			// bytes after 0x1c whatever its validator read (a (ref null
			// ht) type: the heap type compiled as code).
			k := r.U32()
			t := r.Byte()
			if r.Err == nil && (k != 1 || !oneByteValtype(t)) {
				r.Fail(fmt.Errorf("select with %d types, the first %#x", k, t))
			}
			w = append(w, byte(k), t)
		case op >= 0x28 && op <= 0x3e: // loads and stores
			w = r.CopyMemarg(w)
		case op == 0x41, op == 0x42: // i32.const, i64.const
			w = r.CopyLEB(w)
		case op == 0x43:
			w = append(w, r.Bytes(4)...)
		case op == 0x44:
			w = append(w, r.Bytes(8)...)
		case op == 0xd0: // ref.null heaptype
			w = r.CopyLEB(w)
		case op == 0x00, op == 0x01, op == 0x05, op == 0x0b, op == 0x0f, op == 0x1a, op == 0x1b,
			op >= 0x45 && op <= 0xc4, op == 0xd1: // no immediates
		case op == 0xfc:
			if sub, n := binary.Uvarint(r.B); n > 0 && bulk(sub) {
				w = append(append(w[:len(w)-1], ins.charge...), op)
				if table, m := binary.Uvarint(r.B[n:]); sub == 15 && m > 0 && table <= 0xffffffff {
					w = append(append(w[:len(w)-1], ins.clamp(uint32(table))...), op)
				}
			}
			w = r.CopyPrefixFC(w)
		case op == 0xfd:
			w = r.CopyPrefixFD(w)
		case op == 0xfe:
			w = r.CopyPrefixFE(w)
		default:
			r.Fail(fmt.Errorf("opcode %#x", op))
		}
	}
	if r.Err != nil {
		return nil, r.Err
	}
	if len(w) == 0 || w[len(w)-1] != 0x0b {
		return nil, errors.New("function body does not end with end")
	}
	return w, nil
}
