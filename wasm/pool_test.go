package wasm_test

import (
	"context"
	"testing"

	"github.com/paddock-dev/paddock/wasm"
)

// TestPoolReusesHealthyInstancesAndDropsFailedOnes: a returned instance is
// the next one handed out; one that failed its turn never comes back; the
// idle cap closes the surplus; Close closes the idle ones.
func TestPoolReusesHealthyInstancesAndDropsFailedOnes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, wasm.Config{})
	faulty := b.faulty(t)
	p := wasm.NewPool(b.rt, 2)

	first, err := p.Get(ctx, faulty)
	if err != nil {
		t.Fatal(err)
	}
	if got := reply(t)(first.Turn(ctx, request("one", nil, 1))); got != "ok: one" {
		t.Fatalf("reply %q", got)
	}
	p.Put(first)
	if p.Idle(faulty) != 1 {
		t.Fatalf("idle = %d after a healthy Put, want 1", p.Idle(faulty))
	}
	again, err := p.Get(ctx, faulty)
	if err != nil {
		t.Fatal(err)
	}
	if again != first || again.Turns() != 1 {
		t.Fatalf("Get after Put returned another instance (%p, %d turns), want the pooled %p", again, again.Turns(), first)
	}

	// A trap closes the instance; Put must not keep it.
	_, err = again.Turn(ctx, request("trap", nil, 1))
	turnError(t, err, wasm.KindTrap)
	p.Put(again)
	if p.Idle(faulty) != 0 {
		t.Fatalf("a failed instance went back to the pool (idle %d)", p.Idle(faulty))
	}

	// The idle cap: three returned, two kept, the third closed.
	var insts []*wasm.Instance
	for range 3 {
		inst, err := p.Get(ctx, faulty)
		if err != nil {
			t.Fatal(err)
		}
		insts = append(insts, inst)
	}
	for _, inst := range insts {
		p.Put(inst)
	}
	if p.Idle(faulty) != 2 || !insts[2].Closed() || insts[0].Closed() {
		t.Fatalf("idle %d, third closed %v, first closed %v: want 2 kept and the surplus closed", p.Idle(faulty), insts[2].Closed(), insts[0].Closed())
	}
	p.Close(ctx)
	if !insts[0].Closed() || !insts[1].Closed() || p.Idle(faulty) != 0 {
		t.Fatal("Close left idle instances open")
	}
}
