package wasm

import (
	"context"
	"log/slog"
	"math"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/tetratelabs/wazero/experimental"
)

// Reuse of mappings (memAllocator): how many zeroed mappings a Runtime
// keeps for its next instances, and the most of a mapping's bytes it zeroes
// to keep one (a memory that grew larger is unmapped instead).
const (
	maxIdleMappings   = 8
	maxRecycledMemory = 16 << 20
)

// memAllocator gives every instance of a Runtime its linear memory: a
// reservation of the memory's maximum (Config.MemoryLimitPages, or the
// module's smaller declared maximum) in one anonymous private mapping,
// zeroed by the kernel and backed page by page as the guest touches it,
// so that memory.grow only lengthens a slice of it and never copies (the
// package doc, "Why linear memory is mapped"). A reservation that cannot be
// made falls back to a Go slice that grows as wazero's default does: the
// allocator never fails an instance.
//
// A closed instance's mapping is kept for the next instance if it is
// small enough (maxRecycledMemory) and fewer than maxIdleMappings wait:
// every byte the closed instance could reach is zeroed first, so a guest
// never sees another's bytes, and the next instance touches pages that are
// already there (a fresh mapping costs a page fault per page its guest
// touches, which instantiation does for megabytes). Other mappings are
// unmapped, exactly once: by wazero, which calls Free when it closes the
// module (Instance.Close, a failed turn, a failed _initialize,
// Runtime.Close); or by a cleanup when wazero drops a memory without
// closing its module, which it does when instantiation fails after the
// memory was made (a data segment out of bounds, a start function that
// traps or times out). Runtime.Close unmaps the idle mappings (close).
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

	mu     sync.Mutex
	idle   [][]byte // zeroed mappings for the next Allocate, at most maxIdleMappings
	closed bool     // close was called: nothing is kept any more

	// mapped counts the mappings not yet unmapped (in use or idle),
	// fallbacks the memories made on the Go heap because a reservation
	// failed; both for tests (export_test.go).
	mapped    atomic.Int64
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
	b := a.takeIdle(maxBytes)
	if b == nil {
		var err error
		if b, err = a.reserve(maxBytes); err != nil {
			// Strict overcommit (vm.overcommit_memory=2 ignores
			// MAP_NORESERVE and charges the whole reservation), an
			// address-space limit or vm.max_map_count: the instance
			// still runs, on the Go heap.
			a.fallbacks.Add(1)
			if !a.warned.Swap(true) {
				a.log.LogAttrs(context.Background(), slog.LevelWarn,
					"wasm: cannot map linear memory, instances grow it on the Go heap",
					slog.Uint64("bytes", maxBytes), slog.String("error", err.Error()))
			}
			return newHeapMemory(capacity, maxBytes)
		}
		a.mapped.Add(1)
	}
	l := &lease{a: a, mem: b}
	m := &mappedMemory{l: l}
	// The net for a memory wazero drops without Free (see the type's
	// doc): the mapping is unmapped when m is unreachable. l does not
	// point to m, so m can become unreachable.
	m.cleanup = runtime.AddCleanup(m, (*lease).unmap, l)
	return m
}

// takeIdle returns a kept mapping of n bytes, or nil.
func (a *memAllocator) takeIdle(n uint64) []byte {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i, b := range a.idle {
		if uint64(len(b)) == n {
			last := len(a.idle) - 1
			a.idle[i], a.idle[last] = a.idle[last], nil
			a.idle = a.idle[:last]
			return b
		}
	}
	return nil
}

// recycle keeps the mapping b, whose first used bytes an instance may have
// written, for a later Allocate, zeroing those bytes first; it reports
// false when b is not kept (the caller unmaps it).
func (a *memAllocator) recycle(b []byte, used uint64) bool {
	if used > maxRecycledMemory || !a.hasRoom() {
		return false
	}
	// Pages past used were never handed to the guest (nor to the host
	// through api.Memory): they are still as the kernel zeroed them.
	clear(b[:used])
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed || len(a.idle) >= maxIdleMappings {
		return false
	}
	a.idle = append(a.idle, b)
	return true
}

func (a *memAllocator) hasRoom() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return !a.closed && len(a.idle) < maxIdleMappings
}

// unmapMapping unmaps b, which is no instance's any more.
func (a *memAllocator) unmapMapping(b []byte) {
	if err := a.release(b); err != nil {
		// munmap fails only for a range that is not a mapping, which
		// this one is: the mapping stays counted.
		a.log.LogAttrs(context.Background(), slog.LevelError, "wasm: unmap linear memory",
			slog.Int("bytes", len(b)), slog.String("error", err.Error()))
		return
	}
	a.mapped.Add(-1)
}

// close unmaps the idle mappings and keeps none from now on: Runtime.Close
// calls it before wazero closes the modules (whose memories are then
// unmapped as they are freed).
func (a *memAllocator) close() {
	a.mu.Lock()
	idle := a.idle
	a.idle, a.closed = nil, true
	a.mu.Unlock()
	for _, b := range idle {
		a.unmapMapping(b)
	}
}

// lease is one instance's use of a mapping. It is shared by its
// mappedMemory and that memory's cleanup, and does not point back to the
// memory.
type lease struct {
	a    *memAllocator
	mem  []byte        // the whole mapping: len and cap are the memory's maximum
	used atomic.Uint64 // the most Reallocate handed out
	done atomic.Bool   // the lease ended: mem is no longer this instance's
}

// end ends the lease, once: the mapping is kept for another instance if
// recycle and the allocator takes it, else unmapped.
func (l *lease) end(recycle bool) {
	if l.done.Swap(true) {
		return
	}
	if recycle && l.a.recycle(l.mem, l.used.Load()) {
		return
	}
	l.a.unmapMapping(l.mem)
}

// unmap is the cleanup of a memory wazero dropped without Free.
func (l *lease) unmap() { l.end(false) }

// mappedMemory is an experimental.LinearMemory backed by a mapping.
//
// Free hands the mapping to another instance or unmaps it. Either way the
// closed module must never touch it again: an unmapped page faults, and
// the Go runtime cannot recover from that; a kept one would be another
// guest's memory. Nothing touches it: wazero calls Free only when it
// closes the module (ensureResourcesClosed in
// internal/wasm/module_instance.go, v1.12.0), and a closed module runs no
// more code — calls on it fail before entering the guest (FailIfClosed),
// and the WASI proc_exit that closes a module from inside a guest call
// unwinds that call with a panic that never returns to guest code. wazero
// keeps the memory's slice header after Free (MemoryInstance.Buffer), but
// only Size, which reads its length, may be used on a closed module, and
// that is all Instance.MemoryBytes does. On Paddock's side, the host
// functions touch memory only inside guest calls, Instance.Close during a
// turn leaves the closing to the turn once the guest returned, and
// Runtime.Close waits for the guest calls in flight (Runtime.enter) before
// wazero closes the modules.
type mappedMemory struct {
	l       *lease
	cleanup runtime.Cleanup
}

// Reallocate implements experimental.LinearMemory: the first size bytes of
// the mapping, always at the same address; nil past the maximum (wazero's
// memory.grow then answers -1) or after Free. Its capacity is its length,
// so no slice of it reaches past the guest's memory.
func (m *mappedMemory) Reallocate(size uint64) []byte {
	l := m.l
	if size > uint64(len(l.mem)) || l.done.Load() {
		return nil
	}
	if size > l.used.Load() {
		l.used.Store(size) // wazero grows a memory from one goroutine at a time
	}
	return l.mem[:size:size]
}

// Free implements experimental.LinearMemory: the mapping goes to a later
// instance, zeroed, or is unmapped (once; later calls do nothing).
func (m *mappedMemory) Free() {
	m.cleanup.Stop()
	m.l.end(true)
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
