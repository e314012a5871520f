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
	t.Cleanup(a.close)
	return a
}

// counts returns a's mappings not yet unmapped and those kept idle.
func (a *memAllocator) counts() (mapped int64, idle int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.mapped.Load(), len(a.idle)
}

func wantCounts(t *testing.T, a *memAllocator, mapped int64, idle int, when string) {
	t.Helper()
	if m, i := a.counts(); m != mapped || i != idle {
		t.Fatalf("%s: %d mapped, %d idle; want %d and %d", when, m, i, mapped, idle)
	}
}

func allZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

func fill(b []byte, v byte) {
	for i := range b {
		b[i] = v
	}
}

// TestMappedMemoryGrowsInPlace: a reservation of the maximum, grown by
// Reallocate at one address, zeroed, nil past the maximum and after Free,
// freed once.
func TestMappedMemoryGrowsInPlace(t *testing.T) {
	t.Parallel()
	a := newTestAllocator(t)
	lm := a.Allocate(2*page, 64*page)
	m, ok := lm.(*mappedMemory)
	if !ok {
		t.Fatalf("Allocate returned a %T, want a mapping", lm)
	}
	wantCounts(t, a, 1, 0, "allocated")
	buf := m.Reallocate(2 * page)
	if len(buf) != 2*page || cap(buf) != 2*page || !allZero(buf) {
		t.Fatalf("initial memory: len %d cap %d, zeroed %v", len(buf), cap(buf), allZero(buf))
	}
	base := unsafe.SliceData(buf)
	fill(buf, 0xa5)
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
		fill(grown[len(buf):], 0x5a)
		buf = grown
	}
	if full := m.Reallocate(64 * page); len(full) != 64*page || unsafe.SliceData(full) != base {
		t.Fatalf("Reallocate(max): len %d", len(full))
	}
	if past := m.Reallocate(64*page + 1); past != nil {
		t.Fatalf("Reallocate past the maximum returned %d bytes, want nil", len(past))
	}
	m.Free()
	wantCounts(t, a, 1, 1, "freed: kept for reuse")
	m.Free() // idempotent
	wantCounts(t, a, 1, 1, "freed twice")
	if b := m.Reallocate(page); b != nil {
		t.Fatal("Reallocate after Free returned memory")
	}
	a.close()
	wantCounts(t, a, 0, 0, "allocator closed")
}

// TestMappedMemoryReuse: a freed mapping serves the next Allocate of its
// size, zeroed wherever the last instance could write; a second Free by
// the first owner does not touch the second's; big memories, mappings past
// the idle cap and those freed after close are unmapped.
func TestMappedMemoryReuse(t *testing.T) {
	t.Parallel()
	a := newTestAllocator(t)
	m1 := a.Allocate(page, 64*page)
	b1 := m1.Reallocate(40 * page)
	base := unsafe.SliceData(b1)
	fill(b1, 0xee)
	m1.Free()
	m2 := a.Allocate(page, 64*page)
	b2 := m2.Reallocate(64 * page)
	if unsafe.SliceData(b2) != base {
		t.Fatal("the freed mapping was not reused")
	}
	if !allZero(b2) {
		t.Fatal("a reused mapping holds its last instance's bytes")
	}
	wantCounts(t, a, 1, 0, "reused")
	m1.Free() // the first owner again: must not end the second's lease
	if m2.Reallocate(page) == nil {
		t.Fatal("a second Free by the first owner ended the second owner's memory")
	}
	wantCounts(t, a, 1, 0, "first owner freed again")
	if other := a.Allocate(page, 32*page); unsafe.SliceData(other.Reallocate(page)) == base {
		t.Fatal("a mapping in use was handed out again")
	} else {
		other.Free()
	}
	m2.Free()
	wantCounts(t, a, 2, 2, "two sizes kept")

	// A memory that grew past maxRecycledMemory is unmapped, not zeroed.
	big := a.Allocate(page, 2*maxRecycledMemory)
	big.Reallocate(maxRecycledMemory + page)
	big.Free()
	wantCounts(t, a, 2, 2, "a big memory freed")

	// At most maxIdleMappings are kept.
	var ms []interface{ Free() }
	for range maxIdleMappings + 3 {
		m := a.Allocate(page, 8*page)
		m.Reallocate(page)[0] = 1
		ms = append(ms, m)
	}
	for _, m := range ms {
		m.Free()
	}
	if _, idle := a.counts(); idle != maxIdleMappings {
		t.Fatalf("%d idle mappings, want the cap %d", idle, maxIdleMappings)
	}
	a.close()
	wantCounts(t, a, 0, 0, "allocator closed")
	late := a.Allocate(page, 8*page)
	late.Free()
	wantCounts(t, a, 0, 0, "freed after close: unmapped")
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
	for range 500 {
		if m, _ := a.counts(); m == 0 {
			return
		}
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	wantCounts(t, a, 0, 0, "dropped memory, after GC")
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
	wantCounts(t, a, 0, 0, "fallback freed")
	if a.fallbacks.Load() != 1 {
		t.Fatalf("%d fallbacks, want 1", a.fallbacks.Load())
	}
	// A memory without a maximum to reserve (max 0) needs no mapping.
	a = newTestAllocator(t)
	if m := a.Allocate(0, 0); len(m.Reallocate(0)) != 0 || m.Reallocate(1) != nil {
		t.Fatal("a memory of maximum 0 grew")
	}
	wantCounts(t, a, 0, 0, "maximum 0")
}
