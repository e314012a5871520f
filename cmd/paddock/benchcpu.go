package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
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
// another PID namespace, the database figures are unknown (-1).

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's times: 100 on
// every Linux architecture Go supports (the kernel's ABI fixes it, whatever
// CONFIG_HZ is).
const clockTicks = 100

// procStat is the part of /proc/<pid>/stat a CPU sample reads.
type procStat struct {
	comm string
	ppid int
	// own is utime + stime; reaped is cutime + cstime (the children it
	// waited for). Both in clock ticks.
	own, reaped int64
}

// parseProcStat parses one /proc/<pid>/stat line: "pid (comm) state ppid
// …", where comm may itself hold spaces and parentheses (the last ')'
// ends it); utime, stime, cutime and cstime are fields 14-17.
func parseProcStat(line []byte) (procStat, error) {
	open, end := bytes.IndexByte(line, '('), bytes.LastIndexByte(line, ')')
	if open < 0 || end < open {
		return procStat{}, fmt.Errorf("/proc stat %.40q: no (comm)", line)
	}
	st := procStat{comm: string(line[open+1 : end])}
	f := bytes.Fields(line[end+1:])
	// f[0] is field 3 (state): field k is f[k-3].
	if len(f) < 15 {
		return procStat{}, fmt.Errorf("/proc stat of %q: %d fields after comm, want at least 15", st.comm, len(f))
	}
	nums := make([]int64, 0, 5)
	for _, k := range []int{4, 14, 15, 16, 17} {
		v, err := strconv.ParseInt(string(f[k-3]), 10, 64)
		if err != nil {
			return procStat{}, fmt.Errorf("/proc stat of %q: field %d: %w", st.comm, k, err)
		}
		nums = append(nums, v)
	}
	st.ppid = int(nums[0])
	st.own, st.reaped = nums[1]+nums[2], nums[3]+nums[4]
	return st, nil
}

func readProcStat(proc string, pid int) (procStat, error) {
	b, err := os.ReadFile(filepath.Join(proc, strconv.Itoa(pid), "stat"))
	if err != nil {
		return procStat{}, err
	}
	return parseProcStat(b)
}

// serverCPU samples a PostgreSQL server's processes under proc (/proc).
type serverCPU struct {
	proc       string
	postmaster int
}

// errServerNotLocal: the server's processes are not visible here.
var errServerNotLocal = errors.New("the PostgreSQL server's processes are not visible in /proc (another machine or PID namespace)")

// findServer finds the postmaster of the server conn is connected to: the
// parent of conn's backend, both named postgres in proc.
func findServer(ctx context.Context, conn *pgx.Conn, proc string) (*serverCPU, error) {
	var backend int
	if err := conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		return nil, fmt.Errorf("backend pid: %w", err)
	}
	b, err := readProcStat(proc, backend)
	if err != nil || b.comm != "postgres" {
		return nil, errServerNotLocal
	}
	pm, err := readProcStat(proc, b.ppid)
	if err != nil || pm.comm != "postgres" {
		return nil, errServerNotLocal
	}
	return &serverCPU{proc: proc, postmaster: b.ppid}, nil
}

// cpuSample is the server's CPU so far: total, and each live process's own.
type cpuSample struct {
	total int64 // clock ticks
	own   map[int]int64
}

// sample reads the postmaster and every process whose parent it is.
func (s *serverCPU) sample() (cpuSample, error) {
	pm, err := readProcStat(s.proc, s.postmaster)
	if err != nil {
		return cpuSample{}, fmt.Errorf("postmaster %d: %w", s.postmaster, err)
	}
	out := cpuSample{total: pm.own + pm.reaped, own: map[int]int64{s.postmaster: pm.own}}
	entries, err := os.ReadDir(s.proc)
	if err != nil {
		return cpuSample{}, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == s.postmaster {
			continue
		}
		st, err := readProcStat(s.proc, pid)
		if err != nil || st.ppid != s.postmaster {
			continue // not the server's, or it exited meanwhile (then in cutime)
		}
		out.total += st.own
		out.own[pid] = st.own
	}
	return out, nil
}

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
	st, err := readProcStat("/proc", os.Getpid())
	if err != nil {
		return -1
	}
	return st.own
}

// ticks converts clock ticks to a duration.
func ticks(n int64) time.Duration { return time.Duration(n) * time.Second / clockTicks }

// runCPU is the CPU clocks at the start of a measured run (startCPU).
type runCPU struct {
	at     time.Time
	host   int64
	server *serverCPU // nil: not measured
	db     cpuSample
}

// startCPU samples the clocks before a measured run. conn is the bench's
// admin connection (nil on SQLite); why the database cannot be measured
// is written to logw.
func startCPU(ctx context.Context, conn *pgx.Conn, logw io.Writer) *runCPU {
	r := &runCPU{host: hostCPU()}
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
	elapsed := time.Since(r.at)
	if h := hostCPU(); h >= 0 && r.host >= 0 && n > 0 {
		res.HostCPUMSPerTurn = round3(ms(ticks(h-r.host)) / float64(n))
	}
	if r.server == nil || n <= 0 {
		return
	}
	b, err := r.server.sample()
	if err != nil {
		return
	}
	res.DBCPUMSPerTurn = round3(ms(ticks(b.total-r.db.total)) / float64(n))
	res.DBBusiestCores = round3(ticks(busiest(r.db, b)).Seconds() / elapsed.Seconds())
}
