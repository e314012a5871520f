// Package runner adapts the worker kinds (wasm today) to the host's Runner
// seam. It is the only place that knows both the store (where module bytes
// live) and a worker runtime.
package runner

import (
	"context"
	"fmt"

	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/wasm"
)

// Wasm runs wasm bindings (module digests) on a wazero runtime, loading a
// module's bytes from the store and compiling it the first time a turn
// needs it (the runtime compiles each digest once).
type Wasm struct {
	rt *wasm.Runtime
	st store.Store
}

// NewWasm returns a runner over rt that loads modules from st.
func NewWasm(rt *wasm.Runtime, st store.Store) *Wasm { return &Wasm{rt: rt, st: st} }

// Instantiate returns a fresh instance of the module with digest binding.
func (w *Wasm) Instantiate(ctx context.Context, binding string) (host.Instance, error) {
	if !w.rt.Loaded(binding) {
		m, err := w.st.GetModule(ctx, binding)
		if err != nil {
			return nil, fmt.Errorf("runner: module %s: %w", binding, err)
		}
		if _, err := w.rt.Load(ctx, binding, m.Bytes); err != nil {
			return nil, fmt.Errorf("runner: load module %s: %w", binding, err)
		}
	}
	inst, err := w.rt.Instantiate(ctx, binding)
	if err != nil {
		return nil, err
	}
	return inst, nil
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
