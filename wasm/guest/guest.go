// Package guest is the Go SDK for Paddock wasm agents: it implements the
// guest side of the wasm ABI (abi/README.md, "Wasm guest ABI") so that an
// agent author writes only an abi.TurnFunc.
//
// A complete agent module:
//
//	//go:build wasip1
//
//	package main
//
//	import (
//		"github.com/paddock-dev/paddock/abi"
//		"github.com/paddock-dev/paddock/wasm/guest"
//	)
//
//	func init() { guest.Handle(myTurn) }
//
//	func main() {} // required by the toolchain, never run by the host
//
//	func myTurn(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) { ... }
//
// built as a WASI reactor:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o agent.wasm ./path/to/cmd
//
// Building without -buildmode=c-shared produces a command module (it exports
// _start instead of _initialize); the host refuses it at upload.
//
// The SDK runs the TurnFunc through abi.Run: a returned error, a nil result
// or a recovered panic becomes an "error" outcome, the turn_ref is echoed, an
// empty outcome means "ok", and a nil State keeps the session state. A panic
// that is not recovered (for example in another goroutine), os.Exit, a wasm
// trap or running out of memory ends the module; the host reports the turn
// as failed and discards the instance.
//
// A long turn can be steered: PollSteer takes in steer input that arrived
// while the turn runs (abi/README.md, "Steering and cancellation") and
// makes the SDK echo the steer's turn_ref, so the agent only has to use the
// steer's message. A module that never calls PollSteer does not import
// paddock.steer_poll and still works: the host then runs the turn again
// with the steers in TurnRequest.Steers.
//
// A turn streams its output while it runs with Emit and EmitJSON (host
// call kind emit, abi/README.md "Emit"): chat clients following the
// session stream see it before the turn commits.
//
// A turn reaches the outside world through host calls (abi/README.md,
// "Host calls"): the SDK puts an abi.Caller into the TurnFunc's context
// (abi.WithCaller), so agent code calls abi.CallHTTP(ctx, ...) and
// abi.CallModel(ctx, ...) — or HTTP and Model here, which are the same —
// and the same source works in a plugin worker. A module that never makes
// a host call does not import paddock.call or paddock.call_result.
//
// One module instance serves many turns of one session, one at a time, so
// package-level variables of the agent survive between turns of an
// activation — but not across activations, hosts or failures. Keep anything
// that must last in the session state. An agent whose policy says
// instance_reuse: agent shares warm instances among its sessions: a turn
// may then see package variables another session's turn left
// (abi/README.md, "Instances and state").
//
// On platforms other than wasip1, Handle does nothing, PollSteer reports no
// steer, Log writes to standard error, and HTTP and Model use the Caller
// a test harness put in ctx (not_configured without one), so agent
// packages that call them still build and test on the developer's
// machine.
//
// The package imports only the standard library, abi and its own codec
// (wasm/internal/wire), which decodes requests and encodes results without
// reflection, byte for byte as encoding/json does, because reflection
// dominated a wasm turn's cost.
package guest

import (
	"context"

	"github.com/paddock-dev/paddock/abi"
)

// Level is the severity of a log record sent to the host. The values are
// those of log/slog (the host logs records with slog).
type Level int32

// Log levels.
const (
	LevelDebug Level = -4
	LevelInfo  Level = 0
	LevelWarn  Level = 4
	LevelError Level = 8
)

// HTTP makes an http host call from the running turn: it is exactly
// abi.CallHTTP(ctx, req), and ctx must be the turn's context (or derived
// from it), which carries the SDK's abi.Caller. In a wasm module the call
// goes through the paddock.call import (abi/README.md, "Host calls"); on
// other platforms through the Caller a test harness put in ctx with
// abi.WithCaller, or it fails with a *abi.CallError of code
// not_configured. A refused or failed call returns a *abi.CallError; a
// response with any status is a response.
func HTTP(ctx context.Context, req *abi.HTTPRequest) (*abi.HTTPResponse, error) {
	return abi.CallHTTP(ctx, req)
}

// Model makes a model host call from the running turn: it is exactly
// abi.CallModel(ctx, req), with the same context rule as HTTP. A refused
// or failed call returns a *abi.CallError.
func Model(ctx context.Context, req *abi.ModelRequest) (*abi.ModelResponse, error) {
	return abi.CallModel(ctx, req)
}

// Emit sends a text delta of the running turn's answer to the session
// stream: it is exactly abi.Emit(ctx, text), with the same context rule as
// HTTP. The host answers at once; a refused chunk (over the turn's
// stream limit, the turn over) returns a *abi.CallError the agent may
// ignore.
func Emit(ctx context.Context, text string) error {
	return abi.Emit(ctx, text)
}

// EmitJSON sends v, encoded as JSON, as a chunk of type typ (abi.ChunkTool
// or abi.ChunkJSON) to the session stream: abi.EmitJSON(ctx, typ, v).
func EmitJSON(ctx context.Context, typ string, v any) error {
	return abi.EmitJSON(ctx, typ, v)
}
