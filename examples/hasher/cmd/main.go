//go:build wasip1

// Command hasher is the benchmark agent as a wasm reactor module:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o examples/hasher/hasher.wasm ./examples/hasher/cmd
package main

import (
	"github.com/paddock-dev/paddock/examples/hasher"
	"github.com/paddock-dev/paddock/wasm/guest"
)

func init() {
	var a hasher.Agent
	guest.Handle(a.Turn)
}

func main() {}
