package wasm

import (
	"context"
	"log/slog"
	"math"
	"runtime"
	"sync/atomic"

	"github.com/tetratelabs/wazero/experimental"
)

// memAllocator gives every instance of a Runtime its linear memory: a
// reservation of the memory's maximum (Config.MemoryLimitPages, or the
// module's smaller declared maximum) in one anonymous private mapping,
// zeroed by the kernel and committed page by page as the guest touches it,
// so that memory.grow only lengthens a slice of it and never copies (the
// package doc, "Why linear memory is mapped"). A reservation that cannot be
// made falls back to a Go slice that grows as wazero's default does: the
// allocator never fails an instance.
//
// Every reservation is unmapped exactly once: by wazero, which calls Free
// when it closes the module (Instance.Close, a failed turn, a failed
// _initialize, Runtime.Close); or by a cleanup when wazero drops a memory
// without closing its module, which it does when instantiation fails after
// the memory was made (a data segment out of bounds, a start function that
// traps or times out). Nothing reuses a mapping, so a guest never sees
// another's bytes.
//
// It is nil on platforms without mmap (memory_other.go): the Runtime then
// leaves wazero's default allocator in place.
type memAllocator struct {
	log *slog.Logger
	// reserve maps n bytes of zeroed, private, read-write memory and
	// release unmaps them (mmapReserve, mmapRelease; tests replace them
	// before the Runtime instantiates anything).
	reserve func(n uint64) ([]byte, error)
	release func(b []byte) error

	// live counts the reservations mapped and not yet unmapped, fallbacks
	// the memories made on the Go heap because a reservation failed; both
	// for tests (export_test.go).
	live      atomic.Int64
	fallbacks atomic.Int64
	warned    atomic.Bool
}

// newMemAllocator returns the allocator of a Runtime, or nil where linear
// memory cannot be mapped.
func newMemAllocator(log *slog.Logger) *memAllocator {
	if !mmapSupported {
		return nil
	}
	return &memAllocator{log: log, reserve: mmapReserve, release: mmapRelease}
}

// Allocate implements experimental.MemoryAllocator: wazero calls it once
// per instance, with the memory's initial capacity and maximum in bytes
// (the maximum is already capped at Config.MemoryLimitPages).
func (a *memAllocator) Allocate(capacity, maxBytes uint64) experimental.LinearMemory {
	if maxBytes == 0 || maxBytes > math.MaxInt {
		return newHeapMemory(capacity, maxBytes)
	}
	b, err := a.reserve(maxBytes)
	if err != nil {
		// Strict overcommit (vm.overcommit_memory=2 ignores MAP_NORESERVE
		// and charges the whole reservation), an address-space limit or
		// vm.max_map_count: the instance still runs, on the Go heap.
		a.fallbacks.Add(1)
		if !a.warned.Swap(true) {
			a.log.LogAttrs(context.Background(), slog.LevelWarn,
				"wasm: cannot map linear memory, instances grow it on the Go heap",
				slog.Uint64("bytes", maxBytes), slog.String("error", err.Error()))
		}
		return newHeapMemory(capacity, maxBytes)
	}
	a.live.Add(1)
	r := &reservation{a: a, mem: b}
	m := &mappedMemory{r: r}
	// The net for a memory wazero drops without Free (see the type's
	// doc): the reservation is unmapped when m is unreachable. r does not
	// point to m, so m can become unreachable.
	m.cleanup = runtime.AddCleanup(m, (*reservation).unmap, r)
	return m
}

// reservation is one mapping. It is shared by its mappedMemory and that
// memory's cleanup, and does not point back to the memory.
type reservation struct {
	a     *memAllocator
	mem   []byte // the whole mapping: len and cap are the memory's maximum
	freed atomic.Bool
}

// unmap releases the mapping, once.
func (r *reservation) unmap() {
	if r.freed.Swap(true) {
		return
	}
	if err := r.a.release(r.mem); err != nil {
		// munmap fails only for a range that is not a mapping, which
		// this one is: the mapping stays counted as live.
		r.a.log.LogAttrs(context.Background(), slog.LevelError, "wasm: unmap linear memory",
			slog.Int("bytes", len(r.mem)), slog.String("error", err.Error()))
		return
	}
	r.a.live.Add(-1)
}

// mappedMemory is an experimental.LinearMemory backed by a reservation.
//
// Free unmaps the memory; touching it after that faults, and the Go
// runtime cannot recover from such a fault. Nothing touches it: wazero
// calls Free only when it closes the module (ensureResourcesClosed in
// internal/wasm/module_instance.go, v1.12.0), and a closed module runs no
// more code — calls on it fail before entering the guest
// (FailIfClosed), and the WASI proc_exit that closes a module from inside
// a guest call unwinds that call with a panic that never returns to guest
// code. wazero keeps the memory's slice header after Free (MemoryInstance
// .Buffer), but only Size, which reads its length, may be used on a closed
// module, and that is all Instance.MemoryBytes does. On Paddock's side,
// the host functions touch memory only inside guest calls, Instance.Close
// during a turn leaves the closing to the turn once the guest returned,
// and Runtime.Close waits for the guest calls in flight (Runtime.enter)
// before wazero closes the modules.
type mappedMemory struct {
	r       *reservation
	cleanup runtime.Cleanup
}

// Reallocate implements experimental.LinearMemory: the first size bytes of
// the mapping, always at the same address; nil past the maximum (wazero's
// memory.grow then answers -1) or after Free. Its capacity is its length,
// so no slice of it reaches past the guest's memory.
func (m *mappedMemory) Reallocate(size uint64) []byte {
	if size > uint64(len(m.r.mem)) || m.r.freed.Load() {
		return nil
	}
	return m.r.mem[:size:size]
}

// Free implements experimental.LinearMemory: it unmaps the memory (once;
// later calls do nothing).
func (m *mappedMemory) Free() {
	m.cleanup.Stop()
	m.r.unmap()
}

// heapMemory is the fallback LinearMemory: a Go slice grown by append,
// like wazero's default memory (which copies on growth).
type heapMemory struct {
	buf []byte
	max uint64
}

func newHeapMemory(capacity, maxBytes uint64) *heapMemory {
	return &heapMemory{buf: make([]byte, 0, min(capacity, maxBytes)), max: maxBytes}
}

// Reallocate implements experimental.LinearMemory; nil past the maximum.
// wazero only ever grows a memory, and both make and append zero what
// they add.
func (h *heapMemory) Reallocate(size uint64) []byte {
	switch {
	case size > h.max:
		return nil
	case size <= uint64(cap(h.buf)):
		h.buf = h.buf[:size]
	default:
		h.buf = append(h.buf, make([]byte, size-uint64(len(h.buf)))...)
	}
	return h.buf
}

// Free implements experimental.LinearMemory: the garbage collector frees
// the slice.
func (h *heapMemory) Free() { h.buf = nil }
