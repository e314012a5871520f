package storetest

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

// testWaitResolveRace (attack, branch breaker): many resolvers of one wait
// race each other and ExpireDueWaits on the wait's timeout. Exactly one of
// them closes the wait; every other resolver gets a *WaitClosedError
// (nothing else: no lock or serialization error leaks out), and the
// stream and the session get exactly one wait.resolved frame and one
// wait event.
func testWaitResolveRace(t *testing.T, b *bundle) {
	for round := range 3 {
		timeout := time.Duration(0)
		if round > 0 {
			timeout = time.Millisecond // due at once: the expiry races the resolvers
		}
		id := fmt.Sprintf("race-%d", round)
		key, _, _ := b.waitingSession(store.WaitParams{ID: id, Timeout: timeout})
		head := b.stream(key).Head
		const resolvers, expirers = 12, 4
		var mu sync.Mutex
		wins, expired := 0, 0
		var bad []string
		var wg sync.WaitGroup
		for i := range resolvers {
			wg.Go(func() {
				_, err := b.s.ResolveWait(b.ctx, store.ResolveWaitParams{Key: key, WaitID: id, Resolution: []byte(fmt.Sprintf(`{"by":%d}`, i))})
				mu.Lock()
				defer mu.Unlock()
				var wc *store.WaitClosedError
				switch {
				case err == nil:
					wins++
				case errors.As(err, &wc):
				default:
					bad = append(bad, err.Error())
				}
			})
		}
		for range expirers {
			wg.Go(func() {
				keys, err := b.s.ExpireDueWaits(b.ctx, 100)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					bad = append(bad, "expire: "+err.Error())
				}
				if slices.Contains(keys, key) {
					expired++
				}
			})
		}
		wg.Wait()
		if len(bad) > 0 {
			t.Fatalf("round %d: errors other than WaitClosedError: %q", round, bad)
		}
		if round == 0 && wins != 1 || wins+expired != 1 {
			t.Fatalf("round %d: %d resolutions and %d expiries succeeded, want exactly one", round, wins, expired)
		}
		pg := b.stream(key)
		wantGapFree(t, key, pg)
		wantEq(t, pg.Head, head+1, fmt.Sprintf("round %d: head after the race (one wait.resolved frame)", round))
		n := 0
		for _, e := range b.events(key) {
			if e.Kind == abi.EventWaitResolved || e.Kind == abi.EventWaitExpired {
				n++
			}
		}
		wantEq(t, n, 1, fmt.Sprintf("round %d: wait events", round))
	}
}
