// Package runner adapts the worker kinds (wasm today) to the host's Runner
// seam. It is the only place that knows both the store (where module bytes
// live) and a worker runtime.
package runner

import (
	"context"
	"fmt"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/wasm"
)

// Wasm runs wasm bindings (module digests) on a wazero runtime, loading a
// module's bytes from the store and compiling it the first time a turn
// needs it (the runtime compiles each digest once). Turns borrow warm
// instances from a wasm.Pool, so a live activation holds no instance
// between its turns.
type Wasm struct {
	rt   *wasm.Runtime
	st   store.Store
	pool *wasm.Pool
}

// NewWasm returns a runner over rt that loads modules from st, keeping up
// to poolIdle idle instances per module (0: wasm.DefaultPoolIdle; negative:
// none).
func NewWasm(rt *wasm.Runtime, st store.Store, poolIdle ...int) *Wasm {
	n := 0
	if len(poolIdle) > 0 {
		n = poolIdle[0]
	}
	return &Wasm{rt: rt, st: st, pool: wasm.NewPool(rt, n)}
}

// Close closes the pool's idle instances.
func (w *Wasm) Close(ctx context.Context) { w.pool.Close(ctx) }

// Instantiate returns the host's instance of the module with digest
// binding: a handle that borrows a pooled wasm instance for each turn. One
// instance is made (or taken from the pool) at once, so a module that
// cannot instantiate fails here, as a fresh instance would.
func (w *Wasm) Instantiate(ctx context.Context, binding string) (host.Instance, error) {
	if err := w.load(ctx, binding); err != nil {
		return nil, err
	}
	inst, err := w.pool.Get(ctx, binding)
	if err != nil {
		return nil, err
	}
	w.pool.Put(inst)
	return &pooled{w: w, digest: binding}, nil
}

// pooled is a host.Instance that borrows an instance per turn.
type pooled struct {
	w      *Wasm
	digest string
}

// Turn borrows an instance, runs the turn and returns the instance to the
// pool (a failed one closed itself). An instance that cannot be made fails
// the turn as not sent: the agent never ran.
func (p *pooled) Turn(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
	inst, err := p.w.pool.Get(ctx, p.digest)
	if err != nil {
		return nil, notSentError{fmt.Errorf("runner: instantiate %s: %w", p.digest, err)}
	}
	res, err := inst.Turn(ctx, req)
	p.w.pool.Put(inst)
	return res, err
}

// Close releases nothing: the handle holds no instance between turns.
func (p *pooled) Close(context.Context) error { return nil }

// notSentError is a turn failure before the agent ran (host.SendAware).
type notSentError struct{ err error }

func (e notSentError) Error() string  { return e.err.Error() }
func (e notSentError) Unwrap() error  { return e.err }
func (e notSentError) TurnSent() bool { return false }

// load makes sure the module binding is compiled in the runtime.
func (w *Wasm) load(ctx context.Context, binding string) error {
	if !w.rt.Loaded(binding) {
		m, err := w.st.GetModule(ctx, binding)
		if err != nil {
			return fmt.Errorf("runner: module %s: %w", binding, err)
		}
		if _, err := w.rt.Load(ctx, binding, m.Bytes); err != nil {
			return fmt.Errorf("runner: load module %s: %w", binding, err)
		}
	}
	return nil
}

// Inspect validates an uploaded module (the API's Modules seam): it must be
// wasm, export Paddock's guest ABI and speak abi.Version.
func (w *Wasm) Inspect(ctx context.Context, b []byte) (string, int, error) {
	info, err := w.rt.Validate(ctx, b)
	if err != nil {
		return "", 0, err
	}
	return info.Digest, info.ABIVersion, nil
}

// Binding returns the module digest a wasm agent runs (host.Runner). For
// other kinds use Runner.
func (w *Wasm) Binding(_ context.Context, a store.Agent, _ string) (string, error) {
	if a.Kind != "" && a.Kind != store.KindWasm {
		return "", fmt.Errorf("runner: agent %s is a %s agent; this host runs wasm only", a.Name, a.Kind)
	}
	return a.ModuleDigest, nil
}
