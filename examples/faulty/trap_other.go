//go:build !wasip1

package faulty

// trap has no wasm trap to execute outside wasip1; it panics instead.
func trap() {
	panic("faulty: trap requested")
}
