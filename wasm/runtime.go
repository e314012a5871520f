package wasm

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
	"github.com/tetratelabs/wazero/sys"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/wasm/internal/interrupt"
)

// Names of the wasm guest ABI (abi/README.md, "Wasm guest ABI").
const (
	// HostModule is the import module of Paddock's host functions.
	HostModule = "paddock"
	// HostLog is the host function log(level i32, ptr i32, len i32).
	HostLog = "log"
	// HostSteerPoll is the host function steer_poll(buf_ptr i32, buf_cap
	// i32) -> i32, by which a running turn takes in steers (see
	// abi.WithSteers). Importing it is optional.
	HostSteerPoll = "steer_poll"
	// HostCall is the host function call(req_ptr i32, req_len i32,
	// buf_ptr i32, buf_cap i32) -> i32, by which a running turn makes a
	// host call (abi.CallRequest in, abi.CallResult out; see abi.Caller).
	// Importing it is optional.
	HostCall = "call"
	// HostCallResult is the host function call_result(buf_ptr i32,
	// buf_cap i32) -> i32, which delivers a call's result that did not fit
	// the buffer given to call. Importing it is optional.
	HostCallResult = "call_result"

	// ExportABIVersion is paddock_abi_version() -> i32.
	ExportABIVersion = "paddock_abi_version"
	// ExportAlloc is paddock_alloc(size i32) -> ptr i32.
	ExportAlloc = "paddock_alloc"
	// ExportFree is paddock_free(ptr i32).
	ExportFree = "paddock_free"
	// ExportTurn is paddock_turn(ptr i32, len i32) -> i64 (ptr<<32 | len).
	ExportTurn = "paddock_turn"
	// ExportMemory is the exported linear memory.
	ExportMemory = "memory"
	// ExportInitialize is the reactor initialiser, called once per instance
	// if the module exports it.
	ExportInitialize = "_initialize"
	// ExportStart marks a command module, which the host refuses.
	ExportStart = "_start"
)

// Defaults applied by New to zero Config fields.
const (
	// DefaultMemoryLimitPages is 1024 pages of 64 KiB = 64 MiB per instance.
	DefaultMemoryLimitPages = 1024
	// DefaultTurnTimeout is the wall-time cap of one turn.
	DefaultTurnTimeout = 10 * time.Second
	// DefaultInitTimeout is the wall-time cap of a module's _initialize.
	DefaultInitTimeout = 30 * time.Second
	// DefaultMaxModuleBytes bounds an uploaded module (64 MiB).
	DefaultMaxModuleBytes = 64 << 20
	// DefaultMaxLogBytesPerTurn bounds what one turn may write to the host
	// log through stdout, stderr and the log import together (64 KiB).
	DefaultMaxLogBytesPerTurn = 64 << 10
	// DefaultRecycleAfterTurns is the turn count after which ShouldRecycle
	// reports true.
	DefaultRecycleAfterTurns = 10000
)

// sleepSlice is the longest single host sleep served to a guest; see the
// package doc, "Why real clocks".
const sleepSlice = 10 * time.Millisecond

// Config configures a Runtime. Zero fields take the defaults above.
type Config struct {
	// CacheDir is the directory of wazero's persistent compilation cache,
	// created if missing. Compiled machine code is loaded from it, so it
	// must be writable only by Paddock. Empty: compile in memory only.
	CacheDir string
	// MemoryLimitPages caps the linear memory of each instance, in 64 KiB
	// pages (0: DefaultMemoryLimitPages; at most 65536 = 4 GiB). A guest
	// that needs more fails its turn with KindOOM.
	MemoryLimitPages uint32
	// TurnTimeout caps the wall time of one Turn. 0: DefaultTurnTimeout.
	TurnTimeout time.Duration
	// InitTimeout caps the instantiation of a module (its _initialize),
	// at Load's probe and at Instantiate. 0: DefaultInitTimeout. Separate
	// from TurnTimeout so that a short turn cap cannot fail a slow start on
	// a loaded machine, and a long one cannot let a hung _initialize stall.
	InitTimeout time.Duration
	// MaxResultBytes caps an encoded TurnResult, in bytes (0 and the most:
	// abi.MaxResultBytes). A larger result fails the turn with KindOversized.
	MaxResultBytes int
	// MaxModuleBytes caps a module's size at Validate and Load
	// (0: DefaultMaxModuleBytes).
	MaxModuleBytes int
	// RecycleMemoryBytes is the linear-memory high-water mark, in bytes, past
	// which Instance.ShouldRecycle reports true (0: half the memory cap).
	RecycleMemoryBytes uint64
	// RecycleAfterTurns is the number of turns after which
	// Instance.ShouldRecycle reports true (0: DefaultRecycleAfterTurns;
	// negative: never).
	RecycleAfterTurns int
	// MaxLogBytesPerTurn caps the guest output logged per turn, in bytes;
	// the rest is dropped and counted (0: DefaultMaxLogBytesPerTurn).
	MaxLogBytesPerTurn int
}

// withDefaults validates c and fills its zero fields.
func (c Config) withDefaults() (Config, error) {
	if c.MemoryLimitPages == 0 {
		c.MemoryLimitPages = DefaultMemoryLimitPages
	}
	if c.MemoryLimitPages > 65536 {
		return c, fmt.Errorf("wasm: MemoryLimitPages %d exceeds 65536 (4 GiB)", c.MemoryLimitPages)
	}
	if c.TurnTimeout < 0 {
		return c, fmt.Errorf("wasm: TurnTimeout %s is negative", c.TurnTimeout)
	}
	if c.TurnTimeout == 0 {
		c.TurnTimeout = DefaultTurnTimeout
	}
	if c.InitTimeout < 0 {
		return c, fmt.Errorf("wasm: InitTimeout %s is negative", c.InitTimeout)
	}
	if c.InitTimeout == 0 {
		c.InitTimeout = DefaultInitTimeout
	}
	if c.MaxResultBytes < 0 || c.MaxResultBytes > abi.MaxResultBytes {
		return c, fmt.Errorf("wasm: MaxResultBytes %d is outside 0..%d", c.MaxResultBytes, abi.MaxResultBytes)
	}
	if c.MaxResultBytes == 0 {
		c.MaxResultBytes = abi.MaxResultBytes
	}
	if c.MaxModuleBytes < 0 {
		return c, fmt.Errorf("wasm: MaxModuleBytes %d is negative", c.MaxModuleBytes)
	}
	if c.MaxModuleBytes == 0 {
		c.MaxModuleBytes = DefaultMaxModuleBytes
	}
	if c.RecycleMemoryBytes == 0 {
		c.RecycleMemoryBytes = uint64(c.MemoryLimitPages) * 65536 / 2
	}
	if c.RecycleAfterTurns == 0 {
		c.RecycleAfterTurns = DefaultRecycleAfterTurns
	}
	if c.MaxLogBytesPerTurn < 0 {
		return c, fmt.Errorf("wasm: MaxLogBytesPerTurn %d is negative", c.MaxLogBytesPerTurn)
	}
	if c.MaxLogBytesPerTurn == 0 {
		c.MaxLogBytesPerTurn = DefaultMaxLogBytesPerTurn
	}
	return c, nil
}

// ErrClosed is returned by a Runtime's methods after Close.
var ErrClosed = errors.New("wasm: runtime closed")

// ErrNotLoaded is returned (wrapped, with the digest) by Instantiate for a
// module that was not loaded with Load or Validate in this Runtime. The host
// answers it by reading the module from the store and calling Load.
var ErrNotLoaded = errors.New("wasm: module not loaded")

// ErrDigestMismatch is returned (wrapped) by Load when the bytes do not hash
// to the digest they were loaded under.
var ErrDigestMismatch = errors.New("wasm: module bytes do not match digest")

// ModuleInfo describes a loaded module.
type ModuleInfo struct {
	// Digest is "sha256:" and the lowercase hex SHA-256 of the module bytes.
	Digest string
	// ABIVersion is what the module's paddock_abi_version returned.
	ABIVersion int
	// Size is the module size in bytes.
	Size int
	// CompileTime is how long compilation took in this Runtime (short when
	// the compilation cache had the module).
	CompileTime time.Duration
}

// Digest returns the content address of a module: "sha256:<hex>".
func Digest(wasm []byte) string {
	sum := sha256.Sum256(wasm)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Runtime compiles, validates and instantiates agent modules. It is safe for
// concurrent use. One Runtime per process is the intended use: its
// compilation cache and compiled modules are shared by all instances.
type Runtime struct {
	cfg     Config
	log     *slog.Logger
	wz      wazero.Runtime
	cache   wazero.CompilationCache // nil without CacheDir
	mem     *memAllocator           // linear memories; nil: wazero's default
	modCfg  wazero.ModuleConfig     // the sandbox, without stdout/stderr
	imports map[string]map[string]api.FunctionDefinition

	// compileMu serialises compilations when there is a compilation cache,
	// so that the artefacts of a module refused after compiling are known
	// and evicted (newFiles, evict).
	compileMu sync.Mutex

	mu      sync.Mutex
	closed  bool
	modules map[string]*module // by digest
	// closing ends with Close: the guest calls in flight (running, under
	// mu) stop at their next fuel check or host call, and Close waits for
	// them before it releases the instances' memory.
	closing    context.Context
	stopGuests context.CancelFunc
	running    sync.WaitGroup
}

// module is one digest's compilation, shared by the Load calls that wait
// for it (single-flight).
type module struct {
	digest   string
	ready    chan struct{} // closed when compiled or err is set
	compiled wazero.CompiledModule
	info     ModuleInfo
	err      error
}

// New creates a Runtime. logger receives runtime events and guest output
// (nil discards them). It fails on an invalid Config or an unusable CacheDir.
func New(ctx context.Context, cfg Config, logger *slog.Logger) (*Runtime, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	// No WithCloseOnContextDone: modules carry a fuel check instead
	// (compile, interrupt.Instrument; see the package doc).
	rc := wazero.NewRuntimeConfig().
		WithMemoryLimitPages(cfg.MemoryLimitPages)
	r := &Runtime{cfg: cfg, log: logger, modules: map[string]*module{}, mem: newMemAllocator(logger)}
	r.closing, r.stopGuests = context.WithCancel(context.WithoutCancel(ctx))
	if cfg.CacheDir != "" {
		r.cache, err = wazero.NewCompilationCacheWithDir(cfg.CacheDir)
		if err != nil {
			return nil, fmt.Errorf("wasm: compilation cache %s: %w", cfg.CacheDir, err)
		}
		rc = rc.WithCompilationCache(r.cache)
	}
	r.wz = wazero.NewRuntimeWithConfig(ctx, rc)
	fail := func(err error) (*Runtime, error) {
		_ = r.wz.Close(ctx)
		if r.cache != nil {
			_ = r.cache.Close(ctx)
		}
		return nil, err
	}
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, r.wz); err != nil {
		return fail(fmt.Errorf("wasm: instantiate WASI: %w", err))
	}
	// The fuel check's yield (interrupt.Instrument). Its module is not in
	// r.imports, so no module may import it itself.
	if _, err := r.wz.NewHostModuleBuilder(interruptModule().Import).
		NewFunctionBuilder().
		WithGoModuleFunction(api.GoModuleFunc(hostYield), nil, []api.ValueType{api.ValueTypeI32}).
		WithResultNames("fuel").
		Export(interruptModule().Name).
		Instantiate(ctx); err != nil {
		return fail(fmt.Errorf("wasm: instantiate host module %q: %w", interruptModule().Import, err))
	}
	host, err := r.wz.NewHostModuleBuilder(HostModule).
		NewFunctionBuilder().
		WithGoModuleFunction(api.GoModuleFunc(hostLog),
			[]api.ValueType{api.ValueTypeI32, api.ValueTypeI32, api.ValueTypeI32}, nil).
		WithParameterNames("level", "ptr", "len").
		Export(HostLog).
		NewFunctionBuilder().
		WithGoModuleFunction(api.GoModuleFunc(hostSteerPoll),
			[]api.ValueType{api.ValueTypeI32, api.ValueTypeI32}, []api.ValueType{api.ValueTypeI32}).
		WithParameterNames("buf_ptr", "buf_cap").
		WithResultNames("n").
		Export(HostSteerPoll).
		NewFunctionBuilder().
		WithGoModuleFunction(api.GoModuleFunc(hostCall),
			[]api.ValueType{api.ValueTypeI32, api.ValueTypeI32, api.ValueTypeI32, api.ValueTypeI32}, []api.ValueType{api.ValueTypeI32}).
		WithParameterNames("req_ptr", "req_len", "buf_ptr", "buf_cap").
		WithResultNames("n").
		Export(HostCall).
		NewFunctionBuilder().
		WithGoModuleFunction(api.GoModuleFunc(hostCallResult),
			[]api.ValueType{api.ValueTypeI32, api.ValueTypeI32}, []api.ValueType{api.ValueTypeI32}).
		WithParameterNames("buf_ptr", "buf_cap").
		WithResultNames("n").
		Export(HostCallResult).
		Instantiate(ctx)
	if err != nil {
		return fail(fmt.Errorf("wasm: instantiate host module %q: %w", HostModule, err))
	}
	r.imports = map[string]map[string]api.FunctionDefinition{
		wasi_snapshot_preview1.ModuleName: r.wz.Module(wasi_snapshot_preview1.ModuleName).ExportedFunctionDefinitions(),
		HostModule:                        host.ExportedFunctionDefinitions(),
	}
	// The sandbox: no filesystem, network, environment or arguments (none
	// is configured; stdin reads EOF); stdout and stderr are set per
	// instance to the host log.
	r.modCfg = wazero.NewModuleConfig().
		WithName("").                         // anonymous: many instances of one module coexist
		WithStartFunctions(ExportInitialize). // reactors; the default _start would run a command's main
		// Real clocks: wazero's defaults are fake (walltime frozen at
		// 2022-01-01, nanotime +1 ms per read), which would stamp wrong
		// times and break any elapsed-time logic in agents. Turns are not
		// replayed, so determinism buys nothing (package doc).
		WithSysWalltime().
		WithSysNanotime().
		// Real sleep, in slices, so a sleeping guest still sees its
		// deadline; WithSysNanosleep could block a turn past its timeout.
		WithNanosleep(func(ns int64) { time.Sleep(min(time.Duration(ns), sleepSlice)) }).
		// The default random source is identical in every instance.
		WithRandSource(rand.Reader)
	return r, nil
}

// Config returns the effective configuration, defaults filled in.
func (r *Runtime) Config() Config { return r.cfg }

// Validate checks an uploaded module and loads it (see Load); it is Load
// under the module's own digest. A module that cannot serve turns returns a
// *ModuleError naming every problem found (the API answers 400); other
// errors are the host's (ErrClosed, a cancelled ctx).
//
// Validation first reads the module's imports and exports from its header
// (the type, import, function and export sections) and checks them against
// the ABI, imports first; a module refused there is never compiled, so it
// leaves nothing in the compilation cache. Then it compiles the module and
// instantiates it once in the sandbox, bounded by InitTimeout, to call
// paddock_abi_version: the only guest code run is the module's initialiser
// and that function. The module stays loaded; call Unload if this Runtime
// will not run it.
func (r *Runtime) Validate(ctx context.Context, wasm []byte) (ModuleInfo, error) {
	return r.Load(ctx, Digest(wasm), wasm)
}

// Load compiles and validates the module wasm under digest, once per digest:
// concurrent calls for one digest wait for the first (single-flight), later
// calls return at once. The compilation cache (Config.CacheDir) makes a
// reload after a restart cheap. Errors: ErrDigestMismatch, *ModuleError
// (as Validate), ErrClosed, or ctx's error while waiting for another
// caller's compilation. A failed load is forgotten, so a later call retries.
func (r *Runtime) Load(ctx context.Context, digest string, wasm []byte) (ModuleInfo, error) {
	if got := Digest(wasm); got != digest {
		return ModuleInfo{}, fmt.Errorf("%w: loaded as %s, bytes hash to %s", ErrDigestMismatch, digest, got)
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return ModuleInfo{}, ErrClosed
	}
	if m, ok := r.modules[digest]; ok {
		r.mu.Unlock()
		return m.wait(ctx)
	}
	m := &module{digest: digest, ready: make(chan struct{})}
	r.modules[digest] = m
	r.mu.Unlock()

	m.compiled, m.info, m.err = r.compile(context.WithoutCancel(ctx), digest, wasm)
	if m.err != nil {
		r.mu.Lock()
		if r.modules[digest] == m {
			delete(r.modules, digest)
		}
		r.mu.Unlock()
	}
	close(m.ready)
	return m.info, m.err
}

// wait blocks until m is compiled or ctx is done.
func (m *module) wait(ctx context.Context) (ModuleInfo, error) {
	select {
	case <-m.ready:
		return m.info, m.err
	case <-ctx.Done():
		return ModuleInfo{}, fmt.Errorf("wasm: waiting for module %s to compile: %w", m.digest, ctx.Err())
	}
}

// compile compiles wasm and runs every check of Validate.
func (r *Runtime) compile(ctx context.Context, digest string, wasm []byte) (wazero.CompiledModule, ModuleInfo, error) {
	info := ModuleInfo{Digest: digest, Size: len(wasm)}
	if err := checkHeader(wasm, r.cfg.MaxModuleBytes); err != nil {
		err.Digest = digest
		return nil, info, err
	}
	// Imports and exports are checked from the header first, so that a
	// module that cannot serve turns is refused without being compiled
	// (and leaves nothing in the compilation cache).
	h, err := readHeader(wasm)
	if err != nil {
		return nil, info, &ModuleError{Digest: digest, Reason: ReasonInvalidWasm, Err: err}
	}
	if merr := r.checkInterface(h); merr != nil {
		merr.Digest = digest
		return nil, info, merr
	}
	start := time.Now()
	compiled, made, err := r.compileOnly(ctx, wasm)
	info.CompileTime = time.Since(start)
	if err != nil {
		if r.isClosed() {
			return nil, info, ErrClosed
		}
		return nil, info, &ModuleError{Digest: digest, Reason: ReasonInvalidWasm, Err: err}
	}
	// The probe runs the guest's start (bounded only by the init timeout)
	// outside compileMu: held across it, a few modules whose start spins
	// stalled every other load of the host, of every namespace, for their
	// init timeouts (found in review: a harmless upload took 88 s).
	v, err := r.probeVersion(ctx, digest, compiled)
	if err != nil {
		_ = compiled.Close(ctx)
		r.evict(made)
		return nil, info, err
	}
	info.ABIVersion = v
	if v != abi.Version {
		_ = compiled.Close(ctx)
		r.evict(made)
		return nil, info, &ModuleError{Digest: digest, Reason: ReasonABIVersion, ABIVersion: v}
	}
	r.log.LogAttrs(ctx, slog.LevelInfo, "wasm module loaded",
		slog.String("module", digest), slog.Int("size", len(wasm)),
		slog.Duration("compile_time", info.CompileTime))
	return compiled, info, nil
}

// compileOnly instruments and compiles wasm; made lists the compilation
// cache's files the compilation wrote (nil without a cache), which evict
// removes if the module is refused after compiling. Compilations are
// serialised by compileMu, so that those files are known.
func (r *Runtime) compileOnly(ctx context.Context, wasm []byte) (wazero.CompiledModule, []string, error) {
	var before map[string]bool
	if r.cache != nil {
		r.compileMu.Lock()
		defer r.compileMu.Unlock()
		before = r.cacheFiles()
	}
	instrumented, err := interrupt.Instrument(wasm, interruptModule(), fuelPerYield)
	if err != nil {
		return nil, nil, err
	}
	workers := min(runtime.GOMAXPROCS(0), 4)
	compiled, err := r.wz.CompileModule(experimental.WithCompilationWorkers(ctx, workers), instrumented)
	if err != nil {
		return nil, nil, err
	}
	return compiled, r.newFiles(before), nil
}

// probeVersion instantiates compiled once, in the sandbox and within
// InitTimeout, and calls paddock_abi_version. Instantiating once right after
// compiling also sidesteps wazero/wazero#929 (racy first instantiation).
func (r *Runtime) probeVersion(ctx context.Context, digest string, compiled wazero.CompiledModule) (int, error) {
	inst, err := r.instantiate(ctx, digest, compiled)
	if err != nil {
		if errors.Is(err, ErrClosed) {
			return 0, err
		}
		return 0, &ModuleError{Digest: digest, Reason: ReasonInitFailed, Err: err}
	}
	defer inst.Close(ctx)
	inst.callStart = time.Now()
	cctx, cancel := context.WithTimeout(ctx, r.cfg.InitTimeout)
	defer cancel()
	gctx, leave, err := r.enter(withTurnCalls(withGuestLog(abi.WithCaller(cctx, nil), inst.glog), &turnCalls{digest: digest}))
	if err != nil {
		return 0, err
	}
	out, err := inst.mod.ExportedFunction(ExportABIVersion).Call(gctx)
	leave()
	if err != nil {
		return 0, &ModuleError{Digest: digest, Reason: ReasonInitFailed,
			Err: inst.classify(cctx, "paddock_abi_version", err)}
	}
	return int(api.DecodeI32(out[0])), nil
}

// Unload forgets the module of digest and releases its compiled code.
// Instances already made keep running; Instantiate then returns
// ErrNotLoaded. Unloading an unknown digest does nothing.
func (r *Runtime) Unload(ctx context.Context, digest string) error {
	r.mu.Lock()
	m, ok := r.modules[digest]
	delete(r.modules, digest)
	r.mu.Unlock()
	if !ok {
		return nil
	}
	if _, err := m.wait(ctx); err != nil {
		return nil // the failed load left nothing to release
	}
	if err := m.compiled.Close(ctx); err != nil {
		return fmt.Errorf("wasm: unload %s: %w", digest, err)
	}
	return nil
}

// Loaded reports whether the module of digest is loaded (or loading).
func (r *Runtime) Loaded(digest string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.modules[digest]
	return ok
}

// Instantiate makes a new instance of a loaded module: it runs the module's
// _initialize within InitTimeout. Errors: ErrNotLoaded (wrapped), ErrClosed,
// ctx's error while the module is still compiling, or a *TurnError if the
// guest's initialiser fails (the attempt fails as if the turn had).
func (r *Runtime) Instantiate(ctx context.Context, digest string) (*Instance, error) {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil, ErrClosed
	}
	m, ok := r.modules[digest]
	r.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrNotLoaded, digest)
	}
	if _, err := m.wait(ctx); err != nil {
		return nil, err
	}
	return r.instantiate(ctx, digest, m.compiled)
}

// Close closes every instance and compiled module of the Runtime and
// releases the compilation cache (its directory stays). Turns in progress
// fail (KindCanceled): Close stops them at their next fuel check or host
// call and waits for them. Calling Close again returns nil.
func (r *Runtime) Close(ctx context.Context) error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	r.modules = map[string]*module{}
	r.mu.Unlock()
	// Stop the guests in flight and wait for them to leave: closing a
	// module releases its memory, which must not happen under running
	// code.
	r.stopGuests()
	r.running.Wait()
	if r.mem != nil {
		// First, so that the memories wazero frees now are unmapped, not
		// kept.
		r.mem.close()
	}
	err := r.wz.Close(ctx)
	if r.cache != nil {
		err = errors.Join(err, r.cache.Close(ctx))
	}
	if err != nil {
		return fmt.Errorf("wasm: close runtime: %w", err)
	}
	return nil
}

func (r *Runtime) isClosed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closed
}

// fuelPerYield is the fuel a guest gets at a time: function entries and
// loop iterations between two calls to hostYield (≈ 0.1-0.5 ms of guest
// code; the yield itself costs a host call, ≈ 0.1 µs). It bounds how long
// a guest can hold off a stop, and the Go garbage collector's
// stop-the-world.
const fuelPerYield = 1 << 16

// interruptModule is the yield import interrupt.Instrument adds.
func interruptModule() interrupt.Module {
	return interrupt.Module{Import: "paddock_interrupt", Name: "yield"}
}

// hostYield is the fuel check's yield: it stops the guest call (a
// sys.ExitError, which wazero returns from the call as is) when its ctx
// ended — the turn's deadline, its cancellation, Instance.Close or
// Runtime.Close — else it answers the next fuel.
func hostYield(ctx context.Context, _ api.Module, stack []uint64) {
	if err := ctx.Err(); err != nil {
		code := uint32(sys.ExitCodeContextCanceled)
		if errors.Is(err, context.DeadlineExceeded) {
			code = sys.ExitCodeDeadlineExceeded
		}
		panic(sys.NewExitError(code))
	}
	stack[0] = api.EncodeI32(fuelPerYield)
}

// enter registers a guest call about to run under ctx: the returned ctx
// also ends when the Runtime closes, and leave must be called when the
// call returned. Errors: ErrClosed.
func (r *Runtime) enter(ctx context.Context) (context.Context, func(), error) {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil, nil, ErrClosed
	}
	r.running.Add(1)
	r.mu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(r.closing, cancel)
	return ctx, func() {
		stop()
		cancel()
		r.running.Done()
	}, nil
}
