package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/fabric"
	"github.com/paddock-dev/paddock/fabric/guard"
	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/host/api"
	"github.com/paddock-dev/paddock/host/calls"
	"github.com/paddock-dev/paddock/host/config"
	"github.com/paddock-dev/paddock/host/console"
	"github.com/paddock-dev/paddock/host/rivetapi"
	"github.com/paddock-dev/paddock/host/runner"
	"github.com/paddock-dev/paddock/host/service"
	"github.com/paddock-dev/paddock/host/stream"
	"github.com/paddock-dev/paddock/plugins/pluginhost"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/store/postgres"
	"github.com/paddock-dev/paddock/store/sqlite"
	"github.com/paddock-dev/paddock/tracing"
	"github.com/paddock-dev/paddock/wasm"
)

// serveFlags maps `paddock serve` flags to configuration keys.
var serveFlags = map[string]string{
	"listen": "listen", "data-dir": "data_dir", "store": "store.driver", "dsn": "store.dsn",
	"log-level": "log.level", "auth-token": "auth_token", "fabric-listen": "fabric.listen",
}

func newServe() *cobra.Command {
	var cfgFile string
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the host: the API, the controllers and the wasm runtime",
		Long: "Run the host. Configuration: defaults → --config YAML file → PADDOCK_* environment\n" +
			"(nesting with a double underscore: PADDOCK_STORE__DSN) → flags.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			src := config.Sources{File: cfgFile, Environ: os.Environ(), Flags: cmd.Flags(), FlagKeys: serveFlags}
			cfg, err := config.Load(src)
			if err != nil {
				return err
			}
			return serve(cmd.Context(), cfg, src)
		},
	}
	f := cmd.Flags()
	f.StringVarP(&cfgFile, "config", "c", "", "YAML configuration file")
	f.String("listen", "", "API address host:port (default 127.0.0.1:8080)")
	f.String("data-dir", "", "data directory (default ./data)")
	f.String("store", "", "store driver: sqlite or postgres")
	f.String("dsn", "", "store DSN (postgres://… or a sqlite file)")
	f.String("log-level", "", "debug, info, warn or error")
	f.String("auth-token", "", "bearer token the API requires")
	f.String("fabric-listen", "", "endpoint remote workers connect to, e.g. tcp://127.0.0.1:7700 (\"\" disables the fabric)")
	return cmd
}

func newLogger(c config.Log) *slog.Logger {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(c.Level))
	opts := &slog.HandlerOptions{Level: lvl}
	// A record logged under an active span carries its trace_id and span_id.
	if c.Format == "json" {
		return slog.New(tracing.LogHandler(slog.NewJSONHandler(os.Stderr, opts)))
	}
	return slog.New(tracing.LogHandler(slog.NewTextHandler(os.Stderr, opts)))
}

// openStore opens the configured store driver (migrations run at open).
func openStore(ctx context.Context, cfg config.Config) (store.Store, error) {
	switch cfg.Store.Driver {
	case "postgres":
		return postgres.Open(ctx, cfg.Store.DSN)
	default:
		dsn := cfg.Store.DSN
		if dsn == "" {
			if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
				return nil, fmt.Errorf("data_dir %s: %w", cfg.DataDir, err)
			}
			dsn = filepath.Join(cfg.DataDir, "paddock.db")
		}
		return sqlite.Open(ctx, dsn)
	}
}

// agentPolicy maps a configured policy onto the host's form.
func agentPolicy(p config.Policy) host.AgentPolicy {
	return host.AgentPolicy{
		CrashPolicy: store.CrashPolicy(p.CrashPolicy), MaxAttempts: p.MaxAttempts,
		BackoffMin: p.BackoffMin, BackoffMax: p.BackoffMax, BlockOnDeadLetter: p.DeadLetter == "block",
		IdleTimeout: p.IdleTimeout, TurnTimeout: p.TurnTimeout, RestartPendingTimeout: p.RestartPendingTimeout,
		Pool: p.Pool, TranscriptTail: p.TranscriptTail, InstanceReuse: host.InstanceScope(p.InstanceReuse),
		MidTurn: host.MidTurn(p.MidTurn),
	}
}

// newExecutor builds the host-call executor from the configuration: the
// model endpoints, the secrets (declared in config, or set through the API
// and sealed under secrets_key in the store), the egress rules and the
// metrics on the host's registry.
func newExecutor(cfg config.Config, st store.Store, m *host.Metrics, log *slog.Logger) (*calls.Executor, *calls.Secrets, error) {
	key, err := cfg.SecretsKeyBytes()
	if err != nil {
		return nil, nil, err
	}
	secrets, err := calls.NewSecrets(calls.SecretsConfig{
		Declared: cfg.SecretSources(), Key: key, Sealed: st,
		NotFound: func(err error) bool { return errors.Is(err, store.ErrNotFound) },
	})
	if err != nil {
		return nil, nil, fmt.Errorf("secrets: %w", err)
	}
	x, err := calls.New(calls.Config{
		Endpoints: cfg.ModelEndpoints(), Secrets: secrets, Timeout: cfg.HostCalls.Timeout,
		MaxResponseBytes: cfg.HostCalls.MaxResponseBytes, Egress: calls.EgressConfig{OwnAddrs: cfg.OwnAPIAddrs()},
		Metrics: calls.NewMetrics(m.Registry), Logger: log.With("component", "host-calls"),
	})
	if err != nil {
		return nil, nil, fmt.Errorf("host calls: %w", err)
	}
	checkSealedSecrets(context.Background(), st, secrets, key != nil, log)
	return x, secrets, nil
}

// checkSealedSecrets warns at start about secrets set through the API that
// this host cannot open (another secrets_key, or none): they would fail
// only at the first call that uses them. It names them, never a value.
func checkSealedSecrets(ctx context.Context, st store.Store, secrets *calls.Secrets, haveKey bool, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	list, err := st.ListSecrets(ctx, store.AnyNamespace)
	if err != nil || len(list) == 0 {
		return
	}
	if !haveKey {
		log.Warn("secrets set through the API cannot be used: this host has no secrets_key", "secrets", len(list))
		return
	}
	var bad []string
	for _, sec := range list {
		q := calls.Qualified(sec.Namespace, sec.Name)
		sealed, err := st.SealedSecret(ctx, sec.Namespace, sec.Name)
		if err == nil {
			_, err = secrets.Open(q, sealed)
		}
		if err != nil {
			bad = append(bad, q)
		}
	}
	if len(bad) > 0 {
		log.Warn("secrets set through the API do not open with this secrets_key (another key sealed them): calls using them answer not_configured", "secrets", bad)
	}
}

// policyFromConfig maps configuration onto the host's policy.
func policyFromConfig(cfg config.Config) host.Policy {
	p := host.DefaultPolicy()
	p.LeaseTTL = cfg.Runtime.LeaseTTL
	p.ScanInterval = cfg.Runtime.ScanInterval
	p.TranscriptTail = cfg.Runtime.TranscriptTail
	p.ShutdownTimeout = cfg.Runtime.ShutdownTimeout
	p.PromoteAfter = cfg.Runtime.PromoteAfter
	p.Stream = host.StreamPolicy{FlushInterval: cfg.Stream.FlushInterval, Retention: cfg.Stream.Retention, MaxBytesPerTurn: cfg.Stream.MaxBytesPerTurn}
	p.AgentPolicy = agentPolicy(cfg.Policy)
	p.AgentPolicy.Capabilities = cfg.Capabilities.Calls()
	p.Agents = map[string]host.AgentPolicy{}
	for _, a := range cfg.Agents {
		ap := agentPolicy(cfg.AgentPolicy(a.Name))
		ap.Capabilities = cfg.AgentCapabilities(a.Name)
		p.Agents[a.Name] = ap
	}
	p.Namespaces = map[string]host.NamespacePolicy{}
	for name, n := range cfg.Namespaces {
		q := n.Quotas
		p.Namespaces[name] = host.NamespacePolicy{Quotas: host.Quotas{LiveSessions: q.LiveSessions,
			SignalsPerMinute: q.SignalsPerMinute, ModelTokensPerDay: q.ModelTokensPerDay}}
	}
	p.Pools = map[string]int{}
	for name, pl := range cfg.Pools {
		p.Pools[name] = pl.Capacity
	}
	return p
}

func serve(ctx context.Context, cfg config.Config, src config.Sources) error {
	log := newLogger(cfg.Log)
	log.Info("paddock starting", "store", cfg.Store.Driver, "data_dir", cfg.DataDir, "listen", cfg.Listen)
	st, err := openStore(ctx, cfg)
	if err != nil {
		return fmt.Errorf("open %s store: %w", cfg.Store.Driver, err)
	}
	defer st.Close()
	log.Info("store open, migrations applied", "store", st.Driver())

	// The wasm runtime's own turn cap is a backstop; each turn runs under
	// its agent's policy.turn_timeout through its context.
	wcfg := wasm.Config{
		MemoryLimitPages: cfg.Wasm.MemoryLimitPages, TurnTimeout: 24 * time.Hour, MaxResultBytes: cfg.Wasm.MaxResultBytes,
	}
	if cfg.Wasm.CompilationCache {
		wcfg.CacheDir = cfg.Wasm.CacheDir
		if wcfg.CacheDir == "" {
			wcfg.CacheDir = filepath.Join(cfg.DataDir, "wasm-cache")
		}
	}
	rt, err := wasm.New(ctx, wcfg, log.With("component", "wasm"))
	if err != nil {
		return fmt.Errorf("wasm runtime: %w", err)
	}
	defer rt.Close(context.Background())
	pm := pluginhost.NewManager(log.With("component", "plugins"), pluginhost.Options{})
	defer pm.Close(context.Background()) // plugin processes never outlive the host
	r := runner.New(runner.NewWasm(rt, st), pm, st)

	// Late replies of remote turns go through the fences like any other;
	// the host that submits them is made below.
	var late atomic.Pointer[host.Host]
	var broker *fabric.Broker
	if cfg.Fabric.Listen != "" {
		b, err := startBroker(ctx, cfg, st, log, func(res *abi.TurnResult) {
			if h := late.Load(); h != nil {
				cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_, _ = h.Commit(cctx, res) // a rejection is counted and logged by Commit
			}
		}, func() {
			// A worker connected: sessions of its pools that waited for one
			// (signalled through any host) start now, not at the next scan.
			// Before the host exists, its first scan at start does it.
			if h := late.Load(); h != nil {
				h.Rescan()
			}
		})
		if err != nil {
			return err
		}
		defer b.Close(context.Background())
		var remote []string
		for name, p := range cfg.Pools {
			if p.Remote {
				remote = append(remote, name)
			}
		}
		r.WithFabric(b, remote)
		broker = b
	}

	metrics := host.NewMetrics()
	exec, secrets, err := newExecutor(cfg, st, metrics, log)
	if err != nil {
		return err
	}
	// Session streams: the host pokes the hub after its frame writes, the
	// hub polls the heads of watched sessions for other hosts' writes.
	hub := stream.New(stream.Options{Store: st, PollInterval: cfg.Stream.PollInterval, Logger: log.With("component", "stream")})
	defer hub.Close()
	tp, err := tracing.New(ctx, tracing.Config{Endpoint: cfg.Tracing.Endpoint, Headers: cfg.Tracing.Headers,
		SampleRatio: cfg.Tracing.SampleRatio, ServiceName: cfg.Tracing.ServiceName})
	if err != nil {
		return err
	}
	defer func() {
		// The spans still queued are sent before the process exits.
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tp.Shutdown(sctx); err != nil {
			log.Warn("tracing: flush at shutdown", "err", err)
		}
	}()
	if tp.Enabled() {
		log.Info("tracing on", "sample_ratio", cfg.Tracing.SampleRatio) // not the endpoint's headers
	}
	h, err := host.New(host.Options{Store: st, Runner: r, Policy: policyFromConfig(cfg), Logger: log, Metrics: metrics, Calls: exec,
		StreamNotify: hub.Poke, Tracing: tp})
	if err != nil {
		return err
	}
	// The one way into the runtime: the config's registrations and the
	// HTTP API go through the same operations and rules.
	svc := service.New(h, r, r).WithSecrets(secrets).WithStream(hub).WithAuthToken(cfg.AuthToken)
	var openAttrs []any // the open host's warning, logged once it serves
	if cfg.AuthToken == "" {
		// An open host: every request acts as the anonymous admin, and
		// stored tokens are not checked (docs/DESIGN.md "Tokens, roles
		// and the audit log").
		if ts, err := st.ListTokens(ctx, ""); err == nil && len(ts) > 0 {
			openAttrs = append(openAttrs, "stored_tokens", len(ts))
		}
	}
	if err := registerPlugins(ctx, cfg, svc, log); err != nil {
		return err
	}
	if err := registerAgents(ctx, cfg, svc, log); err != nil {
		return err
	}
	late.Store(h)
	if broker != nil {
		h.Metrics().Registry.MustRegister(newFabricCollector(broker))
		svc.WithWorkers(func() []service.RemoteWorker { return remoteWorkers(broker) })
	}
	h.Metrics().Registry.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "paddock_stream_subscribers", Help: "Open session-stream (SSE) subscriptions on this host."},
			func() float64 { return float64(hub.Subscribers()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "paddock_stream_watched_sessions", Help: "Sessions with stream subscribers on this host (one reader each)."},
			func() float64 { return float64(hub.Watched()) }))
	// The web console at /ui/ calls the same service; / redirects to it.
	ui, err := console.New(console.Options{Service: svc, AuthToken: cfg.AuthToken, Logger: log.With("component", "console")})
	if err != nil {
		return err
	}
	// Rivet's actors API (/actors) is a second front door over the same
	// service, behind the same token.
	rivet := rivetapi.New(rivetapi.Options{Service: svc, AuthToken: cfg.AuthToken, Logger: log.With("component", "rivetapi")})
	srv := &http.Server{
		Handler: rivet.Mount(ui.Handler(api.New(api.Options{
			Host: h, Service: svc, AuthToken: cfg.AuthToken, MaxBodyBytes: cfg.API.MaxBodyBytes,
			MaxModuleBytes: cfg.API.MaxModuleBytes, Logger: log,
		}))),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       2 * time.Minute, // module uploads of up to api.max_module_bytes
		// Transcript long-polls wait up to 60 s. Session streams (SSE) last
		// longer: their handler lifts the read deadline and sets a write
		// deadline per event (host/api stream.go).
		WriteTimeout: 2 * time.Minute,
		IdleTimeout:  2 * time.Minute,
	}
	if cfg.AuthToken == "" {
		if h, _, err := net.SplitHostPort(cfg.Listen); err == nil && api.LoopbackHost(h) {
			// Open on loopback: refuse requests addressed to any other
			// name, so that a DNS-rebinding page cannot use the API or the
			// console as its own origin.
			srv.Handler = api.LoopbackHostOnly(srv.Handler)
		}
	}
	// Open streams never go idle: end them first so that Shutdown can
	// finish (their clients reconnect to another host, or this one after
	// a restart, with Last-Event-ID).
	srv.RegisterOnShutdown(hub.Close)
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}
	hostDone := make(chan error, 1)
	go func() { hostDone <- h.Run(ctx) }()
	if src.File != "" {
		go watchConfig(ctx, src, cfg, h, log)
	}
	srvDone := make(chan error, 1)
	go func() { srvDone <- srv.Serve(ln) }()
	if svc.Open() {
		// Allowed on a loopback address only (config.Validate); said before
		// the line that it serves, for whoever tries tokens against it: no
		// token is checked.
		log.Warn("the API is open: no auth_token is set, so every request to its loopback address is served as the anonymous admin, whatever bearer token it carries, and stored tokens are not checked (set auth_token to require tokens)", openAttrs...)
	}
	log.Info("paddock serving", "listen", "http://"+ln.Addr().String(), "store", st.Driver(), "data_dir", cfg.DataDir)

	select {
	case <-ctx.Done():
	case err := <-srvDone:
		return fmt.Errorf("api server: %w", err)
	}
	shutCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutCtx)
	return <-hostDone
}

// startBroker binds the fabric's ROUTER socket through the guard transport
// (greetings pre-read off the accept loop, frame sizes capped, stalled
// writes cut: fabric/guard) for the configured workers.
// admitted is called (and must return at once) when a worker is admitted.
func startBroker(ctx context.Context, cfg config.Config, st store.Store, log *slog.Logger, lateResult func(*abi.TurnResult), admitted func()) (*fabric.Broker, error) {
	// The guard's write timeout sits below the broker's send timeout and
	// the heartbeat margin, so a peer that stops reading is cut before it
	// costs anyone a heartbeat; its frame limit is the broker's message
	// limit, enforced before allocation.
	wt := min(cfg.Fabric.SendTimeout, cfg.Fabric.HeartbeatTimeout-cfg.Fabric.HeartbeatInterval) * 3 / 4
	// DuplicateDistinct: a client claiming a worker's id without its key
	// (or a misconfigured copy of the worker) gets a connection of its own
	// and cannot displace the worker's; the broker answers whichever
	// connection last authenticated.
	g, err := guard.New(guard.Options{WriteTimeout: wt, MaxFrameSize: int64(cfg.Fabric.MaxMessageBytes), MaxMessageSize: int64(cfg.Fabric.MaxMessageBytes),
		DuplicateIdentity: guard.DuplicateDistinct, Logger: log.With("component", "fabric.guard")})
	if err != nil {
		return nil, fmt.Errorf("fabric: guard: %w", err)
	}
	if err := g.Register("gtcp-serve"); err != nil {
		return nil, fmt.Errorf("fabric: %w", err)
	}
	endpoint := cfg.Fabric.Listen
	if rest, ok := strings.CutPrefix(endpoint, "tcp://"); ok {
		endpoint = g.Endpoint(rest) // workers still dial plain tcp://
	}
	keys := map[string][]byte{}
	for _, w := range cfg.Fabric.Workers {
		k, err := w.WorkerKey()
		if err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
		keys[w.ID] = k
	}
	b, err := fabric.NewBroker(ctx, fabric.BrokerConfig{
		Endpoint: endpoint, Workers: keys,
		HeartbeatInterval: cfg.Fabric.HeartbeatInterval, HeartbeatTimeout: cfg.Fabric.HeartbeatTimeout,
		AcceptTimeout: cfg.Fabric.AcceptTimeout, SendTimeout: cfg.Fabric.SendTimeout,
		MaxMessageBytes: cfg.Fabric.MaxMessageBytes,
		Modules: func(ctx context.Context, digest string) ([]byte, error) {
			m, err := st.GetModule(ctx, store.AnyNamespace, digest)
			return m.Bytes, err
		},
		LateResult: lateResult,
		Disconnect: g.Disconnect,
		Admitted:   func(string, []string) { admitted() },
	}, log)
	if err != nil {
		return nil, fmt.Errorf("fabric: listen %s: %w", cfg.Fabric.Listen, err)
	}
	log.Info("fabric listening for remote workers (they dial tcp://; the host's end runs through the guard transport)",
		"listen", cfg.Fabric.Listen, "workers", len(keys))
	return b, nil
}

// registerPlugins verifies and registers the configured plugin workers that
// do not exist yet (service.RegisterPlugin: the API's rules and check). The
// config seeds; the store owns: a plugin worker that exists (registered
// through the API, or by another host) is left as it is, and a difference
// from the config is logged by field name (never the env values).
func registerPlugins(ctx context.Context, cfg config.Config, svc *service.Service, log *slog.Logger) error {
	for i, p := range cfg.Plugins {
		sum, err := p.PluginSHA256()
		if err != nil {
			return fmt.Errorf("config: plugins[%d]: %w", i, err)
		}
		// "team-a/tool" is plugin worker tool of namespace team-a.
		ns, name := store.SplitQualified(p.Name)
		ctx := service.WithNamespace(ctx, ns)
		want := service.PluginParams{Name: name, Path: p.Path, SHA256: sum, Env: p.Env, Processes: p.Processes}
		old, err := svc.GetPlugin(ctx, name)
		var notFound *service.NotFoundError
		switch {
		case err == nil:
			logLeftAlone(log, "plugin", p.Name, pluginDiff(old, want))
			continue
		case !errors.As(err, &notFound):
			return fmt.Errorf("look up plugin %s: %w", p.Name, err)
		}
		_, _, err = svc.RegisterPlugin(ctx, want)
		var rejected *service.RejectedError
		switch {
		case errors.As(err, &rejected):
			return fmt.Errorf("config: plugins[%d] (%s): %w", i, p.Name, rejected.Err)
		case err != nil:
			return fmt.Errorf("register plugin %s: %w", p.Name, err)
		}
		log.Info("plugin worker registered from config", "plugin", p.Name, "path", p.Path, "sha256", sum)
	}
	return nil
}

// pluginDiff names the fields in which the stored plugin worker differs
// from the config's.
func pluginDiff(old store.PluginWorker, want service.PluginParams) []string {
	return differing(map[string]bool{
		"path":      old.Path != want.Path,
		"sha256":    old.SHA256 != want.SHA256,
		"env":       !maps.Equal(old.Env, want.Env) && (len(old.Env) > 0 || len(want.Env) > 0),
		"processes": old.Processes != max(want.Processes, 1),
	})
}

// differing returns the sorted names whose value is true.
func differing(fields map[string]bool) []string {
	var out []string
	for name, differs := range fields {
		if differs {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// logLeftAlone logs that the config left an existing agent or plugin
// worker as it is, naming what differs from the config.
func logLeftAlone(log *slog.Logger, kind, name string, diff []string) {
	if len(diff) == 0 {
		log.Info(kind+" exists; config matches", kind, name)
		return
	}
	log.Warn(kind+" exists and differs from the config; left as it is (the config only seeds what does not exist; change it through the API)",
		kind, name, "differs", strings.Join(diff, ","))
}

// registerAgents uploads the configured agents' modules and registers the
// agents that do not exist yet, so that `make run` has example agents
// ready. The config seeds; the store owns: an agent that exists (created or
// re-bound through the API, or by another host) is left as it is, and a
// difference from the config is logged by field name, never rolled back.
func registerAgents(ctx context.Context, cfg config.Config, svc *service.Service, log *slog.Logger) error {
	for i, a := range cfg.Agents {
		// "team-a/chat" is agent chat of namespace team-a: its module is
		// uploaded there, its plugin worker is team-a's.
		ns, name := store.SplitQualified(a.Name)
		ctx := service.WithNamespace(ctx, ns)
		b := service.Binding{Plugin: a.Plugin, CrashPolicy: cfg.AgentPolicy(a.Name).CrashPolicy}
		if a.Plugin == "" {
			if a.ModuleFile == "" {
				continue // a policy override only
			}
			wasm, err := os.ReadFile(a.ModuleFile)
			if err != nil {
				return fmt.Errorf("config: agents[%d].module_file: %w", i, err)
			}
			m, _, err := svc.UploadModule(ctx, wasm)
			var rejected *service.RejectedError
			switch {
			case errors.As(err, &rejected):
				return fmt.Errorf("config: agents[%d].module_file %s: %w", i, a.ModuleFile, rejected.Err)
			case err != nil:
				return fmt.Errorf("store module %s: %w", a.ModuleFile, err)
			}
			b.Module = m.Digest
		}
		ag, err := svc.CreateAgent(ctx, name, b)
		var conflict *service.ConflictError
		if errors.As(err, &conflict) && conflict.Reason == service.ConflictAgentExists {
			old, err := svc.GetAgent(ctx, name)
			if err != nil {
				return fmt.Errorf("look up agent %s: %w", a.Name, err)
			}
			logLeftAlone(log, "agent", a.Name, agentDiff(old, b))
			continue
		}
		if err != nil {
			return fmt.Errorf("register agent %s: %w", a.Name, err)
		}
		log.Info("agent registered from config", "agent", store.QualifiedName(ag.Namespace, ag.Name), "module", ag.ModuleDigest, "plugin", ag.Plugin, "crash_policy", ag.CrashPolicy)
	}
	return nil
}

// agentDiff names the fields in which the stored agent differs from the
// config's binding.
func agentDiff(old store.Agent, b service.Binding) []string {
	return differing(map[string]bool{
		"module":       old.ModuleDigest != b.Module,
		"plugin":       old.Plugin != b.Plugin,
		"crash_policy": b.CrashPolicy != "" && string(old.CrashPolicy) != b.CrashPolicy,
	})
}

// watchConfig reloads the policies when the config file changes: the new
// file is loaded and validated in full (defaults, file, environment, flags)
// and swapped in atomically; an invalid file is refused and logged and the
// old policies stay. Keys that need a restart are named in the log.
func watchConfig(ctx context.Context, src config.Sources, cur config.Config, h *host.Host, log *slog.Logger) {
	changes := make(chan struct{}, 1)
	stop, err := config.Watch(src.File, func() {
		select {
		case changes <- struct{}{}:
		default:
		}
	})
	if err != nil {
		log.Warn("config reload disabled: cannot watch the file", "file", src.File, "err", err)
		return
	}
	defer stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-changes:
		}
		// Editors write in several steps: let the file settle.
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
		next, err := config.Load(src)
		if err != nil {
			log.Error("config reload refused; the running policies stay", "file", src.File, "err", err)
			continue
		}
		if keys := cur.RestartOnlyChanges(next); len(keys) > 0 {
			log.Warn("config reload: these keys change only at restart", "keys", keys)
		}
		for name := range cur.Namespaces {
			if _, kept := next.Namespaces[name]; !kept {
				// Its objects stay stored, unreachable (404) until it is
				// declared again.
				log.Warn("config reload: namespace no longer declared; its agents, sessions and tokens are unreachable until it is declared again", "namespace", name)
			}
		}
		h.SetPolicy(policyFromConfig(next))
		log.Info("config reloaded: policies swapped", "file", src.File)
		cur = next
	}
}
