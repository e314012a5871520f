// Command hasher-plugin is the benchmark agent served as a Paddock plugin
// worker (go build -o bin/hasher-plugin ./examples/hasher/plugin).
package main

import (
	"github.com/paddock-dev/paddock/examples/hasher"
	"github.com/paddock-dev/paddock/plugins"
)

func main() {
	var a hasher.Agent
	plugins.Serve(a.Turn)
}
