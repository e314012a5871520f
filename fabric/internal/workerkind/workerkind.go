// Package workerkind maps a binding — what an agent runs: a wasm module
// digest "sha256:<64 hex>" or a plugin "plugin:<name>@<sha256>" — to the
// worker kind that runs it (abi/FABRIC.md, HELLO "kinds"). The broker
// (package fabric) and the worker (fabric/worker) share it.
package workerkind

import (
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/paddock-dev/paddock/plugins/pluginhost"
)

// Wasm is the kind a worker announces to run wasm module bindings.
// Plugin bindings are announced as themselves, "plugin:<name>@<sha256>".
const Wasm = "wasm"

// ErrBadBinding: a binding is neither a module digest "sha256:<64 hex>" nor
// "plugin:<name>@<sha256>" (fabric.ErrBadBinding).
var ErrBadBinding = errors.New("fabric: invalid binding")

// Of returns the worker kind that runs binding: Wasm for a module
// digest "sha256:<64 hex>", the binding itself for a plugin binding.
// Errors: ErrBadBinding (wrapped).
func Of(binding string) (string, error) {
	if _, _, ok := pluginhost.ParseBinding(binding); ok {
		return binding, nil
	}
	if hexPart, ok := strings.CutPrefix(binding, "sha256:"); ok && len(hexPart) == 64 {
		if _, err := hex.DecodeString(hexPart); err == nil && strings.ToLower(hexPart) == hexPart {
			return Wasm, nil
		}
	}
	return "", fmt.Errorf("%w: %q", ErrBadBinding, binding)
}
