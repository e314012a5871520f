package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/procfs"

	"github.com/paddock-dev/paddock/examples/hasher"
	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/plugins/plugintest"
	"github.com/paddock-dev/paddock/store/pgtest"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// TestBenchRunsTheWorkloadOnEveryStoreAndWorker runs `paddock bench` small
// on each store driver and worker kind and both signal paths, and checks
// that every turn committed and the figures are there.
func TestBenchRunsTheWorkloadOnEveryStoreAndWorker(t *testing.T) {
	t.Parallel()
	bin := paddockBin(t)
	module, _ := wasmtest.BuildExample(t, "./examples/hasher/cmd")
	plugin, _ := plugintest.Build(t, "./examples/hasher/plugin")
	dsn := pgtest.DSN(t)
	for _, c := range []struct{ store, worker, signal string }{
		{"sqlite", "wasm", "go"},
		{"sqlite", "wasm", "http"},
		{"postgres", "wasm", "go"},
		{"postgres", "plugin", "http"},
		{"postgres", "fabric", "go"},
	} {
		t.Run(c.store+"/"+c.worker+"/"+c.signal, func(t *testing.T) {
			args := []string{"bench", "--store", c.store, "--worker", c.worker, "--signal", c.signal,
				"--n", "48", "--keys", "8", "--producers", "4", "--warmup", "4", "--module", module, "--plugin", plugin,
				"--timeout", "3m"}
			if c.store == "postgres" {
				args = append(args, "--dsn", dsn, "--schema", "bench_"+c.worker+"_"+c.signal)
			}
			var stdout, stderr bytes.Buffer
			cmd := exec.Command(bin, args...)
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("paddock %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
			}
			lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
			if len(lines) != 2 || !strings.HasPrefix(lines[1], "peer=paddock ") {
				t.Fatalf("want a JSON line and a human line, got:\n%s", stdout.String())
			}
			var r BenchResult
			if err := json.Unmarshal([]byte(lines[0]), &r); err != nil {
				t.Fatal(err)
			}
			if r.Completed != 48 || r.Latency.N != 48 || r.JobsPerS <= 0 || r.Latency.P50 <= 0 || r.Latency.Max < r.Latency.P99 ||
				r.Worker != c.worker || r.Store != c.store || r.PeakRSSMB <= 0 || r.WorkerMeanMS <= 0 {
				t.Fatalf("figures: %+v", r)
			}
			// Measured, and above zero: the group commit shares one round
			// trip and transaction among several turns, so under load a
			// turn may cost less than one of each.
			if c.store == "postgres" && (r.RoundTrips <= 0 || r.Transactions <= 0) {
				t.Fatalf("PostgreSQL round trips %.2f and transactions %.2f per turn: want > 0 each (measured)", r.RoundTrips, r.Transactions)
			}
			if c.store == "sqlite" && r.RoundTrips != -1 {
				t.Fatalf("SQLite round trips %.2f: want -1 (not measured)", r.RoundTrips)
			}
			// CPU: the host's is measured wherever /proc is; the server's
			// when this test sees its processes (a throwaway cluster does),
			// else it must say so (-1). 48 turns are a few clock ticks, so
			// 0 is a possible measurement; -1 is not.
			if r.HostCPUMSPerTurn < 0 {
				t.Fatalf("host CPU per turn %.3f ms: want measured (>= 0)", r.HostCPUMSPerTurn)
			}
			// The throwaway cluster pgtest starts without DATABASE_URL is
			// local: its figures must be measured.
			wantDB := c.store == "postgres" && (os.Getenv("DATABASE_URL") == "" || serverIsLocal(t, dsn))
			switch {
			case wantDB && (r.DBCPUMSPerTurn < 0 || r.DBBusiestCores < 0 || r.DBBusiestCores > float64(runtime.NumCPU())+0.5):
				t.Fatalf("local server: db CPU %.3f ms/turn, busiest process %.3f cores: want measured, within the machine", r.DBCPUMSPerTurn, r.DBBusiestCores)
			case !wantDB && (r.DBCPUMSPerTurn != -1 || r.DBBusiestCores != -1):
				t.Fatalf("db CPU %.3f ms/turn, busiest %.3f: want -1 (not measured)", r.DBCPUMSPerTurn, r.DBBusiestCores)
			}
		})
	}
}

// TestBenchMemoryPhase: --sleeping sessions end idle (no controller), the
// --warm ones keep theirs, and the RSS is read at each step.
func TestBenchMemoryPhase(t *testing.T) {
	t.Parallel()
	bin := paddockBin(t)
	module, _ := wasmtest.BuildExample(t, "./examples/hasher/cmd")
	out, err := exec.Command(bin, "bench", "--n", "0", "--sleeping", "24", "--warm", "12", "--keys", "4", "--producers", "4",
		"--warmup", "4", "--module", module, "--timeout", "3m").Output()
	if err != nil {
		t.Fatalf("paddock bench: %v", err)
	}
	var r BenchResult
	if err := json.Unmarshal([]byte(strings.SplitN(string(out), "\n", 2)[0]), &r); err != nil {
		t.Fatal(err)
	}
	m := r.Memory
	if m == nil || m.Sleeping != 24 || m.Warm != 12 || m.Controllers != 12 || m.BaseMB <= 0 || m.SleepingMB <= 0 || m.WarmMB <= 0 {
		t.Fatalf("memory phase: %+v", m)
	}
	if !strings.Contains(string(out), "memory: rss_base_mb=") {
		t.Fatalf("no human memory line:\n%s", out)
	}
}

// TestBenchBacklogDrainsOnBothStores runs `paddock bench --backlog` small
// (what `make bench-backlog` runs at 100 and 10,000 open events per
// session): each session is given its backlog with the host stopped, and
// the drain's first turns are measured. The figure itself is the bench
// target's business; here the run must complete every measured turn on
// both drivers and report a rate.
func TestBenchBacklogDrainsOnBothStores(t *testing.T) {
	t.Parallel()
	bin := paddockBin(t)
	module, _ := wasmtest.BuildExample(t, "./examples/hasher/cmd")
	dsn := pgtest.DSN(t)
	for _, st := range []string{"sqlite", "postgres"} {
		t.Run(st, func(t *testing.T) {
			args := []string{"bench", "--store", st, "--backlog", "30", "--keys", "4", "--producers", "2", "--n", "100",
				"--module", module, "--timeout", "3m"}
			if st == "postgres" {
				args = append(args, "--dsn", dsn, "--schema", "bench_backlog")
			}
			out, err := exec.Command(bin, args...).Output()
			if err != nil {
				t.Fatalf("paddock %s: %v", strings.Join(args, " "), err)
			}
			var r BenchResult
			if err := json.Unmarshal([]byte(strings.SplitN(string(out), "\n", 2)[0]), &r); err != nil {
				t.Fatalf("%v in %q", err, out)
			}
			if r.Mode != "backlog=30" || r.Completed != 100 || r.JobsPerS <= 0 || r.WallS <= 0 {
				t.Fatalf("backlog run: %+v", r)
			}
			if st == "postgres" && (r.RoundTrips <= 0 || r.Transactions <= 0) {
				t.Fatalf("round trips per turn on PostgreSQL: %+v", r)
			}
			// The drain is timed as a whole: the human line says n/a for
			// the latencies, not 0.0, which reads as a measurement.
			human := strings.SplitN(string(out), "\n", 3)[1]
			for _, f := range []string{"p50_ms=n/a", "p99_ms=n/a", "signal_call_p50_ms=n/a", "cold_start_p99_ms=n/a"} {
				if !strings.Contains(human+" ", " "+f+" ") {
					t.Errorf("backlog run's human line lacks %q: %s", f, human)
				}
			}
		})
	}
}

// TestBenchRefusesBadFlags: a workload that cannot be split among the
// producers, or an unknown store, worker or signal path, is refused by name.
func TestBenchRefusesBadFlags(t *testing.T) {
	t.Parallel()
	bin := paddockBin(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--keys", "10", "--producers", "3"}, "keys a multiple of producers"},
		{[]string{"--store", "mysql"}, `--store "mysql"`},
		{[]string{"--worker", "lambda"}, `--worker "lambda"`},
		{[]string{"--signal", "grpc"}, `--signal "grpc"`},
		{[]string{"--n", "0"}, "want a measured run"},
		{[]string{"--dsn", "postgres://x"}, "--dsn is for --store postgres"},
		{[]string{"--instance-reuse", "module"}, `--instance-reuse "module"`},
		{[]string{"--rate", "-5"}, "--rate -5"},
		{[]string{"--transcript-tail", "2000"}, "--transcript-tail 2000"},
		{[]string{"--backlog", "10", "--keys", "4", "--producers", "4", "--n", "40"}, "want --n below backlog × keys = 40"},
		{[]string{"--backlog", "10", "--keys", "4", "--producers", "4", "--n", "20", "--rate", "100"}, "it takes no --rate"},
		{[]string{"--backlog", "-1"}, "--backlog -1"},
		{[]string{"--module", "/nonexistent.wasm", "--warmup", "0", "--n", "1", "--keys", "1", "--producers", "1"}, "--module"},
		{[]string{"-n", "100"}, "for the number of turns write --n, with two dashes"},
	} {
		out, err := exec.Command(bin, append([]string{"bench"}, c.args...)...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), c.want) {
			t.Errorf("paddock bench %v: err %v, output %q; want a refusal naming %q", c.args, err, out, c.want)
		}
	}
}

// TestBenchEndsARunThatCannotMeasure: a module whose every turn fails
// ends the run once an event is dead-lettered (--max-attempts 1 here), its
// cause (ErrBenchFailing) naming the failures, not after --timeout; a
// module that answers other than the peers' unit of work is refused with
// its first wrong answer — at the warm-up, after the measured run (no
// warm-up) and after a backlog's drain.
func TestBenchEndsARunThatCannotMeasure(t *testing.T) {
	t.Parallel()
	bin := paddockBin(t)
	failing, _ := wasmtest.BuildExample(t, wasmtest.CallGuest) // "unknown command" for every job
	wrong, _ := wasmtest.BuildExample(t, wasmtest.Faulty)      // answers "ok: " to a job
	run := []string{"--store", "sqlite", "--n", "8", "--keys", "4", "--producers", "4", "--timeout", "5m"}
	for _, c := range []struct {
		name, module string
		args         []string
		want         []string
	}{
		{"failing", failing, []string{"--warmup", "4", "--max-attempts", "1"},
			[]string{"warm-up: event 1 not committed: bench: the agent's turns fail: ", "event(s) dead-lettered; ", "failed attempt(s) in all (agent_error"}},
		{"wrong-warmup", wrong, []string{"--warmup", "4"}, []string{"warm-up: 4 of 4 turns did not answer the bench's job (is --module the hasher agent?)",
			`event 1 (key k00000, seq -1) answered "ok: ", want "` + hasher.Work("k00000", -1) + `"`}},
		{"wrong-measured", wrong, []string{"--warmup", "0"}, []string{"8 of 8 turns did not answer the bench's job",
			`(key k00000, seq 0) answered "ok: ", want "` + hasher.Work("k00000", 0) + `"`}},
		{"wrong-backlog", wrong, []string{"--warmup", "0", "--backlog", "4"}, []string{"turns did not answer the bench's job", `answered "ok: "`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			args := append(append(append([]string{"bench"}, run...), c.args...), "--module", c.module)
			out, err := exec.Command(bin, args...).CombinedOutput()
			if err == nil {
				t.Fatalf("paddock %s: succeeded, want a refusal:\n%s", strings.Join(args, " "), out)
			}
			last := strings.TrimSpace(string(out))
			last = last[strings.LastIndex(last, "\n")+1:]
			for _, w := range c.want {
				if !strings.Contains(last, w) {
					t.Errorf("last line %q: want it to contain %q", last, w)
				}
			}
		})
	}
}

// TestWatchFailuresEndsTheRunAtADeadLetter: failed attempts alone (a
// flaky turn, retried) leave the run going; a dead letter ends it, the
// cause naming the failures by cause.
func TestWatchFailuresEndsTheRunAtADeadLetter(t *testing.T) {
	t.Parallel()
	m := host.NewMetrics()
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	go watchFailures(ctx, cancel, m, time.Millisecond)
	m.FailedAttempts.WithLabelValues("agent_error").Add(2)
	m.FailedAttempts.WithLabelValues("crash").Inc()
	time.Sleep(50 * time.Millisecond) // fifty ticks
	if ctx.Err() != nil {
		t.Fatalf("failed attempts without a dead letter ended the run: %v", context.Cause(ctx))
	}
	m.DeadLetters.Inc()
	select {
	case <-ctx.Done():
	case <-time.After(time.Minute):
		t.Fatal("a dead letter did not end the run")
	}
	err := failing(ctx, errors.New("context canceled, as a step saw it"))
	if want := "bench: the agent's turns fail: 1 event(s) dead-lettered; 3 failed attempt(s) in all (agent_error 2, crash 1)"; !errors.Is(err, ErrBenchFailing) || !strings.Contains(err.Error(), want) {
		t.Errorf("cause %q: want ErrBenchFailing and %q", err, want)
	}
}

// TestBenchReportComputesTheRatios: the report reads peers' and Paddock's
// lines and gives the goals' ratios.
func TestBenchReportComputesTheRatios(t *testing.T) {
	t.Parallel()
	in := strings.Join([]string{
		`{"peer":"pgbench","mode":"simple-update","tps":4000,"latency_avg_ms":2}`,
		`{"peer":"river","mode":"single","tuning":"default","jobs_per_s":990,"latency_ms":{"p50":7000,"p99":15000}}`,
		`{"peer":"river","mode":"single","tuning":"fetch_cooldown=10ms","jobs_per_s":3000,"latency_ms":{"p50":46,"p99":150}}`,
		`not json: a log line`,
		`{"peer":"paddock","mode":"single","worker":"wasm","signal_path":"go","n":100,"completed":100,"jobs_per_s":4500,"latency_ms":{"p50":5,"p99":20},"db_round_trips_per_turn":6.5,"host_cpu_ms_per_turn":0.61,"db_cpu_ms_per_turn":1.07,"db_busiest_process_cores":0.78}`,
		`{"peer":"paddock","mode":"single","worker":"wasm","module":"hasher-rust.wasm","signal_path":"go","n":100,"completed":100,"jobs_per_s":3600,"latency_ms":{"p50":5,"p99":20}}`,
	}, "\n")
	var out bytes.Buffer
	if err := benchReport(strings.NewReader(in), &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"pgbench -N (ceiling)", "river single fetch_cooldown=10ms", "1.50× River single fetch_cooldown=10ms", "1.12× pgbench TPS", "6.5", "paddock  wasm/go", "paddock  wasm(rust)/go", "1.20× River single fetch_cooldown=10ms", "host cpu ms/t", " 0.61 ", " 1.07 ", " 0.78"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
	if err := benchReport(strings.NewReader(`{"peer": 3}`), &out); err == nil {
		t.Error("a malformed results line was accepted")
	}

	// Rounds: each Paddock run beside the River run of its round, and the
	// median of those ratios per configuration.
	in = strings.Join([]string{
		`{"peer":"river","mode":"single","tuning":"fetch_cooldown=10ms","jobs_per_s":3000,"round":1}`,
		`{"peer":"paddock","mode":"single","store":"postgres","worker":"wasm","signal_path":"go","n":100,"completed":100,"jobs_per_s":2700,"round":1}`,
		`{"peer":"paddock","mode":"single","store":"postgres","worker":"wasm","signal_path":"http","n":100,"completed":100,"jobs_per_s":1500,"round":1}`,
		`{"peer":"river","mode":"single","tuning":"fetch_cooldown=10ms","jobs_per_s":2000,"round":2}`,
		`{"peer":"paddock","mode":"single","store":"postgres","worker":"wasm","signal_path":"go","n":100,"completed":100,"jobs_per_s":2200,"round":2}`,
		`{"peer":"river","mode":"single","tuning":"fetch_cooldown=10ms","jobs_per_s":2500,"round":3}`,
		`{"peer":"paddock","mode":"single","store":"postgres","worker":"wasm","signal_path":"go","n":100,"completed":100,"jobs_per_s":2500,"round":3}`,
		`{"peer":"paddock","mode":"single","store":"postgres","worker":"wasm","signal_path":"http","n":100,"completed":100,"jobs_per_s":1500,"round":4}`,
	}, "\n")
	out.Reset()
	if err := benchReport(strings.NewReader(in), &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"river single fetch_cooldown=10ms #2", "paddock postgres wasm/go #3",
		"0.73× River single fetch_cooldown=10ms", // 2200 against the best, 3000
		"1.10× River of its round",               // 2200 against round 2's 2000
		"paddock postgres wasm/go:                median 1.00× River of its round over 3 rounds (0.90, 1.10, 1.00); 2 of 3 ≥ 1.0",
		"paddock postgres wasm/http:              0.50× River of its round (1 round: too few for a median); 0 of 1 ≥ 1.0; 1 run in a round without a River tuned run left out",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}

// serverIsLocal reports whether the server at dsn has its processes in
// this machine's /proc (findServer).
func serverIsLocal(t *testing.T, dsn string) bool {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	_, err = findServer(context.Background(), conn, "/proc")
	return err == nil
}

// TestServerCPUSumsThePostmasterTree checks the arithmetic of a server's
// CPU samples on a /proc of its own: the postmaster's own and reaped
// children's time plus its live children's, nobody else's; the busiest
// process, a newborn counted from zero; a comm with spaces and
// parentheses.
func TestServerCPUSumsThePostmasterTree(t *testing.T) {
	proc := t.TempDir()
	write := func(pid int, line string) {
		dir := filepath.Join(proc, strconv.Itoa(pid))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "stat"), []byte(line), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// stat fields: pid (comm) state ppid pgrp session tty tpgid flags
	// minflt cminflt majflt cmajflt utime stime cutime cstime …, 52 in
	// all, as the kernel writes them (procfs reads the first 44).
	stat := func(pid int, comm string, ppid int, utime, stime, cutime, cstime int) string {
		return fmt.Sprintf("%d (%s) S %d 1 1 0 -1 4194560 0 0 0 0 %d %d %d %d 20 0 1 0 5 1000 100 "+
			"18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n",
			pid, comm, ppid, utime, stime, cutime, cstime)
	}
	write(100, stat(100, "postgres", 1, 5, 5, 40, 10))    // postmaster: own 10, reaped 50
	write(101, stat(101, "postgres", 100, 300, 20, 0, 0)) // a backend: 320
	write(102, stat(102, "postgres", 100, 7, 3, 0, 0))    // the WAL writer: 10
	write(200, stat(200, "a (weird) name", 1, 999, 999, 0, 0))
	fs, err := procfs.NewFS(proc)
	if err != nil {
		t.Fatal(err)
	}
	srv := &serverCPU{fs: fs, postmaster: 100}
	a, err := srv.sample()
	if err != nil {
		t.Fatal(err)
	}
	if a.total != 10+50+320+10 {
		t.Fatalf("total %d ticks: want 390 (postmaster own and reaped, its two children; not pid 200)", a.total)
	}
	// Later: the backend ran 100 more ticks, the WAL writer 5; a new
	// backend was born with 30; an exited one left 20 in the reaped time.
	write(100, stat(100, "postgres", 1, 5, 5, 60, 10))
	write(101, stat(101, "postgres", 100, 390, 30, 0, 0))
	write(102, stat(102, "postgres", 100, 10, 5, 0, 0))
	write(103, stat(103, "postgres", 100, 30, 0, 0, 0))
	b, err := srv.sample()
	if err != nil {
		t.Fatal(err)
	}
	if d := b.total - a.total; d != 100+5+30+20 {
		t.Fatalf("delta %d ticks: want 155", d)
	}
	if top := busiest(a, b); top != 100 {
		t.Fatalf("busiest %d ticks: want 100 (pid 101)", top)
	}
	st, err := readProcCPU(fs, 200)
	if err != nil || st.comm != "a (weird) name" || st.ppid != 1 || st.own != 1998 {
		t.Fatalf("stat with a parenthesised comm: %+v, %v", st, err)
	}
}

// TestBenchServerCPUReadsALocalServer: `paddock bench server-cpu` prints
// a tick count that does not go back, and grows with work the server does;
// an unreachable server is an error naming the connection.
func TestBenchServerCPUReadsALocalServer(t *testing.T) {
	t.Parallel()
	bin := paddockBin(t)
	dsn := pgtest.DSN(t)
	if os.Getenv("DATABASE_URL") != "" && !serverIsLocal(t, dsn) {
		t.Skip("DATABASE_URL's server is not on this machine: nothing to read")
	}
	read := func() int64 {
		t.Helper()
		out, err := exec.Command(bin, "bench", "server-cpu", "--dsn", dsn).CombinedOutput()
		if err != nil {
			t.Fatalf("server-cpu: %v\n%s", err, out)
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
		if err != nil || n < 0 {
			t.Fatalf("server-cpu printed %q: want a tick count", out)
		}
		return n
	}
	before := read()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	// About a second of one backend's CPU: at least a few ticks more.
	if _, err := conn.Exec(context.Background(), `SELECT count(*) FROM generate_series(1, 3000000) g WHERE g % 7 = 3`); err != nil {
		t.Fatal(err)
	}
	if after := read(); after < before+5 {
		t.Fatalf("server CPU %d ticks before a busy query, %d after: want it to grow by at least 5", before, after)
	}
	out, err := exec.Command(bin, "bench", "server-cpu", "--dsn", "postgres://nobody@127.0.0.1:1/none?connect_timeout=2").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "connect postgres://") {
		t.Fatalf("an unreachable server: err %v, output %q; want an error naming the connection", err, out)
	}
}

// TestHistStatsQuantileBounds: the bench's cold-start figures come from the
// host's histogram read before and after the measured run; the quantile is
// the bound of the bucket that holds it, over the run's observations only.
func TestHistStatsQuantileBounds(t *testing.T) {
	m := host.NewMetrics()
	h := m.ActivationStartSeconds
	h.Observe(20) // before the run, past the last bucket (16.384 s)
	before := histStats(m, "paddock_activation_start_seconds")
	for range 98 {
		h.Observe(0.0004) // the first bucket: ≤ 0.5 ms
	}
	h.Observe(0.003) // ≤ 4 ms
	h.Observe(0.003)
	run := histStats(m, "paddock_activation_start_seconds").since(before)
	if run.n != 100 {
		t.Fatalf("observations in the run = %d, want 100", run.n)
	}
	if got := run.bound(0.50); got != 0.0005 {
		t.Errorf("p50 bound = %v s, want 0.0005", got)
	}
	if got := run.bound(0.99); got != 0.004 {
		t.Errorf("p99 bound = %v s, want 0.004 (the two slow ones)", got)
	}
	all := histStats(m, "paddock_activation_start_seconds")
	if got := all.bound(1); got != 16.384 {
		t.Errorf("max bound with one past the last bucket = %v s, want the last finite bound 16.384", got)
	}
	if got := (histSum{}).bound(0.99); got != 0 {
		t.Errorf("no observation: bound %v, want 0", got)
	}
}
