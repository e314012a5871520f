//go:build unix

package wasm

import "golang.org/x/sys/unix"

// mmapSupported: linear memory is mapped (memAllocator).
const mmapSupported = true

// mmapReserve maps n bytes (0 < n <= math.MaxInt: memAllocator.Allocate
// checks) of private anonymous memory, readable and writable. The kernel
// hands out zeroed pages and, on Linux with MAP_NORESERVE (mapNoReserve),
// commits a page only when it is first touched, so the reservation costs
// address space, not memory.
func mmapReserve(n uint64) ([]byte, error) {
	return unix.Mmap(-1, 0, int(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON|mapNoReserve)
}

// mmapRelease unmaps a reservation of mmapReserve.
func mmapRelease(b []byte) error { return unix.Munmap(b) }
