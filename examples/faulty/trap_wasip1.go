//go:build wasip1

package faulty

import "unsafe"

// trapSink receives the byte trapAt reads, so the load cannot be optimised
// away.
var trapSink byte

// trap loads from an address far beyond the linear memory: the wasm load
// instruction traps ("out of bounds memory access"). Go's own checks do not
// catch it, so no recover runs: this is a real trap, not a panic.
func trap() {
	trapAt(0xF000_0000)
}

//go:noinline
func trapAt(off uintptr) {
	trapSink = *(*byte)(unsafe.Add(unsafe.Pointer(&trapSink), off))
}
