package wasm

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/tetratelabs/wazero/api"

	"github.com/paddock-dev/paddock/abi"
)

// turnCallsKey is the context key under which the call and call_result
// host functions find the running guest call's turnCalls (host functions
// are shared by all instances).
type turnCallsKey struct{}

// turnCalls is the host-call state of one guest call (a turn, or an
// instantiation or version probe, which have no Caller). The guest calls
// the imports on the goroutine that runs the turn, one at a time, so no
// lock is needed.
type turnCalls struct {
	digest string
	// pending is the encoded result of the last call whose result did not
	// fit the guest's buffer, until call_result delivers it or the next
	// call replaces it.
	pending []byte
}

// withTurnCalls attaches c to the context of a guest call.
func withTurnCalls(ctx context.Context, c *turnCalls) context.Context {
	return context.WithValue(ctx, turnCallsKey{}, c)
}

// callsOf returns the turnCalls of ctx; a guest call made without one (none
// is: Turn, instantiate and probeVersion attach one) gets a fresh one.
func callsOf(ctx context.Context) *turnCalls {
	if c, ok := ctx.Value(turnCallsKey{}).(*turnCalls); ok {
		return c
	}
	return &turnCalls{}
}

// hostCall is the host function
// paddock.call(req_ptr i32, req_len i32, buf_ptr i32, buf_cap i32) -> i32
// (abi/README.md, "Imports" and "Host calls"). It reads the CallRequest
// JSON at req_ptr/req_len, performs it through the abi.Caller of the turn's
// context (abi.NoCaller's result without one), and answers with the
// CallResult JSON: n > 0 when its n bytes were written at buf_ptr; -n when
// they do not fit buf_cap — the result is then kept for call_result, so a
// small buffer never makes the host perform the call twice. A request that
// is not JSON or fails abi.CallRequest.Validate is answered with an
// invalid_request result, not a trap. A buffer outside guest memory fails
// the turn with KindInvalidResult; the end of the turn's context (cancel,
// deadline) aborts a call in flight and fails the turn as KindCanceled or
// KindTimeout.
//
// The guest is blocked in the import for the whole call: the goroutine that
// runs the turn waits in the Caller (no busy-wait, no extra goroutine here)
// and the Instance stays held by the turn.
func hostCall(ctx context.Context, m api.Module, stack []uint64) {
	c := callsOf(ctx)
	stack[0] = api.EncodeI32(c.call(ctx, m.Memory(),
		api.DecodeU32(stack[0]), api.DecodeU32(stack[1]), api.DecodeU32(stack[2]), api.DecodeU32(stack[3])))
}

// hostCallResult is the host function
// paddock.call_result(buf_ptr i32, buf_cap i32) -> i32: the pending result
// of the last call, n > 0 when written at buf_ptr (it is then cleared), -n
// when buf_cap is smaller than its n bytes (it stays pending), 0 when no
// result is pending. A buffer outside guest memory fails the turn with
// KindInvalidResult.
func hostCallResult(ctx context.Context, m api.Module, stack []uint64) {
	c := callsOf(ctx)
	stack[0] = api.EncodeI32(c.result(m.Memory(), api.DecodeU32(stack[0]), api.DecodeU32(stack[1])))
}

// call implements paddock.call.
func (c *turnCalls) call(ctx context.Context, mem api.Memory, reqPtr, reqLen, bufPtr, capacity uint32) int32 {
	c.pending = nil // an uncollected result of an earlier call is dropped
	var view []byte
	ok := false
	if mem != nil {
		view, ok = mem.Read(reqPtr, reqLen)
	}
	if !ok {
		c.outside(HostCall, "request", reqPtr, reqLen, mem)
	}
	res := c.perform(ctx, view)
	if err := ctx.Err(); err != nil {
		// The turn is over: the guest must not run on with a result. The
		// panic fails the guest call; classify reports it from the turn's
		// context as canceled or timeout.
		panic(fmt.Errorf("wasm %s.%s aborted by the end of the turn: %w", HostModule, HostCall, err))
	}
	b := encodeCallResult(res)
	if uint64(len(b)) > uint64(capacity) {
		c.pending = b
		return -int32(len(b))
	}
	if mem == nil || !mem.Write(bufPtr, b) {
		c.outside(HostCall, "result buffer", bufPtr, uint32(len(b)), mem)
	}
	return int32(len(b))
}

// result implements paddock.call_result.
func (c *turnCalls) result(mem api.Memory, bufPtr, capacity uint32) int32 {
	if c.pending == nil {
		return 0
	}
	n := len(c.pending)
	if uint64(n) > uint64(capacity) {
		return -int32(n)
	}
	if mem == nil || !mem.Write(bufPtr, c.pending) {
		c.outside(HostCallResult, "result buffer", bufPtr, uint32(n), mem)
	}
	c.pending = nil
	return int32(n)
}

// perform decodes the request bytes (still in guest memory: decoding copies
// every field out) and makes the call through the turn's Caller.
func (c *turnCalls) perform(ctx context.Context, raw []byte) *abi.CallResult {
	if len(raw) > abi.MaxCallRequestBytes {
		return callError(abi.CallTooLarge, fmt.Sprintf("call request is %d bytes, limit %d", len(raw), abi.MaxCallRequestBytes))
	}
	req := new(abi.CallRequest)
	if err := json.Unmarshal(raw, req); err != nil {
		return callError(abi.CallInvalid, fmt.Sprintf("call request is not valid JSON: %v", err))
	}
	if err := req.Validate(); err != nil {
		return callError(abi.CallInvalid, err.Error())
	}
	return abi.Call(ctx, req)
}

// encodeCallResult encodes res for the guest; a result that cannot be
// encoded or exceeds abi.MaxCallResultBytes becomes an error result with
// the same seq.
func encodeCallResult(res *abi.CallResult) []byte {
	b, err := json.Marshal(res)
	switch {
	case err != nil:
		b, _ = json.Marshal(&abi.CallResult{Seq: res.Seq, Replayed: res.Replayed,
			Error: &abi.CallError{Code: abi.CallUpstream, Message: fmt.Sprintf("encode call result: %v", err)}})
	case len(b) > abi.MaxCallResultBytes:
		b, _ = json.Marshal(&abi.CallResult{Seq: res.Seq, Replayed: res.Replayed,
			Error: &abi.CallError{Code: abi.CallTooLarge, Message: fmt.Sprintf("call result is %d bytes, limit %d", len(b), abi.MaxCallResultBytes)}})
	}
	return b
}

// callError is a CallResult with only an error: the call never reached the
// turn's Caller (seq 0).
func callError(code abi.CallErrorCode, msg string) *abi.CallResult {
	return &abi.CallResult{Error: &abi.CallError{Code: code, Message: msg}}
}

// outside fails the guest call: the guest gave a buffer outside its memory.
// A panic with an error fails the guest call; classify finds the
// *TurnError in the chain.
func (c *turnCalls) outside(fn, what string, ptr, n uint32, mem api.Memory) {
	size := uint32(0)
	if mem != nil {
		size = mem.Size()
	}
	panic(&TurnError{Kind: KindInvalidResult, Op: HostModule + "." + fn, Digest: c.digest,
		Err: fmt.Errorf("%s %#x of %d bytes is outside the %d-byte memory", what, ptr, n, size)})
}
