// Command garbage is a test plugin that prints to stdout before serving,
// corrupting the go-plugin handshake.
package main

import (
	"context"
	"fmt"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/plugins"
)

func main() {
	fmt.Println("hello from a plugin that should not print here")
	plugins.Serve(func(context.Context, *abi.TurnRequest) (*abi.TurnResult, error) {
		return &abi.TurnResult{}, nil
	})
}
