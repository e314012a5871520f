package runner

import (
	"context"

	"fmt"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/plugins"
	"github.com/paddock-dev/paddock/store"
)

// Runner runs every worker kind the host has: wasm modules on the wazero
// runtime and plugin workers through go-plugin. It implements host.Runner
// (bindings and instances), api.Modules and api.Plugins.
type Runner struct {
	*Wasm
	plugins *plugins.Manager
	st      store.Store
}

// New returns a Runner over the wasm runner and the plugin manager.
func New(w *Wasm, pm *plugins.Manager, st store.Store) *Runner {
	return &Runner{Wasm: w, plugins: pm, st: st}
}

// Binding returns what the agent runs now: its module digest, or
// "plugin:<name>@<sha256>" of its plugin worker's registered binary.
func (r *Runner) Binding(ctx context.Context, a store.Agent, pool string) (string, error) {
	switch a.Kind {
	case store.KindPlugin:
		w, err := r.st.GetPluginWorker(ctx, a.Plugin)
		if err != nil {
			return "", fmt.Errorf("runner: plugin worker %s: %w", a.Plugin, err)
		}
		return plugins.Binding(w.Name, w.SHA256), nil
	default:
		return a.ModuleDigest, nil
	}
}

// Instantiate returns an instance for a module digest or a plugin binding.
// A plugin registered on another host (through the shared store) is
// registered here on first use. An event whose first attempt ran a plugin
// version that has since been replaced fails: its retries must run the
// version they started with (DESIGN invariant 10), which is gone.
func (r *Runner) Instantiate(ctx context.Context, binding string) (host.Instance, error) {
	name, sum, ok := plugins.ParseBinding(binding)
	if !ok {
		return r.Wasm.Instantiate(ctx, binding)
	}
	if cfg, ok := r.plugins.Registered(name); !ok || cfg.SHA256 != sum {
		w, err := r.st.GetPluginWorker(ctx, name)
		if err != nil {
			return nil, fmt.Errorf("runner: plugin worker %s: %w", name, err)
		}
		if w.SHA256 != sum {
			return nil, fmt.Errorf("runner: plugin %s version sha256:%s is no longer registered (now sha256:%s); this event started on it", name, sum[:12], w.SHA256[:min(12, len(w.SHA256))])
		}
		if err := r.plugins.Register(ctx, pluginConfig(w)); err != nil {
			return nil, err
		}
	}
	inst, err := r.plugins.Instance(ctx, name, sum)
	if err != nil {
		return nil, err
	}
	return pluginInstance{inst}, nil
}

// CheckPlugin registers w with this host's plugin manager, which verifies
// the binary (exists, executable, checksum) and starts it once to check the
// handshake and ABI version (api.Plugins).
func (r *Runner) CheckPlugin(ctx context.Context, w store.PluginWorker) error {
	return r.plugins.Register(ctx, pluginConfig(w))
}

func pluginConfig(w store.PluginWorker) plugins.Config {
	return plugins.Config{Name: w.Name, Path: w.Path, SHA256: w.SHA256, Env: w.Env, Processes: w.Processes}
}

// pluginInstance hands the host's steer channel to the plugin turn.
type pluginInstance struct{ *plugins.Instance }

func (i pluginInstance) Turn(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
	if ch := host.SteersOf(ctx); ch != nil {
		ctx = plugins.WithSteers(ctx, ch)
	}
	return i.Instance.Turn(ctx, req)
}
