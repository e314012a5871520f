package wasm

import (
	"fmt"

	"github.com/tetratelabs/wazero/api"

	"github.com/paddock-dev/paddock/wasm/internal/wasmbin"
)

// Section ids of the WebAssembly binary format (core spec, 5.5) that the
// header reader uses.
const (
	secType     = 1
	secImport   = 2
	secFunction = 3
	secExport   = 7
)

// External kinds of imports and exports.
const (
	externFunc   = 0x00
	externTable  = 0x01
	externMemory = 0x02
	externGlobal = 0x03
)

// headerImport is one import of a module, as its header declares it.
type headerImport struct {
	module, name string
	kind         byte
	sig          signature // kind externFunc
}

// headerExport is one export of a module.
type headerExport struct {
	kind  byte
	index uint32    // in the index space of kind
	sig   signature // kind externFunc
}

// header is what Validate checks before compiling: a module's imports and
// exports with the signatures of its functions, read from the type,
// import, function and export sections of the binary.
type header struct {
	imports []headerImport
	exports map[string]headerExport
}

// reader is the binary format's reader (wasmbin.Reader) with the header's
// own reads.
type reader struct{ wasmbin.Reader }

// count reads a vector length, refusing one that cannot fit in what is
// left (each element takes at least one byte).
func (r *reader) count() uint32 {
	n := r.U32()
	if uint64(n) > uint64(len(r.B)) {
		r.Fail(wasmbin.ErrTruncated)
		return 0
	}
	return n
}

func (r *reader) valueTypes() []api.ValueType {
	n := r.count()
	out := make([]api.ValueType, 0, n)
	for range n {
		out = append(out, r.Byte())
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// readHeader reads the imports and exports of a module whose 8-byte
// preamble checkHeader accepted. It reads only section headers and the
// type, import, function and export sections, skipping every other
// section (code included) by its size; what it cannot read is an error
// (the module is not valid WebAssembly).
func readHeader(wasm []byte) (*header, error) {
	h := &header{exports: map[string]headerExport{}}
	var types []signature
	var funcTypes []uint32 // type index of each function, imports first
	r := &reader{wasmbin.Reader{B: wasm[8:]}}
	for len(r.B) > 0 && r.Err == nil {
		id := r.Byte()
		s := &reader{wasmbin.Reader{B: r.Bytes(int(r.U32()))}}
		if r.Err != nil {
			break
		}
		switch id {
		case secType:
			for range s.count() {
				if form := s.Byte(); form != 0x60 && s.Err == nil {
					return nil, fmt.Errorf("type section: unsupported type form 0x%x", form)
				}
				types = append(types, signature{s.valueTypes(), s.valueTypes()})
			}
		case secImport:
			for range s.count() {
				im := headerImport{module: s.Name(), name: s.Name(), kind: s.Byte()}
				switch im.kind {
				case externFunc:
					funcTypes = append(funcTypes, s.U32())
				case externTable:
					s.Byte()
					s.Limits()
				case externMemory:
					s.Limits()
				case externGlobal:
					s.Byte()
					s.Byte()
				default:
					if s.Err == nil {
						return nil, fmt.Errorf("import section: unknown import kind 0x%x", im.kind)
					}
				}
				h.imports = append(h.imports, im)
			}
		case secFunction:
			for range s.count() {
				funcTypes = append(funcTypes, s.U32())
			}
		case secExport:
			for range s.count() {
				// A function's signature is resolved below, once every
				// section is read.
				name := s.Name()
				h.exports[name] = headerExport{kind: s.Byte(), index: s.U32()}
			}
		}
		if s.Err != nil {
			return nil, fmt.Errorf("section %d: %w", id, s.Err)
		}
	}
	if r.Err != nil {
		return nil, fmt.Errorf("section header: %w", r.Err)
	}
	sigOfType := func(ti uint32) (signature, error) {
		if uint64(ti) >= uint64(len(types)) {
			return signature{}, fmt.Errorf("type index %d out of range (%d types)", ti, len(types))
		}
		return types[ti], nil
	}
	fi := 0
	for i := range h.imports {
		if h.imports[i].kind != externFunc {
			continue
		}
		sig, err := sigOfType(funcTypes[fi])
		if err != nil {
			return nil, fmt.Errorf("import %s.%s: %w", h.imports[i].module, h.imports[i].name, err)
		}
		h.imports[i].sig = sig
		fi++
	}
	for name, e := range h.exports {
		if e.kind != externFunc {
			continue
		}
		idx := e.index
		if uint64(idx) >= uint64(len(funcTypes)) {
			return nil, fmt.Errorf("export %q: function index %d out of range", name, idx)
		}
		sig, err := sigOfType(funcTypes[idx])
		if err != nil {
			return nil, fmt.Errorf("export %q: %w", name, err)
		}
		e.sig = sig
		h.exports[name] = e
	}
	return h, nil
}
