package host

import (
	"context"
	"testing"
	"time"
)

// isClosed reports whether ch is closed now.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// TestPoolIdleHoldersYieldOncePerWaiter checks the yield accounting behind
// docs/DESIGN.md invariant 11: a queued waiter closes the contention channel, one
// idle holder (not two) wins the yield, and its release hands the slot to
// the waiter.
func TestPoolIdleHoldersYieldOncePerWaiter(t *testing.T) {
	p := newPool(2)
	for i := range 2 {
		if !p.tryAcquire() {
			t.Fatalf("free slot %d of 2 not acquired", i+1)
		}
	}
	idle := p.contended()
	if isClosed(idle) {
		t.Fatal("contended with nobody waiting")
	}
	if p.claimYield() {
		t.Fatal("a yield claimed with nobody waiting")
	}
	got := make(chan error, 1)
	go func() { got <- p.acquire(context.Background()) }()
	select {
	case <-idle:
	case <-time.After(time.Minute):
		t.Fatal("a queued waiter did not close the contention channel")
	}
	if !p.claimYield() {
		t.Fatal("the first idle holder could not claim the yield")
	}
	if p.claimYield() {
		t.Fatal("a second idle holder claimed a yield for the same waiter")
	}
	if isClosed(p.contended()) {
		t.Fatal("still contended once the waiter has a yield promised")
	}
	p.release(true)
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("acquire: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the waiter did not get the yielded slot")
	}
	if used, capacity, waiting := p.stats(); used != 2 || capacity != 2 || waiting != 0 || p.yielding != 0 {
		t.Fatalf("after the yield: used %d of %d, %d waiting, %d yielding", used, capacity, waiting, p.yielding)
	}
}
