package wasm_test

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/wasm"
)

// TestCloseRacingTurn: Instance.Close from another goroutine, at any point
// of a Turn (before, during, as it ends), leaves the module closed — its
// memory released — and the turn succeeded, failed as cancelled, or found
// the instance closed.
func TestCloseRacingTurn(t *testing.T) {
	t.Parallel()
	b := setup(t, wasm.Config{})
	ctx := context.Background()
	ref := `{"delivery_id":"d","activation_uid":"a","actor_epoch":1,"actor_event_id":2,"revision":0,"agent_uid":"g","session_id":"s"}`
	info, err := b.rt.Validate(ctx, fixedGuest(1, []byte(`{"turn_ref":`+ref+`,"outcome":"sleep"}`)).bytes())
	if err != nil {
		t.Fatal(err)
	}
	req := request("hi", nil, 1)
	req.TurnRef = abi.TurnRef{DeliveryID: "d", ActivationUID: "a", ActorEpoch: 1, ActorEventID: 2, AgentUID: "g", SessionID: "s"}
	leaked := 0
	for n := range 3000 {
		inst, err := b.rt.Instantiate(ctx, info.Digest)
		if err != nil {
			t.Fatal(err)
		}
		start := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			<-start
			_, err := inst.Turn(ctx, req)
			var te *wasm.TurnError
			switch {
			case err == nil, errors.Is(err, wasm.ErrInstanceClosed) && !errors.As(err, &te):
			case errors.As(err, &te) && te.Kind == wasm.KindCanceled:
			default:
				t.Errorf("iteration %d: turn: %v", n, err)
			}
		})
		wg.Go(func() {
			<-start
			for range n % 200 {
				runtime.Gosched()
			}
			if err := inst.Close(ctx); err != nil {
				t.Errorf("iteration %d: close: %v", n, err)
			}
		})
		close(start)
		wg.Wait()
		if !wasm.ModuleClosed(inst) {
			leaked++
		}
	}
	if leaked > 0 {
		t.Errorf("%d of 3000 instances closed during a turn kept their module open", leaked)
	}
}
