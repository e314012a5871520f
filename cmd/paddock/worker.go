package main

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/paddock-dev/paddock/fabric/wire"
	"github.com/paddock-dev/paddock/fabric/worker"
	"github.com/paddock-dev/paddock/host/config"
	"github.com/paddock-dev/paddock/plugins/pluginhost"
	"github.com/paddock-dev/paddock/wasm"
)

func newWorkerCmd() *cobra.Command {
	var (
		connect, id, keyFile, cacheDir, logLevel string
		pools, pluginSpecs                       []string
		capacity                                 int
		memPages                                 uint32
		turnTimeout                              time.Duration
	)
	cmd := &cobra.Command{
		Use:   "worker --connect tcp://HOST:PORT --id ID --key-file FILE --pool NAME",
		Short: "Run a remote worker: it connects to a host's fabric and runs turns of the pools it serves",
		Long: "Run a remote worker. It authenticates with its id and key (listed in the host's fabric.workers),\n" +
			"announces its pools, kinds and free capacity, runs wasm agents (modules fetched from the host by\n" +
			"digest and cached under --cache-dir) and the plugin workers given with --plugin, heartbeats, and\n" +
			"reconnects after a host restart. The wire protocol is abi/FABRIC.md.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch logLevel {
			case "debug", "info", "warn", "error":
			default:
				return fmt.Errorf("--log-level %q: want debug, info, warn or error", logLevel)
			}
			log := newLogger(config.Log{Level: logLevel, Format: "text"})
			if capacity < 1 || capacity > 4096 {
				return fmt.Errorf("--capacity %d: want 1..4096 turns at once", capacity)
			}
			if err := checkEndpoint(connect); err != nil {
				return fmt.Errorf("--connect %q: %w", connect, err)
			}
			raw, err := os.ReadFile(keyFile)
			if err != nil {
				return fmt.Errorf("--key-file: %w", err)
			}
			key, err := wire.ParseKey(string(raw))
			if err != nil {
				return fmt.Errorf("--key-file %s: %w", keyFile, err)
			}
			var pcs []pluginhost.Config
			for _, spec := range pluginSpecs {
				name, path, ok := strings.Cut(spec, "=")
				if !ok || name == "" || path == "" {
					return fmt.Errorf("--plugin %q: want NAME=PATH", spec)
				}
				sum, err := pluginhost.FileSHA256(path)
				if err != nil {
					return fmt.Errorf("--plugin %s: %w", name, err)
				}
				pcs = append(pcs, pluginhost.Config{Name: name, Path: path, SHA256: sum})
			}
			if cacheDir == "" {
				base, err := os.UserCacheDir()
				if err != nil {
					base = os.TempDir()
				}
				cacheDir = filepath.Join(base, "paddock", "worker-"+id)
			}
			log.Info("paddock worker starting", "connect", connect, "id", id, "pools", pools, "capacity", capacity, "cache_dir", cacheDir)
			// On SIGINT or SIGTERM the context ends (main's signal.NotifyContext):
			// worker.Run logs why, says GOODBYE to the host and returns nil.
			ctx := cmd.Context()
			if err := worker.Run(ctx, worker.Config{
				Connect: connect, ID: id, Key: key, Pools: pools, Capacity: capacity, CacheDir: cacheDir,
				Wasm:    wasm.Config{MemoryLimitPages: memPages, TurnTimeout: turnTimeout},
				Plugins: pcs,
			}, log); err != nil {
				return err
			}
			log.Info("paddock worker stopped", "reason", fmt.Sprint(context.Cause(ctx)))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&connect, "connect", "tcp://127.0.0.1:7700", "the host's fabric endpoint")
	f.StringVar(&id, "id", "", "this worker's id, as listed in the host's fabric.workers")
	f.StringVar(&keyFile, "key-file", "", "file holding this worker's key (paddock worker keygen)")
	f.StringArrayVar(&pools, "pool", nil, "a pool this worker serves (repeatable)")
	f.IntVar(&capacity, "capacity", 4, "turns run at once")
	f.StringVar(&cacheDir, "cache-dir", "", "where fetched modules and compiled code are cached (default: <user cache dir>/paddock/worker-<id>)")
	f.StringArrayVar(&pluginSpecs, "plugin", nil, "NAME=PATH of a plugin worker binary on this machine (repeatable)")
	f.Uint32Var(&memPages, "wasm-memory-pages", 1024, "wasm memory cap per instance, in 64 KiB pages")
	f.DurationVar(&turnTimeout, "turn-timeout", 30*time.Minute, "backstop wall-time cap of a turn (the host's turn timeout applies first)")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	_ = cmd.MarkFlagRequired("id")
	_ = cmd.MarkFlagRequired("key-file")
	_ = cmd.MarkFlagRequired("pool")
	cmd.AddCommand(&cobra.Command{
		Use: "keygen", Short: "Print a new random worker key (base64); list it in the host's fabric.workers", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), base64.StdEncoding.EncodeToString(wire.NewKey()))
			return err
		},
	})
	return cmd
}

// checkEndpoint accepts tcp://HOST:PORT, the endpoint a worker dials;
// anything else would only be retried forever.
func checkEndpoint(ep string) error {
	scheme, addr, ok := strings.Cut(ep, "://")
	if !ok || scheme != "tcp" {
		return errors.New("want tcp://HOST:PORT")
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return fmt.Errorf("want tcp://HOST:PORT: %s", addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("port %q is not 1..65535", port)
	}
	return nil
}
