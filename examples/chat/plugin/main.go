// Command chat-plugin is the chat example agent served as a Paddock plugin
// worker. It runs the same logic as the wasm module built from ../cmd —
// package chat — and makes its model and HTTP calls through the host the
// same way:
//
//	go build -o bin/chat-plugin ./examples/chat/plugin
package main

import (
	"github.com/paddock-dev/paddock/examples/chat"
	"github.com/paddock-dev/paddock/plugins"
)

func main() { plugins.Serve(chat.Turn) }
