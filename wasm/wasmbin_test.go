package wasm_test

// A minimal WebAssembly binary encoder, enough to hand-write the small
// modules the tests need: modules without our exports, with the wrong
// signatures or imports, and a non-Go guest that answers a fixed result.

import (
	"encoding/binary"
	"errors"
	"fmt"
)

const (
	tI32 byte = 0x7f
	tI64 byte = 0x7e
)

// Instructions used by the tests.
const (
	opUnreachable byte = 0x00
	opI32Const    byte = 0x41
	opI64Const    byte = 0x42
	opEnd         byte = 0x0b
)

type wfunc struct {
	params, results []byte
	body            []byte // instructions, without the final end
	export          string // "" for none
	locals          []byte // types of the locals after the params, one each
}

type wimport struct {
	module, name    string
	params, results []byte
}

type wdata struct {
	offset int32
	bytes  []byte
}

// wmod describes a module; bytes encodes it.
type wmod struct {
	imports  []wimport
	funcs    []wfunc
	memPages int // 0: no memory
	exportMe bool
	data     []wdata
	table    []uint32 // a funcref table holding these function indices (none if empty)
	start    int      // the start function's index plus one (0: none)
}

func uleb(v uint64) []byte { return binary.AppendUvarint(nil, v) }

func sleb(v int64) []byte {
	var out []byte
	for {
		b := byte(v & 0x7f)
		v >>= 7
		if (v == 0 && b&0x40 == 0) || (v == -1 && b&0x40 != 0) {
			return append(out, b)
		}
		out = append(out, b|0x80)
	}
}

func name(s string) []byte { return append(uleb(uint64(len(s))), s...) }

func vec(items ...[]byte) []byte {
	out := uleb(uint64(len(items)))
	for _, it := range items {
		out = append(out, it...)
	}
	return out
}

func section(id byte, content []byte) []byte {
	return append(append([]byte{id}, uleb(uint64(len(content)))...), content...)
}

func functype(params, results []byte) []byte {
	return append(append([]byte{0x60}, vec(bytesOf(params)...)...), vec(bytesOf(results)...)...)
}

func bytesOf(b []byte) [][]byte {
	out := make([][]byte, len(b))
	for i, x := range b {
		out[i] = []byte{x}
	}
	return out
}

func i32Const(v int32) []byte { return append([]byte{opI32Const}, sleb(int64(v))...) }
func i64Const(v int64) []byte { return append([]byte{opI64Const}, sleb(v)...) }

func (m wmod) bytes() []byte {
	out := []byte("\x00asm\x01\x00\x00\x00")
	var types, imports, funcs, exports, codes, datas [][]byte
	for i, im := range m.imports {
		types = append(types, functype(im.params, im.results))
		imports = append(imports, append(append(name(im.module), name(im.name)...), append([]byte{0x00}, uleb(uint64(i))...)...))
	}
	for i, f := range m.funcs {
		ti := len(types)
		types = append(types, functype(f.params, f.results))
		funcs = append(funcs, uleb(uint64(ti)))
		if f.export != "" {
			exports = append(exports, append(name(f.export), append([]byte{0x00}, uleb(uint64(len(m.imports)+i))...)...))
		}
		locals := uleb(uint64(len(f.locals)))
		for _, l := range f.locals {
			locals = append(locals, 0x01, l)
		}
		body := append(append(locals, f.body...), opEnd)
		codes = append(codes, append(uleb(uint64(len(body))), body...))
	}
	if m.exportMe {
		exports = append(exports, append(name("memory"), 0x02, 0x00))
	}
	for _, d := range m.data {
		seg := append([]byte{0x00}, i32Const(d.offset)...)
		seg = append(append(seg, opEnd), uleb(uint64(len(d.bytes)))...)
		datas = append(datas, append(seg, d.bytes...))
	}
	out = append(out, section(1, vec(types...))...)
	if len(imports) > 0 {
		out = append(out, section(2, vec(imports...))...)
	}
	out = append(out, section(3, vec(funcs...))...)
	if len(m.table) > 0 {
		out = append(out, section(4, vec(append([]byte{0x70, 0x00}, uleb(uint64(len(m.table)))...)))...)
	}
	if m.memPages > 0 {
		out = append(out, section(5, vec(append([]byte{0x00}, uleb(uint64(m.memPages))...)))...)
	}
	out = append(out, section(7, vec(exports...))...)
	if m.start > 0 {
		out = append(out, section(8, uleb(uint64(m.start-1)))...)
	}
	if len(m.table) > 0 {
		var idx [][]byte
		for _, f := range m.table {
			idx = append(idx, uleb(uint64(f)))
		}
		out = append(out, section(9, vec(append(append([]byte{0x00}, i32Const(0)...), append([]byte{opEnd}, vec(idx...)...)...)))...)
	}
	out = append(out, section(10, vec(codes...))...)
	if len(datas) > 0 {
		out = append(out, section(11, vec(datas...))...)
	}
	return out
}

// Layout of fixedGuest's memory (2 pages).
const (
	fixedResultAt  = 1024
	fixedRequestAt = 65536
)

// fixedGuest is a non-Go guest with the full ABI (no _initialize) whose
// paddock_turn always returns result, read from a data segment. Overrides
// replace exports by name (e.g. a paddock_alloc returning 0).
func fixedGuest(abiVersion int32, result []byte, overrides ...wfunc) wmod {
	packed := int64(fixedResultAt)<<32 | int64(len(result))
	m := wmod{
		memPages: 2, exportMe: true,
		data: []wdata{{fixedResultAt, result}},
		funcs: []wfunc{
			{export: "paddock_abi_version", results: []byte{tI32}, body: i32Const(abiVersion)},
			{export: "paddock_alloc", params: []byte{tI32}, results: []byte{tI32}, body: i32Const(fixedRequestAt)},
			{export: "paddock_free", params: []byte{tI32}},
			{export: "paddock_turn", params: []byte{tI32, tI32}, results: []byte{tI64}, body: i64Const(packed)},
		},
	}
	for _, o := range overrides {
		for i := range m.funcs {
			if m.funcs[i].export == o.export {
				m.funcs[i] = o
			}
		}
	}
	return m
}

// importedFunctions lists the function imports of a binary module as
// "module.name", read from its import section (enough of a decoder for the
// modules Go and the tests produce).
func importedFunctions(wasm []byte) ([]string, error) {
	if len(wasm) < 8 {
		return nil, errors.New("not a wasm module")
	}
	p := wasm[8:]
	uint := func() uint64 {
		v, n := binary.Uvarint(p)
		if n <= 0 {
			p = nil
			return 0
		}
		p = p[n:]
		return v
	}
	str := func() string {
		n := uint()
		if n > uint64(len(p)) {
			p = nil
			return ""
		}
		s := string(p[:n])
		p = p[n:]
		return s
	}
	next := func() byte {
		if len(p) == 0 {
			return 0
		}
		b := p[0]
		p = p[1:]
		return b
	}
	for len(p) > 0 {
		id, size := next(), uint()
		if size > uint64(len(p)) {
			return nil, errors.New("truncated section")
		}
		if id != 2 {
			p = p[size:]
			continue
		}
		var out []string
		for range uint() {
			mod, name := str(), str()
			switch kind := next(); kind {
			case 0x00: // function: type index
				uint()
				out = append(out, mod+"."+name)
			case 0x01: // table: reftype, limits
				next()
				if next()&1 != 0 {
					uint()
				}
				uint()
			case 0x02: // memory: limits
				if next()&1 != 0 {
					uint()
				}
				uint()
			case 0x03: // global: valtype, mutability
				next()
				next()
			default:
				return nil, fmt.Errorf("import %s.%s of unknown kind %#x", mod, name, kind)
			}
		}
		return out, nil
	}
	return nil, nil
}
