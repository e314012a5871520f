//go:build wasip1

// Command notes is the notes example agent as a wasm reactor module:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o examples/notes/notes.wasm ./examples/notes/cmd
package main

import (
	"github.com/paddock-dev/paddock/examples/notes"
	"github.com/paddock-dev/paddock/wasm/guest"
)

func init() { guest.Handle(notes.Turn) }

func main() {}
