package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/store/pgtest"
	"github.com/paddock-dev/paddock/store/postgres"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// newStore opens a store on a fresh database; it closes with the test.
func newStore(t testing.TB) *postgres.Store {
	t.Helper()
	s, err := postgres.Open(context.Background(), pgtest.DSN(t))
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func must(t testing.TB, err error, what string) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// fixture is a store with an agent and one session.
type fixture struct {
	t   testing.TB
	ctx context.Context
	s   *postgres.Store
	key store.ActorKey
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	return newFixtureOn(t, newStore(t))
}

// newFixtureOn registers a module, an agent and a session on s.
func newFixtureOn(t testing.TB, s *postgres.Store) *fixture {
	t.Helper()
	ctx := context.Background()
	mod := []byte("\x00asm\x01\x00\x00\x00")
	m, _, err := s.PutModule(ctx, store.PutModuleParams{Digest: "sha256:test", ABIVersion: abi.Version, Bytes: mod})
	must(t, err, "PutModule")
	a, err := s.CreateAgent(ctx, store.CreateAgentParams{UID: uuid.NewString(), Name: "agent", ModuleDigest: m.Digest,
		CrashPolicy: store.CrashRestart})
	must(t, err, "CreateAgent")
	f := &fixture{t: t, ctx: ctx, s: s}
	f.key = f.session(a.UID)
	return f
}

func (f *fixture) session(agentUID string) store.ActorKey {
	f.t.Helper()
	ss, _, err := f.s.CreateSession(f.ctx, store.CreateSessionParams{AgentUID: agentUID, SessionID: uuid.NewString()})
	must(f.t, err, "CreateSession")
	return ss.ActorKey
}

func (f *fixture) append(msg string) store.Event {
	f.t.Helper()
	e, _, err := f.s.AppendEvent(f.ctx, store.AppendEventParams{Key: f.key, Kind: abi.EventMessage,
		Payload: []byte(fmt.Sprintf(`{"message": %q}`, msg))})
	must(f.t, err, "AppendEvent")
	return e
}

func (f *fixture) claim(ttl time.Duration) store.Activation {
	f.t.Helper()
	a, err := f.s.ClaimActivation(f.ctx, store.ClaimActivationParams{Key: f.key, UID: uuid.NewString(),
		LeaseID: uuid.NewString(), HostID: "host", LeaseTTL: ttl})
	must(f.t, err, "ClaimActivation")
	return a
}

func (f *fixture) next(a store.Activation) store.Dispatch {
	f.t.Helper()
	d, err := f.s.NextDelivery(f.ctx, store.NextDeliveryParams{Activation: a.Ref(), DeliveryID: uuid.NewString(),
		Binding: "sha256:test", MarkSent: true, TailMessages: 10})
	must(f.t, err, "NextDelivery")
	return d
}

func (f *fixture) commit(ref abi.TurnRef) (store.Turn, error) {
	return f.s.CommitTurn(f.ctx, store.CommitTurnParams{Ref: ref, State: []byte("state"),
		Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "reply"}}, Outcome: abi.OutcomeOK})
}

// TestTurnRoundTrip runs claim, dispatch and commit, and checks what the
// commit wrote.
func TestTurnRoundTrip(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	e := f.append("hello")
	a := f.claim(time.Minute)
	if a.ActorEpoch != 1 {
		t.Fatalf("epoch = %d, want 1", a.ActorEpoch)
	}
	d := f.next(a)
	if d.Event.ID != e.ID || d.Attempt != 1 || d.Delivery.Binding != "sha256:test" || d.State != nil {
		t.Fatalf("dispatch = %+v", d)
	}
	turn, err := f.commit(d.Delivery.TurnRef())
	must(t, err, "CommitTurn")
	if turn.TurnNo != 1 || len(turn.Messages) != 2 || turn.Messages[0].Content != "hello" || turn.Messages[1].Index != 1 {
		t.Fatalf("turn = %+v", turn)
	}
	tr, err := f.s.Transcript(f.ctx, store.TranscriptParams{Key: f.key})
	must(t, err, "Transcript")
	if len(tr) != 1 || len(tr[0].Messages) != 2 || !tr[0].CommittedAt.Equal(turn.CommittedAt) {
		t.Fatalf("transcript = %+v, want %+v", tr, turn)
	}
	ss, err := f.s.GetSession(f.ctx, f.key)
	must(t, err, "GetSession")
	if ss.TurnCount != 1 || ss.EventCount != 1 || ss.OpenEvents != 0 {
		t.Fatalf("session counters = %+v", ss)
	}
	// Replay: rejected, nothing written.
	_, err = f.commit(d.Delivery.TurnRef())
	var fe *store.FenceError
	if !errors.As(err, &fe) || fe.Reason != store.FenceSupersededDelivery {
		t.Fatalf("replay: err = %v, want superseded_delivery", err)
	}
	// The next dispatch carries state and tail.
	f.append("again")
	d2 := f.next(a)
	if string(d2.State) != "state" || len(d2.Tail) != 2 || d2.Tail[0].Content != "hello" {
		t.Fatalf("second dispatch = %+v", d2)
	}
}

// TestSubscribeSeesAppends checks LISTEN/NOTIFY: an event appended after
// Subscribe returned wakes the subscriber with its key, and the channel
// closes with the context.
func TestSubscribeSeesAppends(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := f.s.Subscribe(ctx)
	must(t, err, "Subscribe")
	f.append("wake up")
	select {
	case k := <-ch:
		if k != f.key {
			t.Fatalf("notified %v, want %v", k, f.key)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no notification within 10s")
	}
	cancel()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-timeout:
			t.Fatal("channel not closed after cancel")
		}
	}
}

// TestSubscribeEndsOnClose checks that Close ends subscriptions.
func TestSubscribeEndsOnClose(t *testing.T) {
	t.Parallel()
	s, err := postgres.Open(context.Background(), pgtest.DSN(t))
	must(t, err, "Open")
	ch, err := s.Subscribe(context.Background())
	must(t, err, "Subscribe")
	must(t, s.Close(), "Close")
	select {
	case _, ok := <-ch:
		if ok {
			t.Fatal("unexpected notification")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("channel not closed by Close")
	}
}

// TestOpenTwiceMigratesOnce opens two stores on one database at once: the
// advisory lock serialises the migrations, and both work.
func TestOpenTwiceMigratesOnce(t *testing.T) {
	t.Parallel()
	dsn := pgtest.DSN(t)
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		wg.Go(func() {
			s, err := postgres.Open(context.Background(), dsn)
			if err == nil {
				_, err = s.ListModules(context.Background())
				_ = s.Close()
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for _, err := range errs {
		must(t, err, "Open")
	}
}

// TestCommitRacesWatchdog hammers the row lock of invariant 3: a commit and
// the watchdog's expiry of the same activation, started together after the
// lease is about to lapse, never both win, and the event ends consistent
// with whichever did.
func TestCommitRacesWatchdog(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	var commits, expiries int
	defer func() { t.Logf("commit won %d rounds, watchdog won %d", commits, expiries) }()
	for i := range 20 {
		e := f.append(fmt.Sprintf("m%d", i))
		a, d := f.claimAndNextShort(30 * time.Millisecond)
		time.Sleep(25 * time.Millisecond)
		var commitErr, expireErr error
		var wg sync.WaitGroup
		wg.Go(func() { _, commitErr = f.commit(d.Delivery.TurnRef()) })
		wg.Go(func() {
			for {
				_, expireErr = f.s.ExpireActivation(f.ctx, store.ExpireActivationParams{Ref: a.Ref(), Backoff: 0,
					MaxAttempts: 100})
				if !errors.Is(expireErr, store.ErrNotLive) {
					return
				}
				// Not yet expired, or the commit won and the activation
				// is idle-live: it must expire later all the same.
				time.Sleep(5 * time.Millisecond)
			}
		})
		wg.Wait()
		must(t, expireErr, "ExpireActivation")
		evs, err := f.s.ListEvents(f.ctx, store.ListEventsParams{Key: f.key, After: e.ID - 1, Limit: 1})
		must(t, err, "ListEvents")
		switch {
		case commitErr == nil:
			commits++
			if evs[0].Status != store.EventDone {
				t.Fatalf("round %d: commit won but event is %s", i, evs[0].Status)
			}
		case errors.Is(commitErr, store.ErrFence):
			expiries++
			if evs[0].Status != store.EventOpen || evs[0].Attempts != 1 {
				t.Fatalf("round %d: watchdog won but event = %+v", i, evs[0])
			}
			// Finish the event so the next round starts clean.
			a2 := f.claim(time.Minute)
			d2 := f.next(a2)
			_, err := f.commit(d2.Delivery.TurnRef())
			must(t, err, "CommitTurn after expiry")
			must(t, f.s.StopActivation(f.ctx, a2.Ref()), "StopActivation")
		default:
			t.Fatalf("round %d: CommitTurn: %v", i, commitErr)
		}
	}
}

// claimAndNextShort claims with a short lease and takes the next event. On
// a loaded machine (-race, parallel packages) the lease can lapse before
// NextDelivery runs, which then refuses (ErrNotLive, nothing taken): the
// watchdog ends that activation and the claim is retried.
func (f *fixture) claimAndNextShort(ttl time.Duration) (store.Activation, store.Dispatch) {
	f.t.Helper()
	for range 50 {
		a := f.claim(ttl)
		d, err := f.s.NextDelivery(f.ctx, store.NextDeliveryParams{Activation: a.Ref(), DeliveryID: uuid.NewString(),
			Binding: "sha256:test", MarkSent: true, TailMessages: 10})
		if err == nil {
			return a, d
		}
		if !errors.Is(err, store.ErrNotLive) {
			must(f.t, err, "NextDelivery")
		}
		for {
			_, err := f.s.ExpireActivation(f.ctx, store.ExpireActivationParams{Ref: a.Ref(), MaxAttempts: 100})
			if err == nil {
				break
			}
			if !errors.Is(err, store.ErrNotLive) {
				must(f.t, err, "ExpireActivation")
			}
			time.Sleep(ttl / 4)
		}
	}
	f.t.Fatalf("NextDelivery lost its %s lease 50 times", ttl)
	return store.Activation{}, store.Dispatch{}
}

// TestConcurrentAppendsKeepOrder appends from many goroutines to one session:
// seq is dense and unique (assigned under the session row lock).
func TestConcurrentAppendsKeepOrder(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const n = 64
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			_, _, err := f.s.AppendEvent(f.ctx, store.AppendEventParams{Key: f.key, Kind: abi.EventMessage,
				Payload: []byte(`{}`), IdempotencyKey: fmt.Sprintf("k%d", i%(n/2))})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		must(t, err, "AppendEvent")
	}
	evs, err := f.s.ListEvents(f.ctx, store.ListEventsParams{Key: f.key, Limit: 1000})
	must(t, err, "ListEvents")
	if len(evs) != n/2 {
		t.Fatalf("%d events, want %d (one per idempotency key)", len(evs), n/2)
	}
	for i, e := range evs {
		if e.Seq != int64(i+1) {
			t.Fatalf("event %d has seq %d", i, e.Seq)
		}
	}
}

// TestDefaultDeadline checks that a call without a deadline still gets one:
// a store with a tiny call timeout fails fast instead of hanging.
func TestDefaultDeadline(t *testing.T) {
	t.Parallel()
	s, err := postgres.Open(context.Background(), pgtest.DSN(t), postgres.WithCallTimeout(time.Nanosecond))
	must(t, err, "Open")
	defer s.Close()
	_, err = s.ListModules(context.Background())
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ListModules with a 1ns call timeout: %v, want deadline exceeded", err)
	}
}

// TestErrorsArePrefixed checks the error convention of the driver.
func TestErrorsArePrefixed(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	_, err := s.GetSession(context.Background(), store.ActorKey{AgentUID: "a", SessionID: "s"})
	if !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("GetSession: %v, want ErrNotFound", err)
	}
	if got, want := err.Error(), "store/postgres: get session: session a/s: not found"; got != want {
		t.Fatalf("error = %q, want %q", got, want)
	}
}

// TestClaimsDuringCommits hammers the lock order: while the live activation
// appends and commits turns, other goroutines keep trying to claim the same
// key. Every claim must get ErrActivationLive (invariant 1) and every
// commit must succeed: no deadlock, no error leaking from the claims'
// rolled-back epoch bumps.
func TestClaimsDuringCommits(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a := f.claim(time.Minute)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	claimErrs := make(chan error, 4)
	for range 4 {
		wg.Go(func() {
			for ctx.Err() == nil {
				_, err := f.s.ClaimActivation(ctx, store.ClaimActivationParams{Key: f.key, UID: uuid.NewString(),
					LeaseID: uuid.NewString(), HostID: "other", LeaseTTL: time.Minute})
				if ctx.Err() != nil {
					return
				}
				if !errors.Is(err, store.ErrActivationLive) {
					claimErrs <- err
					return
				}
			}
		})
	}
	for i := range 50 {
		f.append(fmt.Sprintf("m%d", i))
		d := f.next(a)
		_, err := f.commit(d.Delivery.TurnRef())
		must(t, err, "CommitTurn")
	}
	cancel()
	wg.Wait()
	close(claimErrs)
	for err := range claimErrs {
		t.Fatalf("ClaimActivation during commits: %v, want ErrActivationLive", err)
	}
	ss, err := f.s.GetSession(f.ctx, f.key)
	must(t, err, "GetSession")
	if ss.ActorEpoch != a.ActorEpoch || ss.TurnCount != 50 {
		t.Fatalf("session epoch %d turns %d, want epoch %d (failed claims roll back) and 50 turns",
			ss.ActorEpoch, ss.TurnCount, a.ActorEpoch)
	}
}

// TestSubscribeReconnects kills the listener's backend: the subscription
// reconnects and keeps delivering (notifications sent while it was down are
// lost, so the test appends until one arrives).
func TestSubscribeReconnects(t *testing.T) {
	t.Parallel()
	dsn := pgtest.DSN(t)
	s, err := postgres.Open(context.Background(), dsn)
	must(t, err, "Open")
	t.Cleanup(func() { _ = s.Close() })
	f := newFixtureOn(t, s)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := f.s.Subscribe(ctx)
	must(t, err, "Subscribe")
	conn, err := pgx.Connect(ctx, dsn)
	must(t, err, "Connect")
	defer conn.Close(context.Background())
	var killed int
	err = conn.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE application_name = $1 AND datname = current_database()`, postgres.ListenerApplicationName).Scan(&killed)
	must(t, err, "pg_terminate_backend")
	if killed != 1 {
		t.Fatalf("terminated %d listener backends, want 1", killed)
	}
	deadline := time.After(20 * time.Second)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case k := <-ch:
			if k != f.key {
				t.Fatalf("notified %v, want %v", k, f.key)
			}
			return
		case <-tick.C:
			f.append("ping")
		case <-deadline:
			t.Fatal("no notification within 20s of the listener's backend being killed")
		}
	}
}
