package wasm_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/examples/faulty"
	"github.com/paddock-dev/paddock/wasm"
)

// mapped returns a Runtime of its own (so that its reservations can be
// counted) that maps linear memories, skipping t where there is no mmap.
func mapped(t *testing.T, cfg wasm.Config) *bundle {
	t.Helper()
	b := setup(t, cfg)
	if !wasm.MemoryMapped(b.rt) {
		t.Skip("no mmap on this platform: wazero's default memory")
	}
	return b
}

// wantInUse asserts the number of rt's linear-memory mappings in use
// (mapped and not kept for reuse), and that those kept are zeroed.
func wantInUse(t *testing.T, rt *wasm.Runtime, want int, when string) {
	t.Helper()
	if mapped, idle := wasm.MemoryMappings(rt); mapped-idle != want {
		t.Fatalf("%s: %d memory mappings in use (%d mapped, %d kept), want %d", when, mapped-idle, mapped, idle, want)
	}
	if !wasm.IdleMemoriesZeroed(rt) {
		t.Fatalf("%s: a mapping kept for reuse holds bytes of its last instance", when)
	}
}

// awaitMappings runs the garbage collector until rt has mapped mappings
// of which idle are kept for reuse (cleanups run after a collection, on
// their own goroutine), failing t if that does not happen within a
// generous bound.
func awaitMappings(t *testing.T, rt *wasm.Runtime, mapped, idle int, when string) {
	t.Helper()
	for range 500 {
		if m, i := wasm.MemoryMappings(rt); m == mapped && i == idle {
			return
		}
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	m, i := wasm.MemoryMappings(rt)
	t.Fatalf("%s: %d memory mappings (%d kept), want %d (%d kept)", when, m, i, mapped, idle)
}

// TestLinearMemoryGrowsInPlace: turns that make a Go guest grow its memory
// from its initial size by megabytes run on a memory that never moves, and
// every byte of state crosses it intact.
func TestLinearMemoryGrowsInPlace(t *testing.T) {
	t.Parallel()
	b := mapped(t, wasm.Config{})
	ctx := context.Background()
	inst := b.instance(t, b.faulty(t))
	wantInUse(t, b.rt, 1, "one instance") // the load's probe instance is closed
	base, initial := wasm.MemoryBase(inst), inst.MemoryBytes()
	rounds := 4
	if raceEnabled {
		rounds = 1
	}
	turns := 0
	for range rounds {
		for n := 1 << 10; n <= 1<<20; n *= 2 {
			state := faulty.StateOf(n)
			if got, want := reply(t)(inst.Turn(ctx, request("statesum", state, 1))), faulty.StateSum(state); got != want {
				t.Fatalf("statesum of %d bytes: %q, want %q", n, got, want)
			}
			if got := reply(t)(inst.Turn(ctx, request(fmt.Sprintf("big %d", n), nil, 1))); len(got) != n || strings.Trim(got, "x") != "" {
				t.Fatalf("big %d: a reply of %d bytes", n, len(got))
			}
			turns += 2
			if wasm.MemoryBase(inst) != base {
				t.Fatalf("the memory moved after %d turns (%d bytes)", turns, inst.MemoryBytes())
			}
		}
	}
	grown := inst.MemoryBytes()
	t.Logf("%d turns: memory %d -> %d KiB at one address", turns, initial>>10, grown>>10)
	if grown < initial+4<<20 {
		t.Fatalf("memory grew from %d to %d bytes only: the test does not exercise growth", initial, grown)
	}
	wantInUse(t, b.rt, 1, "after the turns")
	if err := inst.Close(ctx); err != nil {
		t.Fatal(err)
	}
	wantInUse(t, b.rt, 0, "after Instance.Close")
	// The next instance gets the mapping, zeroed (wantInUse checked it).
	next := b.instance(t, b.faulty(t))
	if wasm.MemoryBase(next) != base {
		t.Fatal("the closed instance's mapping was not reused")
	}
	reply(t)(next.Turn(ctx, request("hello", nil, 1)))
}

// TestLinearMemoryReleased: every way an instance ends unmaps its memory —
// Instance.Close, a failed turn, an OOM at the memory cap, Pool.Close and
// Runtime.Close.
func TestLinearMemoryReleased(t *testing.T) {
	t.Parallel()
	b := mapped(t, wasm.Config{MemoryLimitPages: 256})
	ctx := context.Background()
	notes, bad := b.notes(t), b.faulty(t)
	wantInUse(t, b.rt, 0, "after loading (probe instances closed)")

	inst := make([]*wasm.Instance, 4)
	for i := range inst {
		var err error
		if inst[i], err = b.rt.Instantiate(ctx, notes); err != nil {
			t.Fatal(err)
		}
		reply(t)(inst[i].Turn(ctx, request("count", nil, 1)))
	}
	wantInUse(t, b.rt, 4, "four instances")
	if err := inst[0].Close(ctx); err != nil {
		t.Fatal(err)
	}
	_ = inst[0].Close(ctx) // a second Close frees nothing twice
	wantInUse(t, b.rt, 3, "after Instance.Close")

	for _, msg := range []string{"exit", "oom"} {
		f, err := b.rt.Instantiate(ctx, bad)
		if err != nil {
			t.Fatal(err)
		}
		wantInUse(t, b.rt, 4, msg+": one more instance")
		_, err = f.Turn(ctx, request(msg, nil, 1))
		var te *wasm.TurnError
		if !errors.As(err, &te) || (msg == "oom") != (te.Kind == wasm.KindOOM) {
			t.Fatalf("%s: %v", msg, err)
		}
		wantInUse(t, b.rt, 3, msg+": after the failed turn")
	}

	pool := wasm.NewPool(b.rt, 4)
	for _, key := range []string{"a", "b"} {
		p, err := pool.Get(ctx, key, notes)
		if err != nil {
			t.Fatal(err)
		}
		pool.Put(key, p)
	}
	wantInUse(t, b.rt, 5, "two idle pooled instances")
	pool.Close(ctx)
	wantInUse(t, b.rt, 3, "after Pool.Close")

	if err := b.rt.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if mapped, _ := wasm.MemoryMappings(b.rt); mapped != 0 {
		t.Fatalf("after Runtime.Close: %d memory mappings, want 0", mapped)
	}
	if _, err := inst[1].Turn(ctx, request("count", nil, 2)); !errors.Is(err, wasm.ErrClosed) {
		t.Fatalf("turn after Runtime.Close: %v, want ErrClosed", err)
	}
	// MemoryBytes reads only the length wazero keeps after Free, and
	// Instance.Close after Runtime.Close frees nothing twice.
	_ = inst[1].MemoryBytes()
	for _, i := range inst[1:] {
		_ = i.Close(ctx)
	}
	if mapped, _ := wasm.MemoryMappings(b.rt); mapped != 0 {
		t.Fatalf("after closing instances of a closed Runtime: %d memory mappings, want 0", mapped)
	}
}

// TestLinearMemoryOfFailedInstantiation: wazero drops the memory of an
// instantiation that fails after making it (a start function that traps, a
// data segment out of bounds) without freeing it; the cleanup net unmaps
// it.
func TestLinearMemoryOfFailedInstantiation(t *testing.T) {
	t.Parallel()
	b := mapped(t, wasm.Config{})
	trapStart := fixedGuest(1, []byte("{}"))
	trapStart.funcs = append(trapStart.funcs, wfunc{body: []byte{opUnreachable}})
	trapStart.start = len(trapStart.funcs)
	outOfBounds := fixedGuest(1, []byte("{}"))
	outOfBounds.data = append(outOfBounds.data, wdata{offset: 2*65536 - 2, bytes: []byte("four")})
	for name, m := range map[string]wmod{"start traps": trapStart, "data out of bounds": outOfBounds} {
		_, err := b.rt.Validate(context.Background(), m.bytes())
		moduleError(t, err, wasm.ReasonInitFailed)
		t.Logf("%s: %v", name, err)
	}
	awaitMappings(t, b.rt, 0, 0, "after the failed instantiations and a GC")
}

// TestDroppedInstanceIsClosed: an Instance the host drops without Close is
// closed, its memory unmapped, once the garbage collector finds it.
func TestDroppedInstanceIsClosed(t *testing.T) {
	t.Parallel()
	b := mapped(t, wasm.Config{})
	digest := b.notes(t)
	func() {
		inst, err := b.rt.Instantiate(context.Background(), digest)
		if err != nil {
			t.Fatal(err)
		}
		reply(t)(inst.Turn(context.Background(), request("count", nil, 1)))
	}()
	// Closing the module frees its memory, which is kept for reuse.
	awaitMappings(t, b.rt, 1, 1, "after dropping the instance")
	if len(b.logs.find("dropped without Close")) != 1 {
		t.Error("the dropped instance was not logged")
	}
}

// TestLinearMemoryFallback: when memory cannot be mapped, instances run on
// the Go heap, with the same outcomes.
func TestLinearMemoryFallback(t *testing.T) {
	t.Parallel()
	b := mapped(t, wasm.Config{MemoryLimitPages: 256})
	wasm.FailMemoryMappings(b.rt)
	ctx := context.Background()
	inst := b.instance(t, b.faulty(t))
	state := faulty.StateOf(1 << 20)
	if got, want := reply(t)(inst.Turn(ctx, request("statesum", state, 1))), faulty.StateSum(state); got != want {
		t.Fatalf("statesum: %q, want %q", got, want)
	}
	_, err := b.instance(t, b.faulty(t)).Turn(ctx, request("oom", nil, 1))
	turnError(t, err, wasm.KindOOM)
	if mapped, _ := wasm.MemoryMappings(b.rt); mapped != 0 || wasm.MemoryFallbacks(b.rt) < 3 {
		t.Fatalf("%d mapped, %d fallbacks; want 0 and 3 (probe and two instances)", mapped, wasm.MemoryFallbacks(b.rt))
	}
	if n := len(b.logs.find("cannot map linear memory")); n != 1 {
		t.Fatalf("the fallback was logged %d times, want once", n)
	}
}
