package service

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/store"
)

// ---- modules

// UploadModule inspects b (raw wasm) and stores it by digest, visible in
// the namespace of ctx; created is false when a module with that digest
// was visible there already. An empty or refused module is a
// *RejectedError.
func (s *Service) UploadModule(ctx context.Context, b []byte) (m store.Module, created bool, err error) {
	ns, err := s.namespace(ctx)
	if err != nil {
		return m, false, err
	}
	if len(b) == 0 {
		return m, false, &RejectedError{Resource: ResourceModule, Err: errors.New("the module is empty")}
	}
	digest, version, err := s.modules.Inspect(ctx, b)
	if err != nil {
		return m, false, &RejectedError{Resource: ResourceModule, Err: err}
	}
	m, created, err = s.st.PutModule(ctx, store.PutModuleParams{Namespace: ns, Digest: digest, ABIVersion: version, Bytes: b})
	return m, created, wrap("upload module", err)
}

// ListModules returns the modules visible in the namespace of ctx without
// their bytes, newest first.
func (s *Service) ListModules(ctx context.Context) ([]store.Module, error) {
	ns, err := s.namespace(ctx)
	if err != nil {
		return nil, err
	}
	ms, err := s.st.ListModules(ctx, ns)
	return ms, wrap("list modules", err)
}

// GetModule returns the module with the digest ("sha256:<hex>") visible
// in the namespace of ctx, or a *NotFoundError for field "digest".
func (s *Service) GetModule(ctx context.Context, digest string) (store.Module, error) {
	ns, err := s.namespace(ctx)
	if err != nil {
		return store.Module{}, err
	}
	m, err := s.st.GetModule(ctx, ns, digest)
	if errors.Is(err, store.ErrNotFound) {
		return m, &NotFoundError{Resource: ResourceModule, Field: "digest", Message: fmt.Sprintf("no module with digest %q", digest)}
	}
	return m, wrap("get module", err)
}

// ---- plugin workers

// PluginParams register a plugin worker.
type PluginParams struct {
	// Name is the worker's name (lowercase letters, digits, '_' and '-',
	// at most 63).
	Name string
	// Path is the plugin binary on the host; SHA256 its 64 lowercase hex
	// digits.
	Path, SHA256 string
	// Env is the environment the plugin process gets.
	Env map[string]string
	// Processes is how many plugin processes run, 1 to 64 (0: 1).
	Processes int
}

// sha256RE matches a lowercase hex sha256.
var sha256RE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// envNameRE matches the environment variable names a plugin may be given.
var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// RegisterPlugin checks p on this host (Plugins.CheckPlugin) and registers
// it in the namespace of ctx, or replaces the registration of that name
// there (created false). Refusals:
// *InvalidError for name, path, sha256, env or processes;
// ErrPluginsDisabled; *RejectedError when the check fails.
func (s *Service) RegisterPlugin(ctx context.Context, p PluginParams) (w store.PluginWorker, created bool, err error) {
	ns, err := s.namespace(ctx)
	if err != nil {
		return w, false, err
	}
	switch {
	case !nameRE.MatchString(p.Name):
		return w, false, checkName(p.Name)
	case p.Path == "":
		return w, false, missing("path", "path (the plugin binary on the host) is required")
	case !sha256RE.MatchString(p.SHA256):
		return w, false, invalid("sha256", "sha256 %q must be the binary's 64 lowercase hex digits (sha256sum)", p.SHA256)
	case p.Processes < 0 || p.Processes > 64:
		return w, false, invalid("processes", "processes %d must be between 1 and 64 (0: 1)", p.Processes)
	}
	names := make([]string, 0, len(p.Env))
	for k := range p.Env {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		// "A=B": "x" would reach the plugin as A="B=x"; NUL cannot be
		// passed to a process (nor stored by PostgreSQL).
		if !envNameRE.MatchString(k) {
			return w, false, invalid("env", "env name %q must be letters, digits and '_', not starting with a digit", k)
		}
		if strings.IndexByte(p.Env[k], 0) >= 0 {
			return w, false, invalid("env", "env %s holds a NUL character", k)
		}
	}
	w = store.PluginWorker{Namespace: ns, Name: p.Name, Path: p.Path, SHA256: p.SHA256, Env: p.Env, Processes: max(p.Processes, 1)}
	if s.plugins == nil {
		return w, false, ErrPluginsDisabled
	}
	if err := s.plugins.CheckPlugin(ctx, w); err != nil {
		return w, false, &RejectedError{Resource: ResourcePlugin, Err: err}
	}
	w, created, err = s.st.PutPluginWorker(ctx, w)
	return w, created, wrap("register plugin", err)
}

// ListPlugins returns the plugin workers of the namespace of ctx by name
// (never nil).
func (s *Service) ListPlugins(ctx context.Context) ([]store.PluginWorker, error) {
	ns, err := s.namespace(ctx)
	if err != nil {
		return nil, err
	}
	ps, err := s.st.ListPluginWorkers(ctx, ns)
	if ps == nil {
		ps = []store.PluginWorker{}
	}
	return ps, wrap("list plugins", err)
}

// GetPlugin returns the plugin worker of that name of the namespace of
// ctx, or a *NotFoundError for field "plugin".
func (s *Service) GetPlugin(ctx context.Context, name string) (store.PluginWorker, error) {
	ns, err := s.namespace(ctx)
	if err != nil {
		return store.PluginWorker{}, err
	}
	p, err := s.st.GetPluginWorker(ctx, ns, name)
	if errors.Is(err, store.ErrNotFound) {
		return p, &NotFoundError{Resource: ResourcePlugin, Field: "plugin", Message: fmt.Sprintf("no plugin worker named %q", name)}
	}
	return p, wrap("get plugin", err)
}

// ---- agents

// Binding is what an agent runs and its default crash policy: a module
// digest ("sha256:<hex>") or a plugin worker name, not both.
type Binding struct {
	Module, Plugin string
	// CrashPolicy is restart, sleep or destroy; empty means the configured
	// default for the agent (host.Policy.For), for UpdateAgent the
	// agent's current one.
	CrashPolicy string
}

// CreateAgent registers an agent named name with binding b in the
// namespace of ctx (its module must be visible, its plugin worker
// registered, there). Refusals:
// *InvalidError (name, module, plugin, crash_policy); a *ConflictError
// ConflictAgentExists (field "name") when the name is taken; a
// *NotFoundError with Referenced when the module or plugin does not exist.
func (s *Service) CreateAgent(ctx context.Context, name string, b Binding) (store.Agent, error) {
	if err := checkNewName(name); err != nil {
		return store.Agent{}, err
	}
	return s.putAgent(ctx, name, b, false)
}

// UpdateAgent re-binds the agent a (as GetAgent returned it): new events
// run the new binding, events already started keep theirs (docs/DESIGN.md
// invariant 10). Refusals as CreateAgent, without the conflict.
func (s *Service) UpdateAgent(ctx context.Context, a store.Agent, b Binding) (store.Agent, error) {
	if b.CrashPolicy == "" {
		b.CrashPolicy = string(a.CrashPolicy)
	}
	if ns, err := s.namespace(ctx); err != nil {
		return store.Agent{}, err
	} else if ns != a.Namespace {
		// a came from GetAgent of another namespace: never reachable here.
		return store.Agent{}, notFoundAgent(a.Name)
	}
	return s.putAgent(ctx, a.Name, b, true)
}

// checkNewName refuses a new agent's name that has the shape of an agent
// uid (a UUID): GetAgent resolves a name or a uid, so such a name could
// be taken for another agent's uid. Agents that have such a name already
// keep it.
func checkNewName(name string) error {
	if len(name) == 36 && uuid.Validate(name) == nil {
		return invalid("name", "name %q has the shape of an agent uid (a UUID); choose a name that does not", name)
	}
	return nil
}

func (s *Service) putAgent(ctx context.Context, name string, b Binding, update bool) (store.Agent, error) {
	ns, err := s.namespace(ctx)
	if err != nil {
		return store.Agent{}, err
	}
	if err := checkName(name); err != nil {
		return store.Agent{}, err
	}
	kind := store.KindWasm
	switch {
	case b.Module != "" && b.Plugin != "":
		return store.Agent{}, invalid("plugin", "an agent runs either a module or a plugin, not both")
	case b.Plugin != "":
		kind = store.KindPlugin
	case b.Module == "":
		return store.Agent{}, missing("module", "module (a module digest, sha256:<hex>) or plugin (a plugin worker name) is required")
	}
	// The one configured default (docs/DESIGN.md "Crash policy"), or the agent's
	// override in the config.
	pol, err := policy(b.CrashPolicy, s.h.Policy().For(store.QualifiedName(ns, name)).CrashPolicy)
	if err != nil {
		return store.Agent{}, err
	}
	a, err := s.st.CreateAgent(ctx, store.CreateAgentParams{
		UID: uuid.NewString(), Namespace: ns, Name: name, Kind: kind, ModuleDigest: b.Module, Plugin: b.Plugin, CrashPolicy: pol,
		Upsert: update,
	})
	switch {
	case errors.Is(err, store.ErrConflict):
		return a, &ConflictError{Reason: ConflictAgentExists, Field: "name",
			Message: fmt.Sprintf("an agent named %q already exists", name)}
	case errors.Is(err, store.ErrNotFound) && kind == store.KindPlugin:
		return a, &NotFoundError{Resource: ResourcePlugin, Field: "plugin", Referenced: true,
			Message: fmt.Sprintf("no plugin worker named %q in namespace %q; register it there first", b.Plugin, ns)}
	case errors.Is(err, store.ErrNotFound):
		return a, &NotFoundError{Resource: ResourceModule, Field: "module", Referenced: true,
			Message: fmt.Sprintf("no module with digest %q in namespace %q; upload it there first", b.Module, ns)}
	}
	return a, wrap("put agent", err)
}

// ListAgents returns the agents of the namespace of ctx by name.
func (s *Service) ListAgents(ctx context.Context) ([]store.Agent, error) {
	ns, err := s.namespace(ctx)
	if err != nil {
		return nil, err
	}
	as, err := s.st.ListAgents(ctx, ns)
	return as, wrap("list agents", err)
}

// GetAgent returns the agent named (or with the uid) nameOrUID of the
// namespace of ctx, or a *NotFoundError for field "agent" (also for an
// agent of another namespace, by name or by uid: the same answer as a
// missing one).
func (s *Service) GetAgent(ctx context.Context, nameOrUID string) (store.Agent, error) {
	ns, err := s.namespace(ctx)
	if err != nil {
		return store.Agent{}, err
	}
	a, err := s.st.GetAgent(ctx, ns, nameOrUID)
	if errors.Is(err, store.ErrNotFound) {
		return a, notFoundAgent(nameOrUID)
	}
	return a, wrap("get agent", err)
}

// notFoundAgent is the answer for an agent that is not in the namespace
// asked, missing or of another namespace alike.
func notFoundAgent(nameOrUID string) error {
	return &NotFoundError{Resource: ResourceAgent, Field: "agent", Message: fmt.Sprintf("no agent named %q", nameOrUID)}
}
