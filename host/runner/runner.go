package runner

import (
	"context"
	"fmt"
	"strings"

	"github.com/paddock-dev/paddock/fabric"
	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/plugins/pluginhost"
	"github.com/paddock-dev/paddock/store"
)

// Runner runs every worker kind the host has: wasm modules on the wazero
// runtime and plugin workers through go-plugin. It implements host.Runner
// (bindings and instances), service.Modules and service.Plugins.
type Runner struct {
	*Wasm
	plugins *pluginhost.Manager
	st      store.Store
	// fabric runs the turns of remote pools (nil: no remote workers).
	fabric *fabric.Broker
	remote map[string]bool
}

// New returns a Runner over the wasm runner and the plugin manager.
func New(w *Wasm, pm *pluginhost.Manager, st store.Store) *Runner {
	return &Runner{Wasm: w, plugins: pm, st: st}
}

// WithFabric makes the pools named in remote run on the broker's remote
// workers.
func (r *Runner) WithFabric(b *fabric.Broker, remote []string) *Runner {
	r.fabric, r.remote = b, map[string]bool{}
	for _, p := range remote {
		r.remote[p] = true
	}
	return r
}

// A remote pool runs only where its worker is (docs/DESIGN.md "Remote pools across
// hosts").
var _ host.Placer = (*Runner)(nil)

// poolPrefix starts the binding of a turn that runs on a remote pool:
// "pool:<name>/<module digest or plugin binding>".
const poolPrefix = "pool:"

// Binding returns the binding of what an agent runs (host.Runner): its
// module digest, or "plugin:<name>@<sha256>" of its plugin worker's
// registered binary; "pool:<name>/" first for a remote pool. A plugin agent
// whose plugin worker is not registered has none (an error).
func (r *Runner) Binding(b store.AgentBinding, pool string) (string, error) {
	inner := b.ModuleDigest
	if b.Kind == store.KindPlugin {
		if b.PluginSHA256 == "" {
			return "", fmt.Errorf("runner: plugin worker %q is not registered", b.Plugin)
		}
		// The plugin worker of the agent's namespace: its qualified name
		// (the plain name in the default namespace, so bindings recorded
		// before namespaces still run).
		inner = pluginhost.Binding(store.QualifiedName(b.Namespace, b.Plugin), b.PluginSHA256)
	}
	if inner == "" {
		return "", fmt.Errorf("runner: the agent (%s) has no module", b.Kind)
	}
	if r.remote[pool] {
		return poolPrefix + pool + "/" + inner, nil
	}
	return inner, nil
}

// current is the binding agent a runs now, read from the store.
func (r *Runner) current(ctx context.Context, a store.Agent, pool string) (string, error) {
	b := store.AgentBinding{Namespace: a.Namespace, Kind: a.Kind, ModuleDigest: a.ModuleDigest, Plugin: a.Plugin}
	if a.Kind == store.KindPlugin {
		w, err := r.st.GetPluginWorker(ctx, a.Namespace, a.Plugin)
		if err != nil {
			return "", fmt.Errorf("runner: plugin worker %s: %w", a.Plugin, err)
		}
		b.PluginSHA256 = w.SHA256
	}
	return r.Binding(b, pool)
}

// MayRefuse reports whether CanRun can refuse pool: only a remote pool
// (host.PoolScope).
func (r *Runner) MayRefuse(pool string) bool { return r.remote[pool] }

// CanRun reports whether a turn of agent in pool could be dispatched on
// this host now (host.Placer): always for a local pool; for a remote pool,
// only while a live worker connected to this host's broker announces the
// pool and the kind the agent's binding needs (wasm, or its plugin). When
// the binding cannot be resolved, any live worker of the pool will do: the
// turn then fails as it would have anyway.
func (r *Runner) CanRun(ctx context.Context, a store.Agent, pool string) bool {
	if !r.remote[pool] {
		return true
	}
	if r.fabric == nil {
		return false
	}
	binding, err := r.current(ctx, a, pool)
	if err != nil {
		return r.fabric.Serves(pool, "")
	}
	_, inner, _ := strings.Cut(strings.TrimPrefix(binding, poolPrefix), "/")
	return r.fabric.Serves(pool, inner)
}

// InProcess reports whether binding's turns run in this process
// (host.InProcessRunner): a wasm module run here, not a remote pool's or a
// plugin's.
func (r *Runner) InProcess(binding string) bool {
	if strings.HasPrefix(binding, poolPrefix) {
		return false
	}
	_, _, plugin := pluginhost.ParseBinding(binding)
	return !plugin
}

// Instantiate returns an instance for a module digest or a plugin binding.
// A plugin registered on another host (through the shared store) is
// registered here on first use. An event whose first attempt ran a plugin
// version that has since been replaced fails: its retries must run the
// version they started with (docs/DESIGN.md invariant 10), which is gone.
func (r *Runner) Instantiate(ctx context.Context, binding string) (host.Instance, error) {
	if rest, ok := strings.CutPrefix(binding, poolPrefix); ok {
		pool, inner, _ := strings.Cut(rest, "/")
		if r.fabric == nil {
			return nil, fmt.Errorf("runner: binding %s names remote pool %q but this host has no fabric (fabric.listen)", binding, pool)
		}
		inst, err := r.fabric.Instance(pool, inner)
		if err != nil {
			return nil, err
		}
		return inst, nil
	}
	name, sum, ok := pluginhost.ParseBinding(binding)
	if !ok {
		return r.Wasm.Instantiate(ctx, binding)
	}
	if cfg, ok := r.plugins.Registered(name); !ok || cfg.SHA256 != sum {
		ns, plain := store.SplitQualified(name)
		w, err := r.st.GetPluginWorker(ctx, ns, plain)
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
	return inst, nil
}

// CheckPlugin registers w with this host's plugin manager, which verifies
// the binary (exists, executable, checksum) and starts it once to check the
// handshake and ABI version (service.Plugins).
func (r *Runner) CheckPlugin(ctx context.Context, w store.PluginWorker) error {
	return r.plugins.Register(ctx, pluginConfig(w))
}

func pluginConfig(w store.PluginWorker) pluginhost.Config {
	return pluginhost.Config{Name: store.QualifiedName(w.Namespace, w.Name), Path: w.Path, SHA256: w.SHA256, Env: w.Env, Processes: w.Processes}
}
