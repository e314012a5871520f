// Command silent is a test plugin that never answers the go-plugin
// handshake.
package main

import (
	"fmt"
	"os"
	"time"
)

func main() {
	fmt.Fprintln(os.Stderr, "silent: not answering the handshake")
	time.Sleep(time.Hour)
}
