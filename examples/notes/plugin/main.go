// Command notes-plugin is the notes example agent served as a Paddock
// plugin worker (hashicorp/go-plugin over gRPC). It runs the same logic
// as the wasm module built from ../cmd — package notes — so both behave
// identically:
//
//	go build -o bin/notes-plugin ./examples/notes/plugin
//
// Register the binary with its sha256 (sha256sum bin/notes-plugin) and
// bind an agent to it; run by hand it only explains that it is a plugin.
package main

import (
	"github.com/paddock-dev/paddock/examples/notes"
	"github.com/paddock-dev/paddock/plugins"
)

func main() { plugins.Serve(notes.Turn) }
