//go:build !unix

package wasm

import "errors"

// mmapSupported: no mapping here; the Runtime keeps wazero's default
// linear memory (newMemAllocator returns nil).
const mmapSupported = false

func mmapReserve(uint64) ([]byte, error) { return nil, errors.New("wasm: no mmap on this platform") }

func mmapRelease([]byte) error { return nil }
