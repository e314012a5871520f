package host_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/store"
)

// placedRunner is a funcRunner whose pools run only while can is set, as a
// remote pool runs only while its worker is connected (host.Placer).
type placedRunner struct {
	funcRunner
	can *atomic.Bool
}

func (r placedRunner) CanRun(context.Context, store.Agent, string) bool { return r.can.Load() }

// placedHost starts a host over st whose runner can run turns only while
// the returned flag is set; commits counts the turns it committed.
func placedHost(t *testing.T, st store.Store) (h *host.Host, can *atomic.Bool, commits *atomic.Int64) {
	t.Helper()
	can, commits = &atomic.Bool{}, &atomic.Int64{}
	h, err := host.New(host.Options{
		Store: st, Runner: placedRunner{funcRunner{map[string]abi.TurnFunc{"counter": counter}}, can}, Policy: testPolicy(),
		Logger: quietLogger(), OnCommit: func(store.Turn) { commits.Add(1) },
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("host.Run: %v", err)
		}
	})
	return h, can, commits
}

// Two hosts on one store: a session is claimed only by a host whose runner
// can run its pool now; a host that cannot leaves it alone (no claim, no
// attempt), however it was woken, and Rescan starts waiting work at once
// when the host becomes able to run it.
func TestSessionRunsOnlyWhereItsPoolCanRun(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		a, canA, commitsA := placedHost(t, st)
		b, canB, commitsB := placedHost(t, st)
		f := &fixture{t: t, st: st, h: a}
		key := f.session(f.agent("counter"))

		// Nobody can run it: signalled through a, it waits, unclaimed.
		f.signal(key, "one")
		b.Ensure(key)
		time.Sleep(500 * time.Millisecond) // ten scans of each host
		if s := f.get(key); s.ActorEpoch != 0 {
			t.Fatalf("claimed %d times while no host could run the pool, want never", s.ActorEpoch)
		}
		if e := f.events(key)[0]; e.Status != store.EventOpen || e.Attempts != 0 {
			t.Fatalf("event %+v, want open with no attempt", e)
		}

		// b can now (its worker came): it runs the waiting event; signals
		// through a keep running on b.
		canB.Store(true)
		b.Rescan()
		f.waitFor("the waiting event to run on b", func() bool { return f.get(key).TurnCount == 1 })
		for _, m := range []string{"two", "three"} {
			f.signal(key, m)
		}
		// (OnCommit runs just after the commit is visible: wait for both.)
		f.waitFor("three turns", func() bool { return f.get(key).TurnCount == 3 && commitsA.Load()+commitsB.Load() == 3 })
		if commitsA.Load() != 0 || commitsB.Load() != 3 {
			t.Errorf("commits: a %d, b %d; want 0 and 3", commitsA.Load(), commitsB.Load())
		}

		// b's worker leaves and a's comes: the next signal, through b, runs
		// on a, and no attempt is lost on the way.
		canB.Store(false)
		// (A turn b's activation took just before the flag flipped may
		// still run on b, as a real one would fail no_worker; wait until b
		// let go of the session.)
		f.waitFor("b to let go of the session", func() bool { return b.Controllers() == 0 })
		canA.Store(true)
		f.h = b
		f.signal(key, "four")
		f.waitFor("the fourth turn", func() bool { return f.get(key).TurnCount == 4 && commitsA.Load()+commitsB.Load() == 4 })
		if commitsA.Load() != 1 {
			t.Errorf("a committed %d turns, want 1", commitsA.Load())
		}
		for _, e := range f.events(key) {
			if e.Status != store.EventDone || e.Attempts != 0 {
				t.Errorf("event %d: %s after %d failed attempts, want done with none", e.ID, e.Status, e.Attempts)
			}
		}
		if s := f.get(key); s.ActorEpoch > 4 {
			t.Errorf("epoch %d after 4 events, want ≤ 4", s.ActorEpoch)
		}
	})
}

// poolRunner is a funcRunner that cannot run the pool "remote" (as a host
// without a live worker of a remote pool) and says which pools it may
// refuse (host.PoolScope).
type poolRunner struct{ funcRunner }

func (poolRunner) CanRun(_ context.Context, _ store.Agent, pool string) bool { return pool != "remote" }
func (poolRunner) MayRefuse(pool string) bool                                { return pool == "remote" }

// More due sessions of a pool this host cannot run than the runnable
// scan's page (256) must not hide a session it can run, that only the scan
// can find (signalled while no host ran): the scan leaves the unrunnable
// pool's agents out (docs/DESIGN.md "Remote pools across hosts").
func TestScanPageIsNotFilledByAPoolThisHostCannotRun(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		f := &fixture{t: t, st: st}
		remote, local := f.agent("counter"), f.agent("counter")
		signal := func(key store.ActorKey, msg string) { // no host runs yet: no Ensure
			t.Helper()
			payload, _ := json.Marshal(map[string]string{"message": msg})
			if _, _, err := st.AppendEvent(context.Background(), store.AppendEventParams{Key: key, Kind: abi.EventMessage, Payload: payload}); err != nil {
				t.Fatal(err)
			}
		}
		var parked []store.ActorKey
		for i := range 300 {
			key := f.session(remote)
			signal(key, fmt.Sprint("for a worker elsewhere ", i))
			parked = append(parked, key)
		}
		key := f.session(local)
		signal(key, "runs here")

		pol := testPolicy()
		pol.Pools = map[string]int{"default": 8, "remote": 8}
		rp := pol.AgentPolicy
		rp.Pool = "remote"
		pol.Agents = map[string]host.AgentPolicy{remote.Name: rp}
		h, err := host.New(host.Options{
			Store: st, Runner: poolRunner{funcRunner{map[string]abi.TurnFunc{"counter": counter}}}, Policy: pol, Logger: quietLogger(),
		})
		if err != nil {
			t.Fatal(err)
		}
		f.h = h
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- h.Run(ctx) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("host.Run: %v", err)
			}
		})
		f.waitFor("the local pool's session to run", func() bool { return f.get(key).TurnCount == 1 })
		for _, k := range parked[:10] {
			if s := f.get(k); s.ActorEpoch != 0 {
				t.Fatalf("a session of the pool this host cannot run was claimed (epoch %d)", s.ActorEpoch)
			}
		}
	})
}
