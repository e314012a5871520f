package plugins

import (
	"context"

	"github.com/hashicorp/go-hclog"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/plugins/internal/wire"
)

// Serve serves f as a Paddock plugin worker: call it from main, and
// nothing else. It speaks go-plugin's gRPC protocol with the handshake
// {ProtocolVersion: abi.Version, fixed magic cookie}, runs every turn
// through abi.Run (an error, nil result or panic becomes an error outcome;
// the turn_ref is echoed; nil State keeps the state), and runs turns
// concurrently — several sessions' turns may share one process, so f must
// be safe for concurrent use and keep nothing between turns that must last
// (use the session state).
//
// It never returns while a host serves the plugin: the process exits when
// the host closes it, and on its own when the host process dies (it
// watches its parent). Do not write to stdout before calling Serve (stdout
// carries the handshake); log with Logger. Run by hand, without a host, it
// explains that and exits with status 1.
func Serve(f abi.TurnFunc) {
	wire.Serve(f, abi.Version)
}

// PollSteer takes in the next steer sent to the turn running under ctx, if
// any, without waiting: ok is false when none is waiting (or ctx is not a
// plugin turn's). A turn that wants to be steerable calls it from time to
// time, e.g. between steps of a long computation or before a slow call,
// and takes the steer's Message and Data into account.
//
// Taking a steer in changes the turn's turn_ref: PollSteer tells the host,
// sets the running request's TurnRef to the steer's and appends the steer
// to its Steers, so the result Serve returns echoes the newest ref and the
// agent need do nothing about the fences (as wasm/guest.PollSteer does).
// Call it from the turn's goroutine, not from goroutines that outlive it.
func PollSteer(ctx context.Context) (abi.Steer, bool) {
	return wire.PollSteer(ctx)
}

// Logger returns the plugin's logger, which writes hclog JSON to stderr;
// the host re-emits each line in its structured log at its level, tagged
// with the worker name. Under a turn's ctx the logger also carries the
// turn's turn_ref (as of the call). The level is info unless the
// registered environment sets PADDOCK_PLUGIN_LOG_LEVEL.
func Logger(ctx context.Context) hclog.Logger {
	return wire.Logger(ctx)
}

// HTTP makes an http host call from the turn running under ctx: the host
// checks it against the agent's capabilities, fills secret placeholders,
// performs it and journals it. It is exactly abi.CallHTTP, which agent
// code may call instead (the same source then builds as a wasm guest):
// Serve puts the turn's abi.Caller in the TurnFunc's ctx. A refused or
// failed call returns a *abi.CallError; any HTTP status is a response.
// Calls may be made from several goroutines of the turn; at most 16 are
// in flight at once (more wait), and every call ends, cancelled, when the
// turn does.
func HTTP(ctx context.Context, req *abi.HTTPRequest) (*abi.HTTPResponse, error) {
	return abi.CallHTTP(ctx, req)
}

// Model makes a model host call from the turn running under ctx; it is
// exactly abi.CallModel (see HTTP). A refused or failed call returns a
// *abi.CallError.
func Model(ctx context.Context, req *abi.ModelRequest) (*abi.ModelResponse, error) {
	return abi.CallModel(ctx, req)
}
