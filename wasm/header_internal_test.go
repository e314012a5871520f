package wasm

import "testing"

// FuzzReadHeader: the header reader never panics, whatever follows a valid
// preamble.
func FuzzReadHeader(f *testing.F) {
	f.Add([]byte{1, 4, 1, 0x60, 0, 0})
	f.Add([]byte{2, 7, 1, 1, 'e', 1, 'f', 0, 0})
	f.Add([]byte{7, 5, 1, 1, 'x', 0, 9})
	f.Add([]byte{1, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, rest []byte) {
		_, _ = readHeader(append([]byte("\x00asm\x01\x00\x00\x00"), rest...))
	})
}
