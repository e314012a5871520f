package pluginhost

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/plugins/internal/wire"
)

// Options configure a Manager. Zero values take the defaults named on each
// field.
type Options struct {
	// StartTimeout bounds one process start: exec, checksum and the
	// go-plugin handshake (go-plugin's StartTimeout). Default 10 s.
	StartTimeout time.Duration
	// TurnTimeout caps every turn in addition to the caller's ctx.
	// Default 5 min.
	TurnTimeout time.Duration
	// CancelGrace is how long a plugin has, after a turn was cancelled or
	// timed out, to stop that turn (its TurnFunc returns) before its
	// process is considered hung and replaced. Default 2 s.
	CancelGrace time.Duration
	// HealthInterval is the period of the gRPC health check of every
	// process; HealthTimeout bounds one check. A process that fails a
	// check is killed and its turns fail with KindUnresponsive.
	// Defaults 5 s and 3 s.
	HealthInterval time.Duration
	HealthTimeout  time.Duration
	// MaxRestarts process failures (crashes, failed starts, hung or
	// unresponsive processes, protocol violations) of one plugin within
	// RestartWindow are tolerated; one more puts the plugin in cool-down
	// for RestartCooldown, during which no process is started for it and
	// turns that need one fail with KindRestartLimit. Defaults 5, 1 min,
	// 30 s.
	MaxRestarts     int
	RestartWindow   time.Duration
	RestartCooldown time.Duration
	// MaxResultBytes caps an encoded TurnResult. Default and maximum
	// abi.MaxResultBytes.
	MaxResultBytes int
	// KillTimeout bounds a graceful stop (go-plugin's Kill: close the
	// connection, wait up to 2 s for the exit) before SIGKILL. Default 5 s.
	KillTimeout time.Duration
	// SocketDir is where plugin processes create their unix sockets
	// (go-plugin UnixSocketConfig.TempDir); default os.TempDir().
	SocketDir string
	// DisableParentDeathSignal stops asking the kernel (Linux
	// PR_SET_PDEATHSIG) to SIGKILL plugin processes when the host dies.
	// The plugin SDK's own parent watch still ends them within
	// ~200 ms. For tests of that watch; leave it false.
	DisableParentDeathSignal bool
}

func (o Options) withDefaults() Options {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.StartTimeout, 10*time.Second)
	def(&o.TurnTimeout, 5*time.Minute)
	def(&o.CancelGrace, 2*time.Second)
	def(&o.HealthInterval, 5*time.Second)
	def(&o.HealthTimeout, 3*time.Second)
	def(&o.RestartWindow, time.Minute)
	def(&o.RestartCooldown, 30*time.Second)
	def(&o.KillTimeout, 5*time.Second)
	if o.MaxRestarts <= 0 {
		o.MaxRestarts = 5
	}
	if o.MaxResultBytes <= 0 || o.MaxResultBytes > abi.MaxResultBytes {
		o.MaxResultBytes = abi.MaxResultBytes
	}
	return o
}

// Config is one plugin worker registration.
type Config struct {
	// Name identifies the plugin: 1–100 bytes of [A-Za-z0-9._/-] (a
	// host names the plugin worker of a namespace other than the default
	// "namespace/name", store.QualifiedName).
	Name string
	// Path is the plugin binary; a relative path is made absolute against
	// the working directory at registration.
	Path string
	// SHA256 is the binary's checksum, 64 hex digits (an optional
	// "sha256:" prefix is accepted). It is verified at registration and
	// before every process start (go-plugin SecureConfig).
	SHA256 string
	// Env is the plugin's whole environment: the host's is not inherited
	// (SkipHostEnv). Keys must not start with PLUGIN_ or PADDOCK_PLUGIN_COOKIE
	// (go-plugin's own); PADDOCK_PLUGIN_LOG_LEVEL sets the SDK's log level.
	Env map[string]string
	// Processes is how many processes may serve the plugin's turns at
	// once (started on demand; a new one when every running one is busy).
	// Default 1, at most 64.
	Processes int
	// MaxTurnsPerProcess bounds the turns multiplexed on one process; 0 is
	// no limit. When every process is full the turn fails with KindBusy.
	MaxTurnsPerProcess int
	// SkipVerify registers without starting a process. By default
	// Register starts one to verify the handshake and ABI version, and
	// keeps it running to serve the first turns.
	SkipVerify bool
}

// maxProcesses bounds Config.Processes.
const maxProcesses = 64

// normalize checks cfg and returns it with defaults applied, the absolute
// path and the lowercase checksum, plus the checksum bytes.
func normalize(cfg Config) (Config, []byte, error) {
	bad := func(field, value string, format string, args ...any) (Config, []byte, error) {
		return Config{}, nil, &ConfigError{Plugin: cfg.Name, Field: field, Value: value, Err: fmt.Errorf(format, args...)}
	}
	if !validName(cfg.Name) {
		return bad("name", cfg.Name, "must be 1–100 bytes of letters, digits, '.', '_', '/' or '-'")
	}
	sum := strings.ToLower(strings.TrimPrefix(strings.TrimSpace(cfg.SHA256), "sha256:"))
	raw, err := hex.DecodeString(sum)
	if err != nil || len(raw) != sha256.Size {
		return bad("sha256", cfg.SHA256, "must be 64 hex digits (the sha256 of the binary)")
	}
	cfg.SHA256 = sum
	if cfg.Path == "" {
		return bad("path", "", "is required (the plugin binary)")
	}
	abs, err := filepath.Abs(cfg.Path)
	if err != nil {
		return bad("path", cfg.Path, "%w", err)
	}
	cfg.Path = abs
	if cfg.Processes < 0 || cfg.Processes > maxProcesses {
		return bad("processes", fmt.Sprint(cfg.Processes), "must be 0 (default 1) to %d", maxProcesses)
	}
	if cfg.Processes == 0 {
		cfg.Processes = 1
	}
	if cfg.MaxTurnsPerProcess < 0 {
		return bad("max_turns_per_process", fmt.Sprint(cfg.MaxTurnsPerProcess), "must be 0 (no limit) or more")
	}
	for k, v := range cfg.Env {
		switch {
		case k == "" || strings.ContainsAny(k, "=\x00"):
			return bad("env", k, "is not a valid environment variable name")
		case strings.HasPrefix(k, "PLUGIN_") || k == wire.MagicCookieKey:
			return bad("env", k, "is reserved for the go-plugin handshake")
		case strings.ContainsRune(v, 0):
			return bad("env", k, "value contains a NUL character")
		}
	}
	cfg.Env = maps.Clone(cfg.Env)
	if err := checkBinary(cfg.Path, sum); err != nil {
		var ce *ConfigError
		if errors.As(err, &ce) {
			ce.Plugin = cfg.Name
		}
		return Config{}, nil, err
	}
	return cfg, raw, nil
}

// checkBinary checks that path is an executable regular file whose sha256
// is sum.
func checkBinary(path, sum string) error {
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return &ConfigError{Field: "path", Value: path, Err: fmt.Errorf("binary does not exist: %w", err)}
	case err != nil:
		return &ConfigError{Field: "path", Value: path, Err: fmt.Errorf("cannot stat binary: %w", err)}
	case !fi.Mode().IsRegular():
		return &ConfigError{Field: "path", Value: path, Err: fmt.Errorf("is not a regular file (mode %s)", fi.Mode())}
	case fi.Mode().Perm()&0o111 == 0:
		return &ConfigError{Field: "path", Value: path, Err: fmt.Errorf("binary is not executable (mode %s)", fi.Mode())}
	}
	got, err := fileSHA256(path)
	if err != nil {
		return &ConfigError{Field: "path", Value: path, Err: fmt.Errorf("cannot read binary: %w", err)}
	}
	if got != sum {
		return &ConfigError{Field: "sha256", Value: sum, Err: fmt.Errorf("does not match the binary %s, whose sha256 is %s", path, got)}
	}
	return nil
}

// fileSHA256 returns the lowercase hex sha256 of the file at path.
func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// FileSHA256 returns the lowercase hex sha256 of the file at path, the
// value Config.SHA256 expects.
func FileSHA256(path string) (string, error) {
	sum, err := fileSHA256(path)
	if err != nil {
		return "", fmt.Errorf("plugins: checksum %s: %w", path, err)
	}
	return sum, nil
}

func validName(s string) bool {
	if s == "" || len(s) > 100 {
		return false
	}
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_', r == '-', r == '/':
		default:
			return false
		}
	}
	return true
}

// BindingPrefix starts a plugin binding string.
const BindingPrefix = "plugin:"

// Binding returns the binding string of a plugin version,
// "plugin:<name>@<sha256>", which identifies exactly what runs a turn
// (docs/DESIGN.md invariant 10).
func Binding(name, sha256 string) string {
	return BindingPrefix + name + "@" + strings.ToLower(sha256)
}

// ParseBinding splits a binding made by Binding. ok is false when b is not
// a plugin binding.
func ParseBinding(b string) (name, sha256 string, ok bool) {
	rest, found := strings.CutPrefix(b, BindingPrefix)
	if !found {
		return "", "", false
	}
	name, sha256, found = strings.Cut(rest, "@")
	if !found || !validName(name) || len(sha256) != 64 {
		return "", "", false
	}
	return name, sha256, true
}

// Manager runs plugin worker processes: it registers plugins, starts and
// supervises their processes, and runs turns on them. It is safe for
// concurrent use. Plugin processes never outlive it: Close kills them, and
// if the host process dies they die too (parent-death signal on Linux,
// and the SDK's parent watch).
type Manager struct {
	log    *slog.Logger
	opts   Options
	ctx    context.Context // cancelled by Close: parent of every process's context
	cancel context.CancelFunc
	bg     tracker // background goroutines: starts, supervisors, cleanups

	mu      sync.Mutex
	workers map[string]*worker
	closed  bool
}

// NewManager returns a Manager that logs to logger (nil: discard) with
// opts (zero values: defaults).
func NewManager(logger *slog.Logger, opts Options) *Manager {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Manager{log: logger, opts: opts.withDefaults(), ctx: ctx, cancel: cancel, workers: map[string]*worker{}}
}

// Options returns the effective options (defaults applied).
func (m *Manager) Options() Options { return m.opts }

// Register validates cfg and registers the plugin under cfg.Name: the
// binary must exist, be an executable regular file and have the sha256
// cfg.SHA256. Unless cfg.SkipVerify, it then starts one process (bounded
// by Options.StartTimeout, not by ctx) to verify the go-plugin handshake
// and the ABI version, and keeps it to serve turns.
//
// Registering a name again with the same Config is a no-op; with another
// Config it replaces the registration: the old processes finish their
// turns and stop, and Instances bound to the old sha256 fail with
// ErrBindingChanged.
//
// Errors: a *ConfigError naming the field at fault (a failed verification
// start is on "path" and wraps a *TurnError of KindStart, KindChecksum,
// KindVersion or KindProtocol), or ErrClosed.
func (m *Manager) Register(ctx context.Context, cfg Config) error {
	cfg, sum, err := normalize(cfg)
	if err != nil {
		return err
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return ErrClosed
	}
	if old := m.workers[cfg.Name]; old != nil && old.cfg.equal(cfg) {
		m.mu.Unlock()
		return nil
	}
	m.mu.Unlock()

	w := newWorker(m, cfg, sum)
	if !cfg.SkipVerify {
		p := w.newProcess()
		if err := p.start(); err != nil {
			return &ConfigError{Plugin: cfg.Name, Field: "path", Value: cfg.Path,
				Err: fmt.Errorf("verification start failed: %w", err)}
		}
		w.mu.Lock()
		w.procs = append(w.procs, p)
		w.mu.Unlock()
		w.log.LogAttrs(ctx, slog.LevelInfo, "plugin registered and verified",
			slog.String("path", cfg.Path), slog.String("sha256", cfg.SHA256), slog.Int("pid", p.pid),
			slog.Duration("start", p.startDur))
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		w.shutdown(true)
		return ErrClosed
	}
	old := m.workers[cfg.Name]
	m.workers[cfg.Name] = w
	m.mu.Unlock()
	if old != nil {
		old.shutdown(false)
	}
	return nil
}

// Unregister removes the plugin name: turns running on it finish, its
// processes then stop, and its Instances fail with ErrUnknownPlugin.
// Errors: ErrUnknownPlugin (wrapped).
func (m *Manager) Unregister(ctx context.Context, name string) error {
	m.mu.Lock()
	w := m.workers[name]
	delete(m.workers, name)
	m.mu.Unlock()
	if w == nil {
		return fmt.Errorf("plugins: unregister %q: %w", name, ErrUnknownPlugin)
	}
	w.shutdown(false)
	return nil
}

// lookup returns the worker registered as name, checking that its sha256
// is sum ("" accepts any).
func (m *Manager) lookup(name, sum string) (*worker, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	w := m.workers[name]
	if w == nil {
		return nil, fmt.Errorf("plugins: %q: %w", name, ErrUnknownPlugin)
	}
	sum = strings.ToLower(strings.TrimPrefix(sum, "sha256:"))
	if sum != "" && sum != w.cfg.SHA256 {
		return nil, fmt.Errorf("plugins: %q is registered with sha256 %s, the binding asks for %s: %w",
			name, w.cfg.SHA256, sum, ErrBindingChanged)
	}
	return w, nil
}

// Instance returns a handle that runs turns of plugin name at version
// sha256 (the binding; "" accepts whatever is registered). It starts
// nothing: each Turn picks the least loaded process of the plugin,
// starting one when needed. Errors: ErrUnknownPlugin, ErrBindingChanged,
// ErrClosed (wrapped).
func (m *Manager) Instance(_ context.Context, name, sha256 string) (*Instance, error) {
	w, err := m.lookup(name, sha256)
	if err != nil {
		return nil, err
	}
	return &Instance{m: m, name: name, sum: w.cfg.SHA256}, nil
}

// Registered returns the effective Config of plugin name (defaults
// applied, path absolute, checksum lowercase).
func (m *Manager) Registered(name string) (Config, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	w := m.workers[name]
	if w == nil {
		return Config{}, false
	}
	c := w.cfg
	c.Env = maps.Clone(c.Env)
	return c, true
}

// Names returns the registered plugin names, sorted.
func (m *Manager) Names() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Sorted(maps.Keys(m.workers))
}

// ProcessStatus describes one running plugin process.
type ProcessStatus struct {
	PID int
	// Turns is the number of turns running on it.
	Turns int
	// Retired processes take no new turns and stop when idle.
	Retired   bool
	StartedAt time.Time
}

// Status describes a registered plugin and its processes.
type Status struct {
	Config    Config
	Processes []ProcessStatus
	// Failures counts process failures since registration.
	Failures int
	// CoolingUntil is the end of the restart cool-down (zero when none).
	CoolingUntil time.Time
	// LastFailure describes the latest process failure.
	LastFailure string
}

// Status reports plugin name. Errors: ErrUnknownPlugin (wrapped).
func (m *Manager) Status(name string) (Status, error) {
	m.mu.Lock()
	w := m.workers[name]
	m.mu.Unlock()
	if w == nil {
		return Status{}, fmt.Errorf("plugins: %q: %w", name, ErrUnknownPlugin)
	}
	return w.status(), nil
}

// Close kills every plugin process and waits for them and for the
// Manager's goroutines. Running turns fail with KindClosed. Processes get
// a graceful stop until ctx is done, then SIGKILL. Calling Close again
// returns nil.
func (m *Manager) Close(ctx context.Context) error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	ws := slices.Collect(maps.Values(m.workers))
	m.mu.Unlock()
	m.cancel()
	var procs []*process
	for _, w := range ws {
		procs = append(procs, w.shutdown(false)...)
	}
	for _, p := range procs {
		select {
		case <-p.dead:
		case <-ctx.Done():
			p.signalKill()
			<-p.dead
		}
	}
	m.bg.wait()
	return nil
}

// closing reports whether Close was called.
func (m *Manager) closing() bool { return m.ctx.Err() != nil }

// tracker counts background goroutines so that Close can wait for them.
// Unlike a sync.WaitGroup it allows starting one at any time, also while
// (or after) someone waits.
type tracker struct {
	mu   sync.Mutex
	n    int
	zero chan struct{} // closed when n drops to 0; nil while n == 0
}

// goTracked runs f in a new goroutine, counted until it returns.
func (t *tracker) goTracked(f func()) {
	t.mu.Lock()
	if t.n == 0 {
		t.zero = make(chan struct{})
	}
	t.n++
	t.mu.Unlock()
	go func() {
		defer t.done()
		f()
	}()
}

func (t *tracker) done() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.n--
	if t.n == 0 {
		close(t.zero)
		t.zero = nil
	}
}

// wait returns when no counted goroutine runs.
func (t *tracker) wait() {
	t.mu.Lock()
	z := t.zero
	t.mu.Unlock()
	if z != nil {
		<-z
	}
}
