package wasm

import "golang.org/x/sys/unix"

// mapNoReserve reserves linear memory without charging it to the commit
// limit up front (in the default heuristic overcommit mode; strict mode,
// vm.overcommit_memory=2, ignores it).
const mapNoReserve = unix.MAP_NORESERVE
