package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Agents the driver spreads its sessions across: the same notes logic as a
// wasm module run by the hosts, as a plugin worker process, and as a wasm
// module run by remote workers of pool "remote".
const (
	agentWasm   = "notes"
	agentPlugin = "notes-plugin"
	agentRemote = "notes-remote"
)

var agentNames = []string{agentWasm, agentPlugin, agentRemote}

// Config is one chaos run.
type Config struct {
	// Paddock is the paddock binary; NotesWasm the notes module; Plugin the
	// notes plugin binary (its sha256 is computed here).
	Paddock, NotesWasm, Plugin string
	// DatabaseURL, when set, names a server to use instead of a throwaway
	// cluster: a database is created on it and dropped at the end, and
	// PostgreSQL is not restarted (the run does not own the server).
	DatabaseURL string
	// PGBin is the directory of initdb and pg_ctl ("" = search).
	PGBin string
	// WorkDir holds configs, keys, caches and logs ("" = a new temp dir,
	// removed after a passing run and kept after a failing one).
	WorkDir string
	// CacheDir holds the wasm compilation caches: the hosts share
	// CacheDir/hosts, each worker has CacheDir/<worker id> ("" = in WorkDir).
	// A cache kept between runs saves every run the modules' compilation.
	CacheDir string

	Hosts           int // paddock serve processes
	WorkersPerHost  int // paddock worker processes connected to each host
	PluginProcesses int // plugin processes per host

	Sessions int // K: sessions, spread round-robin over the three agents
	Signals  int // N: signals in all, each with a unique payload
	// Faults is the number of faults to inject of each kind (PostgreSQL is
	// restarted once regardless); FaultInterval the mean gap between two.
	Faults        int
	FaultInterval time.Duration
	// Kinds are the fault kinds to inject (default: all).
	Kinds []string
	// PGRestartMode is pg_ctl's shutdown mode for the one restart: fast or
	// immediate.
	PGRestartMode string

	// Host settings (short, so that recovery is fast).
	LeaseTTL, ScanInterval              time.Duration
	HeartbeatInterval, HeartbeatTimeout time.Duration
	MaxAttempts                         int
	BackoffMin, BackoffMax              time.Duration
	TurnTimeout                         time.Duration

	// QuiesceTimeout bounds the wait, once sending and faults have ended,
	// for every accepted signal to reach a terminal state; reaching it is a
	// failure.
	QuiesceTimeout time.Duration
	// HTTPTimeout bounds one API call of the driver.
	HTTPTimeout time.Duration
	// Seed seeds the random choices (0 = time).
	Seed int64

	// Progress receives progress lines (nil = discard).
	Progress io.Writer
}

// Fault kinds.
const (
	kindHostKill   = "host_kill"
	kindPluginKill = "plugin_kill"
	kindWorkerKill = "worker_kill"
	kindStall      = "stall"      // SIGSTOP … SIGCONT of a remote worker or a plugin process
	kindHostStall  = "host_stall" // SIGSTOP … SIGCONT of a host, past its lease
	kindPGRestart  = "pg_restart" // once per run
)

// AllKinds lists every fault kind, pg_restart last.
var AllKinds = []string{kindHostKill, kindPluginKill, kindWorkerKill, kindStall, kindHostStall, kindPGRestart}

// DefaultConfig is the long run's configuration less the paths.
func DefaultConfig() Config {
	return Config{
		Hosts: 3, WorkersPerHost: 2, PluginProcesses: 2,
		Sessions: 24, Signals: 2400, Faults: 50, FaultInterval: 1200 * time.Millisecond,
		Kinds: AllKinds, PGRestartMode: "immediate",
		LeaseTTL: 2 * time.Second, ScanInterval: 250 * time.Millisecond,
		HeartbeatInterval: 500 * time.Millisecond, HeartbeatTimeout: 2 * time.Second,
		MaxAttempts: 50, BackoffMin: 50 * time.Millisecond, BackoffMax: time.Second,
		TurnTimeout:    30 * time.Second,
		QuiesceTimeout: 3 * time.Minute, HTTPTimeout: 10 * time.Second,
	}
}

func (c Config) logf(format string, args ...any) {
	if c.Progress != nil {
		fmt.Fprintf(c.Progress, "[chaos %s] %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
	}
}

// syncWriter serialises the progress lines of the run's goroutines.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

func (c Config) validate() error {
	var errs []error
	if c.Paddock == "" || c.NotesWasm == "" || c.Plugin == "" {
		errs = append(errs, errors.New("the paddock binary, the notes module and the notes plugin are required"))
	}
	if c.Hosts < 1 || c.WorkersPerHost < 1 || c.PluginProcesses < 1 {
		errs = append(errs, errors.New("-hosts, -workers-per-host and -plugin-processes must be at least 1"))
	}
	if c.Sessions < 1 || c.Signals < c.Sessions {
		errs = append(errs, errors.New("-sessions must be at least 1 and -signals at least -sessions"))
	}
	if c.Faults < 0 || c.FaultInterval <= 0 {
		errs = append(errs, errors.New("-faults must not be negative and -fault-interval must be positive"))
	}
	for _, k := range c.Kinds {
		if !contains(AllKinds, k) {
			errs = append(errs, fmt.Errorf("fault kind %q: want one of %s", k, strings.Join(AllKinds, ", ")))
		}
	}
	if c.PGRestartMode != "fast" && c.PGRestartMode != "immediate" {
		errs = append(errs, fmt.Errorf("-pg-restart-mode %q: want fast or immediate", c.PGRestartMode))
	}
	return errors.Join(errs...)
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// env is a run's live environment.
type env struct {
	cfg     Config
	dsn     string
	cluster *cluster // nil with DatabaseURL
	work    string
	hosts   []*host
	workers []*worker
}

// Run runs one chaos run: set-up, driver and fault injector, quiescence,
// checker; it always tears everything down before it returns. The report
// says whether the checks passed (Report.OK); err is a run that could not be
// carried out (set-up failed, interrupted).
func Run(ctx context.Context, cfg Config) (rep *Report, err error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Seed == 0 {
		cfg.Seed = time.Now().UnixNano()
	}
	if cfg.Progress != nil {
		cfg.Progress = &syncWriter{w: cfg.Progress}
	}
	start := time.Now()
	rep = newReport(cfg)
	e := &env{cfg: cfg}
	// Teardown runs however Run ends (a failure, ^C, a panic).
	defer func() {
		t := time.Now()
		e.teardown(rep.OK() && err == nil)
		rep.Times.Teardown = time.Since(t)
		rep.Times.Total = time.Since(start)
	}()
	if err := e.setup(ctx); err != nil {
		return rep, fmt.Errorf("set-up: %w", err)
	}
	rep.WorkDir, rep.PG = e.work, e.pgDesc()
	rep.Times.Setup = time.Since(start)
	cfg.logf("set-up done in %v: %d hosts, %d workers, PostgreSQL %s", rep.Times.Setup.Round(time.Millisecond), len(e.hosts), len(e.workers), e.pgDesc())

	sessions, err := createSessions(ctx, e)
	if err != nil {
		return rep, fmt.Errorf("create sessions: %w", err)
	}

	// The chaos phase: the driver and the injector run side by side.
	t := time.Now()
	scrape := startScraper(ctx, e)
	defer scrape.stop()
	inj := newInjector(ctx, e, cfg.Seed)
	drv := newDriver(e, sessions, cfg.Seed+1)
	planned := inj.planned()
	var wg sync.WaitGroup
	wg.Add(2)
	// The injector gives up on its targets well after the plan (a host
	// that cannot come back makes host faults ineligible forever).
	injCtx, stopInj := context.WithTimeout(ctx, 2*planned+2*time.Minute)
	defer stopInj()
	go func() { defer wg.Done(); inj.run(injCtx) }()
	go func() { defer wg.Done(); drv.run(ctx, planned) }()
	wg.Wait()
	rep.Times.Chaos = time.Since(t)
	if err := ctx.Err(); err != nil {
		rep.setFaults(inj)
		rep.setDriver(drv)
		return rep, fmt.Errorf("interrupted: %w", context.Cause(ctx))
	}
	// Everything back up before the wait for quiescence; what cannot be
	// restored fails the run, and the checks still run on the rest.
	healErr := inj.heal(ctx)
	rep.setFaults(inj)
	rep.setDriver(drv)
	if healErr != nil {
		rep.fail(checkRun, "", fmt.Sprintf("restore processes after the faults: %v", healErr))
		if !e.anyHostUp() {
			return rep, fmt.Errorf("no host could be restored: %w", healErr)
		}
	}
	cfg.logf("chaos phase done in %v: %s; %d/%d signals accepted", rep.Times.Chaos.Round(time.Millisecond), rep.faultLine(), drv.accepted(), cfg.Signals)

	conn, err := connectRetry(ctx, e.dsn, time.Minute)
	if err != nil {
		return rep, fmt.Errorf("checker: connect: %w", err)
	}
	defer conn.Close(context.Background())

	t = time.Now()
	quiet := waitQuiescent(ctx, conn, cfg, rep)
	rep.Times.Quiesce = time.Since(t)
	if ctx.Err() != nil {
		return rep, fmt.Errorf("interrupted: %w", context.Cause(ctx))
	}
	if quiet {
		cfg.logf("quiescent after %v", rep.Times.Quiesce.Round(time.Millisecond))
	}

	t = time.Now()
	if err := check(ctx, conn, e, sessions, rep); err != nil {
		return rep, fmt.Errorf("checker: %w", err)
	}
	rep.Times.Check = time.Since(t)
	rep.setFences(scrape.stop(), e)
	return rep, nil
}

func (e *env) anyHostUp() bool {
	for _, h := range e.hosts {
		if h.isUp() {
			return true
		}
	}
	return false
}

func (e *env) pgDesc() string {
	if e.cluster == nil {
		return "from DATABASE_URL (not restarted)"
	}
	return fmt.Sprintf("throwaway cluster on port %d", e.cluster.port)
}

// setup starts PostgreSQL (or creates a database on DATABASE_URL's server),
// writes keys and configs, and starts the hosts and the workers.
func (e *env) setup(ctx context.Context) error {
	cfg := e.cfg
	work := cfg.WorkDir
	if work == "" {
		var err error
		if work, err = os.MkdirTemp("", "paddock-chaos-"); err != nil {
			return err
		}
	}
	e.work = work
	cache := cfg.CacheDir
	if cache == "" {
		cache = filepath.Join(work, "cache")
	}
	for _, d := range []string{filepath.Join(work, "logs"), filepath.Join(work, "config"), cache} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	dbName := "paddock_chaos"
	if cfg.DatabaseURL != "" {
		dsn, err := createDatabase(ctx, cfg.DatabaseURL)
		if err != nil {
			return err
		}
		e.dsn = dsn
	} else {
		cfg.logf("starting a throwaway PostgreSQL cluster")
		c, err := startCluster(ctx, cfg.PGBin, dbName)
		if err != nil {
			return err
		}
		e.cluster = c
		e.dsn = c.dsn(dbName)
	}
	// The run uses copies of the binaries and the module: a rebuild in the
	// working tree meanwhile (make build, make plugins) must not change
	// what a restarted host runs, nor the plugin's checksum under it.
	binDir := filepath.Join(work, "bin")
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return err
	}
	for _, f := range []*string{&e.cfg.Paddock, &e.cfg.Plugin, &e.cfg.NotesWasm} {
		dst := filepath.Join(binDir, filepath.Base(*f))
		if err := copyFile(*f, dst); err != nil {
			return fmt.Errorf("copy %s: %w", *f, err)
		}
		*f = dst
	}
	cfg = e.cfg
	pluginSum, err := fileSHA256(cfg.Plugin)
	if err != nil {
		return fmt.Errorf("plugin binary: %w", err)
	}
	abs := func(p string) string { a, _ := filepath.Abs(p); return a }
	for i := range cfg.Hosts {
		api, err := freePort()
		if err != nil {
			return err
		}
		fab, err := freePort()
		if err != nil {
			return err
		}
		h := &host{idx: i, addr: fmt.Sprintf("127.0.0.1:%d", api), fabricAddr: fmt.Sprintf("127.0.0.1:%d", fab),
			cfgPath: filepath.Join(work, "config", fmt.Sprintf("host%d.yaml", i)), logDir: filepath.Join(work, "logs")}
		var ws []*worker
		for j := range cfg.WorkersPerHost {
			w := &worker{id: fmt.Sprintf("h%d-w%d", i, j), host: h, logDir: h.logDir}
			w.keyFile = filepath.Join(work, "config", w.id+".key")
			w.cacheDir = filepath.Join(cache, w.id)
			key := make([]byte, 32)
			_, _ = rand.Read(key)
			if err := os.WriteFile(w.keyFile, []byte(base64.StdEncoding.EncodeToString(key)+"\n"), 0o600); err != nil {
				return err
			}
			ws = append(ws, w)
		}
		if err := os.WriteFile(h.cfgPath, []byte(hostConfig(cfg, h, ws, e.dsn, filepath.Join(cache, "hosts"),
			filepath.Join(work, fmt.Sprintf("data%d", i)), abs(cfg.NotesWasm), abs(cfg.Plugin), pluginSum)), 0o600); err != nil {
			return err
		}
		e.hosts = append(e.hosts, h)
		e.workers = append(e.workers, ws...)
	}
	// The first host alone (it compiles the module into the shared cache
	// and runs the migrations), then the others at once.
	cfg.logf("starting %d hosts", len(e.hosts))
	if err := e.hosts[0].start(ctx, cfg.Paddock, 3*time.Minute); err != nil {
		return err
	}
	errs := make(chan error, len(e.hosts))
	for _, h := range e.hosts[1:] {
		go func() { errs <- h.start(ctx, cfg.Paddock, 3*time.Minute) }()
	}
	for range e.hosts[1:] {
		if err := <-errs; err != nil {
			return err
		}
	}
	for _, w := range e.workers {
		if err := w.start(cfg.Paddock); err != nil {
			return err
		}
	}
	return nil
}

// hostConfig is one host's YAML configuration.
func hostConfig(cfg Config, h *host, ws []*worker, dsn, wasmCache, dataDir, notesWasm, plugin, pluginSum string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `# paddock-chaos: host %d
listen: %s
data_dir: %s
log:
  level: info
store:
  driver: postgres
  dsn: %q
wasm:
  cache_dir: %s
runtime:
  lease_ttl: %s
  scan_interval: %s
policy:
  crash_policy: restart
  max_attempts: %d
  backoff_min: %s
  backoff_max: %s
  idle_timeout: 5s
  turn_timeout: %s
pools:
  default:
    capacity: 64
  remote:
    capacity: 64
    remote: true
fabric:
  listen: tcp://%s
  heartbeat_interval: %s
  heartbeat_timeout: %s
  workers:
`, h.idx, h.addr, dataDir, dsn, wasmCache, cfg.LeaseTTL, cfg.ScanInterval, cfg.MaxAttempts, cfg.BackoffMin, cfg.BackoffMax,
		cfg.TurnTimeout, h.fabricAddr, cfg.HeartbeatInterval, cfg.HeartbeatTimeout)
	for _, w := range ws {
		fmt.Fprintf(&b, "    - id: %s\n      key_file: %s\n", w.id, w.keyFile)
	}
	fmt.Fprintf(&b, `plugins:
  - name: %s
    path: %s
    sha256: %s
    processes: %d
agents:
  - name: %s
    module_file: %s
  - name: %s
    plugin: %s
  - name: %s
    module_file: %s
    policy:
      pool: remote
`, agentPlugin, plugin, pluginSum, cfg.PluginProcesses, agentWasm, notesWasm, agentPlugin, agentPlugin, agentRemote, notesWasm)
	return b.String()
}

// teardown stops every child process and the cluster, and removes the work
// directory after a passing run that made it.
func (e *env) teardown(passed bool) {
	var wg sync.WaitGroup
	for _, w := range e.workers {
		if p := w.current(); p != nil {
			wg.Add(1)
			go func() { defer wg.Done(); p.terminate(5 * time.Second) }()
		}
	}
	for _, h := range e.hosts {
		if p, _ := h.current(); p != nil {
			wg.Add(1)
			go func() { defer wg.Done(); p.terminate(10 * time.Second) }()
		}
	}
	wg.Wait()
	// Plugin processes die with their host (PR_SET_PDEATHSIG); wait for
	// them so that none is left when Run returns.
	deadline := time.Now().Add(10 * time.Second)
	for _, h := range e.hosts {
		if p, _ := h.current(); p != nil {
			for len(childrenNamed(p.pid, pluginComm(e.cfg.Plugin))) > 0 && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
		}
	}
	if e.cluster != nil {
		if err := e.cluster.stop(); err != nil {
			e.cfg.logf("stop the cluster: %v", err)
		}
	} else if e.dsn != "" {
		dropDatabase(e.cfg.DatabaseURL, e.dsn)
	}
	if passed && e.cfg.WorkDir == "" && e.work != "" {
		_ = os.RemoveAll(e.work)
	}
}

// copyFile copies src to dst with src's mode.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, fi.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// pluginComm is the command name (/proc/PID/stat) of plugin processes.
func pluginComm(path string) string {
	c := filepath.Base(path)
	if len(c) > 15 {
		c = c[:15]
	}
	return c
}

// connectRetry connects to dsn, retrying while the server is unreachable.
func connectRetry(ctx context.Context, dsn string, d time.Duration) (*pgx.Conn, error) {
	deadline := time.Now().Add(d)
	for {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		conn, err := pgx.Connect(cctx, dsn)
		cancel()
		if err == nil {
			return conn, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, err
		}
		time.Sleep(200 * time.Millisecond)
	}
}
