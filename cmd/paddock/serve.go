package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/host/api"
	"github.com/paddock-dev/paddock/host/config"
	"github.com/paddock-dev/paddock/host/runner"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/store/postgres"
	"github.com/paddock-dev/paddock/store/sqlite"
	"github.com/paddock-dev/paddock/wasm"
)

// serveFlags maps `paddock serve` flags to configuration keys.
var serveFlags = map[string]string{
	"listen": "listen", "data-dir": "data_dir", "store": "store.driver", "dsn": "store.dsn",
	"log-level": "log.level", "auth-token": "auth_token",
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
			cfg, err := config.Load(config.Sources{
				File: cfgFile, Environ: os.Environ(), Flags: cmd.Flags(), FlagKeys: serveFlags,
			})
			if err != nil {
				return err
			}
			return serve(cmd.Context(), cfg)
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
	return cmd
}

func newLogger(c config.Log) *slog.Logger {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(c.Level))
	opts := &slog.HandlerOptions{Level: lvl}
	if c.Format == "json" {
		return slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts))
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

// PolicyFromConfig maps configuration onto the host's policy.
func policyFromConfig(cfg config.Config) host.Policy {
	p := host.DefaultPolicy()
	p.LeaseTTL = cfg.Runtime.LeaseTTL
	p.IdleTimeout = cfg.Runtime.IdleTimeout
	p.ScanInterval = cfg.Runtime.ScanInterval
	p.TranscriptTail = cfg.Runtime.TranscriptTail
	p.ShutdownTimeout = cfg.Runtime.ShutdownTimeout
	p.TurnTimeout = cfg.Wasm.TurnTimeout
	p.MaxAttempts = cfg.Retry.MaxAttempts
	p.BackoffMin, p.BackoffMax = cfg.Retry.BackoffMin, cfg.Retry.BackoffMax
	return p
}

func serve(ctx context.Context, cfg config.Config) error {
	log := newLogger(cfg.Log)
	st, err := openStore(ctx, cfg)
	if err != nil {
		return fmt.Errorf("open %s store: %w", cfg.Store.Driver, err)
	}
	defer st.Close()

	wcfg := wasm.Config{
		MemoryLimitPages: cfg.Wasm.MemoryLimitPages, TurnTimeout: cfg.Wasm.TurnTimeout, MaxResultBytes: cfg.Wasm.MaxResultBytes,
	}
	if cfg.Wasm.CompilationCache {
		wcfg.CacheDir = filepath.Join(cfg.DataDir, "wasm-cache")
	}
	rt, err := wasm.New(ctx, wcfg, log.With("component", "wasm"))
	if err != nil {
		return fmt.Errorf("wasm runtime: %w", err)
	}
	defer rt.Close(context.Background())
	wr := runner.NewWasm(rt, st)

	if err := registerAgents(ctx, cfg, st, wr, log); err != nil {
		return err
	}

	h, err := host.New(host.Options{Store: st, Runner: wr, Policy: policyFromConfig(cfg), Logger: log})
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler: api.New(api.Options{
			Host: h, Modules: wr, AuthToken: cfg.AuthToken, MaxBodyBytes: cfg.API.MaxBodyBytes,
			MaxModuleBytes: cfg.API.MaxModuleBytes, DefaultCrashPolicy: store.CrashPolicy(cfg.CrashPolicy), Logger: log,
		}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}
	hostDone := make(chan error, 1)
	go func() { hostDone <- h.Run(ctx) }()
	srvDone := make(chan error, 1)
	go func() { srvDone <- srv.Serve(ln) }()
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

// registerAgents uploads the configured agents' modules and registers (or
// re-binds) the agents, so that `make run` has example agents ready.
func registerAgents(ctx context.Context, cfg config.Config, st store.Store, wr *runner.Wasm, log *slog.Logger) error {
	for i, a := range cfg.Agents {
		b, err := os.ReadFile(a.ModuleFile)
		if err != nil {
			return fmt.Errorf("config: agents[%d].module_file: %w", i, err)
		}
		digest, version, err := wr.Inspect(ctx, b)
		if err != nil {
			return fmt.Errorf("config: agents[%d].module_file %s: %w", i, a.ModuleFile, err)
		}
		if _, _, err := st.PutModule(ctx, store.PutModuleParams{Digest: digest, ABIVersion: version, Bytes: b}); err != nil {
			return fmt.Errorf("store module %s: %w", a.ModuleFile, err)
		}
		policy := store.CrashPolicy(a.CrashPolicy)
		if policy == "" {
			policy = store.CrashPolicy(cfg.CrashPolicy)
		}
		ag, err := st.CreateAgent(ctx, store.CreateAgentParams{
			UID: uuid.NewString(), Name: a.Name, ModuleDigest: digest, CrashPolicy: policy, Upsert: true,
		})
		if err != nil {
			return fmt.Errorf("register agent %s: %w", a.Name, err)
		}
		log.Info("agent registered from config", "agent", ag.Name, "module", digest, "crash_policy", ag.CrashPolicy)
	}
	return nil
}

// digestOf returns the content address of b.
func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

var errUsage = errors.New("usage")
