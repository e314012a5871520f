//go:build wasip1

// Command chat is the chat example agent as a wasm reactor module:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o examples/chat/chat.wasm ./examples/chat/cmd
package main

import (
	"github.com/paddock-dev/paddock/examples/chat"
	"github.com/paddock-dev/paddock/wasm/guest"
)

func init() { guest.Handle(chat.Turn) }

func main() {}
