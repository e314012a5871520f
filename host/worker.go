package host

import (
	"context"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

// Runner makes worker instances for a binding. The binding is what an
// agent runs (a wasm module digest today; a plugin or pool name later). It
// is the seam between the host, which decides turns, and the worker kinds,
// which only run them (DESIGN "Layout").
type Runner interface {
	// Binding returns what the agent runs now, in its policy's pool: a
	// wasm module digest, or "plugin:<name>@<sha256>" for a plugin worker's
	// current binary — prefixed with "pool:<name>/" when the pool is served
	// by remote workers. It is recorded on an event at its first attempt,
	// and that event's retries run it (DESIGN invariant 10).
	Binding(ctx context.Context, agent store.Agent, pool string) (string, error)
	// Instantiate returns a fresh instance for binding. Errors mean the
	// binding cannot run at all (e.g. the module is missing or does not
	// instantiate).
	Instantiate(ctx context.Context, binding string) (Instance, error)
}

// Instance runs turns one at a time for one activation. After Turn returns
// an error the instance is discarded (closed) and a new one is made.
type Instance interface {
	// Turn runs one turn under ctx (which carries the wall-time cap).
	Turn(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error)
	// Close releases the instance.
	Close(ctx context.Context) error
}

// Recycler is implemented by instances that should be replaced by a fresh
// one after some use (e.g. a wasm instance whose linear memory, which never
// shrinks, passed a high-water mark). The controller asks after each turn.
type Recycler interface {
	ShouldRecycle() bool
}

// SendAware is implemented by worker errors that know whether the turn
// reached the worker at all. A turn that never reached it (no process could
// start, the worker was busy) fails without consuming an attempt (DESIGN
// "What counts as an attempt"); every other failure counts.
type SendAware interface {
	TurnSent() bool
}
