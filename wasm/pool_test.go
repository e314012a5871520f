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

	first, err := p.Get(ctx, "k", faulty)
	if err != nil {
		t.Fatal(err)
	}
	if got := reply(t)(first.Turn(ctx, request("one", nil, 1))); got != "ok: one" {
		t.Fatalf("reply %q", got)
	}
	p.Put("k", first)
	if p.Idle("k") != 1 {
		t.Fatalf("idle = %d after a healthy Put, want 1", p.Idle("k"))
	}
	again, err := p.Get(ctx, "k", faulty)
	if err != nil {
		t.Fatal(err)
	}
	if again != first || again.Turns() != 1 {
		t.Fatalf("Get after Put returned another instance (%p, %d turns), want the pooled %p", again, again.Turns(), first)
	}

	// A trap closes the instance; Put must not keep it.
	_, err = again.Turn(ctx, request("trap", nil, 1))
	turnError(t, err, wasm.KindTrap)
	p.Put("k", again)
	if p.Idle("k") != 0 {
		t.Fatalf("a failed instance went back to the pool (idle %d)", p.Idle("k"))
	}

	// The idle cap: three returned, two kept, the third closed.
	var insts []*wasm.Instance
	for range 3 {
		inst, err := p.Get(ctx, "k", faulty)
		if err != nil {
			t.Fatal(err)
		}
		insts = append(insts, inst)
	}
	for _, inst := range insts {
		p.Put("k", inst)
	}
	if p.Idle("k") != 2 || !insts[2].Closed() || insts[0].Closed() {
		t.Fatalf("idle %d, third closed %v, first closed %v: want 2 kept and the surplus closed", p.Idle("k"), insts[2].Closed(), insts[0].Closed())
	}
	// Another key never gets them.
	other, err := p.Get(ctx, "other", faulty)
	if err != nil {
		t.Fatal(err)
	}
	if other == insts[0] || other == insts[1] || other.Turns() != 0 {
		t.Fatal("an instance kept under one key was handed out under another")
	}
	p.Put("other", other)
	p.Close(ctx)
	if !insts[0].Closed() || !insts[1].Closed() || p.Idle("k") != 0 {
		t.Fatal("Close left idle instances open")
	}
}
