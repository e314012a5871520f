package host

import (
	"context"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

// Runner makes worker instances for a binding. The binding is what an
// agent runs (a wasm module digest today; a plugin or pool name later). It
// is the seam between the host, which decides turns, and the worker kinds,
// which only run them (docs/DESIGN.md "Layout").
type Runner interface {
	// Binding returns the binding of what an agent runs (b, as the store
	// read it under the activation's lock) in its policy's pool: a wasm
	// module digest, or "plugin:<name>@<sha256>" for a plugin worker's
	// current binary — prefixed with "pool:<name>/" when the pool is served
	// by remote workers. It is recorded on an event at its first attempt,
	// and that event's retries run it (docs/DESIGN.md invariant 10). It does
	// no I/O: it runs inside NextDelivery's transaction.
	Binding(b store.AgentBinding, pool string) (string, error)
	// Instantiate returns a fresh instance for binding. Errors mean the
	// binding cannot run at all (e.g. the module is missing or does not
	// instantiate).
	Instantiate(ctx context.Context, binding string) (Instance, error)
}

// InProcessRunner is implemented by a Runner that can tell whether a
// binding's turns run inside this process (a wasm module here, not a
// plugin process or a remote worker): no byte of such a turn leaves the
// host before its first host call, so its dispatch may be deferred
// (store.NextDeliveryParams.Defer; invariant 9 holds for the others).
type InProcessRunner interface {
	InProcess(binding string) bool
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
// start, the worker was busy) fails without consuming an attempt (docs/DESIGN.md
// "What counts as an attempt"); every other failure counts.
type SendAware interface {
	TurnSent() bool
}

// InstanceScope says who may see a wasm instance's globals after whom: the
// agent's instance_reuse policy.
type InstanceScope string

const (
	// ScopeSession: an instance serves the turns of one activation of one
	// session (the guest ABI's default contract, abi/README.md).
	ScopeSession InstanceScope = "session"
	// ScopeAgent: warm instances are kept per agent and lent to any of
	// its sessions' turns, one turn at a time; a session's turn may see
	// globals another session's turn left. No cost of instantiating on a
	// wake, and memory bounded by the turns running at once, not by the
	// live sessions. For agents that keep everything in the session state.
	ScopeAgent InstanceScope = "agent"
)

type scopeKey struct{}

// WithInstanceScope returns ctx carrying the turn's instance scope; the
// controller sets it on every turn from the agent's policy.
func WithInstanceScope(ctx context.Context, s InstanceScope) context.Context {
	return context.WithValue(ctx, scopeKey{}, s)
}

// InstanceScopeOf returns the instance scope ctx carries (ScopeSession by
// default).
func InstanceScopeOf(ctx context.Context) InstanceScope {
	if s, ok := ctx.Value(scopeKey{}).(InstanceScope); ok && s != "" {
		return s
	}
	return ScopeSession
}
