//go:build race

package wasm_test

// raceEnabled reports a -race build, where wazero's compiler is slow.
const raceEnabled = true
