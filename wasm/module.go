package wasm

import (
	"bytes"
	"fmt"
	"slices"
	"strings"

	"github.com/tetratelabs/wazero/api"

	"github.com/paddock-dev/paddock/abi"
)

// Reasons of a ModuleError.
const (
	// ReasonNotWasm: the bytes are not a WebAssembly binary module.
	ReasonNotWasm = "not_wasm"
	// ReasonTooLarge: the module exceeds Config.MaxModuleBytes.
	ReasonTooLarge = "too_large"
	// ReasonInvalidWasm: wazero refused to compile the module.
	ReasonInvalidWasm = "invalid_wasm"
	// ReasonCommandModule: a WASI command (exports _start, not
	// _initialize); Go guests must be built with -buildmode=c-shared.
	ReasonCommandModule = "command_module"
	// ReasonMissingExports: required exports are missing (see Missing)
	// or have the wrong signature (see Mismatched).
	ReasonMissingExports = "missing_exports"
	// ReasonBadImports: the module imports something the host does not
	// provide (see Unresolved).
	ReasonBadImports = "bad_imports"
	// ReasonInitFailed: instantiating the module or calling
	// paddock_abi_version failed (see Err).
	ReasonInitFailed = "init_failed"
	// ReasonABIVersion: the module speaks another major version of the
	// turn contract (see ABIVersion).
	ReasonABIVersion = "abi_version"
)

// ModuleError says why a module cannot serve turns. It is the uploader's
// fault (HTTP 400), and stable: loading the same bytes again fails the
// same way.
type ModuleError struct {
	// Digest is the module's content address.
	Digest string
	// Reason is one of the Reason constants.
	Reason string
	// Missing lists the required exports that are absent, in ABI order.
	Missing []string
	// Mismatched lists exports present with the wrong signature, each as
	// "name: want (params) -> results, have ...".
	Mismatched []string
	// Unresolved lists imports the host does not provide, as "module.name"
	// (with the signature when only it differs).
	Unresolved []string
	// ABIVersion is the version the module reported (ReasonABIVersion).
	ABIVersion int
	// Err is the underlying error, if any.
	Err error
}

// Error names every problem found, e.g. `wasm module sha256:…: missing
// exports paddock_alloc, paddock_turn (not a Paddock v1 agent module; see
// abi/README.md)`.
func (e *ModuleError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "wasm module %s: ", e.Digest)
	switch e.Reason {
	case ReasonNotWasm, ReasonTooLarge:
		b.WriteString(e.Err.Error())
	case ReasonInvalidWasm:
		fmt.Fprintf(&b, "invalid WebAssembly: %v", e.Err)
	case ReasonCommandModule:
		b.WriteString("is a WASI command module (exports _start, not _initialize); build a reactor, e.g. GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared")
	case ReasonMissingExports:
		var parts []string
		if len(e.Missing) > 0 {
			parts = append(parts, "missing exports "+strings.Join(e.Missing, ", "))
		}
		if len(e.Mismatched) > 0 {
			parts = append(parts, "wrong export signatures "+strings.Join(e.Mismatched, "; "))
		}
		fmt.Fprintf(&b, "%s (not a Paddock v%d agent module; see abi/README.md)", strings.Join(parts, "; "), abi.Version)
	case ReasonBadImports:
		fmt.Fprintf(&b, "imports the host does not provide: %s (allowed: module %q and wasi_snapshot_preview1)",
			strings.Join(e.Unresolved, ", "), HostModule)
	case ReasonInitFailed:
		fmt.Fprintf(&b, "failed to initialise: %v", e.Err)
	case ReasonABIVersion:
		fmt.Fprintf(&b, "speaks turn ABI v%d, this host speaks v%d", e.ABIVersion, abi.Version)
	default:
		fmt.Fprintf(&b, "%s: %v", e.Reason, e.Err)
	}
	return b.String()
}

// Unwrap returns the underlying error.
func (e *ModuleError) Unwrap() error { return e.Err }

// wasmMagic is the header of a core WebAssembly binary module, version 1.
var wasmMagic = []byte("\x00asm\x01\x00\x00\x00")

// checkHeader refuses what is not a core wasm module before compiling it.
func checkHeader(wasm []byte, maxBytes int) *ModuleError {
	switch {
	case len(wasm) > maxBytes:
		return &ModuleError{Reason: ReasonTooLarge,
			Err: fmt.Errorf("module is %d bytes, limit %d", len(wasm), maxBytes)}
	case len(wasm) < 8 || !bytes.Equal(wasm[:4], wasmMagic[:4]):
		return &ModuleError{Reason: ReasonNotWasm,
			Err: fmt.Errorf("not a WebAssembly binary (%d bytes, no \\0asm header)", len(wasm))}
	case !bytes.Equal(wasm[4:8], wasmMagic[4:8]):
		return &ModuleError{Reason: ReasonNotWasm,
			Err: fmt.Errorf("WebAssembly binary version %x is not a core module (version 1); components are not supported", wasm[4:8])}
	}
	return nil
}

// signature is a function type in ABI notation.
type signature struct {
	params, results []api.ValueType
}

func (s signature) String() string {
	names := func(ts []api.ValueType) string {
		out := make([]string, len(ts))
		for i, t := range ts {
			out[i] = api.ValueTypeName(t)
		}
		return "(" + strings.Join(out, ", ") + ")"
	}
	return names(s.params) + " -> " + names(s.results)
}

func (s signature) equal(o signature) bool {
	return slices.Equal(s.params, o.params) && slices.Equal(s.results, o.results)
}

func sigOf(d api.FunctionDefinition) signature {
	return signature{nilIfEmpty(d.ParamTypes()), nilIfEmpty(d.ResultTypes())}
}

func nilIfEmpty(ts []api.ValueType) []api.ValueType {
	if len(ts) == 0 {
		return nil
	}
	return ts
}

var (
	i32 = api.ValueTypeI32
	i64 = api.ValueTypeI64
)

// requiredExports are the functions of the guest ABI, in documentation order.
var requiredExports = []struct {
	name string
	sig  signature
}{
	{ExportABIVersion, signature{nil, []api.ValueType{i32}}},
	{ExportAlloc, signature{[]api.ValueType{i32}, []api.ValueType{i32}}},
	{ExportFree, signature{[]api.ValueType{i32}, nil}},
	{ExportTurn, signature{[]api.ValueType{i32, i32}, []api.ValueType{i64}}},
}

// checkInterface checks a module's imports, then its exports, against the
// ABI, from its header (readHeader), before anything is compiled: the first
// fault found is reported, an import the host does not provide before a
// missing export.
func (r *Runtime) checkInterface(h *header) *ModuleError {
	e := &ModuleError{Reason: ReasonBadImports}
	for _, im := range h.imports {
		switch im.kind {
		case externFunc:
			have, ok := r.imports[im.module][im.name]
			switch {
			case !ok:
				e.Unresolved = append(e.Unresolved, im.module+"."+im.name)
			case !sigOf(have).equal(im.sig):
				e.Unresolved = append(e.Unresolved, fmt.Sprintf("%s.%s %s (host has %s)", im.module, im.name, im.sig, sigOf(have)))
			}
		case externMemory:
			e.Unresolved = append(e.Unresolved, im.module+"."+im.name+" (memory)")
		case externTable:
			e.Unresolved = append(e.Unresolved, im.module+"."+im.name+" (table)")
		case externGlobal:
			e.Unresolved = append(e.Unresolved, im.module+"."+im.name+" (global)")
		}
	}
	if len(e.Unresolved) > 0 {
		return e
	}

	fn := func(name string) (signature, bool) {
		x, ok := h.exports[name]
		return x.sig, ok && x.kind == externFunc
	}
	_, hasInit := fn(ExportInitialize)
	if _, hasStart := fn(ExportStart); hasStart && !hasInit {
		return &ModuleError{Reason: ReasonCommandModule}
	}
	e = &ModuleError{Reason: ReasonMissingExports}
	for _, want := range requiredExports {
		have, ok := fn(want.name)
		switch {
		case !ok:
			e.Missing = append(e.Missing, want.name)
		case !want.sig.equal(have):
			e.Mismatched = append(e.Mismatched, fmt.Sprintf("%s: want %s, have %s", want.name, want.sig, have))
		}
	}
	if x, ok := h.exports[ExportMemory]; !ok || x.kind != externMemory {
		e.Missing = append(e.Missing, ExportMemory)
	}
	if have, ok := fn(ExportInitialize); ok && (len(have.params) > 0 || len(have.results) > 0) {
		e.Mismatched = append(e.Mismatched, fmt.Sprintf("%s: want () -> (), have %s", ExportInitialize, have))
	}
	if len(e.Missing) > 0 || len(e.Mismatched) > 0 {
		return e
	}
	return nil
}
