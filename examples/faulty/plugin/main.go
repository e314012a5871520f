// Command faulty-plugin is the faulty example agent served as a Paddock
// plugin worker, for failure tests of the plugin kind: "crash" kills the
// plugin process (a panic in a goroutine), "sleep <ms>" keeps a turn busy
// so that a test can kill the process mid-turn, "think <ms>" polls for
// steers.
//
//	go build -o bin/faulty-plugin ./examples/faulty/plugin
package main

import (
	"context"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/examples/faulty"
	"github.com/paddock-dev/paddock/plugins"
)

func main() {
	plugins.Serve(func(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
		// Turns of several sessions run concurrently in one plugin
		// process: each gets its own agent value polling its own turn.
		a := faulty.New()
		a.PollSteer = func() (abi.Steer, bool) { return plugins.PollSteer(ctx) }
		return a.Turn(ctx, req)
	})
}
