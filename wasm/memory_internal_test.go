package wasm

import (
	"errors"
	"log/slog"
	"runtime"
	"testing"
	"time"
	"unsafe"
)

const page = 65536

func newTestAllocator(t *testing.T) *memAllocator {
	t.Helper()
	a := newMemAllocator(slog.New(slog.DiscardHandler))
	if a == nil {
		t.Skip("no mmap on this platform: wazero's default memory")
	}
	return a
}

func allZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

// TestMappedMemoryGrowsInPlace: a reservation of the maximum, grown by
// Reallocate at one address, zeroed, nil past the maximum, freed once.
func TestMappedMemoryGrowsInPlace(t *testing.T) {
	t.Parallel()
	a := newTestAllocator(t)
	lm := a.Allocate(2*page, 64*page)
	m, ok := lm.(*mappedMemory)
	if !ok {
		t.Fatalf("Allocate returned a %T, want a mapping", lm)
	}
	if n := a.live.Load(); n != 1 {
		t.Fatalf("live reservations %d, want 1", n)
	}
	buf := m.Reallocate(2 * page)
	if len(buf) != 2*page || cap(buf) != 2*page || !allZero(buf) {
		t.Fatalf("initial memory: len %d cap %d, zeroed %v", len(buf), cap(buf), allZero(buf))
	}
	base := unsafe.SliceData(buf)
	for i := range buf {
		buf[i] = 0xa5
	}
	for pages := uint64(3); pages <= 64; pages += 7 {
		grown := m.Reallocate(pages * page)
		if uint64(len(grown)) != pages*page {
			t.Fatalf("Reallocate(%d pages): len %d", pages, len(grown))
		}
		if unsafe.SliceData(grown) != base {
			t.Fatalf("Reallocate(%d pages) moved the memory", pages)
		}
		if grown[0] != 0xa5 || grown[2*page-1] != 0xa5 {
			t.Fatal("grown memory lost what was written")
		}
		if !allZero(grown[len(buf):]) {
			t.Fatalf("grown part of %d pages is not zeroed", pages)
		}
		for i := len(buf); i < len(grown); i++ {
			grown[i] = byte(i)
		}
		buf = grown
	}
	if full := m.Reallocate(64 * page); len(full) != 64*page || unsafe.SliceData(full) != base {
		t.Fatalf("Reallocate(max): len %d", len(full))
	}
	if past := m.Reallocate(64*page + 1); past != nil {
		t.Fatalf("Reallocate past the maximum returned %d bytes, want nil", len(past))
	}
	m.Free()
	if n := a.live.Load(); n != 0 {
		t.Fatalf("live reservations %d after Free, want 0", n)
	}
	m.Free() // idempotent: a second munmap of the range could unmap another mapping
	if n := a.live.Load(); n != 0 {
		t.Fatalf("live reservations %d after a second Free, want 0", n)
	}
	if b := m.Reallocate(page); b != nil {
		t.Fatal("Reallocate after Free returned memory")
	}
}

// TestMappedMemoryFreshPerAllocation: every Allocate is a new, zeroed
// mapping, even right after another was written and freed.
func TestMappedMemoryFreshPerAllocation(t *testing.T) {
	t.Parallel()
	a := newTestAllocator(t)
	for range 20 {
		m := a.Allocate(page, 16*page)
		b := m.Reallocate(16 * page)
		if !allZero(b) {
			t.Fatal("a fresh memory holds non-zero bytes")
		}
		for i := range b {
			b[i] = 0xff
		}
		m.Free()
	}
	if n := a.live.Load(); n != 0 {
		t.Fatalf("live reservations %d, want 0", n)
	}
}

// TestMappedMemoryCleanupNet: a memory dropped without Free (as wazero
// drops one when instantiation fails after building it) is unmapped by its
// cleanup.
func TestMappedMemoryCleanupNet(t *testing.T) {
	a := newTestAllocator(t)
	func() {
		m := a.Allocate(page, 4*page)
		m.Reallocate(page)[0] = 1
	}()
	waitLive(t, a, 0)
}

// waitLive runs the garbage collector until a has want live reservations
// (cleanups run after a collection, on their own goroutine), failing t if
// that does not happen within a generous bound.
func waitLive(t *testing.T, a *memAllocator, want int64) {
	t.Helper()
	for range 500 {
		if a.live.Load() == want {
			return
		}
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("live reservations %d, want %d", a.live.Load(), want)
}

// TestMemoryFallsBackToHeap: when the reservation fails, the memory is a
// Go slice with the same contract (zeroed, nil past the maximum); nothing
// is counted as mapped.
func TestMemoryFallsBackToHeap(t *testing.T) {
	t.Parallel()
	a := newTestAllocator(t)
	a.reserve = func(uint64) ([]byte, error) { return nil, errors.New("ENOMEM") }
	m := a.Allocate(page, 8*page)
	if _, ok := m.(*heapMemory); !ok {
		t.Fatalf("Allocate returned a %T, want the heap fallback", m)
	}
	b := m.Reallocate(page)
	b[0] = 7
	b = m.Reallocate(8 * page)
	if len(b) != 8*page || b[0] != 7 || !allZero(b[1:]) {
		t.Fatalf("fallback growth: len %d, first byte %d", len(b), b[0])
	}
	if m.Reallocate(8*page+1) != nil {
		t.Fatal("fallback Reallocate past the maximum returned memory")
	}
	m.Free()
	m.Free()
	if a.live.Load() != 0 || a.fallbacks.Load() != 1 {
		t.Fatalf("live %d fallbacks %d, want 0 and 1", a.live.Load(), a.fallbacks.Load())
	}
	// A memory without a maximum to reserve (max 0) needs no mapping.
	a = newTestAllocator(t)
	if m := a.Allocate(0, 0); len(m.Reallocate(0)) != 0 || m.Reallocate(1) != nil {
		t.Fatal("a memory of maximum 0 grew")
	}
	if a.live.Load() != 0 {
		t.Fatal("a 0-byte memory was mapped")
	}
}
