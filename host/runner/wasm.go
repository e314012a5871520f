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

// InProcess reports that every binding runs in this process
// (host.InProcessRunner).
func (w *Wasm) InProcess(string) bool { return true }

// Instantiate returns the host's instance of the module with digest
// binding for one activation. What it holds between turns depends on the
// turn's instance scope (host.InstanceScopeOf, the agent's instance_reuse
// policy): for ScopeSession, one wasm instance of its own, kept across the
// activation's turns (the guest's globals are the session's); for
// ScopeAgent (ctx says which), nothing — each turn borrows a warm
// instance kept for the agent and returns it after. For session scope the
// instance is made at once, so that a module that cannot instantiate fails
// here; for agent scope the module is compiled here and a failure to
// instantiate fails the turn as not sent.
func (w *Wasm) Instantiate(ctx context.Context, binding string) (host.Instance, error) {
	if err := w.load(ctx, binding); err != nil {
		return nil, err
	}
	if host.InstanceScopeOf(ctx) == host.ScopeAgent {
		// Turns borrow from the agent's warm instances; one that cannot
		// be made fails its turn as not sent.
		return &pooled{w: w, digest: binding}, nil
	}
	inst, err := w.rt.Instantiate(ctx, binding)
	if err != nil {
		return nil, err
	}
	return &pooled{w: w, digest: binding, own: inst}, nil
}

// pooled is the host.Instance of one activation.
type pooled struct {
	w      *Wasm
	digest string
	// own is the activation's own instance (session scope), or the one
	// made by Instantiate until the first agent-scoped turn pools it.
	own *wasm.Instance
}

// Turn runs the turn in the activation's own instance (session scope) or
// in one borrowed for it (agent scope). An instance that failed — an error,
// or an error outcome, whose retry must run in a new instance
// (abi/README.md) — is closed; an instance that cannot be made fails the
// turn as not sent: the agent never ran.
func (p *pooled) Turn(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
	agentScope := host.InstanceScopeOf(ctx) == host.ScopeAgent
	key := p.digest + "\x00" + req.TurnRef.AgentUID
	inst := p.own
	switch {
	case agentScope:
		if inst != nil {
			// Made for session scope by Instantiate (the policy changed
			// since): start the agent's pool with it.
			p.w.pool.Put(key, inst)
			p.own = nil
		}
		var err error
		if inst, err = p.w.pool.Get(ctx, key, p.digest); err != nil {
			return nil, notSentError{fmt.Errorf("runner: instantiate %s: %w", p.digest, err)}
		}
	case inst == nil || inst.ShouldRecycle():
		if inst != nil {
			_ = inst.Close(context.WithoutCancel(ctx))
		}
		var err error
		if inst, err = p.w.rt.Instantiate(ctx, p.digest); err != nil {
			p.own = nil
			return nil, notSentError{fmt.Errorf("runner: instantiate %s: %w", p.digest, err)}
		}
		p.own = inst
	}
	res, err := inst.Turn(ctx, req)
	failed := err != nil || res.Outcome == abi.OutcomeError
	switch {
	case failed:
		_ = inst.Close(context.WithoutCancel(ctx))
		if !agentScope {
			p.own = nil
		}
	case agentScope:
		p.w.pool.Put(key, inst)
	}
	return res, err
}

// Close closes the activation's own instance, if it has one.
func (p *pooled) Close(ctx context.Context) error {
	if p.own != nil {
		err := p.own.Close(ctx)
		p.own = nil
		return err
	}
	return nil
}

// notSentError is a turn failure before the agent ran (host.SendAware).
type notSentError struct{ err error }

func (e notSentError) Error() string  { return e.err.Error() }
func (e notSentError) Unwrap() error  { return e.err }
func (e notSentError) TurnSent() bool { return false }

// load makes sure the module binding is compiled in the runtime.
func (w *Wasm) load(ctx context.Context, binding string) error {
	if !w.rt.Loaded(binding) {
		// The runtime's read: the binding was checked visible in the
		// agent's namespace when the agent was bound.
		m, err := w.st.GetModule(ctx, store.AnyNamespace, binding)
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
func (w *Wasm) Binding(b store.AgentBinding, _ string) (string, error) {
	if b.Kind != "" && b.Kind != store.KindWasm {
		return "", fmt.Errorf("runner: the agent is a %s agent; this host runs wasm only", b.Kind)
	}
	return b.ModuleDigest, nil
}
