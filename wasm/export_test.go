package wasm

import (
	"errors"
	"unsafe"
)

// ModuleClosed reports whether the wazero module of i is closed: its
// memory released.
func ModuleClosed(i *Instance) bool { return i.mod.IsClosed() }

// MemoryMapped reports whether r maps its instances' linear memories
// (false where there is no mmap: wazero's default memory).
func MemoryMapped(r *Runtime) bool { return r.mem != nil }

// MemoryMappings returns the number of r's linear-memory mappings not yet
// unmapped (in use or kept for reuse) and how many of them are kept.
func MemoryMappings(r *Runtime) (mapped, idle int) {
	r.mem.mu.Lock()
	defer r.mem.mu.Unlock()
	return int(r.mem.mapped.Load()), len(r.mem.idle)
}

// IdleMemoriesZeroed reports whether every mapping r keeps for reuse is
// zero where an instance could have written it.
func IdleMemoriesZeroed(r *Runtime) bool {
	r.mem.mu.Lock()
	defer r.mem.mu.Unlock()
	for _, b := range r.mem.idle {
		for _, x := range b[:min(len(b), maxRecycledMemory)] {
			if x != 0 {
				return false
			}
		}
	}
	return true
}

// MemoryFallbacks returns the number of r's linear memories made on the Go
// heap because their reservation failed.
func MemoryFallbacks(r *Runtime) int64 { return r.mem.fallbacks.Load() }

// FailMemoryMappings makes every later reservation of r fail, as strict
// overcommit would. Call it before r instantiates anything.
func FailMemoryMappings(r *Runtime) {
	r.mem.reserve = func(uint64) ([]byte, error) { return nil, errors.New("mmap: cannot allocate memory (test)") }
}

// MemoryBase returns the address of the first byte of i's linear memory
// (i must be open and idle).
func MemoryBase(i *Instance) uintptr {
	b, _ := i.mod.Memory().Read(0, 1)
	return uintptr(unsafe.Pointer(unsafe.SliceData(b)))
}
