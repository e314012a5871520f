package pluginhost

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/plugins/internal/wire"
)

// exitPoll is how often a supervisor checks whether its process exited
// (go-plugin has no exit callback, hashicorp/go-plugin#92).
const exitPoll = 50 * time.Millisecond

// stderrTail is how much of a process's raw stderr is kept for errors.
const stderrTail = 2 << 10

// worker is one registered plugin and its processes.
type worker struct {
	m   *Manager
	cfg Config
	sum []byte
	log *slog.Logger

	mu sync.Mutex
	// procs are the processes that take new turns: started or starting,
	// not retired.
	procs []*process
	// all are the processes not yet stopped, retired ones included.
	all           map[*process]struct{}
	failures      []time.Time // within RestartWindow, oldest first
	totalFailures int
	coolUntil     time.Time
	lastFailure   string
	seq           int
	gone          bool // unregistered, replaced or closed
}

func newWorker(m *Manager, cfg Config, sum []byte) *worker {
	return &worker{m: m, cfg: cfg, sum: sum, all: map[*process]struct{}{},
		log: m.log.With(slog.String("worker", cfg.Name), slog.String("worker_kind", "plugin"))}
}

// equal reports whether two normalized configs register the same thing.
func (c Config) equal(o Config) bool {
	return c.Name == o.Name && c.Path == o.Path && c.SHA256 == o.SHA256 && maps.Equal(c.Env, o.Env) &&
		c.Processes == o.Processes && c.MaxTurnsPerProcess == o.MaxTurnsPerProcess
}

// env returns the plugin's environment: exactly the registered variables.
func (w *worker) env() []string {
	env := make([]string, 0, len(w.cfg.Env))
	for _, k := range slices.Sorted(maps.Keys(w.cfg.Env)) {
		env = append(env, k+"="+w.cfg.Env[k])
	}
	return env
}

// process is one plugin process (one go-plugin Client).
type process struct {
	w     *worker
	seq   int
	ready chan struct{} // closed when start finished; then err, client, cmd, conn, pid are set
	dead  chan struct{} // closed when the process is stopped and cleaned up

	err      error
	client   *plugin.Client
	cmd      *exec.Cmd
	conn     *grpc.ClientConn
	pid      int
	stderr   *tail
	started  time.Time
	startDur time.Duration

	// ctx is the parent of the process's turn streams, cancelled when it
	// stops.
	ctx    context.Context
	cancel context.CancelFunc

	// load and retired are guarded by w.mu.
	load    int
	retired bool

	stopping atomic.Bool // a deliberate stop began: an exit is not a crash
	stopOnce sync.Once

	failMu  sync.Mutex
	failure *TurnError // why the process was killed, for its running turns
}

// newProcess makes a process record (not started) and counts it in w.all.
func (w *worker) newProcess() *process {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.newProcessLocked()
}

func (w *worker) newProcessLocked() *process {
	w.seq++
	p := &process{w: w, seq: w.seq, ready: make(chan struct{}), dead: make(chan struct{}), stderr: newTail(stderrTail)}
	p.ctx, p.cancel = context.WithCancel(w.m.ctx)
	w.all[p] = struct{}{}
	return p
}

// errorf returns a TurnError about w.
func (w *worker) errorf(kind, op string, format string, args ...any) *TurnError {
	return &TurnError{Kind: kind, Op: op, Plugin: w.cfg.Name, SHA256: w.cfg.SHA256, Err: fmt.Errorf(format, args...)}
}

// start starts the process and completes the go-plugin handshake, within
// Options.StartTimeout. On failure the process is cleaned up and the error
// is a *TurnError (KindStart, KindChecksum, KindVersion, KindProtocol).
// Either way p.ready is closed and p.err set.
func (p *process) start() error {
	w, opts := p.w, p.w.m.opts
	log := w.log.With(slog.Int("proc", p.seq))
	cmd := exec.Command(w.cfg.Path)
	cmd.Env = w.env()
	setProcAttr(cmd, !opts.DisableParentDeathSignal)
	var sockets *plugin.UnixSocketConfig
	if opts.SocketDir != "" {
		sockets = &plugin.UnixSocketConfig{TempDir: opts.SocketDir}
	}
	client := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  wire.Handshake(abi.Version),
		Plugins:          plugin.PluginSet{wire.PluginName: &wire.Plugin{}},
		Cmd:              cmd,
		SecureConfig:     &plugin.SecureConfig{Checksum: w.sum, Hash: sha256.New()},
		AutoMTLS:         true,
		SkipHostEnv:      true,
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		StartTimeout:     opts.StartTimeout,
		Managed:          false,
		Logger:           newHclog(log),
		Stderr:           p.stderr,
		SyncStdout: &lineWriter{emit: func(line string) {
			log.LogAttrs(context.Background(), slog.LevelInfo, line, slog.String("stream", "stdout"))
		}},
		SyncStderr: &lineWriter{emit: func(line string) {
			log.LogAttrs(context.Background(), slog.LevelWarn, line, slog.String("stream", "stderr"))
		}},
		UnixSocketConfig: sockets,
	})
	p.started = time.Now()
	// The parent-death signal is tied to the OS thread that forks
	// (prctl(2)); keep this goroutine on one thread while go-plugin starts
	// the process. Go never ends an unlocked thread, so the signal fires
	// only when the host process dies.
	runtime.LockOSThread()
	rpc, err := client.Client()
	runtime.UnlockOSThread()
	p.startDur = time.Since(p.started)
	var conn *grpc.ClientConn
	if err == nil {
		var raw any
		raw, err = rpc.Dispense(wire.PluginName)
		if err == nil {
			var ok bool
			if conn, ok = raw.(*grpc.ClientConn); !ok {
				err = fmt.Errorf("dispensed %T, want a gRPC connection", raw)
			}
		}
		if err != nil {
			err = &TurnError{Kind: KindProtocol, Err: fmt.Errorf("the plugin does not serve Paddock's turn service: %w", err)}
		}
	}
	if err == nil {
		// The handshake only names an address: a health check, within
		// HealthTimeout, proves a server answers there (found in review:
		// a plugin whose handshake named a socket that did not exist was
		// "registered and verified", and each of its turns then failed
		// uncounted, for ever).
		if herr := checkHealth(context.Background(), conn, opts.HealthTimeout); herr != nil {
			err = &TurnError{Kind: KindProtocol, Err: fmt.Errorf("the plugin's handshake named an address where no gRPC server answers a health check with SERVING within %s: %w", opts.HealthTimeout, herr)}
		}
	}
	p.client, p.cmd, p.conn = client, cmd, conn
	if cmd.Process != nil {
		p.pid = cmd.Process.Pid
	}
	if err != nil {
		p.err = p.startError(err)
		w.mu.Lock()
		p.retired = true
		w.procs = slices.DeleteFunc(w.procs, func(q *process) bool { return q == p })
		w.mu.Unlock()
		close(p.ready)
		p.stop(true) // no handshake, nothing to shut down gracefully
		log.LogAttrs(context.Background(), slog.LevelWarn, "plugin process start failed",
			slog.Int("pid", p.pid), slog.String("error", p.err.Error()))
		return p.err
	}
	close(p.ready)
	log.LogAttrs(context.Background(), slog.LevelInfo, "plugin process started",
		slog.Int("pid", p.pid), slog.Duration("start", p.startDur))
	w.m.bg.goTracked(p.supervise)
	return nil
}

var pluginVersionRE = regexp.MustCompile(`Plugin version: (\d+)`)

// startError classifies a failed start of go-plugin into a *TurnError.
func (p *process) startError(err error) *TurnError {
	w := p.w
	te := &TurnError{Kind: KindStart, Op: "start", Plugin: w.cfg.Name, SHA256: w.cfg.SHA256, PID: p.pid,
		Output: p.stderr.String(), Err: err}
	var inner *TurnError
	msg := err.Error()
	switch {
	case errors.As(err, &inner):
		te.Kind, te.Err = inner.Kind, inner.Err
	case errors.Is(err, plugin.ErrChecksumsDoNotMatch):
		sum, serr := fileSHA256(w.cfg.Path)
		if serr != nil {
			sum = "unreadable: " + serr.Error()
		}
		te.Kind = KindChecksum
		te.Err = fmt.Errorf("binary %s has sha256 %s, registered %s: %w", w.cfg.Path, sum, w.cfg.SHA256, err)
	case strings.Contains(msg, "error verifying checksum"):
		te.Err = fmt.Errorf("cannot read binary %s: %w", w.cfg.Path, err)
	case strings.Contains(msg, "incompatible API version"):
		te.Kind = KindVersion
		theirs := "another"
		if mm := pluginVersionRE.FindStringSubmatch(msg); mm != nil {
			theirs = mm[1]
		}
		te.Err = fmt.Errorf("the plugin speaks ABI version %s, this host speaks ABI version %d "+
			"(rebuild the plugin against paddock abi v%d): %w", theirs, abi.Version, abi.Version, err)
	case strings.Contains(msg, "Failed to read any lines from plugin's stdout"):
		te.Kind = KindProtocol
		te.Err = fmt.Errorf("the plugin exited, or closed its stdout, without writing the go-plugin handshake "+
			"(is it a Paddock plugin calling plugins.Serve?): %w", err)
	case strings.Contains(msg, "Unrecognized remote plugin message"):
		te.Kind = KindProtocol
		te.Err = fmt.Errorf("the plugin wrote something other than the go-plugin handshake to stdout "+
			"(a plugin must not print to stdout before plugins.Serve): %w", err)
	case strings.Contains(msg, "unsupported plugin protocol"), strings.Contains(msg, "incompatible core API version"):
		te.Kind = KindProtocol
		te.Err = fmt.Errorf("the plugin is not a gRPC go-plugin plugin of a compatible go-plugin version: %w", err)
	case strings.Contains(msg, "timeout while waiting for plugin to start"):
		te.Err = fmt.Errorf("the plugin did not complete the go-plugin handshake within %s (StartTimeout): %w",
			w.m.opts.StartTimeout, err)
	case strings.Contains(msg, "plugin exited before we could connect"):
		te.Err = fmt.Errorf("the plugin process exited during the handshake (is it a Paddock plugin calling plugins.Serve?): %w", err)
	}
	return te
}

// supervise watches a started process until it stops: an exit that no one
// asked for is a crash; a failed health check makes it unresponsive.
func (p *process) supervise() {
	opts := p.w.m.opts
	tick := time.NewTicker(exitPoll)
	defer tick.Stop()
	next := time.Now().Add(opts.HealthInterval)
	for {
		select {
		case <-p.ctx.Done():
			return
		case <-tick.C:
		}
		if p.client.Exited() {
			if !p.stopping.Load() {
				p.fail(KindCrash, fmt.Errorf("plugin process exited (%s)", p.exitStatus()))
			}
			return
		}
		if time.Now().Before(next) {
			continue
		}
		err := checkHealth(p.ctx, p.conn, opts.HealthTimeout)
		next = time.Now().Add(opts.HealthInterval)
		if p.ctx.Err() != nil || p.client.Exited() {
			continue // the loop reports both
		}
		if err != nil {
			p.fail(KindUnresponsive, fmt.Errorf("no answer to a health check within %s: %w", opts.HealthTimeout, err))
			return
		}
	}
}

// checkHealth asks the plugin's go-plugin health service on conn, within
// timeout: an error unless it answers SERVING. The start's check and the
// supervisor's.
func checkHealth(ctx context.Context, conn *grpc.ClientConn, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: plugin.GRPCServiceName})
	if err == nil && resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		err = fmt.Errorf("health status %s", resp.GetStatus())
	}
	return err
}

// exitStatus describes how an exited process ended.
func (p *process) exitStatus() string {
	if p.client == nil || !p.client.Exited() || p.cmd.ProcessState == nil {
		return "exit status unknown"
	}
	// Exited took the client's lock after the runner's Wait set
	// ProcessState, so reading it here is ordered after the write.
	return p.cmd.ProcessState.String()
}

// fail records that the process failed (kind, err), counts it toward the
// restart limit, takes it out of service and kills it in the background.
// Its running turns see the failure.
func (p *process) fail(kind string, err error) {
	p.failMu.Lock()
	first := p.failure == nil
	if first {
		p.failure = &TurnError{Kind: kind, Err: err}
	}
	p.failMu.Unlock()
	if !first || p.stopping.Load() {
		return
	}
	w := p.w
	w.log.LogAttrs(context.Background(), slog.LevelWarn, "plugin process failed",
		slog.Int("proc", p.seq), slog.Int("pid", p.pid), slog.String("kind", kind), slog.String("error", err.Error()),
		slog.String("stderr", lastLines(p.stderr.String(), 6)))
	w.recordFailure(kind + ": " + err.Error())
	w.mu.Lock()
	p.retired = true
	w.procs = slices.DeleteFunc(w.procs, func(q *process) bool { return q == p })
	w.mu.Unlock()
	w.m.bg.goTracked(func() { p.stop(true) })
}

// failureOf returns the recorded failure, nil if none.
func (p *process) failureOf() *TurnError {
	p.failMu.Lock()
	defer p.failMu.Unlock()
	return p.failure
}

// signalKill sends SIGKILL to a started process.
func (p *process) signalKill() {
	select {
	case <-p.ready:
	default:
		return // cmd.Process is being written by the start; stop waits for it
	}
	if p.cmd != nil && p.cmd.Process != nil {
		_ = p.cmd.Process.Kill()
		// The group only while go-plugin has not reaped its leader: until
		// then the pid cannot be reused, so -pid is still this plugin's
		// group (a child holding its pipes keeps it unreaped). Once
		// reaped, the pipes ended, and the number may be another
		// process's.
		if p.client == nil || !p.client.Exited() {
			killGroup(p.cmd.Process.Pid)
		}
	}
}

// stop ends the process (SIGKILL first when hard; otherwise go-plugin's
// graceful Kill, SIGKILL after Options.KillTimeout), cancels its streams
// and closes p.dead. It waits for a start in progress. Safe to call many
// times; later calls wait for the first.
func (p *process) stop(hard bool) {
	if hard {
		p.signalKill()
	}
	p.stopOnce.Do(func() {
		p.stopping.Store(true)
		w := p.w
		w.mu.Lock()
		p.retired = true
		w.procs = slices.DeleteFunc(w.procs, func(q *process) bool { return q == p })
		w.mu.Unlock()
		<-p.ready
		if p.client != nil {
			done := make(chan struct{})
			go func() {
				p.client.Kill()
				close(done)
			}()
			select {
			case <-done:
			case <-time.After(w.m.opts.KillTimeout):
				p.signalKill()
				<-done
			}
		}
		p.cancel()
		w.mu.Lock()
		delete(w.all, p)
		w.mu.Unlock()
		close(p.dead)
	})
	<-p.dead
}

// stopAsync runs stop in the background.
func (p *process) stopAsync(hard bool) {
	p.w.m.bg.goTracked(func() { p.stop(hard) })
}

// recordFailure counts a process failure toward the restart limit and
// starts the cool-down when it is passed.
func (w *worker) recordFailure(reason string) {
	opts := w.m.opts
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.totalFailures++
	w.lastFailure = reason
	w.failures = slices.DeleteFunc(w.failures, func(t time.Time) bool { return now.Sub(t) > opts.RestartWindow })
	w.failures = append(w.failures, now)
	if len(w.failures) > opts.MaxRestarts {
		w.coolUntil = now.Add(opts.RestartCooldown)
		w.log.LogAttrs(context.Background(), slog.LevelError, "plugin restart limit reached; cooling down",
			slog.Int("failures", len(w.failures)), slog.Duration("window", opts.RestartWindow),
			slog.Int("max_restarts", opts.MaxRestarts), slog.Time("until", w.coolUntil), slog.String("last_failure", reason))
		w.failures = nil
	}
}

// acquire picks the least loaded process for a turn, starting one when
// none runs or every running one is busy and fewer than Config.Processes
// run, and counts the turn on it. Errors are *TurnError (start failures,
// KindRestartLimit, KindBusy, KindClosed, and ctx's end while waiting for
// a start as KindTimeout or KindCanceled).
func (w *worker) acquire(ctx context.Context) (*process, error) {
	w.mu.Lock()
	if w.gone {
		w.mu.Unlock()
		return nil, w.errorf(KindClosed, "turn", "the plugin was unregistered or replaced")
	}
	var best *process
	for _, p := range w.procs {
		if best == nil || p.load < best.load {
			best = p
		}
	}
	limit := w.cfg.MaxTurnsPerProcess
	full := func(p *process) bool { return limit > 0 && p.load >= limit }
	p := best
	switch {
	case best == nil || best.load > 0 && len(w.procs) < w.cfg.Processes:
		if now := time.Now(); now.Before(w.coolUntil) {
			if best == nil || full(best) {
				err := w.errorf(KindRestartLimit, "start",
					"more than %d process failures within %s; no process is started until %s (cool-down %s); last failure: %s",
					w.m.opts.MaxRestarts, w.m.opts.RestartWindow, w.coolUntil.Format(time.TimeOnly),
					w.m.opts.RestartCooldown, w.lastFailure)
				w.mu.Unlock()
				return nil, err
			}
			break // serve on a running process meanwhile
		}
		p = w.newProcessLocked()
		w.procs = append(w.procs, p)
		w.m.bg.goTracked(func() {
			if err := p.start(); err != nil {
				w.recordFailure("start: " + err.Error())
			}
		})
	case full(best):
		w.mu.Unlock()
		return nil, w.errorf(KindBusy, "turn", "all %d processes run %d turns (max_turns_per_process)", len(w.procs), limit)
	}
	p.load++
	w.mu.Unlock()
	select {
	case <-p.ready:
	case <-ctx.Done():
		w.release(p)
		return nil, ctxError(w, ctx)
	}
	if p.err != nil {
		w.release(p)
		te := *p.err.(*TurnError)
		return nil, &te
	}
	return p, nil
}

// release uncounts a turn from p; a retired process stops when idle.
func (w *worker) release(p *process) {
	w.mu.Lock()
	p.load--
	idle := p.retired && p.load == 0
	w.mu.Unlock()
	if idle {
		p.stopAsync(false)
	}
}

// retire takes p out of service; it stops once its turns are done. When
// count, it is a failure toward the restart limit.
func (w *worker) retire(p *process, reason string, count bool) {
	w.mu.Lock()
	if p.retired {
		w.mu.Unlock()
		return
	}
	p.retired = true
	w.procs = slices.DeleteFunc(w.procs, func(q *process) bool { return q == p })
	idle := p.load == 0
	w.mu.Unlock()
	w.log.LogAttrs(context.Background(), slog.LevelWarn, "plugin process retired",
		slog.Int("proc", p.seq), slog.Int("pid", p.pid), slog.String("reason", reason))
	if count {
		w.recordFailure(reason)
	}
	if idle {
		p.stopAsync(false)
	}
}

// shutdown marks w gone and stops its processes: at once when now (their
// turns fail), else each when its turns are done. It returns the
// processes being stopped.
func (w *worker) shutdown(now bool) []*process {
	w.mu.Lock()
	w.gone = true
	w.procs = nil
	var procs, idle []*process
	for p := range w.all {
		procs = append(procs, p)
		p.retired = true
		if now || p.load == 0 {
			idle = append(idle, p)
		}
	}
	w.mu.Unlock()
	for _, p := range idle {
		p.stopAsync(false)
	}
	return procs
}

// status reports w.
func (w *worker) status() Status {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := Status{Config: w.cfg, Failures: w.totalFailures, LastFailure: w.lastFailure}
	s.Config.Env = maps.Clone(w.cfg.Env)
	if time.Now().Before(w.coolUntil) {
		s.CoolingUntil = w.coolUntil
	}
	for p := range w.all {
		select {
		case <-p.ready:
		default:
			continue
		}
		if p.err != nil {
			continue
		}
		s.Processes = append(s.Processes, ProcessStatus{PID: p.pid, Turns: p.load, Retired: p.retired, StartedAt: p.started})
	}
	slices.SortFunc(s.Processes, func(a, b ProcessStatus) int { return a.StartedAt.Compare(b.StartedAt) })
	return s
}

// ctxError describes the end of a turn's ctx as a *TurnError.
func ctxError(w *worker, ctx context.Context) *TurnError {
	switch {
	case w.m.closing():
		return w.errorf(KindClosed, "turn", "the plugin manager closed")
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		dl, _ := ctx.Deadline()
		// The deadline is the agent's turn_timeout's or, when sooner, the
		// manager's cap: which one, ctx does not say (the message named the
		// cap, which misled when the agent's applied: found in review).
		return w.errorf(KindTimeout, "turn", "turn exceeded its deadline of %s (the agent's turn_timeout, or the plugin manager's cap of %s if that was sooner): %w",
			dl.Format("15:04:05.000"), w.m.opts.TurnTimeout, ctx.Err())
	default:
		return w.errorf(KindCanceled, "turn", "turn cancelled: %w", context.Cause(ctx))
	}
}
