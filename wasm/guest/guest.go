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
// One module instance serves many turns of one session, one at a time, so
// package-level variables of the agent survive between turns of an
// activation — but not across activations, hosts or failures. Keep anything
// that must last in the session state. An agent whose policy says
// instance_reuse: agent shares warm instances among its sessions: a turn
// may then see package variables another session's turn left
// (abi/README.md, "Instances and state").
//
// On platforms other than wasip1, Handle does nothing, PollSteer reports no
// steer and Log writes to standard error, so agent packages that call them
// still build and test on the developer's machine.
//
// The package imports only the standard library and abi.
package guest

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
