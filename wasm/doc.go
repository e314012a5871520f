// Package wasm runs Paddock agent turns in sandboxed WebAssembly modules on
// wazero. It implements the host side of the wasm guest ABI documented in
// abi/README.md; the Go guest SDK is wasm/guest.
//
// Life cycle:
//
//	rt, err := wasm.New(ctx, wasm.Config{CacheDir: dir}, logger)  // one per process
//	info, err := rt.Validate(ctx, body)        // upload: refuse a bad module with a *ModuleError (HTTP 400)
//	info, err = rt.Load(ctx, digest, body)     // compile once per digest (single-flight)
//	inst, err := rt.Instantiate(ctx, digest)   // one instance per activation
//	res, err := inst.Turn(ctx, req)            // a *TurnError fails the attempt and closes inst
//	if err != nil || inst.ShouldRecycle() { inst.Close(ctx); inst = nil }
//
// Steering and cancellation (abi/README.md, "Steering and cancellation"):
//
//	steers := make(chan abi.Steer, 16)         // one channel per Turn call
//	res, err := inst.Turn(abi.WithSteers(ctx, steers), req)
//	// meanwhile, after the store raised the revision: steers <- abi.Steer{TurnRef: newRef, ...}
//	// res.TurnRef is the newest ref the guest took in (or req.TurnRef); the store decides
//	// cancel()                                 // aborts the turn: a *TurnError of KindCanceled
//
// Host calls (abi/README.md, "Host calls"): the guest's paddock.call import
// is performed by the abi.Caller the controller puts in the turn's context,
// under the turn's deadline; the guest waits in the import meanwhile.
//
//	res, err := inst.Turn(abi.WithCaller(ctx, caller), req) // no Caller: calls answer not_configured
//
// Measured (BenchmarkHostCall, a Go guest making 100 calls per turn to a
// Caller that answers at once, 2 vCPU): ~120 us per call, nearly all of it
// the guest's encoding/json running as wasm; the host's side (reading the
// request, encoding the result, writing it) is ~1% of the profile.
//
// The package runs turns; it never decides them. A TurnResult it returns has
// been checked against the contract (abi.TurnResult.Validate, size caps, the
// echoed turn_ref), but whether it commits is the store's fence check.
//
// # Why an instance per activation, not per turn
//
// Measured (BenchmarkTurn*, notes example, ~1 KiB state, 2 vCPU, Go 1.26
// guest, wazero v1.12 compiler): a fresh instance per turn costs ~13-16 ms
// (instantiate + _initialize ~6 ms, then a cold first turn ~6 ms) and
// ~12 MB of host allocations per turn (~2.4 MB since linear memory is
// mapped, below); a warm instance ~2.5 ms and ~20 KB.
// The warm floor is the Go guest's encoding/json running as wasm (~120 us
// per turn; it was ~4x that with WithCloseOnContextDone, below). Isolation
// between sessions does not need a fresh instance: by default one instance
// only ever serves one session, whose state arrives in every request
// anyway (an agent may opt into sharing warm instances among its sessions:
// Pool, and host/runner's instance scopes). What a
// long-lived instance accumulates is linear memory (wasm memory never
// shrinks: the notes instance settles at 8 MiB), so the host recycles an
// instance when ShouldRecycle says its memory passed the high-water mark or
// it served RecycleAfterTurns turns, and always after a failed turn (the
// Instance then closes itself).
//
// Compilation (BenchmarkLoad, a 3.5 MB Go module, including validation):
// ~1.2 s cold, ~0.1 s from the file cache of a previous process.
//
// # Why linear memory is mapped
//
// wazero's default linear memory is a Go slice grown by append, so every
// memory.grow past its capacity copies the whole memory, and a Go guest
// grows its memory many times in _initialize and again over its first
// thousands of turns (~4.7 to ~9 MB). In paddock bench with an
// instantiation per activation (--instance-reuse session --idle-timeout
// 1s), wazero's MemoryInstance.Grow took ~19 % of the host's CPU; with
// warm pooled instances ~1 %. Instead (memory.go), an instance's memory is
// one anonymous private mapping of its maximum (Config.MemoryLimitPages;
// MAP_NORESERVE on Linux), which costs address space, not memory, until
// the guest touches it; growing it reslices it in place.
//
// A fresh mapping's pages each cost a page fault when first touched
// (~13-17 us on the 2-vCPU VM measured: a fresh instance and its first
// turn took 16-21 ms of CPU against 9-12 ms on the Go heap). So a closed
// instance's mapping is zeroed — every byte its guest or the host could
// have written — and kept for the next instance: at most 8 per Runtime,
// of memories up to 16 MiB; others are unmapped. A fresh instance and its
// first turn then cost 5-6 ms of CPU. Where mapping fails (strict
// overcommit, an address-space limit) an instance gets a Go-heap memory;
// platforms without mmap keep wazero's default.
//
// The memories are no longer in the Go heap, which lowers the collector's
// target: in the pooled bench the live heap went from ~35 to ~17 MB and
// the collector ran ~50 % more often (3.5-4 % of the CPU against 2-3 %).
//
// # Why real clocks
//
// wazero's default clocks are fake (walltime fixed at 2022-01-01, nanotime
// advancing 1 ms per read) and its default sleep returns at once. Agents
// stamp messages and measure elapsed time, and a guest busy-waiting on a fake
// nanotime would measure nonsense, so instances get the host's real walltime
// and nanotime. Turns are not meant to be replayed deterministically — the
// transcript records their effects — so real time costs nothing in
// correctness. Sleep is real too, but served in short slices so that a
// sleeping guest still notices its turn deadline (a single long host sleep
// could not be interrupted). Randomness comes from crypto/rand: the default
// source is the same in every instance, which would also make the guest's
// map hashing predictable.
//
// # Why a fuel check, not WithCloseOnContextDone
//
// A guest that spins must be stoppable at its turn's deadline. wazero's
// WithCloseOnContextDone does it by checking for cancellation at every
// loop back-edge through an indirect call, which makes tight guest loops
// ~20x slower (wazero/wazero#2466): the bench's hasher turn (SHA-256 of 1
// KiB and a small JSON job) took ~300 us with it, ~45 % of the host's CPU
// in `paddock bench`.
//
// Instead, compile rewrites every module before wazero compiles it
// (internal/interrupt): a fuel counter that every function entry and loop
// head costs one of, and a bulk memory or table instruction one per KiB;
// when it runs out the guest calls the imported paddock_interrupt.yield.
// hostYield stops the call with a sys.ExitError once the call's context
// ended — the turn's deadline or cancel, Instance.Close, Runtime.Close —
// else it answers fuelPerYield more. The hasher turn takes ~80 us (go
// test -bench ModuleTurn ./examples/hasher/). Instrumenting renumbers the
// module's function indices, and it refuses any encoding that wazero would
// read otherwise than the instrumenter does (such a module could hide a
// loop from the check), as well as functions of more than 50,000 locals.
//
// A flag alone (as wasmtime's epoch interruption) is not enough here:
// wazero's native code has no preemption point, so a guest that never
// leaves it blocks the Go garbage collector's stop-the-world, and the
// whole host with it. The yield is that exit, at least every fuelPerYield
// units (TestTurnStopsOnCallerContext runs a GC while a guest spins). For
// the same reason a module is never closed under running code:
// Instance.Close cancels a running turn, which closes the module once the
// guest returned, and Runtime.Close cancels the guest calls in flight and
// waits for them (Runtime.enter) before it releases their memory.
package wasm
