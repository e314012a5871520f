// Command paddock-chaos is Paddock's fault-injection checker.
//
// It starts one PostgreSQL (a throwaway cluster, or a fresh database on the
// server of DATABASE_URL, which it then does not restart), three
// `paddock serve` hosts on it, and `paddock worker` processes for each
// host's remote pool. A driver sends N signals with unique payloads across
// K sessions of three agents — the notes example as a wasm module, as a
// plugin worker, and on remote workers — through the HTTP API of random live
// hosts, each signal with an idempotency key so that a retried send cannot
// duplicate it. Meanwhile an injector, at random intervals, kills a host
// (kill -9, then restarts it), kills a plugin process, kills a remote
// worker (then restarts it), stalls a remote worker or a plugin process
// (SIGSTOP … SIGCONT), stalls a host past its lease, and restarts
// PostgreSQL once.
//
// Once every process is back and every accepted signal is terminal, a
// checker reads the store with SQL and asserts the invariants of
// docs/DESIGN.md "Invariants": every accepted signal ended in exactly one terminal state;
// every transcript holds each committed event once, in acceptance order;
// no commit came from an epoch lower than one already used for its session;
// no session is left with an expired live activation; and (the notes agent
// keeps its notes in the session state) every turn saw the state of the
// turns before it. It prints the faults by kind, the signals accepted,
// committed and dead-lettered, the stale replies the fences rejected by
// reason, lost and duplicated counts, then one JSON line; it exits 1 when a
// check fails.
//
//	make chaos                                   # the long run (builds first)
//	go run ./cmd/paddock-chaos -signals 300 -faults 5
//
// Every child process and the cluster are stopped on exit, also on failure
// and ^C (children are also tied to this process with PR_SET_PDEATHSIG, and
// the cluster to a reaper, should this process be killed).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	cfg := DefaultConfig()
	fs := flag.NewFlagSet("paddock-chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.Paddock, "paddock", "bin/paddock", "the paddock binary (make build)")
	fs.StringVar(&cfg.NotesWasm, "notes-wasm", "examples/notes/notes.wasm", "the notes example module (make examples)")
	fs.StringVar(&cfg.Plugin, "plugin", "bin/notes-plugin", "the notes plugin worker binary (make plugins)")
	fs.StringVar(&cfg.PGBin, "pg-bin", "", "directory of initdb and pg_ctl (default: pg_config --bindir, then /usr/lib/postgresql/*/bin)")
	fs.StringVar(&cfg.WorkDir, "work-dir", "", "directory for configs, caches and logs (default: a temp dir, removed after a passing run)")
	fs.StringVar(&cfg.CacheDir, "cache-dir", "", "wasm compilation caches of hosts and workers, kept between runs (default: in the work dir)")
	fs.IntVar(&cfg.Hosts, "hosts", cfg.Hosts, "paddock serve processes")
	fs.IntVar(&cfg.WorkersPerHost, "workers-per-host", cfg.WorkersPerHost, "paddock worker processes per host")
	fs.IntVar(&cfg.PluginProcesses, "plugin-processes", cfg.PluginProcesses, "plugin processes per host")
	fs.IntVar(&cfg.Sessions, "sessions", cfg.Sessions, "K: sessions, spread over the wasm, plugin and remote agents")
	fs.IntVar(&cfg.Signals, "signals", cfg.Signals, "N: signals to send in all")
	fs.IntVar(&cfg.Faults, "faults", cfg.Faults, "faults to inject of each kind (PostgreSQL restarts once regardless)")
	fs.DurationVar(&cfg.FaultInterval, "fault-interval", cfg.FaultInterval, "mean gap between two faults; the signals spread over faults × kinds × this")
	kinds := fs.String("kinds", strings.Join(cfg.Kinds, ","), "fault kinds to inject: "+strings.Join(AllKinds, ", "))
	fs.StringVar(&cfg.PGRestartMode, "pg-restart-mode", cfg.PGRestartMode, "pg_ctl restart mode: fast or immediate")
	fs.DurationVar(&cfg.LeaseTTL, "lease-ttl", cfg.LeaseTTL, "hosts' runtime.lease_ttl")
	fs.DurationVar(&cfg.ScanInterval, "scan-interval", cfg.ScanInterval, "hosts' runtime.scan_interval")
	fs.DurationVar(&cfg.HeartbeatInterval, "heartbeat-interval", cfg.HeartbeatInterval, "hosts' fabric.heartbeat_interval")
	fs.DurationVar(&cfg.HeartbeatTimeout, "heartbeat-timeout", cfg.HeartbeatTimeout, "hosts' fabric.heartbeat_timeout")
	fs.IntVar(&cfg.MaxAttempts, "max-attempts", cfg.MaxAttempts, "agents' policy.max_attempts (dead-letter threshold)")
	fs.DurationVar(&cfg.BackoffMin, "backoff-min", cfg.BackoffMin, "agents' policy.backoff_min")
	fs.DurationVar(&cfg.BackoffMax, "backoff-max", cfg.BackoffMax, "agents' policy.backoff_max")
	fs.DurationVar(&cfg.TurnTimeout, "turn-timeout", cfg.TurnTimeout, "agents' policy.turn_timeout")
	fs.DurationVar(&cfg.QuiesceTimeout, "quiesce-timeout", cfg.QuiesceTimeout, "how long every accepted signal may take to become terminal after the chaos (a failure past it)")
	fs.Int64Var(&cfg.Seed, "seed", 0, "random seed (0: from the clock; printed)")
	quiet := fs.Bool("quiet", false, "no progress lines on stderr")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "paddock-chaos: unexpected arguments %q\n", fs.Args())
		return 2
	}
	cfg.Kinds = nil
	for _, k := range strings.Split(*kinds, ",") {
		if k = strings.TrimSpace(k); k != "" {
			cfg.Kinds = append(cfg.Kinds, k)
		}
	}
	cfg.DatabaseURL = os.Getenv("DATABASE_URL")
	if !*quiet {
		cfg.Progress = stderr
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	rep, err := Run(ctx, cfg)
	if rep == nil {
		fmt.Fprintf(stderr, "paddock-chaos: %v\n", err)
		return 2
	}
	rep.Print(stdout, err)
	if err != nil || !rep.OK() {
		return 1
	}
	return 0
}
