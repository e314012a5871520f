package wasm

// ModuleClosed reports whether the wazero module of i is closed: its
// memory released.
func ModuleClosed(i *Instance) bool { return i.mod.IsClosed() }
