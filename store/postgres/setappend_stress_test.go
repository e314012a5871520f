package postgres_test

import (
	"context"
	"fmt"
	"math/rand/v2"
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

// TestSetAppendStressTwoHosts: many concurrent AppendEvent callers on two
// Store values of one database (several callers per session, so that a
// batch holds several appends to one session; idempotency keys shared by
// the callers of both stores, so that they race), while turn loops on
// both stores dispatch and commit, sessions are put to sleep and the alarm
// sweep runs. No deadlock is detected by the server; every session's seqs
// are contiguous and match last_event_seq; every key is one event, and
// every caller of a key got that event; every acknowledged payload is
// there once; the set append did run.
func TestSetAppendStressTwoHosts(t *testing.T) {
	// Not parallel: the deadlock count is the database's, and this test's
	// must be alone in it.
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	admin, err := pgx.Connect(ctx, dsn)
	must(t, err, "Connect")
	defer admin.Close(ctx)
	var deadlocks0 int64
	must(t, admin.QueryRow(ctx, `SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()`).Scan(&deadlocks0), "deadlocks")

	sets := &setAppendTracer{}
	s1, err := postgres.Open(ctx, dsn, postgres.WithTracer(sets))
	must(t, err, "Open")
	t.Cleanup(func() { _ = s1.Close() })
	s2, err := postgres.Open(ctx, dsn, postgres.WithTracer(sets))
	must(t, err, "Open")
	t.Cleanup(func() { _ = s2.Close() })
	stores := []*postgres.Store{s1, s2}

	f := newFixtureOn(t, s1)
	acts := liveSessions(f, 10)
	keys := []store.ActorKey{}
	for _, a := range acts {
		keys = append(keys, a.ActorKey)
	}
	var idle []store.ActorKey // no activation: put to sleep now and then
	for _, id := range []string{"Zz", "aa", "a-b", "a_B", "A", "b", "\u00e9t\u00e9", "z", "0", "~"} {
		ss, _, err := s1.CreateSession(ctx, store.CreateSessionParams{AgentUID: f.key.AgentUID, SessionID: id})
		must(t, err, "CreateSession")
		idle = append(idle, ss.ActorKey)
	}
	keys = append(keys, idle...)

	type idemKey struct {
		key  store.ActorKey
		idem string
	}
	var mu sync.Mutex
	acked := map[string]bool{}
	byIdem := map[idemKey]map[int64]bool{}
	var errs, calls atomic.Int64
	stop, cancelStop := context.WithTimeout(ctx, 5*time.Second)
	defer cancelStop()
	var wg sync.WaitGroup
	for si, s := range stores {
		for ki, key := range keys {
			for w := range 3 {
				wg.Go(func() {
					for j := 0; stop.Err() == nil; j++ {
						payload := fmt.Sprintf(`{"message": "s%d-k%d-w%d-%d"}`, si, ki, w, j)
						p := store.AppendEventParams{Key: key, Kind: abi.EventMessage, Payload: []byte(payload)}
						if j%3 == 0 {
							p.IdempotencyKey = fmt.Sprintf("k%d", j/3) // shared by every caller of the session
						}
						if j%4 == 1 {
							p.Audit = &store.AppendAuditParams{TokenID: "tok", Action: "signal.send", Object: payload, Result: "ok", Status: 202}
						}
						cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
						e, created, err := s.AppendEvent(cctx, p)
						cancel()
						calls.Add(1)
						if err != nil {
							errs.Add(1)
							t.Errorf("append: %v", err)
							continue
						}
						mu.Lock()
						if p.IdempotencyKey != "" {
							k := idemKey{key, p.IdempotencyKey}
							if byIdem[k] == nil {
								byIdem[k] = map[int64]bool{}
							}
							byIdem[k][e.ID] = true
						}
						if created {
							acked[payload] = true
						}
						mu.Unlock()
					}
				})
			}
		}
	}
	var turns atomic.Int64
	for i, a := range acts {
		s := stores[i%2]
		wg.Go(func() {
			for stop.Err() == nil {
				d, err := s.NextDelivery(ctx, store.NextDeliveryParams{Activation: a.Ref(), DeliveryID: uuid.NewString(),
					Binding: "sha256:test", MarkSent: true})
				if err != nil {
					time.Sleep(time.Millisecond)
					continue
				}
				if _, err := s.CommitTurn(ctx, store.CommitTurnParams{Ref: d.Delivery.TurnRef(), Outcome: abi.OutcomeOK,
					KeepState: true, Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "reply"}},
					Payloads: []string{string(d.Event.Payload)}}); err != nil {
					t.Errorf("commit: %v", err)
					continue
				}
				turns.Add(1)
			}
		})
	}
	wg.Go(func() {
		for stop.Err() == nil {
			key := idle[rand.IntN(len(idle))]
			_, _ = stores[rand.IntN(2)].SleepSession(ctx, store.SleepSessionParams{Key: key, Reason: "idle"})
			_, _ = stores[rand.IntN(2)].FireDueAlarms(ctx, 100)
			time.Sleep(time.Millisecond)
		}
	})
	waitAll(t, &wg, "stress")

	time.Sleep(1500 * time.Millisecond) // the backends flush their statistics
	var deadlocks int64
	must(t, admin.QueryRow(ctx, `SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()`).Scan(&deadlocks), "deadlocks")
	if deadlocks != deadlocks0 {
		t.Errorf("the server detected %d deadlocks", deadlocks-deadlocks0)
	}
	setAppends, setRows := sets.sets.Load(), sets.held.Load()
	if setAppends == 0 {
		t.Errorf("no set append ran")
	}
	t.Logf("%d appends (%d errors), %d acknowledged, %d turns; %d set appends of %d events; %d keys",
		calls.Load(), errs.Load(), len(acked), turns.Load(), setAppends, setRows, len(byIdem))

	seen := map[string]int{}
	for _, key := range keys {
		evs := allPages(t, "ListEvents", func(after int64) ([]store.Event, error) {
			return s1.ListEvents(ctx, store.ListEventsParams{Key: key, After: after, Limit: 1000})
		}, func(e store.Event) int64 { return e.ID })
		var last int64
		must(t, admin.QueryRow(ctx, `SELECT last_event_seq FROM sessions WHERE agent_uid = $1 AND session_id = $2`,
			key.AgentUID, key.SessionID).Scan(&last), "last_event_seq")
		if int64(len(evs)) != last {
			t.Errorf("session %s: %d events, last_event_seq %d", key.SessionID, len(evs), last)
		}
		keyed := map[string]int64{}
		for j, e := range evs {
			if e.Seq != int64(j+1) {
				t.Fatalf("session %s event %d has seq %d", key.SessionID, j, e.Seq)
			}
			seen[string(e.Payload)]++
			if e.IdempotencyKey != "" {
				keyed[e.IdempotencyKey] = e.ID
			}
		}
		for k, ids := range byIdem {
			if k.key != key {
				continue
			}
			if len(ids) != 1 || !ids[keyed[k.idem]] {
				t.Errorf("session %s key %s: callers got events %v, stored %d", key.SessionID, k.idem, ids, keyed[k.idem])
			}
		}
	}
	for p := range acked {
		if seen[p] != 1 {
			t.Errorf("acknowledged %s is there %d times", p, seen[p])
		}
	}
	var events, audits int64
	must(t, admin.QueryRow(ctx, `SELECT (SELECT count(*) FROM actor_events), (SELECT count(*) FROM audit_log WHERE action = 'signal.send')`).Scan(&events, &audits), "counts")
	var auditedEvents int64
	must(t, admin.QueryRow(ctx, `SELECT count(*) FROM audit_log a JOIN actor_events e ON e.payload = a.object`).Scan(&auditedEvents), "audited")
	if auditedEvents != audits {
		t.Errorf("%d audit rows of appends, %d of them for a stored event", audits, auditedEvents)
	}
	var dupAudits int64
	must(t, admin.QueryRow(ctx, `SELECT count(*) FROM (SELECT object FROM audit_log WHERE action = 'signal.send' GROUP BY object HAVING count(*) > 1) d`).Scan(&dupAudits), "dup audits")
	if dupAudits != 0 {
		t.Errorf("%d payloads audited twice", dupAudits)
	}
}
