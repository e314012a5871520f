package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/procfs"
	"github.com/spf13/cobra"
)

// The CPU a measured run cost, split into the host process and the
// database server, and the busiest server process, which shows when one
// backend (the group commit's pipe, store/postgres/pipeline.go) is the
// serial bottleneck.
//
// Host: the paddock process's utime+stime from /proc/self/stat; the
// in-process wasm worker is included, plugin and fabric worker processes
// are not. Database: when the PostgreSQL server runs on this machine (its
// postmaster visible in this /proc), the server's processes from /proc:
// each live process's utime+stime plus the postmaster's cutime+cstime,
// which accumulate the backends that exited (the postmaster reaps them).
// Linux only; elsewhere, or with the server on another machine or in
// another PID namespace, the database figures are unknown (-1). The stat
// files are parsed by prometheus/procfs (in the module graph already, for
// client_golang's process collector).

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's times: 100 on
// every Linux architecture Go supports (the kernel's ABI fixes it, whatever
// CONFIG_HZ is; procfs assumes the same).
const clockTicks = 100

// procCPU is what a CPU sample reads of one process's /proc/<pid>/stat
// (procfs parses it): its name and parent, its own user + system time
// and that of the children it waited for, in clock ticks.
type procCPU struct {
	comm        string
	ppid        int
	own, reaped int64
}

func readProcCPU(fs procfs.FS, pid int) (procCPU, error) {
	p, err := fs.Proc(pid)
	if err != nil {
		return procCPU{}, err
	}
	return procCPUOf(p)
}

func procCPUOf(p procfs.Proc) (procCPU, error) {
	st, err := p.Stat()
	if err != nil {
		return procCPU{}, err
	}
	return procCPU{comm: st.Comm, ppid: st.PPID, own: int64(st.UTime + st.STime), reaped: int64(st.CUTime + st.CSTime)}, nil
}

// serverCPU samples a PostgreSQL server's processes in a proc file system.
type serverCPU struct {
	fs         procfs.FS
	postmaster int
}

// errServerNotLocal: the server's processes are not visible here; the
// error that wraps it says which check failed.
var errServerNotLocal = errors.New("the PostgreSQL server's processes are not visible in /proc (another machine or PID namespace?)")

// findServer finds the postmaster of the server conn is connected to, in
// the proc file system mounted at proc: the parent of conn's backend, with
// the same process name, started when the server says it started
// (pg_postmaster_start_time, within startSlack) — so that a local
// PostgreSQL whose backend happens to have the pid of a remote server's
// is not taken for it.
func findServer(ctx context.Context, conn *pgx.Conn, proc string) (*serverCPU, error) {
	fs, err := procfs.NewFS(proc)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errServerNotLocal, err)
	}
	var backend int
	var started time.Time
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid(), pg_postmaster_start_time()").Scan(&backend, &started); err != nil {
		return nil, fmt.Errorf("backend pid: %w", err)
	}
	b, err := readProcCPU(fs, backend)
	if err != nil {
		return nil, fmt.Errorf("%w: backend %d: %v", errServerNotLocal, backend, err)
	}
	pm, err := fs.Proc(b.ppid)
	if err != nil {
		return nil, fmt.Errorf("%w: backend %d's parent %d: %v", errServerNotLocal, backend, b.ppid, err)
	}
	st, err := pm.Stat()
	if err != nil {
		return nil, fmt.Errorf("%w: process %d: %v", errServerNotLocal, b.ppid, err)
	}
	if st.Comm != b.comm {
		return nil, fmt.Errorf("%w: process %d (%s) is not a postmaster of backend %d (%s)", errServerNotLocal, b.ppid, st.Comm, backend, b.comm)
	}
	at, err := st.StartTime()
	if err != nil {
		return nil, fmt.Errorf("%w: process %d's start time: %v", errServerNotLocal, b.ppid, err)
	}
	if d := time.Duration((at - float64(started.UnixNano())/1e9) * float64(time.Second)); d > startSlack || d < -startSlack {
		return nil, fmt.Errorf("%w: process %d started %s away from the server's start time", errServerNotLocal, b.ppid, d.Round(time.Millisecond))
	}
	return &serverCPU{fs: fs, postmaster: b.ppid}, nil
}

// startSlack is how far the postmaster's process start time (whole clock
// ticks after boot) may be from pg_postmaster_start_time.
const startSlack = 2 * time.Second

// cpuSample is the server's CPU so far, in clock ticks: total (live and
// exited processes), and own, each live process's by pid.
type cpuSample struct {
	total int64
	own   map[int]int64
}

// sample reads the postmaster and every process whose parent it is. A
// backend that exits and is reaped while the children are read would be
// counted neither live nor in the postmaster's reaped time, so the
// postmaster is read before and after them, and the sample is taken again
// (up to sampleTries times) when its reaped time moved meanwhile.
func (s *serverCPU) sample() (cpuSample, error) {
	var out cpuSample
	for range sampleTries {
		before, err := readProcCPU(s.fs, s.postmaster)
		if err != nil {
			return cpuSample{}, fmt.Errorf("postmaster %d: %w", s.postmaster, err)
		}
		out = cpuSample{own: map[int]int64{s.postmaster: before.own}}
		procs, err := s.fs.AllProcs()
		if err != nil {
			return cpuSample{}, err
		}
		for _, p := range procs {
			if p.PID == s.postmaster {
				continue
			}
			st, err := procCPUOf(p)
			if err != nil || st.ppid != s.postmaster {
				continue // not the server's, or it exited meanwhile
			}
			out.total += st.own
			out.own[p.PID] = st.own
		}
		after, err := readProcCPU(s.fs, s.postmaster)
		if err != nil {
			return cpuSample{}, fmt.Errorf("postmaster %d: %w", s.postmaster, err)
		}
		out.total += after.own + after.reaped
		out.own[s.postmaster] = after.own
		if after.reaped == before.reaped {
			break
		}
	}
	return out, nil
}

// sampleTries bounds sample's attempts at a consistent reading.
const sampleTries = 5

// busiest is the most CPU one server process used between a and b (a
// process born meanwhile counts from 0), in clock ticks.
func busiest(a, b cpuSample) int64 {
	var top int64
	for pid, t := range b.own {
		top = max(top, t-a.own[pid])
	}
	return top
}

// hostCPU is this process's user + system CPU so far, in clock ticks
// (-1: no /proc).
func hostCPU() int64 {
	p, err := procfs.Self()
	if err != nil {
		return -1
	}
	st, err := p.Stat()
	if err != nil {
		return -1
	}
	return int64(st.UTime + st.STime)
}

// ticks converts clock ticks to a duration.
func ticks(n int64) time.Duration { return time.Duration(n) * time.Second / clockTicks }

// runCPU is the CPU clocks at the start of a measured run (startCPU).
type runCPU struct {
	logw io.Writer
	at   time.Time
	// host is the bench process's CPU in clock ticks (-1: no /proc).
	host   int64
	server *serverCPU // nil: not measured
	db     cpuSample
}

// startCPU samples the clocks before a measured run. conn is the bench's
// admin connection (nil on SQLite); why the database cannot be measured
// is written to logw.
func startCPU(ctx context.Context, conn *pgx.Conn, logw io.Writer) *runCPU {
	r := &runCPU{logw: logw, host: hostCPU()}
	if conn != nil {
		srv, err := findServer(ctx, conn, "/proc")
		if err == nil {
			if r.db, err = srv.sample(); err == nil {
				r.server = srv
			}
		}
		if err != nil {
			fmt.Fprintf(logw, "database CPU not measured: %v\n", err)
		}
	}
	r.at = time.Now()
	return r
}

// end samples the clocks again and sets res's CPU figures for n turns.
func (r *runCPU) end(res *BenchResult, n int) {
	if h := hostCPU(); h >= 0 && r.host >= 0 && n > 0 {
		res.HostCPUMSPerTurn = round3(ms(ticks(h-r.host)) / float64(n))
	}
	if r.server == nil || n <= 0 {
		return
	}
	b, err := r.server.sample()
	elapsed := time.Since(r.at)
	if err != nil {
		fmt.Fprintf(r.logw, "database CPU not measured: %v\n", err)
		return
	}
	res.DBCPUMSPerTurn = round3(ms(ticks(max(0, b.total-r.db.total))) / float64(n))
	res.DBBusiestCores = round3(ticks(busiest(r.db, b)).Seconds() / elapsed.Seconds())
}

// newBenchServerCPUCmd is `paddock bench server-cpu`: the CPU a local
// PostgreSQL server has used so far, for scripts that measure a peer's run
// with the same arithmetic as the bench (cmd/bench-peers.sh).
func newBenchServerCPUCmd() *cobra.Command {
	var dsn string
	cmd := &cobra.Command{
		Use:   "server-cpu",
		Short: "Print the CPU time a PostgreSQL server on this machine has used so far, in clock ticks (100 per second)",
		Long: "Print the user + system CPU time of every process of the PostgreSQL server at --dsn (or DATABASE_URL),\n" +
			"including backends that have exited, as an integer count of clock ticks (100 per second). Two readings\n" +
			"around a run give its database CPU. Fails, saying why, when the server's processes are not in this\n" +
			"machine's /proc.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dsn == "" {
				dsn = os.Getenv("DATABASE_URL")
				if dsn == "" {
					return errors.New("server-cpu needs --dsn or DATABASE_URL")
				}
			}
			conn, err := pgx.Connect(cmd.Context(), dsn)
			if err != nil {
				return fmt.Errorf("connect %s: %w", redactDSN(dsn), err)
			}
			defer conn.Close(context.Background())
			srv, err := findServer(cmd.Context(), conn, "/proc")
			if err != nil {
				return err
			}
			s, err := srv.sample()
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), s.total)
			return nil
		},
	}
	cmd.Flags().StringVar(&dsn, "dsn", "", "PostgreSQL DSN (default $DATABASE_URL)")
	return cmd
}
