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
// Before it closes, the test fails if the database holds an orphan
// (noOrphans).
func newStore(t testing.TB) *postgres.Store {
	t.Helper()
	dsn := pgtest.DSN(t)
	s, err := postgres.Open(context.Background(), dsn)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	t.Cleanup(func() { noOrphans(t, dsn) }) // runs first
	return s
}

// orphansSQL counts the rows of the tables written per turn whose session
// (for messages: whose turn) does not exist. Migration 00015 dropped those
// tables' foreign keys: what they guarded must hold by construction.
const orphansSQL = `
	SELECT t, n FROM (
		SELECT 'actor_events' AS t, count(*) AS n FROM actor_events x
		WHERE NOT EXISTS (SELECT 1 FROM sessions s WHERE s.agent_uid = x.agent_uid AND s.session_id = x.session_id)
		UNION ALL SELECT 'deliveries', count(*) FROM deliveries x
		WHERE NOT EXISTS (SELECT 1 FROM sessions s WHERE s.agent_uid = x.agent_uid AND s.session_id = x.session_id)
		UNION ALL SELECT 'turns', count(*) FROM turns x
		WHERE NOT EXISTS (SELECT 1 FROM sessions s WHERE s.agent_uid = x.agent_uid AND s.session_id = x.session_id)
		UNION ALL SELECT 'messages', count(*) FROM messages x
		WHERE NOT EXISTS (SELECT 1 FROM turns u
			WHERE u.agent_uid = x.agent_uid AND u.session_id = x.session_id AND u.turn_no = x.turn_no)
		UNION ALL SELECT 'stream_heads', count(*) FROM stream_heads x
		WHERE NOT EXISTS (SELECT 1 FROM sessions s WHERE s.agent_uid = x.agent_uid AND s.session_id = x.session_id)
		UNION ALL SELECT 'stream_frames', count(*) FROM stream_frames x
		WHERE NOT EXISTS (SELECT 1 FROM sessions s WHERE s.agent_uid = x.agent_uid AND s.session_id = x.session_id)
		UNION ALL SELECT 'session_state', count(*) FROM session_state x
		WHERE NOT EXISTS (SELECT 1 FROM sessions s WHERE s.agent_uid = x.agent_uid AND s.session_id = x.session_id)
	) o WHERE n > 0`

// noOrphans fails t if the database at dsn holds a row orphansSQL counts.
func noOrphans(t testing.TB, dsn string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Errorf("orphan check: connect: %v", err)
		return
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, orphansSQL)
	if err != nil {
		t.Errorf("orphan check: %v", err)
		return
	}
	found, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (string, error) {
		var table string
		var n int64
		err := r.Scan(&table, &n)
		return fmt.Sprintf("%s: %d", table, n), err
	})
	if err != nil {
		t.Errorf("orphan check: %v", err)
	}
	if len(found) > 0 {
		t.Errorf("rows without their session (or turn): %v", found)
	}
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

// fixtureOnOwnStore is newFixtureOn on a store of its own, opened on a
// database of its own, and that database's DSN (for a second connection
// or store).
func fixtureOnOwnStore(t *testing.T) (string, *fixture) {
	t.Helper()
	dsn := pgtest.DSN(t)
	s, err := postgres.Open(context.Background(), dsn)
	must(t, err, "Open")
	t.Cleanup(func() { _ = s.Close() })
	t.Cleanup(func() { noOrphans(t, dsn) }) // runs first
	return dsn, newFixtureOn(t, s)
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

// TestSubscribeEchoesTellsOwnAppends: SubscribeEchoes marks the
// notification of an event appended through the same Store value with the
// event's seq — whichever path appended it (group commit, the locked path,
// a steer) — and another Store value's appends (another host's) with 0;
// Subscribe, on the same tagged notifications, sees just the key.
func TestSubscribeEchoesTellsOwnAppends(t *testing.T) {
	t.Parallel()
	dsn := pgtest.DSN(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s1, err := postgres.Open(ctx, dsn)
	must(t, err, "Open")
	t.Cleanup(func() { _ = s1.Close() })
	s2, err := postgres.Open(ctx, dsn, postgres.WithoutGroupCommit())
	must(t, err, "Open a second store")
	t.Cleanup(func() { _ = s2.Close() })
	f := newFixtureOn(t, s1)
	echoes, err := s1.SubscribeEchoes(ctx)
	must(t, err, "SubscribeEchoes")
	keys, err := s1.Subscribe(ctx)
	must(t, err, "Subscribe")
	next := func(what string, want store.Wakeup) {
		t.Helper()
		select {
		case w := <-echoes:
			if w != want {
				t.Fatalf("%s: wake-up %+v, want %+v", what, w, want)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: no wake-up within 30s", what)
		}
		select {
		case k := <-keys:
			if k != want.Key {
				t.Fatalf("%s: Subscribe got %v, want %v", what, k, want.Key)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: Subscribe got nothing within 30s", what)
		}
	}
	msg := []byte(`{"message":"m"}`)
	e := f.append("group commit")
	next("own append", store.Wakeup{Key: f.key, EchoSeq: e.Seq})
	e, _, err = s1.AppendEvent(ctx, store.AppendEventParams{Key: f.key, Kind: abi.EventMessage, Payload: msg, RefuseIfInFlight: true})
	must(t, err, "AppendEvent (locked path)")
	next("own append, locked path", store.Wakeup{Key: f.key, EchoSeq: e.Seq})
	st, err := s1.Steer(ctx, store.SteerParams{Key: f.key, Payload: msg, DeliveryID: uuid.NewString()})
	must(t, err, "Steer")
	next("own steer", store.Wakeup{Key: f.key, EchoSeq: st.Event.Seq})
	_, _, err = s2.AppendEvent(ctx, store.AppendEventParams{Key: f.key, Kind: abi.EventMessage, Payload: msg})
	must(t, err, "AppendEvent through another store")
	next("another store's append", store.Wakeup{Key: f.key})
	// An idempotent re-send appends nothing and notifies nothing: the next
	// wake-up after the first keyed append's is the following append's.
	keyed, _, err := s1.AppendEvent(ctx, store.AppendEventParams{Key: f.key, Kind: abi.EventMessage, Payload: msg, IdempotencyKey: "k"})
	must(t, err, "AppendEvent with a key")
	for range 2 {
		_, created, err := s1.AppendEvent(ctx, store.AppendEventParams{Key: f.key, Kind: abi.EventMessage, Payload: msg, IdempotencyKey: "k"})
		must(t, err, "AppendEvent re-sent")
		if created {
			t.Fatal("a re-send appended")
		}
	}
	e = f.append("after the re-sends")
	next("keyed append", store.Wakeup{Key: f.key, EchoSeq: keyed.Seq})
	next("own append after re-sends", store.Wakeup{Key: f.key, EchoSeq: e.Seq})
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
				_, err = s.ListModules(context.Background(), store.DefaultNamespace)
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

// TestDefaultDeadline checks that a call without a deadline still gets one:
// a store with a tiny call timeout fails fast instead of hanging.
func TestDefaultDeadline(t *testing.T) {
	t.Parallel()
	s, err := postgres.Open(context.Background(), pgtest.DSN(t), postgres.WithCallTimeout(time.Nanosecond))
	must(t, err, "Open")
	defer s.Close()
	_, err = s.ListModules(context.Background(), store.DefaultNamespace)
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

// TestSubscribeReconnects kills the listener's backend: the subscription
// reconnects and keeps delivering (notifications sent while it was down are
// lost, so the test appends until one arrives).
func TestSubscribeReconnects(t *testing.T) {
	t.Parallel()
	dsn, f := fixtureOnOwnStore(t)
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
