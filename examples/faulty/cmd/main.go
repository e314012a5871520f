//go:build wasip1

// Command faulty is the faulty example agent as a wasm reactor module:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o examples/faulty/faulty.wasm ./examples/faulty/cmd
package main

import (
	"github.com/paddock-dev/paddock/examples/faulty"
	"github.com/paddock-dev/paddock/wasm/guest"
)

func init() { guest.Handle(faulty.New().Turn) }

func main() {}
