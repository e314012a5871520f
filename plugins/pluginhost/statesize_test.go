package pluginhost_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/examples/faulty"
	"github.com/paddock-dev/paddock/plugins/pluginhost"
)

// TestMaximalStateRoundTripsThroughAPlugin: under the manager's default
// result cap, a plugin's state of exactly abi.MaxStateBytes comes back
// valid and, sent with the next request, reaches the plugin byte for byte;
// one byte more fails the turn as an invalid result naming the limit.
func TestMaximalStateRoundTripsThroughAPlugin(t *testing.T) {
	t.Parallel()
	m, _ := newManager(t, pluginhost.Options{})
	register(t, m, "agent", agentPkg, pluginhost.Config{})
	inst := instance(t, m, "agent")
	ctx := context.Background()

	res, err := inst.Turn(ctx, request(fmt.Sprintf("state %d", abi.MaxStateBytes), 1, nil))
	if err != nil {
		t.Fatalf("a state of exactly abi.MaxStateBytes: %v", err)
	}
	if res.Outcome != abi.OutcomeOK || len(res.State) != abi.MaxStateBytes {
		t.Fatalf("outcome %s (%s), state of %d bytes; want ok and %d", res.Outcome, res.Error, len(res.State), abi.MaxStateBytes)
	}
	next, err := inst.Turn(ctx, request("statesum", 2, res.State))
	if err != nil {
		t.Fatalf("the turn after a maximal state: %v", err)
	}
	want := faulty.StateSum(faulty.StateOf(abi.MaxStateBytes))
	if len(next.Messages) != 1 || next.Messages[0].Content != want {
		t.Fatalf("the plugin received %v, want %q", next.Messages, want)
	}

	_, err = inst.Turn(ctx, request(fmt.Sprintf("state %d", abi.MaxStateBytes+1), 3, nil))
	te := turnError(t, err, pluginhost.KindInvalidResult)
	if limit := fmt.Sprintf("state is %d bytes, limit %d", abi.MaxStateBytes+1, abi.MaxStateBytes); !strings.Contains(te.Error(), limit) {
		t.Errorf("error %q does not name the state limit (%q)", te.Error(), limit)
	}
}
