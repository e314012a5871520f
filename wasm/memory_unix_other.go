//go:build unix && !linux

package wasm

// mapNoReserve is Linux's MAP_NORESERVE; other systems commit anonymous
// pages when they are touched without it.
const mapNoReserve = 0
