//go:build !wasip1

package guest

import (
	"fmt"
	"os"

	"github.com/paddock-dev/paddock/abi"
)

// Handle does nothing outside GOOS=wasip1: there is no host to call f.
// It exists so that agent packages build and test on the developer machine.
func Handle(f abi.TurnFunc) {}

// PollSteer reports no steer outside GOOS=wasip1: there is no host to steer
// the turn. Agent logic that polls still runs its unsteered path in tests
// on the developer machine.
func PollSteer() (abi.Steer, bool) { return abi.Steer{}, false }

// Log writes "level: msg" to standard error outside GOOS=wasip1.
func Log(level Level, msg string) {
	fmt.Fprintf(os.Stderr, "%d: %s\n", level, msg)
}

// Logf formats its arguments like fmt.Sprintf and calls Log.
func Logf(level Level, format string, args ...any) {
	Log(level, fmt.Sprintf(format, args...))
}
