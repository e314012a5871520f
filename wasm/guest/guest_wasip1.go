//go:build wasip1

package guest

import (
	"context"
	"encoding/json"
	"fmt"
	"unsafe"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/wasm/internal/wire"
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
	// current is the request of the running turn (nil between turns):
	// PollSteer records the steers it takes in there, and abi.Run echoes
	// its TurnRef.
	current *abi.TurnRequest
	// steerBuf receives steers from the host; it grows to the largest
	// steer seen.
	steerBuf []byte
	// callBuf receives host-call results that fit callBufSize; larger
	// ones get a buffer of their own, dropped after the call.
	callBuf []byte
	// spares are buffers the host freed, kept for the next paddock_alloc
	// or result: every turn allocates a request and a result buffer, and
	// in a wasm guest an allocation costs several times its native cost
	// (wasm/internal/wire), so a turn reuses those of the last one. A
	// freed buffer is no longer referenced: the request's decoding copies
	// what it keeps (wire.DecodeTurnRequest's arena), and a result is
	// handed off whole.
	spares [2][]byte
	// turnCtx is every turn's context: the SDK's Caller, made once.
	turnCtx = abi.WithCaller(context.Background(), hostCaller{})
)

// maxSpare is the largest freed buffer kept for reuse (64 KiB): a large
// request's buffer is left to the garbage collector.
const maxSpare = 64 << 10

// callBufSize is the size of callBuf, the first buffer given to
// paddock.call (64 KiB): most results (model replies, small HTTP bodies)
// fit it, and a larger one costs one more import call, never a second
// request.
const callBufSize = 64 << 10

// steerBufStart is the initial size of steerBuf; most steers are a line of
// text and a turn_ref.
const steerBufStart = 4 << 10

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

// PollSteer takes in the next steer sent to the running turn, if any,
// without waiting: ok is false when none is waiting (or outside a turn).
// A turn that wants to be steerable calls it from time to time, e.g.
// between steps of a long computation or before a slow tool call, and
// takes the steer's Message and Data into account.
//
// Taking a steer in changes the turn's turn_ref: PollSteer sets the running
// request's TurnRef to the steer's and appends the steer to its Steers, so
// the result the SDK returns echoes the newest ref and the agent need do
// nothing about the fences. (Answering with the older ref would get the
// reply rejected and the turn run again with the steer in Steers.) The
// agent should therefore not keep its own copy of req.TurnRef.
//
// Call it from the turn, not from goroutines that outlive it. Modules that
// never call PollSteer do not import paddock.steer_poll.
func PollSteer() (abi.Steer, bool) {
	if current == nil {
		return abi.Steer{}, false
	}
	if steerBuf == nil {
		steerBuf = make([]byte, steerBufStart)
	}
	// A negative answer says how large the buffer must be; the steer stays
	// waiting. The host never answers more than abi.MaxRequestBytes, and
	// the second call fits unless the host misbehaves.
	for range 3 {
		n := hostSteerPoll(unsafe.Pointer(unsafe.SliceData(steerBuf)), uint32(len(steerBuf)))
		switch {
		case n == 0:
			return abi.Steer{}, false
		case n < 0:
			if -int64(n) > abi.MaxRequestBytes {
				Logf(LevelError, "paddock steer_poll: steer of %d bytes exceeds %d", -int64(n), abi.MaxRequestBytes)
				return abi.Steer{}, false
			}
			steerBuf = make([]byte, -n)
			continue
		}
		var s abi.Steer
		if err := wire.DecodeSteer(steerBuf[:n], &s); err != nil {
			Logf(LevelError, "paddock steer_poll: decode steer: %v", err)
			return abi.Steer{}, false
		}
		current.TurnRef = s.TurnRef
		current.Steers = append(current.Steers, s)
		return s, true
	}
	Log(LevelError, "paddock steer_poll: the steer does not fit the buffer the host asked for")
	return abi.Steer{}, false
}

//go:wasmimport paddock steer_poll
//go:noescape
func hostSteerPoll(ptr unsafe.Pointer, capacity uint32) int32

// hostCaller is the abi.Caller of a turn in a wasm guest: it makes each
// call through the paddock.call and paddock.call_result imports. The
// linker keeps its Call method, and with it the imports, only in modules
// that make host calls (abi.Call, abi.CallHTTP, abi.CallModel, HTTP,
// Model), so other modules do not import them.
type hostCaller struct{}

// Call encodes req, hands it to paddock.call with callBuf, and fetches a
// result larger than callBuf with paddock.call_result into a buffer of
// the size the host announced. The guest is blocked meanwhile (wasm is
// synchronous): ctx cannot interrupt the host, which ends the call itself
// when the turn is cancelled or times out. Transport failures, which the
// host never causes when it follows the ABI, come back as error results.
func (hostCaller) Call(ctx context.Context, req *abi.CallRequest) *abi.CallResult {
	if err := ctx.Err(); err != nil {
		return callFailed(abi.CallCancelled, fmt.Sprintf("host call not made: %v", err))
	}
	in, err := json.Marshal(req)
	if err != nil {
		return callFailed(abi.CallInvalid, fmt.Sprintf("encode call request: %v", err))
	}
	if len(in) > abi.MaxCallRequestBytes {
		return callFailed(abi.CallTooLarge, fmt.Sprintf("call request is %d bytes, limit %d", len(in), abi.MaxCallRequestBytes))
	}
	if callBuf == nil {
		callBuf = make([]byte, callBufSize)
	}
	buf := callBuf
	n := hostCall(unsafe.Pointer(unsafe.SliceData(in)), uint32(len(in)),
		unsafe.Pointer(unsafe.SliceData(buf)), uint32(len(buf)))
	if n < 0 {
		// The result is pending in the host; the call was made once.
		if -int64(n) > abi.MaxCallResultBytes {
			return callFailed(abi.CallTooLarge, fmt.Sprintf("paddock.call: result of %d bytes exceeds %d", -int64(n), abi.MaxCallResultBytes))
		}
		buf = make([]byte, -n)
		n = hostCallResult(unsafe.Pointer(unsafe.SliceData(buf)), uint32(len(buf)))
	}
	if n <= 0 || int(n) > len(buf) {
		return callFailed(abi.CallUpstream, fmt.Sprintf("paddock.call_result answered %d for a %d-byte buffer", n, len(buf)))
	}
	res := new(abi.CallResult)
	if err := json.Unmarshal(buf[:n], res); err != nil {
		return callFailed(abi.CallUpstream, fmt.Sprintf("decode call result: %v", err))
	}
	return res
}

// callFailed is the result of a call that failed in the guest's transport.
func callFailed(code abi.CallErrorCode, msg string) *abi.CallResult {
	return &abi.CallResult{Error: &abi.CallError{Code: code, Message: msg}}
}

//go:wasmimport paddock call
//go:noescape
func hostCall(reqPtr unsafe.Pointer, reqLen uint32, bufPtr unsafe.Pointer, bufCap uint32) int32

//go:wasmimport paddock call_result
//go:noescape
func hostCallResult(bufPtr unsafe.Pointer, bufCap uint32) int32

//go:wasmexport paddock_abi_version
func exportABIVersion() int32 {
	return abi.Version
}

//go:wasmexport paddock_alloc
func exportAlloc(size uint32) uint32 {
	if size > abi.MaxRequestBytes {
		return 0
	}
	return pin(spare(int(size)))
}

//go:wasmexport paddock_free
func exportFree(ptr uint32) {
	b, ok := pinned[ptr]
	if !ok {
		return
	}
	delete(pinned, ptr)
	if c := cap(b); c <= maxSpare {
		// Keep it in place of the smaller spare.
		if cap(spares[0]) > cap(spares[1]) {
			spares[0], spares[1] = spares[1], spares[0]
		}
		if c > cap(spares[0]) {
			spares[0] = b
		}
	}
}

// spare returns a buffer of length n (its bytes not cleared: the host
// and the encoder write all n), the smallest spare that holds n, or a new
// one.
func spare(n int) []byte {
	k := -1
	for i, b := range spares {
		if cap(b) >= max(n, 1) && (k < 0 || cap(b) < cap(spares[k])) {
			k = i
		}
	}
	if k < 0 {
		return make([]byte, max(n, 1))[:n]
	}
	b := spares[k][:n]
	spares[k] = nil
	return b
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
		if err := wire.DecodeTurnRequest(buf[:size], &req); err != nil {
			return encode(&abi.TurnResult{Outcome: abi.OutcomeError,
				Error: fmt.Sprintf("paddock_turn: decode request: %v", err)})
		}
	}
	if handler == nil {
		return encode(&abi.TurnResult{TurnRef: req.TurnRef, Outcome: abi.OutcomeError,
			Error: "no turn function registered: call guest.Handle from an init function"})
	}
	current = &req
	defer func() { current = nil }()
	return encode(abi.Run(turnCtx, handler, &req))
}

// encode marshals res as abi.Marshal does; it fails only on invalid raw
// JSON (alarm or wait data) or an unencodable alarm time, and stays total.
func encode(res *abi.TurnResult) []byte {
	out, err := wire.AppendTurnResult(spare(512)[:0], res)
	if err != nil {
		out, _ = json.Marshal(&abi.TurnResult{TurnRef: res.TurnRef, Outcome: abi.OutcomeError,
			Error: fmt.Sprintf("encode result: %v", err)})
	}
	return out
}
