package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/examples/hasher"
	"github.com/paddock-dev/paddock/fabric"
	"github.com/paddock-dev/paddock/fabric/wire"
	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/host/api"
	apiclient "github.com/paddock-dev/paddock/host/api/client"
	"github.com/paddock-dev/paddock/host/runner"
	plugins "github.com/paddock-dev/paddock/plugins/pluginhost"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/store/postgres"
	"github.com/paddock-dev/paddock/store/sqlite"
	"github.com/paddock-dev/paddock/tracing"
	"github.com/paddock-dev/paddock/wasm"
)

// benchOptions are `paddock bench`'s flags: the workload of
// ../shared/peers/README.md (N turns over K keys from P producers).
type benchOptions struct {
	n, keys, producers, warmup, pool, capacity, processes   int
	tail, backlog, maxAttempts                              int
	sleeping, warm                                          int
	rate                                                    float64
	storeKind, dsn, worker, signalPath                      string
	module, plugin, schema, cpuProfile, memProfile, dataDir string
	latencyLog                                              string
	reuse, traceEndpoint                                    string
	traceRatio                                              float64
	sqlStats                                                bool
	timeout                                                 time.Duration
	idle                                                    time.Duration
	promoteAfter                                            time.Duration
}

// BenchResult is the JSON line `paddock bench` prints. Field names follow
// the peers' results (../shared/peers/internal/bench) where they mean the
// same; latencies are milliseconds.
type BenchResult struct {
	Peer string `json:"peer"`
	Mode string `json:"mode"`
	// RateTarget is the open-loop target rate (signals/s), 0 for the
	// closed loop.
	RateTarget float64 `json:"rate_target,omitempty"`
	Store      string  `json:"store"`
	Worker     string  `json:"worker"`
	// Module is the wasm worker's module file (--module, its base name):
	// hasher.wasm is the Go agent, hasher-rust.wasm the Rust one.
	Module    string `json:"module,omitempty"`
	Signal    string `json:"signal_path"`
	N         int    `json:"n"`
	Keys      int    `json:"keys"`
	Producers int    `json:"producers"`
	Pool      int    `json:"pool"`
	// TranscriptTail and InstanceReuse are the agent's policies.
	TranscriptTail int    `json:"transcript_tail"`
	InstanceReuse  string `json:"instance_reuse"`
	Completed      int    `json:"completed"`
	// WallS is barrier open → last turn committed.
	WallS      float64 `json:"wall_s"`
	JobsPerS   float64 `json:"jobs_per_s"`
	InsertS    float64 `json:"insert_s"`
	InsertPerS float64 `json:"inserts_per_s"`
	// Latency is signal call start → turn committed, per turn.
	Latency    benchPct `json:"latency_ms"`
	InsertCall benchPct `json:"insert_call_ms"`
	// RoundTrips and Transactions are per committed turn, counted on the
	// host's main PostgreSQL pool by a pgx tracer (transactions: each BEGIN,
	// and each statement or batch sent outside one); -1 on SQLite. The
	// lease pool (renewal every ttl/3) is not counted.
	RoundTrips   float64 `json:"db_round_trips_per_turn"`
	Transactions float64 `json:"db_transactions_per_turn"`
	PeakRSSMB    float64 `json:"peak_rss_mb"`
	// HostCPUMSPerTurn is the paddock process's CPU (user + system) per
	// turn of the measured run, in ms: the in-process wasm worker included,
	// plugin and fabric worker processes not (benchcpu.go).
	// DBCPUMSPerTurn is the PostgreSQL server's, every process of it, and
	// DBBusiestCores the busiest server process's CPU over the run's time
	// (1.0: one core all along; the group commit's pipe is one backend).
	// -1: not measured (no /proc; SQLite; a server on another machine or
	// in another PID namespace; the --backlog run).
	HostCPUMSPerTurn float64 `json:"host_cpu_ms_per_turn"`
	DBCPUMSPerTurn   float64 `json:"db_cpu_ms_per_turn"`
	DBBusiestCores   float64 `json:"db_busiest_process_cores"`
	// Memory is the --sleeping/--warm phase, when run.
	Memory *BenchMemory `json:"memory,omitempty"`
	// WorkerMeanMS is the mean time of a turn in the worker (the host's
	// paddock_turn_seconds), the per-turn overhead of the worker kind.
	WorkerMeanMS float64 `json:"worker_turn_mean_ms"`
	// ColdStarts is the number of activations claimed during the measured
	// run (the host's paddock_activation_start_seconds), and
	// ColdStartP50MS and ColdStartP99MS the upper bounds, in ms, of the
	// histogram buckets (0.5 ms × 2^k) holding the median and the 99th
	// percentile of their waits: the session's look, a slot and the claim,
	// before the first turn can run (-1: no cold start).
	ColdStarts     uint64  `json:"cold_starts"`
	ColdStartP50MS float64 `json:"cold_start_p50_ms"`
	ColdStartP99MS float64 `json:"cold_start_p99_ms"`
	Postgres       string  `json:"postgres,omitempty"`
	GoVersion      string  `json:"go"`
	CPUs           int     `json:"cpus"`
	Time           string  `json:"time"`
}

type benchPct struct {
	N    int     `json:"n"`
	P50  float64 `json:"p50"`
	P95  float64 `json:"p95"`
	P99  float64 `json:"p99"`
	Max  float64 `json:"max"`
	Mean float64 `json:"mean"`
}

func newBenchCmd() *cobra.Command {
	var o benchOptions
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure turns/s and signal→commit latency on the peers' durable-turn workload",
		Long: "Run the durable-turn workload of ../shared/peers/README.md on an in-process host: N turns over\n" +
			"K session keys from P producers, each signal returning once it is durable, the agent hashing 1 KiB\n" +
			"per turn (examples/hasher), turns per key serial. Prints one JSON line and one human line.\n" +
			"PostgreSQL: --dsn or DATABASE_URL; the bench works in its own schema (--schema), dropped first.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cmd.Flags().Changed("namespace") {
				// -n is the client commands' --namespace; a bench given
				// "-n 100" would run its default 20,000 turns.
				return fmt.Errorf("-n/--namespace is not a bench flag (the bench makes its own agent): for the number of turns write --n, with two dashes")
			}
			if o.keys < 1 || o.producers < 1 || o.keys%o.producers != 0 {
				return fmt.Errorf("--n %d --keys %d --producers %d: want positive values with keys a multiple of producers (each key belongs to one producer)", o.n, o.keys, o.producers)
			}
			if o.n < 0 || o.sleeping < 0 || o.warm < 0 || (o.n == 0 && o.sleeping == 0 && o.warm == 0) {
				return fmt.Errorf("--n %d --sleeping %d --warm %d: want a measured run (--n) or a memory phase (--sleeping, --warm)", o.n, o.sleeping, o.warm)
			}
			if o.backlog < 0 {
				return fmt.Errorf("--backlog %d: want 0 (no backlog) or a positive number of open events per session", o.backlog)
			}
			if o.backlog > 0 && o.rate > 0 {
				return fmt.Errorf("--backlog %d --rate %g: a backlog run measures the drain of events queued before the host starts, so it takes no --rate", o.backlog, o.rate)
			}
			if o.backlog > 0 && o.n >= o.backlog*o.keys {
				return fmt.Errorf("--backlog %d --keys %d --n %d: the measured turns (and the first, which starts the clock) must fit the backlog: want --n below backlog × keys = %d", o.backlog, o.keys, o.n, o.backlog*o.keys)
			}
			if o.rate < 0 {
				return fmt.Errorf("--rate %g: want 0 (closed loop) or a positive rate", o.rate)
			}
			if o.reuse != "agent" && o.reuse != "session" {
				return fmt.Errorf("--instance-reuse %q: want agent or session", o.reuse)
			}
			if o.maxAttempts < 1 {
				return fmt.Errorf("--max-attempts %d: want at least 1", o.maxAttempts)
			}
			if o.tail < 0 || o.tail > 1000 {
				return fmt.Errorf("--transcript-tail %d: want 0..1000", o.tail)
			}
			switch o.storeKind {
			case "sqlite", "postgres":
			default:
				return fmt.Errorf("--store %q: want sqlite or postgres", o.storeKind)
			}
			switch o.worker {
			case "wasm", "plugin", "fabric":
			default:
				return fmt.Errorf("--worker %q: want wasm, plugin or fabric", o.worker)
			}
			switch o.signalPath {
			case "go", "http":
			default:
				return fmt.Errorf("--signal %q: want go (in-process client) or http (the API over loopback)", o.signalPath)
			}
			if o.storeKind == "sqlite" && o.dsn != "" {
				return errors.New("--dsn is for --store postgres; SQLite works in --data-dir (default: a temporary directory)")
			}
			if o.storeKind == "postgres" && o.dsn == "" {
				o.dsn = os.Getenv("DATABASE_URL")
				if o.dsn == "" {
					return errors.New("--store postgres needs --dsn or DATABASE_URL")
				}
			}
			res, err := runBench(cmd.Context(), o, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			b, _ := json.Marshal(res)
			out := cmd.OutOrStdout()
			fmt.Fprintln(out, string(b))
			if m := res.Memory; m != nil {
				fmt.Fprintf(out, "memory: rss_base_mb=%.1f sleeping=%d rss_sleeping_mb=%.1f warm=%d rss_warm_mb=%.1f (%.1f KiB per warm session) controllers=%d\n",
					m.BaseMB, m.Sleeping, m.SleepingMB, m.Warm, m.WarmMB, m.WarmKiBPerSession, m.Controllers)
			}
			if res.N == 0 {
				return nil
			}
			// measured is a figure, or n/a for -1 (BenchResult: not measured).
			measured := func(v float64) string {
				if v < 0 {
					return "n/a"
				}
				return fmt.Sprintf("%.2f", v)
			}
			// bucket is a quantile known only as its histogram bucket's
			// upper bound: "≤16.00", or "=n/a" when not measured.
			bucket := func(v float64) string {
				if v < 0 {
					return "=n/a"
				}
				return "≤" + measured(v)
			}
			// A latency with no sample, and a worker mean of no turn, were
			// not measured (a --backlog run times the drain alone).
			ms := func(p benchPct, v float64, format string) string {
				if p.N == 0 {
					return "n/a"
				}
				return fmt.Sprintf(format, v)
			}
			lat, call := res.Latency, res.InsertCall
			worker := "n/a"
			if res.WorkerMeanMS > 0 {
				worker = fmt.Sprintf("%.3f", res.WorkerMeanMS)
			}
			fmt.Fprintf(out, "peer=paddock mode=%s store=%s worker=%s signal=%s n=%d completed=%d wall_s=%.2f turns_per_s=%.0f p50_ms=%s p95_ms=%s p99_ms=%s max_ms=%s signal_call_p50_ms=%s round_trips/turn=%s tx/turn=%s peak_rss_mib=%.0f worker_turn_mean_ms=%s host_cpu_ms/turn=%s db_cpu_ms/turn=%s db_busiest_process_cores=%s cold_starts=%d cold_start_p50_ms%s cold_start_p99_ms%s\n",
				res.Mode, res.Store, res.Worker, res.Signal, res.N, res.Completed, res.WallS, res.JobsPerS,
				ms(lat, lat.P50, "%.1f"), ms(lat, lat.P95, "%.1f"), ms(lat, lat.P99, "%.1f"), ms(lat, lat.Max, "%.1f"),
				ms(call, call.P50, "%.2f"), measured(res.RoundTrips), measured(res.Transactions), res.PeakRSSMB, worker,
				measured(res.HostCPUMSPerTurn), measured(res.DBCPUMSPerTurn), measured(res.DBBusiestCores),
				res.ColdStarts, bucket(res.ColdStartP50MS), bucket(res.ColdStartP99MS))
			if o.rate > 0 && res.InsertPerS < 0.95*o.rate {
				fmt.Fprintf(out, "note: the producers sent %.0f signals/s, below the --rate target %g/s: %d producers each wait for their call (signal_call_p50_ms), so latencies here count from the call, not from when the signal was due; add --producers\n",
					res.InsertPerS, o.rate, o.producers)
			}
			return nil
		},
	}
	cmd.AddCommand(newBenchReportCmd(), newBenchServerCPUCmd())
	f := cmd.Flags()
	f.IntVar(&o.n, "n", 20000, "turns (signals) in the measured run")
	f.IntVar(&o.keys, "keys", 1000, "session keys; turn i goes to key i mod K")
	f.IntVar(&o.producers, "producers", 8, "concurrent producers; producer p sends turns p, p+P, … (one call each, returning when durable)")
	f.IntVar(&o.backlog, "backlog", 0, "instead of the producers' run: give each session this many open events with the host stopped, then start it and measure the first --n turns of the drain (turns/s with that backlog per session; n < backlog × keys)")
	f.IntVar(&o.warmup, "warmup", 200, "untimed warm-up turns run to completion before the measured run")
	f.IntVar(&o.pool, "pool", 20, "PostgreSQL connections of the host's pool")
	f.IntVar(&o.capacity, "capacity", 0, "pool capacity: activations at once (default: --keys + --sleeping + --warm)")
	f.Float64Var(&o.rate, "rate", 0, "open loop: send at this many signals/s in all (0: closed loop, each producer sends its next signal when the last returns)")
	f.IntVar(&o.sleeping, "sleeping", 0, "memory: first give this many extra sessions one turn each and let them go idle (no activation, controller or instance), and report the host's RSS before and after")
	f.IntVar(&o.warm, "warm", 0, "memory: then give this many extra sessions one turn each and keep their activations live, and report the RSS")
	f.StringVar(&o.reuse, "instance-reuse", "agent", "the hasher's instance_reuse policy: agent (warm wasm instances lent to any of its sessions; it keeps nothing in globals) or session (an instance per live session)")
	f.IntVar(&o.tail, "transcript-tail", 0, "the hasher's transcript_tail policy: messages per TurnRequest (it reads none; the host default is 20)")
	f.IntVar(&o.processes, "processes", 2, "plugin processes (--worker plugin)")
	f.StringVar(&o.storeKind, "store", "sqlite", "store driver: sqlite or postgres")
	f.StringVar(&o.dsn, "dsn", "", "PostgreSQL DSN (default $DATABASE_URL)")
	f.StringVar(&o.schema, "schema", "paddock_bench", "PostgreSQL schema the bench creates (dropping it first) and works in")
	f.StringVar(&o.dataDir, "data-dir", "", "SQLite directory (default: a temporary one, removed after)")
	f.StringVar(&o.worker, "worker", "wasm", "worker kind: wasm (in-process wazero), plugin (go-plugin processes) or fabric (a remote paddock worker process over ZeroMQ)")
	f.StringVar(&o.signalPath, "signal", "go", "signal path: go (in-process client) or http (the API over loopback)")
	f.StringVar(&o.module, "module", "examples/hasher/hasher.wasm", "the hasher wasm module (make examples)")
	f.StringVar(&o.plugin, "plugin", "bin/hasher-plugin", "the hasher plugin binary (make plugins)")
	f.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the measured run to this file")
	f.StringVar(&o.memProfile, "memprofile", "", "write the host's allocations during the measured run to this file (a heap profile taken at its end; read it with go tool pprof -sample_index=alloc_space -base FILE.base, FILE.base being the one taken at its start)")
	f.StringVar(&o.latencyLog, "latency-log", "", "write each turn of the measured run to this CSV file (sent_ms: the signal's send time from the run's start; call_ms: the signal call; latency_ms: send → committed), to find what makes a tail")
	f.StringVar(&o.traceEndpoint, "trace-endpoint", "", "export OpenTelemetry spans over OTLP/HTTP to this URL (the cost of tracing); \"discard\": to a loopback receiver that reads and drops them; empty: tracing off")
	f.Float64Var(&o.traceRatio, "trace-sample-ratio", 1, "with --trace-endpoint: the share of traces recorded (0 to 1)")
	f.BoolVar(&o.sqlStats, "sql-stats", false, "print the statements sent per turn, most frequent first (PostgreSQL)")
	f.DurationVar(&o.timeout, "timeout", 15*time.Minute, "give up after this long")
	f.DurationVar(&o.idle, "idle-timeout", 30*time.Second, "sessions' idle timeout")
	f.IntVar(&o.maxAttempts, "max-attempts", host.DefaultPolicy().MaxAttempts, "the agent policy's max_attempts: an event whose attempts fail this often is dead-lettered, and the run ends with the failures' causes (it cannot finish); retried with the policy's backoff before")
	f.DurationVar(&o.promoteAfter, "promote-after", host.DefaultPromoteAfter, "runtime.promote_after: wasm turns are dispatched deferred and written by their commit unless they run this long (0: every dispatch written at once)")
	return cmd
}

// roundTrips counts the queries, batches and prepares a pgx pool sends:
// each is one round trip to the server.
type roundTrips struct {
	n atomic.Int64
	// xacts counts transactions: explicit ones at BEGIN, and every
	// statement or batch sent outside one (an implicit transaction).
	xacts atomic.Int64
	txMu  sync.Mutex
	inTx  map[*pgx.Conn]bool
	// bySQL counts statements by text when set (--sql-stats).
	mu    sync.Mutex
	bySQL map[string]int
}

func (r *roundTrips) TraceQueryStart(ctx context.Context, c *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.n.Add(1)
	r.count(d.SQL)
	r.tx(c, []string{d.SQL})
	return ctx
}

// tx follows a connection's transaction state through the statements it
// sends in one round trip.
func (r *roundTrips) tx(c *pgx.Conn, stmts []string) {
	r.txMu.Lock()
	defer r.txMu.Unlock()
	if r.inTx == nil {
		r.inTx = map[*pgx.Conn]bool{}
	}
	implicit := false
	for _, sql := range stmts {
		verb := strings.TrimSpace(sql)
		if i := strings.IndexAny(verb, " \n\t;"); i > 0 {
			verb = verb[:i]
		}
		verb = strings.ToLower(verb)
		switch verb {
		case "begin", "start":
			r.inTx[c] = true
			r.xacts.Add(1)
		case "commit", "rollback", "end", "abort":
			r.inTx[c] = false
		default:
			if !r.inTx[c] {
				implicit = true
			}
		}
	}
	if implicit {
		r.xacts.Add(1)
	}
}

func (r *roundTrips) count(sql string) {
	if r.bySQL == nil {
		return
	}
	sql = strings.Join(strings.Fields(sql), " ")
	r.mu.Lock()
	r.bySQL[sql[:min(len(sql), 110)]]++
	r.mu.Unlock()
}

// report writes the statements by count, most frequent first.
func (r *roundTrips) report(w io.Writer, turns int) {
	if r.bySQL == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	type kv struct {
		sql string
		n   int
	}
	var all []kv
	for s, n := range r.bySQL {
		all = append(all, kv{s, n})
	}
	slices.SortFunc(all, func(a, b kv) int { return b.n - a.n })
	for _, e := range all[:min(len(all), 25)] {
		fmt.Fprintf(w, "  %6.2f/turn  %s\n", float64(e.n)/float64(turns), e.sql)
	}
}
func (r *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *roundTrips) TraceBatchStart(ctx context.Context, c *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	r.n.Add(1)
	if d.Batch != nil {
		stmts := make([]string, len(d.Batch.QueuedQueries))
		for i, q := range d.Batch.QueuedQueries {
			stmts[i] = q.SQL
		}
		r.tx(c, stmts)
	}
	return ctx
}
func (r *roundTrips) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	if r.bySQL != nil { // without --sql-stats, no copy of each statement's text
		r.count("(batch) " + d.SQL)
	}
}
func (r *roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}
func (r *roundTrips) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	r.n.Add(1)
	return ctx
}
func (r *roundTrips) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {}

// benchSink records commit times by event id.
type benchSink struct {
	mu        sync.Mutex
	committed map[int64]time.Time
	// answers is each committed turn's last assistant message, by event
	// id (checkAnswers).
	answers map[int64]string
	waiters map[int64]chan struct{}
	count   atomic.Int64
	last    atomic.Int64 // unix ns of the latest commit
}

func (s *benchSink) onCommit(t store.Turn) {
	now := time.Now()
	s.mu.Lock()
	if _, dup := s.committed[t.EventID]; !dup {
		s.committed[t.EventID] = now
		s.answers[t.EventID] = lastAssistant(t)
		s.count.Add(1)
		s.last.Store(now.UnixNano())
	}
	if ch, ok := s.waiters[t.EventID]; ok {
		close(ch)
		delete(s.waiters, t.EventID)
	}
	s.mu.Unlock()
}

// reset forgets the commits recorded so far (with a fresh map: maps
// never shrink).
func (s *benchSink) reset() {
	s.mu.Lock()
	s.committed, s.answers = map[int64]time.Time{}, map[int64]string{}
	s.mu.Unlock()
}

// waitAll waits until every id in ids committed.
func (s *benchSink) waitAll(ctx context.Context, ids []int64) error {
	for _, id := range ids {
		s.mu.Lock()
		if _, ok := s.committed[id]; ok {
			s.mu.Unlock()
			continue
		}
		ch := make(chan struct{})
		s.waiters[id] = ch
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("event %d not committed: %w", id, context.Cause(ctx))
		}
	}
	return nil
}

// signaller sends one signal and returns its event id once it is durable.
type signaller func(ctx context.Context, key store.ActorKey, sessionKey string, data []byte) (int64, error)

func runBench(ctx context.Context, o benchOptions, logw io.Writer) (*BenchResult, error) {
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	ctx, fail := context.WithCancelCause(ctx)
	defer fail(nil)
	log := slog.New(slog.NewTextHandler(logw, &slog.HandlerOptions{Level: slog.LevelWarn}))
	progress := func(format string, args ...any) {
		fmt.Fprintf(logw, "[bench %s] %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
	}
	if o.capacity <= 0 {
		o.capacity = o.keys + o.sleeping + o.warm // every session may hold an activation
	}
	mode := "single"
	if o.rate > 0 {
		mode = fmt.Sprintf("rate=%g/s", o.rate)
	}
	res := &BenchResult{Peer: "paddock", Mode: mode, RateTarget: o.rate, Store: o.storeKind, Worker: o.worker, Signal: o.signalPath,
		N: o.n, Keys: o.keys, Producers: o.producers, Pool: o.pool, TranscriptTail: o.tail, InstanceReuse: o.reuse, RoundTrips: -1, Transactions: -1,
		HostCPUMSPerTurn: -1, DBCPUMSPerTurn: -1, DBBusiestCores: -1}
	if o.worker == "wasm" {
		res.Module = filepath.Base(o.module)
	}

	// The store, in a fresh schema (PostgreSQL) or a fresh file (SQLite).
	var st store.Store
	rt := &roundTrips{}
	if o.sqlStats {
		rt.bySQL = map[string]int{}
	}
	var pgConn *pgx.Conn
	switch o.storeKind {
	case "postgres":
		admin, err := pgx.Connect(ctx, o.dsn)
		if err != nil {
			return nil, fmt.Errorf("connect %s: %w", redactDSN(o.dsn), err)
		}
		defer admin.Close(context.Background())
		schema := pgx.Identifier{o.schema}.Sanitize()
		if _, err := admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
			return nil, fmt.Errorf("reset schema %s: %w", o.schema, err)
		}
		if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
			return nil, fmt.Errorf("create schema %s: %w", o.schema, err)
		}
		_ = admin.QueryRow(ctx, "SHOW server_version").Scan(&res.Postgres)
		pgConn = admin
		dsn, err := withSearchPath(o.dsn, o.schema)
		if err != nil {
			return nil, err
		}
		pst, err := postgres.Open(ctx, dsn, postgres.WithMaxConns(int32(o.pool)), postgres.WithTracer(rt))
		if err != nil {
			return nil, err
		}
		st = pst
	default:
		dir := o.dataDir
		if dir == "" {
			d, err := os.MkdirTemp("", "paddock-bench-")
			if err != nil {
				return nil, err
			}
			defer os.RemoveAll(d)
			dir = d
		}
		sst, err := sqlite.Open(ctx, filepath.Join(dir, "bench.db"))
		if err != nil {
			return nil, err
		}
		st = sst
	}
	defer st.Close()

	// The worker kind and the agent bound to it.
	cacheDir, err := os.UserCacheDir()
	if err != nil {
		cacheDir = os.TempDir()
	}
	wrt, err := wasm.New(ctx, wasm.Config{CacheDir: filepath.Join(cacheDir, "paddock", "bench-wasm"), TurnTimeout: time.Hour}, log)
	if err != nil {
		return nil, err
	}
	defer wrt.Close(context.Background())
	pm := plugins.NewManager(log, plugins.Options{})
	defer pm.Close(context.Background())
	r := runner.New(runner.NewWasm(wrt, st), pm, st)
	pol := host.DefaultPolicy()
	pol.IdleTimeout = o.idle
	pol.PromoteAfter = o.promoteAfter
	pol.AgentPolicy.MaxAttempts = o.maxAttempts
	pol.AgentPolicy.TranscriptTail = &o.tail
	pol.AgentPolicy.InstanceReuse = host.InstanceScope(o.reuse)
	pol.Pools = map[string]int{"default": o.capacity}
	agent := store.CreateAgentParams{UID: uuid.NewString(), Name: "hasher", Kind: store.KindWasm, CrashPolicy: store.CrashRestart, Upsert: true}
	if o.worker == "plugin" {
		sum, err := plugins.FileSHA256(o.plugin)
		if err != nil {
			return nil, fmt.Errorf("--plugin %s (make plugins builds it): %w", o.plugin, err)
		}
		w := store.PluginWorker{Name: "hasher", Path: o.plugin, SHA256: sum, Processes: max(o.processes, 1)}
		if err := r.CheckPlugin(ctx, w); err != nil {
			return nil, err
		}
		if _, _, err := st.PutPluginWorker(ctx, w); err != nil {
			return nil, err
		}
		agent.Kind, agent.Plugin = store.KindPlugin, "hasher"
	} else {
		b, err := os.ReadFile(o.module)
		if err != nil {
			return nil, fmt.Errorf("--module (make examples builds it): %w", err)
		}
		digest, version, err := r.Inspect(ctx, b)
		if err != nil {
			return nil, fmt.Errorf("--module %s: %w", o.module, err)
		}
		if _, _, err := st.PutModule(ctx, store.PutModuleParams{Digest: digest, ABIVersion: version, Bytes: b}); err != nil {
			return nil, err
		}
		agent.ModuleDigest = digest
	}
	if o.worker == "fabric" {
		stop, err := startBenchFabric(ctx, st, r, o, log)
		if err != nil {
			return nil, err
		}
		defer stop()
		pol.Pool = "remote"
		pol.Pools["remote"] = o.capacity
	}
	ag, err := st.CreateAgent(ctx, agent)
	if err != nil {
		return nil, err
	}

	sink := &benchSink{committed: map[int64]time.Time{}, answers: map[int64]string{}, waiters: map[int64]chan struct{}{}}
	metrics := host.NewMetrics()
	go watchFailures(ctx, fail, metrics, 250*time.Millisecond)
	agentFlag := "--module"
	if o.worker == "plugin" {
		agentFlag = "--plugin"
	}
	tp, err := benchTracing(ctx, o)
	if err != nil {
		return nil, err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = tp.Shutdown(sctx)
	}()
	h, err := host.New(host.Options{Store: st, Runner: r, Policy: pol, Logger: log, Metrics: metrics, OnCommit: sink.onCommit, Tracing: tp})
	if err != nil {
		return nil, err
	}
	hctx, hstop := context.WithCancel(context.Background())
	hostDone := make(chan error, 1)
	hostStarted := false
	startHost := func() {
		hostStarted = true
		go func() { hostDone <- h.Run(hctx) }()
		time.Sleep(50 * time.Millisecond) // Run has set the host up
	}
	defer func() {
		hstop()
		if hostStarted {
			<-hostDone
		}
	}()
	if o.backlog == 0 {
		startHost() // --backlog starts it once the backlog is in
	}

	send, stopHTTP, err := benchSignaller(ctx, o, h, st, r, log)
	if err != nil {
		return nil, err
	}
	defer stopHTTP()

	// Sessions, created before the clock starts (like the peers' queues).
	progress("creating %d sessions (%s store, %s worker, %s signals)", o.keys, o.storeKind, o.worker, o.signalPath)
	keys := make([]store.ActorKey, o.keys)
	for k := range keys {
		s, _, err := st.CreateSession(ctx, store.CreateSessionParams{AgentUID: ag.UID, SessionID: uuid.NewString(), Key: benchKeyName(k), CrashPolicy: store.CrashRestart, GetOrCreate: true})
		if err != nil {
			return nil, err
		}
		keys[k] = s.ActorKey
	}

	if o.backlog > 0 {
		if pgConn == nil {
			res.RoundTrips, res.Transactions = -1, -1
		} else {
			res.RoundTrips, res.Transactions = 0, 0
		}
		b := &backlogRun{o: o, st: st, h: h, sink: sink, keys: keys, start: startHost, rt: rt, log: progress, agentFlag: agentFlag}
		if err := b.run(ctx, res); err != nil {
			return nil, err
		}
		res.PeakRSSMB = peakRSSMB()
		res.GoVersion, res.CPUs, res.Time = runtime.Version(), runtime.NumCPU(), time.Now().UTC().Format(time.RFC3339)
		return res, nil
	}

	// Warm-up: untimed turns, run to completion (they also compile the
	// module and start plugin processes). They take seqs the measured run
	// does not use.
	if o.warmup > 0 {
		progress("warm-up: %d turns", o.warmup)
		ids := make([]int64, 0, o.warmup)
		jobs := make([]benchJob, 0, o.warmup)
		for i := range o.warmup {
			k := i % o.keys
			job := hasher.Job{Idx: -1 - i, Key: benchKeyName(k), Seq: -1 - i/o.keys, T: time.Now().UnixNano()}
			data, _ := json.Marshal(job)
			id, err := send(ctx, keys[k], benchKeyName(k), data)
			if err != nil {
				return nil, fmt.Errorf("warm-up signal: %w", failing(ctx, err))
			}
			ids, jobs = append(ids, id), append(jobs, benchJob{id: id, key: job.Key, seq: job.Seq})
		}
		if err := sink.waitAll(ctx, ids); err != nil {
			return nil, fmt.Errorf("warm-up: %w", err)
		}
		if err := sink.checkAnswers(jobs, agentFlag); err != nil {
			return nil, fmt.Errorf("warm-up: %w", err)
		}
	}

	if o.sleeping > 0 || o.warm > 0 {
		m, err := memoryPhase(ctx, o, st, h, ag, send, sink, progress, agentFlag)
		if err != nil {
			return nil, err
		}
		res.Memory = m
		if o.n == 0 {
			res.PeakRSSMB = peakRSSMB()
			res.GoVersion, res.CPUs, res.Time = runtime.Version(), runtime.NumCPU(), time.Now().UTC().Format(time.RFC3339)
			return res, nil
		}
	}

	// The measured run.
	stopProfile := func() {}
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return nil, err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return nil, err
		}
		stopProfile = func() { pprof.StopCPUProfile(); f.Close() }
	}
	defer stopProfile()
	if o.memProfile != "" {
		if err := writeHeapProfile(o.memProfile + ".base"); err != nil {
			return nil, err
		}
	}
	rt0, xact0 := rt.n.Load(), rt.xacts.Load()
	if o.sqlStats {
		rt.mu.Lock()
		clear(rt.bySQL)
		rt.mu.Unlock()
	}
	turns0 := histStats(metrics, "paddock_turn_seconds")
	cold0 := histStats(metrics, "paddock_activation_start_seconds")
	cpu0 := startCPU(ctx, pgConn, logw)
	base := sink.count.Load()
	progress("measured run: %d turns over %d keys from %d producers", o.n, o.keys, o.producers)
	type sent struct {
		id    int64
		k     int // the key's index; the job's seq is i / o.keys
		seq   int
		t     time.Time
		took  time.Duration
		fails error
	}
	results := make([][]sent, o.producers)
	var barrier sync.WaitGroup
	barrier.Add(1)
	var start time.Time // set before the barrier opens
	var wg sync.WaitGroup
	var insertEnd atomic.Int64
	for p := range o.producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			barrier.Wait()
			for i := p; i < o.n; i += o.producers {
				k := i % o.keys
				if o.rate > 0 {
					// Open loop: signal i is due at i/rate after the start;
					// a producer that is late sends at once (the latency
					// then counts from the call, like the closed loop's).
					if d := time.Until(start.Add(time.Duration(float64(i) / o.rate * float64(time.Second)))); d > 0 {
						select {
						case <-time.After(d):
						case <-ctx.Done(): // the run ended (watchFailures, --timeout)
							results[p] = append(results[p], sent{fails: ctx.Err()})
							return
						}
					}
				}
				t := time.Now()
				data, _ := json.Marshal(hasher.Job{Idx: i, Key: benchKeyName(k), Seq: i / o.keys, T: t.UnixNano()})
				id, err := send(ctx, keys[k], benchKeyName(k), data)
				results[p] = append(results[p], sent{id: id, k: k, seq: i / o.keys, t: t, took: time.Since(t), fails: err})
				if err != nil {
					return
				}
			}
			if now := time.Now().UnixNano(); now > insertEnd.Load() {
				insertEnd.Store(now) // close enough: the max of P stores
			}
		}()
	}
	start = time.Now()
	barrier.Done()
	wg.Wait()
	var ids []int64
	var jobs []benchJob
	var calls []time.Duration
	for _, rs := range results {
		for _, s := range rs {
			if s.fails != nil {
				return nil, fmt.Errorf("signal: %w", failing(ctx, s.fails))
			}
			ids = append(ids, s.id)
			jobs = append(jobs, benchJob{id: s.id, key: benchKeyName(s.k), seq: s.seq})
			calls = append(calls, s.took)
		}
	}
	if err := sink.waitAll(ctx, ids); err != nil {
		return nil, err
	}
	wall := time.Unix(0, sink.last.Load()).Sub(start)
	stopProfile()
	cpu0.end(res, o.n)
	if err := sink.checkAnswers(jobs, agentFlag); err != nil {
		return nil, err
	}
	if o.memProfile != "" { // after the CPU figures, which it would inflate
		if err := writeHeapProfile(o.memProfile); err != nil {
			return nil, err
		}
	}

	var lat []time.Duration
	sink.mu.Lock()
	for _, rs := range results {
		for _, s := range rs {
			lat = append(lat, sink.committed[s.id].Sub(s.t))
		}
	}
	sink.mu.Unlock()
	done := int(sink.count.Load() - base)
	res.Completed = min(done, o.n)
	res.WallS = round3(wall.Seconds())
	res.JobsPerS = math.Round(float64(o.n) / wall.Seconds())
	res.InsertS = round3(time.Unix(0, insertEnd.Load()).Sub(start).Seconds())
	if res.InsertS > 0 {
		res.InsertPerS = math.Round(float64(o.n) / res.InsertS)
	}
	res.Latency = percentiles(lat)
	res.InsertCall = percentiles(calls)
	if o.latencyLog != "" {
		var b strings.Builder
		b.WriteString("sent_ms,call_ms,latency_ms\n")
		i := 0
		for _, rs := range results {
			for _, s := range rs {
				fmt.Fprintf(&b, "%.3f,%.3f,%.3f\n", ms(s.t.Sub(start)), ms(s.took), ms(lat[i]))
				i++
			}
		}
		if err := os.WriteFile(o.latencyLog, []byte(b.String()), 0o644); err != nil {
			return nil, fmt.Errorf("--latency-log: %w", err)
		}
	}
	if pgConn != nil {
		res.RoundTrips = round3(float64(rt.n.Load()-rt0) / float64(o.n))
		res.Transactions = round3(float64(rt.xacts.Load()-xact0) / float64(o.n))
	}
	if o.sqlStats {
		if rt.bySQL == nil || pgConn == nil {
			fmt.Fprintln(logw, "--sql-stats: statements are counted on PostgreSQL only")
		} else {
			fmt.Fprintln(logw, "statements per turn (measured run):")
			rt.report(logw, o.n)
		}
	}
	turns1 := histStats(metrics, "paddock_turn_seconds")
	if n := turns1.n - turns0.n; n > 0 {
		res.WorkerMeanMS = round3((turns1.sum - turns0.sum) / float64(n) * 1000)
	}
	cold := histStats(metrics, "paddock_activation_start_seconds").since(cold0)
	res.ColdStarts = cold.n
	res.ColdStartP50MS, res.ColdStartP99MS = cold.bound(0.50)*1000, cold.bound(0.99)*1000
	if cold.n == 0 {
		res.ColdStartP50MS, res.ColdStartP99MS = -1, -1
	}
	res.PeakRSSMB = peakRSSMB()
	res.GoVersion, res.CPUs, res.Time = runtime.Version(), runtime.NumCPU(), time.Now().UTC().Format(time.RFC3339)
	return res, nil
}

// benchSignaller returns the signal path: the in-process client (the
// store append plus the host's wake-up, as the API does) or the HTTP API on
// a loopback listener.
func benchSignaller(ctx context.Context, o benchOptions, h *host.Host, st store.Store, r *runner.Runner, log *slog.Logger) (signaller, func(), error) {
	if o.signalPath == "go" {
		return func(ctx context.Context, key store.ActorKey, _ string, data []byte) (int64, error) {
			payload, err := abi.Marshal(struct {
				Data json.RawMessage `json:"data"`
			}{data})
			if err != nil {
				return 0, err
			}
			// The acceptance span and the stored traceparent, as
			// host/service does (nothing recorded with tracing off).
			ctx, span := h.Tracer().Start(ctx, tracing.SpanSignal)
			defer span.End()
			e, created, err := st.AppendEvent(ctx, store.AppendEventParams{Key: key, Kind: abi.EventMessage, Payload: payload,
				Traceparent: tracing.Traceparent(ctx)})
			if err != nil {
				return 0, err
			}
			if created {
				h.Appended(e)
			}
			return e.ID, nil
		}, func() {}, nil
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	srv := &http.Server{Handler: api.New(api.Options{Host: h, Modules: r, Plugins: r, Logger: log,
		MaxBodyBytes: 1 << 20, MaxModuleBytes: 64 << 20}), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	c := apiclient.New("http://"+ln.Addr().String(),
		apiclient.WithHTTPClient(&http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: o.producers * 2}}))
	return func(ctx context.Context, key store.ActorKey, _ string, data []byte) (int64, error) {
			r, err := c.SendSignal(ctx, "hasher", key.SessionID, apiclient.Signal{Kind: apiclient.SignalMessage, Data: data})
			if err != nil {
				return 0, fmt.Errorf("POST signal: %w", err)
			}
			return r.EventID, nil
		}, func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
		}, nil
}

// startBenchFabric starts a broker on a loopback port and one `paddock
// worker` process (this binary) serving pool "remote" with capacity
// --capacity.
func startBenchFabric(ctx context.Context, st store.Store, r *runner.Runner, o benchOptions, log *slog.Logger) (func(), error) {
	key := wire.NewKey()
	dir, err := os.MkdirTemp("", "paddock-bench-fabric-")
	if err != nil {
		return nil, err
	}
	keyFile := filepath.Join(dir, "worker.key")
	if err := os.WriteFile(keyFile, []byte(base64.StdEncoding.EncodeToString(key)+"\n"), 0o600); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	endpoint := "tcp://127.0.0.1:" + strconv.Itoa(port)
	b, err := fabric.NewBroker(ctx, fabric.BrokerConfig{
		Endpoint: endpoint, Workers: map[string][]byte{"bench-1": key},
		Modules: func(ctx context.Context, digest string) ([]byte, error) {
			m, err := st.GetModule(ctx, store.AnyNamespace, digest)
			return m.Bytes, err
		},
	}, log)
	if err != nil {
		return nil, fmt.Errorf("fabric broker: %w", err)
	}
	r.WithFabric(b, []string{"remote"})
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, "worker", "--connect", endpoint, "--id", "bench-1", "--key-file", keyFile, "--pool", "remote",
		"--capacity", strconv.Itoa(min(max(o.capacity, 1), 4096)), "--cache-dir", filepath.Join(dir, "cache"), "--log-level", "warn")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	// Wait for the worker to announce itself.
	deadline := time.Now().Add(30 * time.Second)
	for len(b.Workers()) == 0 {
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			return nil, errors.New("fabric: the bench worker did not connect within 30 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		_ = b.Close(context.Background())
		os.RemoveAll(dir)
	}, nil
}

func benchKeyName(k int) string { return fmt.Sprintf("k%05d", k) }

// withSearchPath adds search_path=schema to a DSN (URL or keyword/value).
func withSearchPath(dsn, schema string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		sep := "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		return dsn + sep + "search_path=" + schema, nil
	}
	return dsn + " search_path=" + schema, nil
}

// redactDSN drops a password from a URL DSN for messages.
func redactDSN(dsn string) string {
	if i := strings.Index(dsn, "@"); i > 0 {
		if j := strings.Index(dsn, "://"); j > 0 && j < i {
			return dsn[:j+3] + "…" + dsn[i:]
		}
	}
	return dsn
}

// histSum is a histogram of the host's metrics as read at one time: its
// observations' count and sum, and each bucket's upper bound (seconds)
// with the cumulative count up to it.
type histSum struct {
	n      uint64
	sum    float64
	bounds []float64
	counts []uint64
}

// histStats reads the host histogram named name (zero when absent).
func histStats(m *host.Metrics, name string) histSum {
	mfs, err := m.Registry.Gather()
	if err != nil {
		return histSum{}
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) > 0 {
			h := mf.GetMetric()[0].GetHistogram()
			s := histSum{n: h.GetSampleCount(), sum: h.GetSampleSum()}
			for _, b := range h.GetBucket() {
				s.bounds = append(s.bounds, b.GetUpperBound())
				s.counts = append(s.counts, b.GetCumulativeCount())
			}
			return s
		}
	}
	return histSum{}
}

// since is the observations of h made after h0 was read.
func (h histSum) since(h0 histSum) histSum {
	d := histSum{n: h.n - h0.n, sum: h.sum - h0.sum, bounds: h.bounds, counts: slices.Clone(h.counts)}
	if len(h0.counts) == len(d.counts) {
		for i := range d.counts {
			d.counts[i] -= h0.counts[i]
		}
	}
	return d
}

// bound is the upper bound (seconds) of the bucket that holds the
// q-quantile of h's observations (0 < q ≤ 1); the last finite bound when
// it is past the last bucket, 0 with no observation.
func (h histSum) bound(q float64) float64 {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	last := 0.0
	for i, c := range h.counts {
		if math.IsInf(h.bounds[i], 1) {
			break
		}
		last = h.bounds[i]
		if c >= rank {
			return last
		}
	}
	return last
}

// peakRSSMB is this process's peak resident set (VmHWM), in MiB.
func peakRSSMB() float64 { return math.Round(procStatusMB("VmHWM:")) }

// procStatusMB reads a kB field of /proc/self/status, in MiB (-1: none).
func procStatusMB(field string) float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			return math.Round(kb/1024*10) / 10
		}
	}
	return -1
}

func percentiles(ds []time.Duration) benchPct {
	if len(ds) == 0 {
		return benchPct{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(q float64) float64 {
		i := int(math.Ceil(q*float64(len(s)))) - 1
		return ms(s[max(0, min(i, len(s)-1))])
	}
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	return benchPct{N: len(s), P50: at(0.50), P95: at(0.95), P99: at(0.99), Max: ms(s[len(s)-1]), Mean: ms(sum / time.Duration(len(s)))}
}

func ms(d time.Duration) float64 { return math.Round(float64(d.Microseconds())) / 1000 }

func round3(v float64) float64 { return math.Round(v*1000) / 1000 }

// BenchMemory is the memory phase of `paddock bench`: the host's resident
// set (VmRSS after a GC that returns freed memory to the OS), in MiB,
// before the phase, with Sleeping idle-stopped sessions and with Warm
// sessions whose activations are live.
type BenchMemory struct {
	BaseMB            float64 `json:"rss_base_mb"`
	Sleeping          int     `json:"sleeping"`
	SleepingMB        float64 `json:"rss_sleeping_mb"`
	Warm              int     `json:"warm"`
	WarmMB            float64 `json:"rss_warm_mb"`
	WarmKiBPerSession float64 `json:"warm_kib_per_session"`
	// Controllers is the host's live controllers when WarmMB was read.
	Controllers int `json:"controllers"`
}

// memoryPhase creates the sleeping, then the warm sessions, one turn each,
// and reads the RSS at each step.
func memoryPhase(ctx context.Context, o benchOptions, st store.Store, h *host.Host, ag store.Agent, send signaller, sink *benchSink, progress func(string, ...any), agentFlag string) (*BenchMemory, error) {
	settle := func() float64 {
		runtime.GC()
		debug.FreeOSMemory()
		return rssMB()
	}
	m := &BenchMemory{BaseMB: settle(), Sleeping: o.sleeping, Warm: o.warm}
	// one gives n new sessions one turn each, from P producers.
	one := func(prefix string, n int) error {
		var wg sync.WaitGroup
		errs := make([]error, o.producers)
		jobs := make([][]benchJob, o.producers)
		for p := range o.producers {
			wg.Go(func() {
				var ids []int64
				for i := p; i < n; i += o.producers {
					name := fmt.Sprintf("%s%06d", prefix, i)
					s, _, err := st.CreateSession(ctx, store.CreateSessionParams{AgentUID: ag.UID, SessionID: uuid.NewString(), Key: name, CrashPolicy: store.CrashRestart, GetOrCreate: true})
					if err != nil {
						errs[p] = err
						return
					}
					data, _ := json.Marshal(hasher.Job{Idx: i, Key: name, T: time.Now().UnixNano()})
					id, err := send(ctx, s.ActorKey, name, data)
					if err != nil {
						errs[p] = err
						return
					}
					ids, jobs[p] = append(ids, id), append(jobs[p], benchJob{id: id, key: name, seq: 0})
				}
				errs[p] = sink.waitAll(ctx, ids)
			})
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				return failing(ctx, err) // the first: the others are mostly the same
			}
		}
		return sink.checkAnswers(slices.Concat(jobs...), agentFlag)
	}
	// The harness keeps only what a phase waits for: the commit times of
	// earlier runs are dropped, so that the RSS read is the host's.
	sink.reset()
	pol := *h.Policy()
	if o.sleeping > 0 {
		progress("memory: %d sessions, one turn each, then idle (RSS before: %.1f MiB)", o.sleeping, m.BaseMB)
		short := pol
		short.IdleTimeout = 100 * time.Millisecond
		h.SetPolicy(short)
		if err := one("s", o.sleeping); err != nil {
			return nil, fmt.Errorf("sleeping sessions: %w", err)
		}
		for h.Controllers() > 0 {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("sleeping sessions: %d controllers still live: %w", h.Controllers(), failing(ctx, ctx.Err()))
			}
			time.Sleep(50 * time.Millisecond)
		}
		sink.reset()
		m.SleepingMB = settle()
	}
	if o.warm > 0 {
		progress("memory: %d sessions, one turn each, kept warm", o.warm)
		long := pol
		long.IdleTimeout = time.Hour
		h.SetPolicy(long)
		if err := one("w", o.warm); err != nil {
			return nil, fmt.Errorf("warm sessions: %w", err)
		}
		sink.reset()
		m.WarmMB = settle()
		m.Controllers = h.Controllers()
		base := m.BaseMB
		if o.sleeping > 0 {
			base = m.SleepingMB
		}
		m.WarmKiBPerSession = math.Round((m.WarmMB-base)*1024/float64(o.warm)*10) / 10
	}
	h.SetPolicy(pol)
	return m, nil
}

// rssMB is this process's resident set (VmRSS), in MiB.
func rssMB() float64 { return procStatusMB("VmRSS:") }

// benchTracing returns the tracer provider of --trace-endpoint: off when
// empty; "discard" starts a loopback OTLP/HTTP receiver that reads each
// export and answers 200 (it lives until the process ends).
func benchTracing(ctx context.Context, o benchOptions) (*tracing.Provider, error) {
	endpoint := o.traceEndpoint
	if endpoint == "discard" {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/x-protobuf")
		})}
		go func() { _ = srv.Serve(ln) }()
		endpoint = "http://" + ln.Addr().String() + "/v1/traces"
	}
	return tracing.New(ctx, tracing.Config{Endpoint: endpoint, SampleRatio: o.traceRatio, ServiceName: "paddock-bench"})
}

// writeHeapProfile writes the heap profile (with the allocations since
// the process started) to path, after a garbage collection: the profile
// is as of the last one, so without it the allocations since would be
// missing.
func writeHeapProfile(path string) error {
	runtime.GC()
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("bench: memory profile: %w", err)
	}
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		f.Close()
		return fmt.Errorf("bench: memory profile %s: %w", path, err)
	}
	return f.Close()
}
