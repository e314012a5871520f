package wasm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"
	"github.com/tetratelabs/wazero/sys"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/wasm/internal/wire"
)

// Kinds of a TurnError.
const (
	// KindTrap: the guest executed a wasm trap (unreachable, out-of-bounds
	// memory access, ...).
	KindTrap = "trap"
	// KindExit: the guest exited (WASI proc_exit), e.g. os.Exit or an
	// unrecovered Go panic (exit code 2). ExitCode says which.
	KindExit = "exit"
	// KindOOM: the guest ran out of memory under Config.MemoryLimitPages.
	KindOOM = "oom"
	// KindTimeout: the turn ran past Config.TurnTimeout or the caller's
	// deadline.
	KindTimeout = "timeout"
	// KindCanceled: the caller's context was cancelled (e.g. the host
	// cancels the turn in flight) or the Instance was closed during the
	// turn.
	KindCanceled = "canceled"
	// KindOversized: the encoded result exceeds Config.MaxResultBytes.
	KindOversized = "oversized"
	// KindInvalidResult: the result is not valid v1 JSON, fails
	// abi.TurnResult.Validate, echoes neither the request's turn_ref nor
	// that of a steer the guest took in, or the guest broke the memory ABI
	// (a null or out-of-bounds buffer, also one given to steer_poll).
	KindInvalidResult = "invalid_result"
)

// TurnError is a failed turn: the attempt fails (docs/DESIGN.md "Failure, retry and
// crash policy") and the Instance that ran it is closed. The host never
// crashes or hangs on a guest's behalf; every guest failure ends here.
type TurnError struct {
	// Kind is one of the Kind constants.
	Kind string
	// Op is what failed: "instantiate", "turn", or the ABI function called.
	Op string
	// Digest is the module's content address.
	Digest string
	// TurnRef is the request's turn_ref rendered by abi.TurnRef.String
	// (empty for instantiation).
	TurnRef string
	// ExitCode is the guest's exit code (KindExit, KindOOM via exit).
	ExitCode uint32
	// Output is the beginning of what the guest wrote to stderr during the
	// turn (at most 1 KiB), e.g. a Go panic or fatal error message.
	Output string
	// Err is the underlying error.
	Err error
}

// Error reads like "wasm turn sha256:…/agent/s1@e3/ev7/r0/d9: exit: guest
// exited with code 2: module closed with exit_code(2); stderr: panic: …".
func (e *TurnError) Error() string {
	// The cause first (it is what a user reads in an event's last_error);
	// where it happened after. The turn_ref is in the logs and the event.
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s", e.Kind, firstLines(fmt.Sprint(e.Err), 8))
	if e.Output != "" {
		b.WriteString("; stderr: " + firstLines(e.Output, 4))
	}
	fmt.Fprintf(&b, " [wasm %s, module %s]", e.Op, shortDigest(e.Digest))
	return b.String()
}

// shortDigest cuts "sha256:<64 hex>" to its first 12 hex digits.
func shortDigest(d string) string {
	if len(d) > len("sha256:")+12 {
		return d[:len("sha256:")+12]
	}
	return d
}

// firstLines cuts s after n lines (wasm stack traces and goroutine dumps
// are long; the first lines say what happened and where).
func firstLines(s string, n int) string {
	at := 0
	for range n {
		nl := strings.IndexByte(s[at:], '\n')
		if nl < 0 {
			return s
		}
		at += nl + 1
	}
	if strings.TrimSpace(s[at:]) == "" {
		return strings.TrimRight(s, "\n")
	}
	return strings.TrimRight(s[:at], "\n") + "\n\t…"
}

// Unwrap returns the underlying error.
func (e *TurnError) Unwrap() error { return e.Err }

// ErrInstanceClosed is returned by Turn on an Instance that was closed, by
// Close or by an earlier failed turn.
var ErrInstanceClosed = errors.New("wasm: instance closed")

// ErrRequestTooLarge is returned (wrapped) by Turn when the encoded request
// exceeds abi.MaxRequestBytes. Nothing ran; the Instance stays usable.
var ErrRequestTooLarge = errors.New("wasm: turn request too large")

// Instance is one instance of a module: its own linear memory, Go runtime
// and globals. It serves turns one at a time (Turn serialises callers) and
// is meant to serve the turns of one activation; see the package doc for
// when to recycle it.
type Instance struct {
	rt     *Runtime
	digest string
	mod    api.Module
	alloc  api.Function
	free   api.Function
	turn   api.Function
	glog   *guestLog

	mu     sync.Mutex // serialises Turn, guards turns and mod's memory
	turns  int
	closed atomic.Bool
	// stopMu guards stop: the cancel of the turn in the guest, nil between
	// turns. Close cancels a running turn instead of closing the module
	// under its code; the turn closes it when the guest has returned.
	stopMu sync.Mutex
	stop   context.CancelFunc
	// reqBuf is the last turn's encoded request, reused (guarded by mu).
	reqBuf []byte
	// callStart is when the guest call being made started (its deadline is
	// reported as a duration from there).
	callStart time.Time
}

// maxKeptRequestBuf bounds the request buffer an Instance keeps between
// turns (bytes): most requests are a few KiB, and a pool keeps up to
// DefaultPoolIdle instances per module.
const maxKeptRequestBuf = 64 << 10

// instantiate makes an instance of compiled in the sandbox, running its
// _initialize within InitTimeout.
func (r *Runtime) instantiate(ctx context.Context, digest string, compiled wazero.CompiledModule) (*Instance, error) {
	inst := &Instance{rt: r, digest: digest, glog: newGuestLog(r.log, digest, r.cfg.MaxLogBytesPerTurn), callStart: time.Now()}
	cfg := r.modCfg.WithStdout(inst.glog.stdout()).WithStderr(inst.glog.stderr())
	ictx, cancel := context.WithTimeout(ctx, r.cfg.InitTimeout)
	defer cancel()
	inst.glog.startTurn("")
	defer inst.glog.endTurn(ictx)
	// The initialiser belongs to no event: a host call made there answers
	// not_configured, whatever Caller ctx carries.
	gctx, leave, err := r.enter(withTurnCalls(withGuestLog(abi.WithCaller(ictx, nil), inst.glog), &turnCalls{digest: digest}))
	if err != nil {
		return nil, err
	}
	if r.mem != nil {
		// Linear memory reserved by mmap and grown in place (memory.go).
		gctx = experimental.WithMemoryAllocator(gctx, r.mem)
	}
	mod, err := r.wz.InstantiateModule(gctx, compiled, cfg)
	leave()
	if err != nil {
		if r.isClosed() {
			return nil, ErrClosed
		}
		return nil, inst.classify(ictx, "instantiate", err)
	}
	inst.mod = mod
	inst.alloc = mod.ExportedFunction(ExportAlloc)
	inst.free = mod.ExportedFunction(ExportFree)
	inst.turn = mod.ExportedFunction(ExportTurn)
	if inst.alloc == nil || inst.free == nil || inst.turn == nil || mod.Memory() == nil {
		_ = mod.Close(ctx)
		return nil, fmt.Errorf("wasm: module %s lacks ABI exports after validation", digest)
	}
	// The net for an Instance dropped without Close: wazero's store keeps
	// every module until it is closed, so the module and its memory would
	// otherwise stay until Runtime.Close. An Instance is reachable while a
	// guest call of it runs (Turn and probeVersion use it after the call),
	// so this never closes a module under running code.
	runtime.AddCleanup(inst, closeDropped, droppedModule{mod: mod, log: r.log, digest: digest})
	return inst, nil
}

// droppedModule is the module of an Instance, for closeDropped. It must not
// point to the Instance.
type droppedModule struct {
	mod    api.Module
	log    *slog.Logger
	digest string
}

// closeDropped closes the module of an unreachable Instance that was never
// closed (a host bug: the log says so).
func closeDropped(d droppedModule) {
	if d.mod.IsClosed() {
		return
	}
	ctx := context.Background()
	d.log.LogAttrs(ctx, slog.LevelWarn, "wasm instance dropped without Close; closing its module",
		slog.String("module", d.digest))
	_ = d.mod.Close(ctx)
}

// Digest returns the content address of the instance's module.
func (i *Instance) Digest() string { return i.digest }

// Turn runs one turn: it encodes req, hands it to the guest's paddock_turn
// within Config.TurnTimeout (or ctx's earlier deadline), and returns the
// guest's result after checking it: size, JSON, abi.TurnResult.Validate and
// the echoed turn_ref. An "error" outcome is a valid result, not an error.
//
// Host calls of the guest (paddock.call) are performed by the abi.Caller
// of ctx (abi.WithCaller; without one they answer not_configured), under
// ctx and the turn's timeout: the guest waits in the import meanwhile.
//
// Steers reach the running turn through ctx (abi.WithSteers). The result's
// TurnRef is then the request's or that of a steer the guest took in — the
// newest one for a guest that follows the contract; which one, the host
// learns from the result (a stale one is for the store's fences to reject).
// Cancelling ctx aborts the turn at once: the guest is stopped, the
// Instance closed, and Turn returns a *TurnError of KindCanceled.
//
// Errors: a *TurnError for any guest failure (the Instance is then closed;
// make a new one for the next attempt), ErrInstanceClosed, ErrRequestTooLarge
// (wrapped; the Instance stays usable), or a JSON encoding error of req.
func (i *Instance) Turn(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.closed.Load() {
		return nil, ErrInstanceClosed
	}
	// The request is copied into guest memory, so its encoding's buffer
	// is kept for the next turn (unless a large request grew it).
	in, err := wire.AppendTurnRequest(i.reqBuf[:0], req)
	if err != nil {
		return nil, fmt.Errorf("wasm: encode turn request: %w", err)
	}
	if cap(in) <= maxKeptRequestBuf {
		i.reqBuf = in
	}
	if len(in) > abi.MaxRequestBytes {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrRequestTooLarge, len(in), abi.MaxRequestBytes)
	}
	i.callStart = time.Now()
	ctx, cancel := context.WithTimeout(ctx, i.rt.cfg.TurnTimeout)
	defer cancel()
	gctx, leave, err := i.rt.enter(ctx)
	if err != nil {
		return nil, err
	}
	defer leave()
	i.stopMu.Lock()
	if i.closed.Load() {
		i.stopMu.Unlock()
		return nil, ErrInstanceClosed
	}
	i.stop = cancel
	i.stopMu.Unlock()
	ref := req.TurnRef.String()
	i.glog.startTurn(ref)
	defer i.glog.endTurn(ctx)
	var steers *turnSteers
	// Host calls go through the Caller the controller put in ctx
	// (abi.WithCaller), under the turn's deadline.
	callCtx := withTurnCalls(withGuestLog(gctx, i.glog), &turnCalls{digest: i.digest})
	if ch := abi.SteersOf(ctx); ch != nil {
		steers = &turnSteers{ch: ch, log: i.rt.log, digest: i.digest, glog: i.glog}
		callCtx = withTurnSteers(callCtx, steers)
	}
	res, err := i.runTurn(callCtx, req, in, steers)
	// The guest has returned: from here on Close closes the module itself
	// (stop is nil); a Close before that left it to this turn. Clearing
	// stop and reading closed under stopMu leaves no gap where each would
	// leave the module to the other.
	i.stopMu.Lock()
	i.stop = nil
	closed := i.closed.Load()
	i.stopMu.Unlock()
	if err == nil && closed {
		// Closed while the guest ran, which returned before it noticed.
		err = &TurnError{Kind: KindCanceled, Op: ExportTurn, Digest: i.digest, Err: ErrInstanceClosed}
	}
	if err != nil {
		var te *TurnError
		if !errors.As(err, &te) {
			te = i.classify(ctx, "turn", err)
		}
		te.TurnRef = ref
		i.closed.Store(true)
		_ = i.mod.Close(context.WithoutCancel(ctx))
		i.rt.log.LogAttrs(ctx, logLevelTurnError, "wasm turn failed",
			logAttrs(i.digest, ref, "kind", te.Kind, "error", te.Error())...)
		return nil, te
	}
	i.turns++
	return res, nil
}

// runTurn is the ABI exchange of one turn.
func (i *Instance) runTurn(ctx context.Context, req *abi.TurnRequest, in []byte, steers *turnSteers) (*abi.TurnResult, error) {
	mem := i.mod.Memory()
	out, err := i.alloc.Call(ctx, uint64(len(in)))
	if err != nil {
		return nil, i.classify(ctx, ExportAlloc, err)
	}
	ptr := api.DecodeU32(out[0])
	if ptr == 0 || !mem.Write(ptr, in) {
		return nil, i.invalid(ExportAlloc, "returned buffer %#x of %d bytes, outside the %d-byte memory", ptr, len(in), mem.Size())
	}
	out, err = i.turn.Call(ctx, uint64(ptr), uint64(len(in)))
	if err != nil {
		return nil, i.classify(ctx, ExportTurn, err)
	}
	rptr, rlen := uint32(out[0]>>32), uint32(out[0])
	if _, err := i.free.Call(ctx, uint64(ptr)); err != nil {
		return nil, i.classify(ctx, ExportFree, err)
	}
	if int64(rlen) > int64(i.rt.cfg.MaxResultBytes) {
		return nil, &TurnError{Kind: KindOversized, Op: ExportTurn, Digest: i.digest,
			Err: fmt.Errorf("result is %d bytes, limit %d", rlen, i.rt.cfg.MaxResultBytes)}
	}
	view, ok := mem.Read(rptr, rlen)
	if !ok {
		return nil, i.invalid(ExportTurn, "result buffer %#x of %d bytes is outside the %d-byte memory", rptr, rlen, mem.Size())
	}
	// Decoding copies every field out of guest memory, so the view may be
	// released right after.
	res := new(abi.TurnResult)
	decErr := wire.DecodeTurnResult(view, res)
	if _, err := i.free.Call(ctx, uint64(rptr)); err != nil {
		return nil, i.classify(ctx, ExportFree, err)
	}
	if decErr != nil {
		return nil, i.invalid(ExportTurn, "malformed result JSON: %v", decErr)
	}
	if err := res.Validate(); err != nil {
		return nil, &TurnError{Kind: KindInvalidResult, Op: ExportTurn, Digest: i.digest, Err: err}
	}
	if !steers.echoes(req.TurnRef, res.TurnRef) {
		msg := fmt.Sprintf("result turn_ref %s does not echo the request's %s or that of a steer the guest took in", res.TurnRef, req.TurnRef)
		if res.Error != "" {
			msg += " (guest error: " + res.Error + ")"
		}
		return nil, i.invalid(ExportTurn, "%s", msg)
	}
	return res, nil
}

func (i *Instance) invalid(op, format string, args ...any) *TurnError {
	return &TurnError{Kind: KindInvalidResult, Op: op, Digest: i.digest, Err: fmt.Errorf(format, args...)}
}

// opName names the guest call of op in a timeout's message.
func opName(op string) string {
	switch op {
	case "instantiate":
		return "instantiation"
	case ExportABIVersion:
		return "the ABI version probe"
	}
	return "turn"
}

// classify turns an error of a guest call into a TurnError.
func (i *Instance) classify(ctx context.Context, op string, err error) *TurnError {
	te := &TurnError{Op: op, Digest: i.digest, Err: err, Output: i.glog.stderrHead()}
	var abiErr *TurnError // raised by a host function: the guest broke the ABI
	if errors.As(err, &abiErr) {
		abiErr.Output = te.Output
		return abiErr
	}
	var exit *sys.ExitError
	switch {
	case errors.As(err, &exit) && exit.ExitCode() == sys.ExitCodeDeadlineExceeded,
		!errors.As(err, &exit) && errors.Is(ctx.Err(), context.DeadlineExceeded):
		te.Kind = KindTimeout
		if dl, ok := ctx.Deadline(); ok {
			// The deadline is the runtime's cap or the caller's, whichever
			// is earlier (the host's per-agent turn timeout): name the one
			// that applied, as a duration from the call's start.
			te.Err = fmt.Errorf("%s exceeded its deadline of %s (deadline %s): %w",
				opName(op), dl.Sub(i.callStart).Round(time.Millisecond), dl.Format("15:04:05.000"), err)
		}
	case errors.As(err, &exit) && exit.ExitCode() == sys.ExitCodeContextCanceled,
		!errors.As(err, &exit) && ctx.Err() != nil,
		i.closed.Load():
		te.Kind = KindCanceled
	case errors.As(err, &exit):
		te.Kind, te.ExitCode = KindExit, exit.ExitCode()
		te.Err = fmt.Errorf("guest exited with code %d: %w", te.ExitCode, err)
	default:
		te.Kind = KindTrap
	}
	if (te.Kind == KindExit || te.Kind == KindTrap || te.Kind == KindTimeout) && i.glog.outOfMemory() {
		// A guest that reported running out of memory and then hit the
		// deadline was still dying (a Go runtime printing its goroutine
		// dump under the loop-check overhead can take seconds): the cause
		// is the memory, not the time.
		te.Kind = KindOOM
		te.Err = fmt.Errorf("guest ran out of memory (cap %d MiB): %w", i.rt.cfg.MemoryLimitPages/16, te.Err)
	}
	return te
}

// MemoryBytes returns the size of the instance's linear memory in bytes
// (0 once closed). Wasm memory never shrinks, so this is the instance's
// high-water mark; it blocks while a turn runs.
func (i *Instance) MemoryBytes() uint64 {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.closed.Load() {
		return 0
	}
	return uint64(i.mod.Memory().Size())
}

// Turns returns the number of turns the instance completed.
func (i *Instance) Turns() int {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.turns
}

// ShouldRecycle reports whether the host should close the instance and use
// a fresh one for the next turn: it is closed (after a failed turn), its
// memory passed Config.RecycleMemoryBytes, or it served
// Config.RecycleAfterTurns turns. It blocks while a turn runs.
func (i *Instance) ShouldRecycle() bool {
	if i.closed.Load() {
		return true
	}
	cfg := i.rt.cfg
	if cfg.RecycleAfterTurns > 0 && i.Turns() >= cfg.RecycleAfterTurns {
		return true
	}
	return i.MemoryBytes() >= cfg.RecycleMemoryBytes
}

// Closed reports whether the instance is closed.
func (i *Instance) Closed() bool { return i.closed.Load() }

// Close closes the instance and releases its memory. It may be called from
// another goroutine during a Turn, which then fails with KindCanceled.
// Calling Close again returns nil.
func (i *Instance) Close(ctx context.Context) error {
	if i.closed.Swap(true) {
		return nil
	}
	i.stopMu.Lock()
	stop := i.stop
	i.stopMu.Unlock()
	if stop != nil {
		// A turn is in the guest: stop it; it closes the module when the
		// guest has returned.
		stop()
		return nil
	}
	if err := i.mod.Close(ctx); err != nil {
		return fmt.Errorf("wasm: close instance of %s: %w", i.digest, err)
	}
	return nil
}
