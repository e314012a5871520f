package fabric

import (
	"fmt"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/examples/faulty"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// TestMaximalStateRoundTripsThroughARemoteWorker: a remote worker with
// its default configuration returns a state of exactly abi.MaxStateBytes
// intact, and the next request carrying it reaches the agent byte for
// byte; one byte more fails the turn with an error naming the limit.
func TestMaximalStateRoundTripsThroughARemoteWorker(t *testing.T) {
	e := newEnv(t)
	digest := e.module(wasmtest.Faulty)
	e.startWorker("w1")

	req := e.request("big-state", fmt.Sprintf("state %d", abi.MaxStateBytes))
	res, err := e.turn(digest, req)
	if err != nil {
		t.Fatalf("a state of exactly abi.MaxStateBytes: %v", err)
	}
	if res.Outcome != abi.OutcomeOK || len(res.State) != abi.MaxStateBytes {
		t.Fatalf("outcome %s (%s), state of %d bytes; want ok and %d", res.Outcome, res.Error, len(res.State), abi.MaxStateBytes)
	}
	next := e.request("big-state", "statesum")
	next.State = res.State
	if got, want := e.mustReply("p", digest, next), faulty.StateSum(faulty.StateOf(abi.MaxStateBytes)); got != want {
		t.Fatalf("the worker's agent received %q, want %q", got, want)
	}

	_, err = e.turn(digest, e.request("big-state", fmt.Sprintf("state %d", abi.MaxStateBytes+1)))
	te := turnError(t, err)
	if limit := fmt.Sprintf("state is %d bytes, limit %d", abi.MaxStateBytes+1, abi.MaxStateBytes); !strings.Contains(te.Error(), limit) {
		t.Errorf("error %q (kind %s) does not name the state limit (%q)", te.Error(), te.Kind, limit)
	}
}
