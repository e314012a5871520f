package storetest

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

func eventCases() []testCase {
	return []testCase{
		{"Events/AppendAssignsSeqStoresPayloadVerbatimListPages", testAppendEvent},
		{"Events/UnknownSessionNotFound", testAppendUnknownSession},
		{"Invariant7/IdempotencyKeyReturnsFirstEvent", testIdempotency},
		{"Invariant7/IdempotencyKeyRaceCreatesOne", testIdempotencyRace},
		{"Invariant7/ReusedKeyIsTheSameSignalByMeaning", testIdempotencyByMeaning},
		{"Subscribe/WakesOnAppendClosesWithContext", testSubscribe},
		{"Subscribe/EchoesTellOwnAppends", testSubscribeEchoes},
	}
}

func testAppendEvent(t *testing.T, b *bundle) {
	key := b.session()
	payload := json.RawMessage(`{"message": "hello", "data": {"n": 1, "tags": ["a", "b"]}}`)
	var evs []store.Event
	for i := range 3 {
		ev, created, err := b.s.AppendEvent(b.ctx, store.AppendEventParams{Key: key, Kind: "message", Payload: payload})
		noErr(t, err, "AppendEvent")
		wantEq(t, created, true, "created")
		wantEq(t, ev.Seq, int64(i+1), "Seq")
		wantEq(t, ev.ActorKey, key, "ActorKey")
		wantEq(t, ev.Kind, "message", "Kind")
		wantEq(t, ev.Status, store.EventOpen, "Status")
		wantEq(t, ev.Attempts, 0, "Attempts")
		wantEq(t, ev.Binding, "", "Binding before the first attempt")
		if ev.AcceptedAt.IsZero() || ev.NextAttemptAt.Before(ev.AcceptedAt.Add(-time.Millisecond)) ||
			ev.NextAttemptAt.After(ev.AcceptedAt.Add(time.Second)) {
			t.Fatalf("a new event is due when accepted: accepted %v, next attempt %v", ev.AcceptedAt, ev.NextAttemptAt)
		}
		if ev.ClosedAt != nil {
			t.Fatalf("a new event has ClosedAt %v", ev.ClosedAt)
		}
		if !jsonEqual(ev.Payload, payload) {
			t.Fatalf("Payload = %s, want %s", ev.Payload, payload)
		}
		if i > 0 && ev.ID <= evs[i-1].ID {
			t.Fatalf("event ids do not increase: %d after %d", ev.ID, evs[i-1].ID)
		}
		evs = append(evs, ev)
	}

	all := b.events(key)
	wantEq(t, len(all), 3, "ListEvents")
	for i, ev := range all {
		wantEq(t, ev.ID, evs[i].ID, fmt.Sprintf("ListEvents[%d].ID", i))
		if !jsonEqual(ev.Payload, payload) {
			t.Fatalf("listed Payload = %s, want %s", ev.Payload, payload)
		}
	}
	page, err := b.s.ListEvents(b.ctx, store.ListEventsParams{Key: key, After: evs[0].ID, Limit: 1})
	noErr(t, err, "ListEvents page")
	if len(page) != 1 || page[0].ID != evs[1].ID {
		t.Fatalf("ListEvents after %d limit 1 = %+v, want event %d", evs[0].ID, page, evs[1].ID)
	}

	// Commit the first to check the status filter.
	act := b.claim(key, LongTTL)
	b.commit(b.next(act).Delivery.TurnRef(), "ok", "")
	open, err := b.s.ListEvents(b.ctx, store.ListEventsParams{Key: key, Status: store.EventOpen})
	noErr(t, err, "ListEvents open")
	wantEq(t, len(open), 2, "open events")
	done, err := b.s.ListEvents(b.ctx, store.ListEventsParams{Key: key, Status: store.EventDone})
	noErr(t, err, "ListEvents done")
	if len(done) != 1 || done[0].ID != evs[0].ID || done[0].ClosedAt == nil {
		t.Fatalf("done events = %+v, want event %d closed", done, evs[0].ID)
	}
	other := b.session()
	if got := b.events(other); len(got) != 0 {
		t.Fatalf("another session lists %d events", len(got))
	}
}

func testAppendUnknownSession(t *testing.T, b *bundle) {
	_, _, err := b.s.AppendEvent(b.ctx, store.AppendEventParams{
		Key: store.ActorKey{AgentUID: b.agent.UID, SessionID: "missing"}, Kind: "message", Payload: json.RawMessage(`{}`),
	})
	wantIs(t, err, store.ErrNotFound, "AppendEvent to an unknown session")
}

// testIdempotencyByMeaning: the event a reused idempotency key returns is
// the same signal (store.SameSignal, decided by canonical JSON) as a
// re-send whose payload differs only in key order, spacing or number
// spelling, on every driver (PostgreSQL's jsonb gives back its own
// formatting), and not the same as a re-send that means something else.
func testIdempotencyByMeaning(t *testing.T, b *bundle) {
	key := b.session()
	sent := []string{`{"data":{"a":1,"b":2}}`, `{"data":{"b":2,"a":1}}`, `{ "data": { "b": 2.0, "a": 1 } }`}
	for i, first := range sent {
		idem := fmt.Sprintf("req-%d", i)
		ev, created, err := b.s.AppendEvent(b.ctx, store.AppendEventParams{Key: key, Kind: "message",
			Payload: json.RawMessage(first), IdempotencyKey: idem})
		noErr(t, err, "first AppendEvent")
		wantEq(t, created, true, "first created")
		for _, again := range sent {
			got, created, err := b.s.AppendEvent(b.ctx, store.AppendEventParams{Key: key, Kind: "message",
				Payload: json.RawMessage(again), IdempotencyKey: idem})
			noErr(t, err, "repeated AppendEvent")
			wantEq(t, created, false, "repeat created")
			wantEq(t, got.ID, ev.ID, "repeat returns the first event")
			if !store.SameSignal(got, "message", []byte(again)) {
				t.Fatalf("key %s first sent %s, returned %s: not the same signal as the re-send %s", idem, first, got.Payload, again)
			}
		}
		got, _, err := b.s.AppendEvent(b.ctx, store.AppendEventParams{Key: key, Kind: "message",
			Payload: json.RawMessage(`{"data":{"a":1,"b":3}}`), IdempotencyKey: idem})
		noErr(t, err, "AppendEvent of another signal under a used key")
		if store.SameSignal(got, "message", []byte(`{"data":{"a":1,"b":3}}`)) || store.SameSignal(got, "steer", []byte(first)) {
			t.Fatalf("key %s: returned %s %s is the same signal as a different one", idem, got.Kind, got.Payload)
		}
	}
}

func testIdempotency(t *testing.T, b *bundle) {
	key := b.session()
	p := store.AppendEventParams{Key: key, Kind: "message", Payload: json.RawMessage(`{"message":"once"}`), IdempotencyKey: "req-1"}
	first, created, err := b.s.AppendEvent(b.ctx, p)
	noErr(t, err, "first AppendEvent")
	wantEq(t, created, true, "first created")
	wantEq(t, first.IdempotencyKey, "req-1", "IdempotencyKey")

	p.Payload = json.RawMessage(`{"message":"twice"}`) // a re-send never replaces the first
	again, created, err := b.s.AppendEvent(b.ctx, p)
	noErr(t, err, "repeated AppendEvent")
	wantEq(t, created, false, "repeat created")
	wantEq(t, again.ID, first.ID, "repeat returns the first event")
	wantEq(t, again.Seq, first.Seq, "repeat Seq")
	if !jsonEqual(again.Payload, []byte(`{"message":"once"}`)) {
		t.Fatalf("repeat payload = %s, want the first one", again.Payload)
	}

	// Still the first after it was processed.
	act := b.claim(key, LongTTL)
	b.commit(b.next(act).Delivery.TurnRef(), "ok", "")
	done, created, err := b.s.AppendEvent(b.ctx, p)
	noErr(t, err, "AppendEvent after commit")
	wantEq(t, created, false, "repeat after commit created")
	wantEq(t, done.ID, first.ID, "repeat after commit returns the first event")
	wantEq(t, done.Status, store.EventDone, "first event status")

	p.IdempotencyKey = "req-2"
	second, created, err := b.s.AppendEvent(b.ctx, p)
	noErr(t, err, "AppendEvent new key")
	wantEq(t, created, true, "new key created")
	wantEq(t, second.Seq, first.Seq+1, "new key Seq")

	// Keys are scoped to the session.
	otherKey := b.session()
	p.Key, p.IdempotencyKey = otherKey, "req-1"
	other, created, err := b.s.AppendEvent(b.ctx, p)
	noErr(t, err, "same key in another session")
	wantEq(t, created, true, "same key in another session created")
	wantEq(t, other.Seq, int64(1), "other session Seq")
	wantEq(t, b.getSession(key).EventCount, int64(2), "EventCount")
}

func testIdempotencyRace(t *testing.T, b *bundle) {
	key := b.session()
	const n = 16
	evs := make([]store.Event, n)
	created := make([]bool, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			evs[i], created[i], errs[i] = b.s.AppendEvent(b.ctx, store.AppendEventParams{
				Key: key, Kind: "message", Payload: json.RawMessage(`{"message":"race"}`), IdempotencyKey: "same",
			})
		})
	}
	close(start)
	wg.Wait()
	creators := 0
	for i := range n {
		noErr(t, errs[i], fmt.Sprintf("racer %d", i))
		if created[i] {
			creators++
		}
		wantEq(t, evs[i].ID, evs[0].ID, fmt.Sprintf("racer %d event", i))
	}
	wantEq(t, creators, 1, "racers that created")
	wantEq(t, len(b.events(key)), 1, "events after the race")
	wantEq(t, b.getSession(key).EventCount, int64(1), "EventCount after the race")
}

func testSubscribe(t *testing.T, b *bundle) {
	ctx, cancel := context.WithCancel(b.ctx)
	ch, err := b.s.Subscribe(ctx)
	noErr(t, err, "Subscribe")
	key := b.session()
	b.message(key, "wake up")
	timeout := time.After(10 * time.Second)
	for got := false; !got; {
		select {
		case k, ok := <-ch:
			if !ok {
				t.Fatalf("subscription closed before the wake-up")
			}
			got = k == key
		case <-timeout:
			t.Fatalf("no wake-up for %s within 10 s", key)
		}
	}
	cancel()
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("subscription still open 10 s after its context ended")
		}
	}
}

// testSubscribeEchoes: a store.EchoSubscriber marks the wake-up of an
// event appended through the same Store value by AppendEvent or Steer
// with the event's seq, and any other wake-up (here a sleeping session
// woken) with 0; an idempotent re-send appends nothing and notifies
// nothing; Subscribe, on the same wake-ups, sees just the key.
func testSubscribeEchoes(t *testing.T, b *bundle) {
	es, ok := b.s.(store.EchoSubscriber)
	if !ok {
		t.Skip("the store does not tell its own appends' wake-ups")
	}
	echoes, err := es.SubscribeEchoes(b.ctx)
	noErr(t, err, "SubscribeEchoes")
	keys, err := b.s.Subscribe(b.ctx)
	noErr(t, err, "Subscribe")
	key := b.session()
	// next takes the next wake-up of key from each channel (others'
	// sessions may share the channel: skipped).
	next := func(what string, want store.Wakeup) {
		t.Helper()
		timeout := time.After(30 * time.Second)
		for {
			select {
			case w := <-echoes:
				if w.Key != key {
					continue
				}
				if w != want {
					t.Fatalf("%s: wake-up %+v, want %+v", what, w, want)
				}
			case <-timeout:
				t.Fatalf("%s: no wake-up within 30 s", what)
			}
			break
		}
		for {
			select {
			case k := <-keys:
				if k != key {
					continue
				}
			case <-timeout:
				t.Fatalf("%s: Subscribe got nothing within 30 s", what)
			}
			return
		}
	}
	msg := json.RawMessage(`{"message":"m"}`)
	e, _, err := b.s.AppendEvent(b.ctx, store.AppendEventParams{Key: key, Kind: abi.EventMessage, Payload: msg, IdempotencyKey: "k"})
	noErr(t, err, "AppendEvent")
	next("append", store.Wakeup{Key: key, EchoSeq: e.Seq})
	_, created, err := b.s.AppendEvent(b.ctx, store.AppendEventParams{Key: key, Kind: abi.EventMessage, Payload: msg, IdempotencyKey: "k"})
	noErr(t, err, "AppendEvent re-sent")
	wantEq(t, created, false, "a re-send created")
	st, err := b.s.Steer(b.ctx, store.SteerParams{Key: key, Payload: msg, DeliveryID: "steer-" + key.SessionID})
	noErr(t, err, "Steer")
	next("steer (the re-send before it notified nothing)", store.Wakeup{Key: key, EchoSeq: st.Event.Seq})
	_, err = b.s.SleepSession(b.ctx, store.SleepSessionParams{Key: key, Reason: "agent"})
	noErr(t, err, "SleepSession")
	_, err = b.s.WakeSession(b.ctx, key)
	noErr(t, err, "WakeSession")
	next("wake", store.Wakeup{Key: key})
}
