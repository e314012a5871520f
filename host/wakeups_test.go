package host_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/store/pgtest"
	"github.com/paddock-dev/paddock/store/postgres"
	"github.com/paddock-dev/paddock/store/sqlite"
)

// TestWakeupsAloneRunEverySignal: with the safety-net scan out of the way
// (an hour), wake-ups alone run every signal, whether appended through the
// host's store and reported with Appended (its in-process wake-up and the
// echo of its notification: one of them wakes, the other is dropped),
// appended through that store unreported (the echo alone), or — on
// PostgreSQL — appended by another Store value on the same database, as
// another host would (its notification). On both drivers, one of each
// reported append's two wake-ups is counted as dropped (SQLite's
// in-process wake-up is an echo too).
func TestWakeupsAloneRunEverySignal(t *testing.T) {
	t.Parallel()
	open := map[string]func(t *testing.T) (st, other store.Store){
		"sqlite": func(t *testing.T) (store.Store, store.Store) {
			st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "paddock.db"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			return st, nil
		},
		"postgres": func(t *testing.T) (store.Store, store.Store) {
			dsn := pgtest.DSN(t)
			var stores [2]store.Store
			for i := range stores {
				st, err := postgres.Open(context.Background(), dsn)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { st.Close() })
				stores[i] = st
			}
			return stores[0], stores[1]
		},
	}
	for name, open := range open {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			st, other := open(t)
			pol := testPolicy()
			pol.ScanInterval = time.Hour
			f := start(t, st, map[string]abi.TurnFunc{"counter": counter}, pol)
			a := f.agent("counter")
			keys := []store.ActorKey{f.session(a), f.session(a), f.session(a)}
			want := map[store.ActorKey]int64{}
			reported := 0
			send := func(via store.Store, key store.ActorKey, report bool, msg string) {
				t.Helper()
				payload, _ := json.Marshal(map[string]string{"message": msg})
				e, created, err := via.AppendEvent(context.Background(), store.AppendEventParams{Key: key, Kind: abi.EventMessage, Payload: payload})
				if err != nil || !created {
					t.Fatalf("append %q: created %v, %v", msg, created, err)
				}
				want[key]++
				if report {
					f.h.Appended(e)
					reported++
				}
			}
			settle := func() {
				t.Helper()
				for _, k := range keys {
					f.waitFor(fmt.Sprintf("%d turns of %s", want[k], k), func() bool { return f.get(k).TurnCount == want[k] })
				}
			}
			// A first turn, run by the host's first scan or by a wake-up:
			// either way its subscription is registered, so every later
			// append's notification reaches it.
			first := f.session(a)
			send(st, first, false, "first")
			f.waitFor("the first turn", func() bool { return f.get(first).TurnCount == 1 })
			// Each way on its own, so that no other wake-up covers it: a
			// burst (turns queue behind each other), then each session idle
			// or its controller gone before the next.
			for round := range 3 {
				for _, way := range []string{"reported", "unreported", "other store"} {
					if way == "other store" && other == nil {
						continue
					}
					for i := range 3 {
						for _, k := range keys {
							msg := fmt.Sprintf("%s %d-%d", way, round, i)
							switch way {
							case "reported":
								send(st, k, true, msg)
							case "unreported":
								send(st, k, false, msg)
							default:
								send(other, k, false, msg)
							}
						}
					}
					settle()
				}
			}
			dropped := func() int { return int(testutil.ToFloat64(f.h.Metrics().WakeupsDeduplicated)) }
			f.waitFor(fmt.Sprintf("%d wake-ups dropped", reported), func() bool { return dropped() == reported })
		})
	}
}
