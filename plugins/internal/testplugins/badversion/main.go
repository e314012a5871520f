// Command badversion is a test plugin built against another ABI major
// version (abi.Version+1): hosts must refuse it at start.
package main

import (
	"context"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/plugins/internal/wire"
)

func main() {
	wire.Serve(func(context.Context, *abi.TurnRequest) (*abi.TurnResult, error) {
		return &abi.TurnResult{}, nil
	}, abi.Version+1)
}
