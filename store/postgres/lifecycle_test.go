package postgres_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/store/pgtest"
	"github.com/paddock-dev/paddock/store/postgres"
)

// openN opens n stores on one fresh database (n hosts sharing it).
func openN(t *testing.T, n int) (dsn string, stores []*postgres.Store) {
	t.Helper()
	dsn = pgtest.DSN(t)
	for range n {
		s, err := postgres.Open(context.Background(), dsn)
		must(t, err, "Open")
		t.Cleanup(func() { _ = s.Close() })
		stores = append(stores, s)
	}
	return dsn, stores
}

// setAlarms commits one turn on f.key that applies ops, then stops the
// activation.
func (f *fixture) setAlarms(ops ...abi.AlarmOp) {
	f.t.Helper()
	f.append("set alarms")
	a := f.claim(time.Minute)
	d := f.next(a)
	_, err := f.s.CommitTurn(f.ctx, store.CommitTurnParams{Ref: d.Delivery.TurnRef(), KeepState: true,
		Outcome: abi.OutcomeOK, Alarms: ops})
	must(f.t, err, "CommitTurn with alarms")
	must(f.t, f.s.StopActivation(f.ctx, a.Ref()), "StopActivation")
}

// firing is one alarm event: which session, alarm and due time it was for.
type firing struct {
	key  store.ActorKey
	name string
	due  int64 // unix ms
}

// alarmFirings lists the alarm events of the given sessions, checking each
// event's payload against its idempotency key.
func alarmFirings(t *testing.T, s *postgres.Store, keys []store.ActorKey) []firing {
	t.Helper()
	var out []firing
	for _, k := range keys {
		evs, err := s.ListEvents(context.Background(), store.ListEventsParams{Key: k, Limit: 1000})
		must(t, err, "ListEvents")
		for _, e := range evs {
			if e.Kind != abi.EventAlarm {
				continue
			}
			var p struct {
				Alarm abi.AlarmFired `json:"alarm"`
			}
			must(t, json.Unmarshal(e.Payload, &p), "alarm payload")
			f := firing{key: k, name: p.Alarm.Name, due: p.Alarm.DueAt.UnixMilli()}
			if want := fmt.Sprintf("alarm:%s:%d", f.name, f.due); e.IdempotencyKey != want {
				t.Fatalf("alarm event idempotency key %q, payload says %q", e.IdempotencyKey, want)
			}
			out = append(out, f)
		}
	}
	return out
}

// TestFireDueAlarmsRaceAcrossHosts races four stores (four hosts, four
// pools) over 1,000 due alarms on 50 sessions, one-shot and repeating with
// missed periods: every (session, alarm, due time) fires exactly once, no
// call returns a key twice, the one-shots are gone and each repeating alarm
// moved to its first due time after now.
func TestFireDueAlarmsRaceAcrossHosts(t *testing.T) {
	t.Parallel()
	_, stores := openN(t, 4)
	f := newFixtureOn(t, stores[0])
	agent, err := f.s.GetAgent(f.ctx, store.DefaultNamespace, "agent")
	must(t, err, "GetAgent")
	const sessions, perSession = 50, 20
	base := time.Now().Add(-time.Hour).Truncate(time.Millisecond).UTC()
	want := map[firing]bool{}
	repeating := map[firing]time.Time{} // the first firing of a repeating alarm -> its next due time
	var keys []store.ActorKey
	for i := range sessions {
		f.key = f.session(agent.UID)
		keys = append(keys, f.key)
		var ops []abi.AlarmOp
		for j := range perSession {
			name := fmt.Sprintf("alarm-%02d", j)
			due := base.Add(-time.Duration(i*perSession+j) * time.Millisecond)
			op := abi.AlarmOp{Name: name, At: &due, Data: json.RawMessage(fmt.Sprintf(`{"i":%d}`, j))}
			fi := firing{key: f.key, name: name, due: due.UnixMilli()}
			if j%4 == 0 {
				// Due 3.5 periods ago: fires once, next due = due + 4 periods.
				op.EveryMs = int64(time.Hour / time.Millisecond)
				d := due.Add(-150 * time.Minute)
				op.At = &d
				fi.due = d.UnixMilli()
				repeating[fi] = d.Add(4 * time.Hour)
			}
			ops = append(ops, op)
			want[fi] = true
		}
		f.setAlarms(ops...)
	}
	if len(want) != sessions*perSession {
		t.Fatalf("set up %d alarms, want %d", len(want), sessions*perSession)
	}

	ctx := context.Background()
	var wg sync.WaitGroup
	var calls atomic.Int64
	returned := make([][]store.ActorKey, len(stores))
	errs := make([]error, len(stores))
	start := make(chan struct{})
	for i, s := range stores {
		wg.Go(func() {
			<-start
			for {
				got, err := s.FireDueAlarms(ctx, 25)
				calls.Add(1)
				if err != nil {
					errs[i] = err
					return
				}
				seen := map[store.ActorKey]bool{}
				for _, k := range got {
					if seen[k] {
						errs[i] = fmt.Errorf("FireDueAlarms returned %v twice in one call", k)
						return
					}
					seen[k] = true
				}
				if len(got) == 0 {
					return
				}
				returned[i] = append(returned[i], got...)
			}
		})
	}
	began := time.Now()
	close(start)
	wg.Wait()
	t.Logf("fired %d alarms in %v", len(want), time.Since(began))
	for _, err := range errs {
		must(t, err, "FireDueAlarms")
	}
	// A racing call that claimed a session's alarms while another call
	// held the session's row skips them (SKIP LOCKED: they fire in a later
	// sweep, by design), and both callers may then have seen an empty
	// call and stopped (a CI run left one session so). So the later
	// sweep runs here, alone; a second finds nothing.
	left, err := stores[0].FireDueAlarms(ctx, 1000)
	must(t, err, "FireDueAlarms (the later sweep)")
	t.Logf("the later sweep fired alarms of %d sessions", len(left))
	if again, err := stores[0].FireDueAlarms(ctx, 1000); err != nil || len(again) != 0 {
		t.Fatalf("a second sweep alone fired for %v (%v), want none left", again, err)
	}
	t.Logf("%d FireDueAlarms calls; keys returned per store: %d %d %d %d", calls.Load(),
		len(returned[0]), len(returned[1]), len(returned[2]), len(returned[3]))

	got := alarmFirings(t, stores[0], keys)
	count := map[firing]int{}
	for _, fi := range got {
		count[fi]++
	}
	for fi, n := range count {
		if n != 1 || !want[fi] {
			t.Fatalf("alarm %v fired %d times (expected: %v)", fi, n, want[fi])
		}
	}
	if len(count) != len(want) {
		t.Fatalf("%d alarms fired, want %d", len(count), len(want))
	}
	var union []store.ActorKey
	for _, r := range returned {
		union = append(union, r...)
	}
	slices.SortFunc(union, cmpKey)
	union = slices.Compact(union)
	wantKeys := slices.SortedFunc(slices.Values(keys), cmpKey)
	if !slices.Equal(union, wantKeys) {
		t.Fatalf("returned keys cover %d sessions, want %d", len(union), len(wantKeys))
	}
	// One-shots are gone; repeating alarms moved past now, data kept.
	nextDue := map[firing]time.Time{}
	for fi, next := range repeating {
		nextDue[firing{key: fi.key, name: fi.name}] = next
	}
	for _, k := range keys {
		alarms, err := stores[0].ListAlarms(ctx, k)
		must(t, err, "ListAlarms")
		if len(alarms) != perSession/4 {
			t.Fatalf("session %v has %d alarms left, want %d repeating ones", k, len(alarms), perSession/4)
		}
		for _, a := range alarms {
			next, ok := nextDue[firing{key: k, name: a.Name}]
			if !ok || !a.DueAt.Equal(next) || a.EveryMs != int64(time.Hour/time.Millisecond) || len(a.Data) == 0 {
				t.Fatalf("alarm left %+v, want a repeating one due %v", a, next)
			}
		}
	}
	// Every session that got an alarm is runnable (woken, due).
	runnable, err := stores[1].RunnableSessions(ctx, store.RunnableSessionsParams{Limit: 1000})
	must(t, err, "RunnableSessions")
	if len(runnable) != sessions {
		t.Fatalf("%d runnable sessions, want %d", len(runnable), sessions)
	}
}

func cmpKey(a, b store.ActorKey) int {
	if a.AgentUID != b.AgentUID {
		if a.AgentUID < b.AgentUID {
			return -1
		}
		return 1
	}
	switch {
	case a.SessionID < b.SessionID:
		return -1
	case a.SessionID > b.SessionID:
		return 1
	}
	return 0
}

// TestAlarmReSetToTheSameDueTimeDoesNotFireTwice: the idempotency key
// "alarm:<name>:<due unix ms>" makes a (session, alarm, due time) fire
// once even when the agent sets the alarm again to a time that already
// fired; the alarm is still deleted and no key is returned.
func TestAlarmReSetToTheSameDueTimeDoesNotFireTwice(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	due := time.Now().Add(-time.Minute).Truncate(time.Millisecond).UTC()
	f.setAlarms(abi.AlarmOp{Name: "once", At: &due})
	got, err := f.s.FireDueAlarms(f.ctx, 10)
	must(t, err, "FireDueAlarms")
	if len(got) != 1 || got[0] != f.key {
		t.Fatalf("first firing returned %v, want [%v]", got, f.key)
	}
	f.setAlarms(abi.AlarmOp{Name: "once", At: &due})
	got, err = f.s.FireDueAlarms(f.ctx, 10)
	must(t, err, "FireDueAlarms")
	if len(got) != 0 {
		t.Fatalf("second firing of the same due time returned %v, want none", got)
	}
	if n := len(alarmFirings(t, f.s, []store.ActorKey{f.key})); n != 1 {
		t.Fatalf("%d alarm events, want 1", n)
	}
	alarms, err := f.s.ListAlarms(f.ctx, f.key)
	must(t, err, "ListAlarms")
	if len(alarms) != 0 {
		t.Fatalf("alarms left: %+v", alarms)
	}
}

// TestAlarmSweepSkipsAHeldSession: the sweep never waits for a session row
// (a wait could close a cycle with a group-commit batch that holds that row
// while it sets an alarm of another session the sweep holds). With session
// A's row locked by another transaction, a sweep fires B's due alarm at once
// and leaves A's due; once A is free the next sweep fires it.
func TestAlarmSweepSkipsAHeldSession(t *testing.T) {
	t.Parallel()
	dsn, f := fixtureOnOwnStore(t)
	s := f.s
	due := time.Now().Add(-time.Minute).Truncate(time.Millisecond).UTC()
	keyA := f.key
	f.setAlarms(abi.AlarmOp{Name: "a", At: &due})
	f.key = f.session(keyA.AgentUID)
	keyB := f.key
	f.setAlarms(abi.AlarmOp{Name: "b", At: &due})

	conn, err := pgx.Connect(f.ctx, dsn)
	must(t, err, "connect")
	defer func() { _ = conn.Close(f.ctx) }()
	tx, err := conn.Begin(f.ctx)
	must(t, err, "begin")
	_, err = tx.Exec(f.ctx, `SELECT 1 FROM sessions WHERE agent_uid = $1 AND session_id = $2 FOR NO KEY UPDATE`,
		keyA.AgentUID, keyA.SessionID)
	must(t, err, "lock session A")
	ctx, cancel := context.WithTimeout(f.ctx, 20*time.Second)
	defer cancel()
	got, err := s.FireDueAlarms(ctx, 10)
	must(t, err, "FireDueAlarms while A is held")
	if len(got) != 1 || got[0] != keyB {
		t.Fatalf("sweep with A held fired %v, want [%v]", got, keyB)
	}
	must(t, tx.Commit(f.ctx), "release session A")
	got, err = s.FireDueAlarms(ctx, 10)
	must(t, err, "FireDueAlarms")
	if len(got) != 1 || got[0] != keyA {
		t.Fatalf("sweep after A was released fired %v, want [%v]", got, keyA)
	}
	if n := len(alarmFirings(t, s, []store.ActorKey{keyA, keyB})); n != 2 {
		t.Fatalf("%d alarm events, want 2 (one per session)", n)
	}
}

// TestLifecycleWritesNotify checks the wake-ups: steer, cancel, redrive,
// wake, destroy and an alarm firing each notify the key (LISTEN/NOTIFY, in
// the same transaction).
func TestLifecycleWritesNotify(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := f.s.Subscribe(ctx)
	must(t, err, "Subscribe")
	expect := func(what string) {
		t.Helper()
		select {
		case k := <-ch:
			if k != f.key {
				t.Fatalf("%s: notified %v, want %v", what, k, f.key)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no notification within 10s", what)
		}
	}
	// Steer, queued.
	_, err = f.s.Steer(f.ctx, store.SteerParams{Key: f.key, Payload: []byte(`{"message": "s"}`)})
	must(t, err, "Steer")
	expect("Steer")
	// Cancel the queued steer.
	evs, err := f.s.ListEvents(f.ctx, store.ListEventsParams{Key: f.key})
	must(t, err, "ListEvents")
	_, err = f.s.CancelEvent(f.ctx, store.CancelEventParams{Key: f.key, EventID: evs[0].ID, Reason: "no"})
	must(t, err, "CancelEvent")
	expect("CancelEvent")
	// Dead-letter an event, then redrive it.
	e := f.append("poison")
	expect("AppendEvent")
	a := f.claim(time.Minute)
	d := f.next(a)
	_, err = f.s.FailAttempt(f.ctx, store.FailAttemptParams{Ref: d.Delivery.TurnRef(), Error: "boom", Counted: true,
		MaxAttempts: 1})
	must(t, err, "FailAttempt")
	_, err = f.s.RedriveEvent(f.ctx, f.key, e.ID)
	must(t, err, "RedriveEvent")
	expect("RedriveEvent")
	// Sleep and wake.
	_, err = f.s.SleepSession(f.ctx, store.SleepSessionParams{Key: f.key, Reason: "capacity"})
	must(t, err, "SleepSession")
	_, err = f.s.WakeSession(f.ctx, f.key)
	must(t, err, "WakeSession")
	expect("WakeSession")
	// An alarm.
	a = f.claim(time.Minute)
	d = f.next(a)
	_, err = f.s.CommitTurn(f.ctx, store.CommitTurnParams{Ref: d.Delivery.TurnRef(), KeepState: true,
		Alarms: []abi.AlarmOp{{Name: "now", InMs: 1}}})
	must(t, err, "CommitTurn")
	must(t, f.s.StopActivation(f.ctx, a.Ref()), "StopActivation")
	for deadline := time.Now().Add(10 * time.Second); ; {
		got, err := f.s.FireDueAlarms(f.ctx, 10)
		must(t, err, "FireDueAlarms")
		if len(got) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("alarm did not fire within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	expect("FireDueAlarms")
	_, err = f.s.DestroySession(f.ctx, f.key)
	must(t, err, "DestroySession")
	expect("DestroySession")
}

// TestLifecycleHammerHasNoDeadlocks runs every lifecycle write at once on a
// few sessions, from two stores (two hosts): turns that set alarms, counted
// failures under each crash policy (dead letters at the second), alarm
// firings, steers, cancellations, appends, redrives, sleeps and wakes, and
// at the end destroys. The lock order (activation, alarms, session, events;
// see the package doc) must keep PostgreSQL from ever detecting a deadlock
// (the driver would retry one silently, so the test reads the server's own
// counter), and every event must end consistent.
func TestLifecycleHammerHasNoDeadlocks(t *testing.T) { lifecycleHammer(t, false) }

// lifecycleHammer is TestLifecycleHammerHasNoDeadlocks; grouped puts its
// turn loop on the group commit's paths (TestGroupAttackHammerHasNoDeadlocks).
func lifecycleHammer(t *testing.T, grouped bool) {
	if testing.Short() {
		t.Skip("hammer")
	}
	t.Parallel()
	dsn, stores := openN(t, 2)
	f := newFixtureOn(t, stores[0])
	agent, err := f.s.GetAgent(f.ctx, store.DefaultNamespace, "agent")
	must(t, err, "GetAgent")
	var expect *store.ExpectedBinding // the one-statement dispatch's
	if grouped {
		f.append("warm")
		warm := f.next(f.claim(time.Hour))
		expect = &store.ExpectedBinding{Agent: warm.Agent, Binding: "sha256:test"}
	}
	policies := []store.CrashPolicy{store.CrashRestart, store.CrashRestart, store.CrashRestart, store.CrashSleep,
		store.CrashSleep, store.CrashDestroy}
	keys := make([]store.ActorKey, len(policies))
	for i, pol := range policies {
		ss, _, err := f.s.CreateSession(f.ctx, store.CreateSessionParams{AgentUID: agent.UID,
			SessionID: uuid.NewString(), CrashPolicy: pol})
		must(t, err, "CreateSession")
		keys[i] = ss.ActorKey
	}
	ctx, stop := context.WithTimeout(context.Background(), 4*time.Second)
	defer stop()
	bg := context.Background()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []error
	fail := func(err error) {
		mu.Lock()
		failures = append(failures, err)
		mu.Unlock()
	}
	var commits, failed, fenced, steered, cancelled, fired, redriven, destroyed atomic.Int64
	done := func() bool { return ctx.Err() != nil }
	// One worker per session: claim, dispatch, then commit with alarm ops
	// (on a fence — steered or cancelled — commit the newest delivery
	// instead) or, one turn in five, fail it counted.
	for i, key := range keys {
		s := stores[i%2]
		wg.Go(func() {
			var act store.Activation
			claimed := false
			for !done() {
				if !claimed {
					var err error
					cp := store.ClaimActivationParams{Key: key, UID: uuid.NewString(),
						LeaseID: uuid.NewString(), HostID: "h", LeaseTTL: time.Minute}
					if grouped {
						cp.First = &store.NextDeliveryParams{Activation: store.ActivationRef{UID: cp.UID, ActorKey: key,
							ActorEpoch: 1, LeaseID: cp.LeaseID}, DeliveryID: uuid.NewString(), MarkSent: true,
							Binding: "sha256:test", Expect: expect}
					}
					act, err = s.ClaimActivation(bg, cp)
					switch {
					case errors.Is(err, store.ErrSessionDestroyed):
						return
					case errors.Is(err, store.ErrSessionSleeping):
						if _, err := s.WakeSession(bg, key); err != nil && !errors.Is(err, store.ErrSessionDestroyed) {
							fail(fmt.Errorf("wake: %w", err))
							return
						}
						continue
					case err != nil:
						fail(fmt.Errorf("claim: %w", err))
						return
					}
					claimed = true
				}
				var d store.Dispatch
				var err error
				if act.First != nil {
					d, act.First = *act.First, nil
				} else {
					d, err = s.NextDelivery(bg, store.NextDeliveryParams{Activation: act.Ref(),
						DeliveryID: uuid.NewString(), Binding: "sha256:test", MarkSent: true, Expect: expect})
				}
				var payloads []string // the commit reads them
				if grouped {
					payloads = []string{string(d.Event.Payload)}
				}
				var nd *store.NoDueEventError
				switch {
				case errors.As(err, &nd):
					_, _, err = s.AppendEvent(bg, store.AppendEventParams{Key: key, Kind: abi.EventMessage,
						Payload: []byte(`{"message": "m"}`)})
					if errors.Is(err, store.ErrSessionDestroyed) {
						return
					}
					if err != nil {
						fail(fmt.Errorf("append: %w", err))
						return
					}
					continue
				case errors.Is(err, store.ErrNotLive): // destroyed
					claimed = false
					continue
				case err != nil:
					fail(fmt.Errorf("next delivery: %w", err))
					return
				}
				ref := d.Delivery.TurnRef()
				failIt := rand.N(5) == 0
				for !done() {
					if failIt {
						_, err = s.FailAttempt(bg, store.FailAttemptParams{Ref: ref, Error: "boom", Counted: true,
							MaxAttempts: 2})
						if err == nil {
							failed.Add(1)
							claimed = false // the activation failed
							break
						}
					} else {
						past := time.Now().Add(-time.Second)
						_, err = s.CommitTurn(bg, store.CommitTurnParams{Ref: ref, KeepState: true, Payloads: payloads,
							Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "r"}},
							Alarms: []abi.AlarmOp{{Name: "a", At: &past}, {Name: "b", InMs: 1},
								{Name: "c", Clear: true}}})
						if err == nil {
							commits.Add(1)
							break
						}
					}
					if !errors.Is(err, store.ErrFence) {
						fail(fmt.Errorf("commit or fail (%v): %w", failIt, err))
						return
					}
					fenced.Add(1)
					in, err := s.InFlight(bg, act.Ref())
					if errors.Is(err, store.ErrNotLive) {
						break // cancelled (idle again) or destroyed (NextDelivery says)
					}
					if err != nil {
						fail(fmt.Errorf("in flight: %w", err))
						return
					}
					ref = in.Delivery.TurnRef()
					payloads = nil // steered: the commit reads its payloads
				}
			}
		})
	}
	// Steerers, cancellers, redrivers, sleepers, wakers; the destroyer.
	for i := range 2 {
		s := stores[i]
		wg.Go(func() {
			for !done() {
				key := keys[rand.N(len(keys))]
				r, err := s.Steer(bg, store.SteerParams{Key: key, DeliveryID: uuid.NewString(),
					Payload: []byte(`{"message": "steer"}`)})
				switch {
				case err == nil && r.InFlight:
					steered.Add(1)
				case err == nil, errors.Is(err, store.ErrSessionDestroyed):
				default:
					fail(fmt.Errorf("steer: %w", err))
					return
				}
				_, err = s.CancelEvent(bg, store.CancelEventParams{Key: keys[rand.N(len(keys))], Reason: "hammer"})
				switch {
				case err == nil:
					cancelled.Add(1)
				case errors.Is(err, store.ErrNotFound), errors.Is(err, store.ErrConflict):
				default:
					fail(fmt.Errorf("cancel: %w", err))
					return
				}
				dls, err := s.ListDeadLetters(bg, store.ListDeadLettersParams{AgentUID: agent.UID, Limit: 5})
				if err != nil {
					fail(fmt.Errorf("list dead letters: %w", err))
					return
				}
				for _, dl := range dls {
					_, err := s.RedriveEvent(bg, dl.Event.ActorKey, dl.Event.ID)
					switch {
					case err == nil:
						redriven.Add(1)
					case errors.Is(err, store.ErrConflict), errors.Is(err, store.ErrSessionDestroyed):
					default:
						fail(fmt.Errorf("redrive: %w", err))
						return
					}
				}
				key = keys[rand.N(len(keys))]
				_, err = s.SleepSession(bg, store.SleepSessionParams{Key: key, Reason: "capacity"})
				if err != nil && !errors.Is(err, store.ErrActivationLive) && !errors.Is(err, store.ErrSessionDestroyed) {
					fail(fmt.Errorf("sleep: %w", err))
					return
				}
				if _, err := s.WakeSession(bg, key); err != nil && !errors.Is(err, store.ErrSessionDestroyed) {
					fail(fmt.Errorf("wake: %w", err))
					return
				}
			}
		})
	}
	wg.Go(func() {
		select {
		case <-time.After(3 * time.Second):
		case <-ctx.Done():
			return
		}
		for _, key := range keys[:2] {
			if _, err := stores[1].DestroySession(bg, key); err != nil {
				fail(fmt.Errorf("destroy: %w", err))
				return
			}
			destroyed.Add(1)
		}
	})
	// Firers on both stores.
	for i := range 2 {
		s := stores[i]
		wg.Go(func() {
			for !done() {
				got, err := s.FireDueAlarms(bg, 10)
				if err != nil {
					fail(fmt.Errorf("fire: %w", err))
					return
				}
				fired.Add(int64(len(got)))
			}
		})
	}
	wg.Wait()
	for _, err := range failures {
		t.Error(err)
	}
	t.Logf("commits %d, counted failures %d, fenced replies %d, steers in flight %d, cancels %d, redrives %d, "+
		"alarm keys %d, destroyed %d", commits.Load(), failed.Load(), fenced.Load(), steered.Load(), cancelled.Load(),
		redriven.Load(), fired.Load(), destroyed.Load())
	if commits.Load() == 0 || failed.Load() == 0 || steered.Load() == 0 || fired.Load() == 0 || cancelled.Load() == 0 {
		t.Errorf("the hammer did not exercise every path")
	}
	// Every done steer closed with the event it was attached to; a
	// destroyed session has no open event; a turn per done event.
	for _, key := range keys {
		ss, err := stores[0].GetSession(bg, key)
		must(t, err, "GetSession")
		evs, err := stores[0].ListEvents(bg, store.ListEventsParams{Key: key, Limit: 1000})
		must(t, err, "ListEvents")
		turns, err := stores[0].Transcript(bg, store.TranscriptParams{Key: key, Limit: 1000})
		must(t, err, "Transcript")
		turnOf := map[int64]int64{}
		for _, turn := range turns {
			if prev, dup := turnOf[turn.EventID]; dup {
				t.Errorf("session %v: event %d committed as turns %d and %d", key, turn.EventID, prev, turn.TurnNo)
			}
			turnOf[turn.EventID] = turn.TurnNo
		}
		status := map[int64]store.EventStatus{}
		for _, e := range evs {
			status[e.ID] = e.Status
		}
		for _, e := range evs {
			if e.SteerOf != 0 && e.Status == store.EventDone && status[e.SteerOf] != store.EventDone {
				t.Errorf("steer %d is done but its event %d is %s", e.ID, e.SteerOf, status[e.SteerOf])
			}
			if ss.Status == store.SessionDestroyed && e.Status == store.EventOpen {
				t.Errorf("destroyed session %v has open event %d", key, e.ID)
			}
		}
		if ss.OpenEvents != int64(countStatus(evs, store.EventOpen)) ||
			ss.DeadLetters != int64(countStatus(evs, store.EventDeadLetter)) {
			t.Errorf("session %v counters %+v disagree with its events", key, ss)
		}
	}
	// Close both stores so that their backends exit (flushing their
	// statistics), then read the server's deadlock counter.
	for _, s := range stores {
		_ = s.Close()
	}
	if n := deadlocks(t, dsn); n != 0 {
		t.Fatalf("PostgreSQL detected %d deadlocks", n)
	}
}

func countStatus(evs []store.Event, st store.EventStatus) int {
	n := 0
	for _, e := range evs {
		if e.Status == st {
			n++
		}
	}
	return n
}

// deadlocks returns pg_stat_database.deadlocks of the dsn's database once
// no other backend is connected to it.
func deadlocks(t *testing.T, dsn string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	must(t, err, "Connect")
	defer conn.Close(context.Background())
	for {
		var others int
		must(t, conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&others), "pg_stat_activity")
		if others == 0 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d backends still connected", others)
		case <-time.After(20 * time.Millisecond):
		}
	}
	var n int64
	must(t, conn.QueryRow(ctx, `SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()`).Scan(&n),
		"pg_stat_database")
	return n
}
