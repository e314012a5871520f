//go:build wasip1

package guest

import (
	"context"
	"encoding/json"
	"fmt"
	"unsafe"

	"github.com/paddock-dev/paddock/abi"
)

// A wasm export is a process-wide function, so the SDK necessarily keeps its
// state at package level: the registered TurnFunc and the buffers pinned for
// the host. Exports run one at a time on the guest's only thread; nothing
// else touches these variables.
var (
	// handler is the agent's TurnFunc, set by Handle from an init function.
	handler abi.TurnFunc
	// pinned keeps every buffer handed to the host reachable, keyed by its
	// address, until the host calls paddock_free. Go's garbage collector
	// does not move objects, so the address stays valid while it is pinned.
	pinned = map[uint32][]byte{}
)

// Handle registers f as the module's turn function. Call it exactly once,
// from an init function of the main package; a later call replaces f.
func Handle(f abi.TurnFunc) {
	handler = f
}

// Log sends one record to the host log, tagged by the host with the module
// digest and the current turn_ref. The host truncates long messages and
// drops records past its per-turn log budget.
func Log(level Level, msg string) {
	if msg == "" {
		return
	}
	hostLog(int32(level), unsafe.Pointer(unsafe.StringData(msg)), uint32(len(msg)))
}

// Logf formats its arguments like fmt.Sprintf and calls Log.
func Logf(level Level, format string, args ...any) {
	Log(level, fmt.Sprintf(format, args...))
}

//go:wasmimport paddock log
//go:noescape
func hostLog(level int32, ptr unsafe.Pointer, size uint32)

//go:wasmexport paddock_abi_version
func exportABIVersion() int32 {
	return abi.Version
}

//go:wasmexport paddock_alloc
func exportAlloc(size uint32) uint32 {
	if size > abi.MaxRequestBytes {
		return 0
	}
	return pin(make([]byte, max(size, 1))[:size])
}

//go:wasmexport paddock_free
func exportFree(ptr uint32) {
	delete(pinned, ptr)
}

//go:wasmexport paddock_turn
func exportTurn(ptr, size uint32) uint64 {
	out := turn(ptr, size)
	return uint64(pin(out))<<32 | uint64(len(out))
}

// pin records b as handed to the host and returns its address.
func pin(b []byte) uint32 {
	p := uint32(uintptr(unsafe.Pointer(unsafe.SliceData(b[:cap(b)]))))
	pinned[p] = b
	return p
}

// turn decodes the request at ptr/size, runs the handler and encodes the
// result. It never fails: every problem becomes an "error" outcome.
func turn(ptr, size uint32) []byte {
	var req abi.TurnRequest
	buf, ok := pinned[ptr]
	switch {
	case !ok || int(size) > len(buf):
		return encode(&abi.TurnResult{Outcome: abi.OutcomeError,
			Error: fmt.Sprintf("paddock_turn: no buffer of %d bytes at %#x from paddock_alloc", size, ptr)})
	default:
		if err := json.Unmarshal(buf[:size], &req); err != nil {
			return encode(&abi.TurnResult{Outcome: abi.OutcomeError,
				Error: fmt.Sprintf("paddock_turn: decode request: %v", err)})
		}
	}
	if handler == nil {
		return encode(&abi.TurnResult{TurnRef: req.TurnRef, Outcome: abi.OutcomeError,
			Error: "no turn function registered: call guest.Handle from an init function"})
	}
	return encode(abi.Run(context.Background(), handler, &req))
}

// encode marshals res; it cannot fail for a TurnResult, but stays total.
func encode(res *abi.TurnResult) []byte {
	out, err := json.Marshal(res)
	if err != nil {
		out, _ = json.Marshal(&abi.TurnResult{TurnRef: res.TurnRef, Outcome: abi.OutcomeError,
			Error: fmt.Sprintf("encode result: %v", err)})
	}
	return out
}
