package host_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

// renewCounter counts, per activation, the leases RenewLeases was asked to
// renew.
type renewCounter struct {
	store.Store
	mu      sync.Mutex
	renewed map[string]int
}

func (c *renewCounter) RenewLeases(ctx context.Context, p store.RenewLeasesParams) ([]store.ActivationRef, error) {
	c.mu.Lock()
	if c.renewed == nil {
		c.renewed = map[string]int{}
	}
	for _, r := range p.Refs {
		c.renewed[r.ActorKey.SessionID]++
	}
	c.mu.Unlock()
	return c.Store.RenewLeases(ctx, p)
}

func (c *renewCounter) count(key store.ActorKey) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.renewed[key.SessionID]
}

// TestCommitsRenewTheLeaseOfABusyActivation: an activation that commits
// often has its lease renewed by its commits (CommitTurnParams.LeaseTTL)
// and is left out of the renewal rounds, while an idle live one is renewed
// at every round; neither loses its lease.
func TestCommitsRenewTheLeaseOfABusyActivation(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		rc := &renewCounter{Store: st}
		pol := testPolicy()
		pol.LeaseTTL = 1500 * time.Millisecond // a round every 500 ms
		pol.IdleTimeout = time.Minute
		f := start(t, rc, map[string]abi.TurnFunc{"o": oneTripFn(make(chan string))}, pol)
		ag := f.agent("o")
		busy, idle := f.session(ag), f.session(ag)
		f.signal(idle, "hello")
		f.waitFor("the idle session's turn", func() bool { return f.get(idle).TurnCount == 1 })
		// The busy session commits a turn every ~50 ms until the idle one
		// has been through several rounds.
		var n int64
		for rc.count(idle) < 6 {
			n++
			f.signal(busy, fmt.Sprintf("b%d", n))
			f.waitFor("the busy session's turn", func() bool { return f.get(busy).TurnCount == n })
			time.Sleep(50 * time.Millisecond)
		}
		if b, i := rc.count(busy), rc.count(idle); b >= i/2 {
			t.Errorf("the busy activation was renewed by %d rounds and the idle one by %d: want the busy one left out, its commits renewing it", b, i)
		}
		for _, key := range []store.ActorKey{busy, idle} {
			for _, e := range f.events(key) {
				if e.Status != store.EventDone || e.Attempts != 0 {
					t.Errorf("event %d is %s after %d failed attempts, want done after none (no lease lost)", e.ID, e.Status, e.Attempts)
				}
			}
		}
		// Both activations are still the ones claimed first: no lease was lost.
		for _, key := range []store.ActorKey{busy, idle} {
			cur, err := st.CurrentActivation(context.Background(), key)
			if err != nil {
				t.Fatal(err)
			}
			if cur.ActorEpoch != 1 || cur.State != store.ActivationActive {
				t.Errorf("session %s: activation at epoch %d, %s; want the first one, still active", key, cur.ActorEpoch, cur.State)
			}
		}
	})
}
