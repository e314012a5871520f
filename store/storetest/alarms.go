package storetest

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

func alarmCases() []testCase {
	return []testCase{
		{"Alarms/CommitSetsReplacesAndClearsByName", testAlarmsCommit},
		{"Alarms/FireDueAlarmsFiresADueAlarmOnce", testAlarmFireOnce},
		{"Alarms/RaceOf8Over200DueAlarmsFiresEachOnce", testAlarmRace},
		{"Alarms/MissedRepeatingAlarmFiresOnceAndIsRescheduledAfterNow", testAlarmRepeating},
		{"Alarms/ShortAlarmFiresWhenDueByTheDatabaseClock", testAlarmShort},
		{"Alarms/AlarmWakesASleepingSession", testAlarmWakes},
		{"Alarms/DestroyedSessionsAlarmsAreDropped", testAlarmDestroyed},
		{"Alarms/OneCallFiresOldestFirstAcrossSessionsWithinItsLimit", testAlarmBatch},
	}
}

// setAlarms commits a turn that applies ops; the session must have no open
// event and no live activation. The activation is stopped afterwards.
func (b *bundle) setAlarms(key store.ActorKey, ops ...abi.AlarmOp) store.Turn {
	b.t.Helper()
	b.message(key, "set alarms")
	act := b.claim(key, LongTTL)
	turn, err := b.s.CommitTurn(b.ctx, store.CommitTurnParams{
		Ref: b.next(act).Delivery.TurnRef(), Outcome: abi.OutcomeOK, KeepState: true, Alarms: ops,
	})
	noErr(b.t, err, "CommitTurn with alarms")
	noErr(b.t, b.s.StopActivation(b.ctx, act.Ref()), "StopActivation")
	return turn
}

// msAgo is a time d before now on the test's clock, at millisecond
// precision (alarm due times are compared to the DB clock by the store; the
// suite only uses times far from now).
func msAgo(d time.Duration) time.Time { return time.Now().Add(-d).Truncate(time.Millisecond).UTC() }

func (b *bundle) fire(limit int) []store.ActorKey {
	b.t.Helper()
	keys, err := b.s.FireDueAlarms(b.ctx, limit)
	noErr(b.t, err, "FireDueAlarms")
	return keys
}

// alarmEvents returns the session's alarm events.
func (b *bundle) alarmEvents(key store.ActorKey) []store.Event {
	b.t.Helper()
	var out []store.Event
	for _, e := range b.events(key) {
		if e.Kind == abi.EventAlarm {
			out = append(out, e)
		}
	}
	return out
}

type alarmPayload struct {
	Alarm *struct {
		Name  string          `json:"name"`
		DueAt string          `json:"due_at"`
		Data  json.RawMessage `json:"data"`
	} `json:"alarm"`
}

// wantAlarmEvent checks an alarm event's payload and idempotency key.
func wantAlarmEvent(t testing.TB, e store.Event, name string, due time.Time, data string) {
	t.Helper()
	wantEq(t, e.Kind, abi.EventAlarm, "alarm event Kind")
	wantEq(t, e.IdempotencyKey, fmt.Sprintf("alarm:%s:%d", name, due.UnixMilli()), "alarm event IdempotencyKey")
	var p alarmPayload
	if err := json.Unmarshal(e.Payload, &p); err != nil || p.Alarm == nil {
		t.Fatalf("alarm event payload %s: %v", e.Payload, err)
	}
	wantEq(t, p.Alarm.Name, name, "payload alarm.name")
	at, err := time.Parse(time.RFC3339Nano, p.Alarm.DueAt)
	if err != nil || !at.Equal(due) {
		t.Fatalf("payload alarm.due_at = %q (%v), want %v", p.Alarm.DueAt, err, due)
	}
	got := string(p.Alarm.Data)
	if got == "null" {
		got = ""
	}
	if (data == "") != (got == "") || (data != "" && !jsonEqual([]byte(got), []byte(data))) {
		t.Fatalf("payload alarm.data = %s, want %s", got, data)
	}
}

func alarmNames(as []store.Alarm) string {
	var names []string
	for _, a := range as {
		names = append(names, a.Name)
	}
	return fmt.Sprint(names)
}

func testAlarmsCommit(t *testing.T, b *bundle) {
	key := b.session()
	at := time.Now().Add(48 * time.Hour).Truncate(time.Millisecond).UTC()
	turn := b.setAlarms(key,
		abi.AlarmOp{Name: "remind", InMs: 3_600_000, Data: json.RawMessage(`{"n":1}`)},
		abi.AlarmOp{Name: "tick", At: &at, EveryMs: 60_000},
		abi.AlarmOp{Name: "never-set", Clear: true},
	)
	as := b.alarms(key)
	wantEq(t, alarmNames(as), "[remind tick]", "alarms by name")
	remind, tick := as[0], as[1]
	wantEq(t, remind.ActorKey, key, "alarm key")
	if d := remind.DueAt.Sub(remind.SetAt); d < time.Hour-time.Second || d > time.Hour+time.Second {
		t.Fatalf("in_ms 1h: DueAt is %v after SetAt", d)
	}
	if d := remind.SetAt.Sub(turn.CommittedAt).Abs(); d > time.Second {
		t.Fatalf("SetAt %v is %v from the commit", remind.SetAt, d)
	}
	wantEq(t, remind.EveryMs, int64(0), "one-shot EveryMs")
	if !jsonEqual(remind.Data, []byte(`{"n":1}`)) {
		t.Fatalf("Data = %s", remind.Data)
	}
	wantEq(t, tick.DueAt.Equal(at), true, fmt.Sprintf("At alarm DueAt %v == %v", tick.DueAt, at))
	wantEq(t, tick.EveryMs, int64(60_000), "EveryMs")

	b.setAlarms(key,
		abi.AlarmOp{Name: "remind", InMs: 7_200_000, Data: json.RawMessage(`{"n":2}`)},
		abi.AlarmOp{Name: "tick", Clear: true},
		abi.AlarmOp{Name: "alpha", At: &at},
	)
	as = b.alarms(key)
	wantEq(t, alarmNames(as), "[alpha remind]", "alarms after replace and clear")
	replaced := as[1]
	if d := replaced.DueAt.Sub(replaced.SetAt); d < 2*time.Hour-time.Second || d > 2*time.Hour+time.Second {
		t.Fatalf("replaced alarm: DueAt is %v after SetAt, want 2h", d)
	}
	if !jsonEqual(replaced.Data, []byte(`{"n":2}`)) {
		t.Fatalf("replaced Data = %s", replaced.Data)
	}
	if replaced.SetAt.Before(remind.SetAt) {
		t.Fatalf("replaced SetAt %v before the first %v", replaced.SetAt, remind.SetAt)
	}
	wantEq(t, len(b.alarms(b.session())), 0, "another session's alarms")
	wantEq(t, len(b.fire(100)), 0, "nothing due")
}

func testAlarmFireOnce(t *testing.T, b *bundle) {
	key := b.session()
	past := msAgo(time.Hour)
	future := time.Now().Add(time.Hour).Truncate(time.Millisecond).UTC()
	b.setAlarms(key,
		abi.AlarmOp{Name: "ring", At: &past, Data: json.RawMessage(`{"x":"y"}`)},
		abi.AlarmOp{Name: "later", At: &future},
	)
	got := b.fire(100)
	wantEq(t, fmt.Sprint(got), fmt.Sprint([]store.ActorKey{key}), "first FireDueAlarms")
	wantEq(t, len(b.fire(100)), 0, "second FireDueAlarms fires nothing")
	evs := b.alarmEvents(key)
	if len(evs) != 1 {
		t.Fatalf("%d alarm events, want 1", len(evs))
	}
	wantAlarmEvent(t, evs[0], "ring", past, `{"x":"y"}`)
	wantEq(t, evs[0].Status, store.EventOpen, "alarm event Status")
	wantEq(t, alarmNames(b.alarms(key)), "[later]", "a fired one-shot alarm is deleted")

	if !slices.Contains(b.runnable(), key) {
		t.Fatalf("a session with an alarm event is not runnable")
	}
	d := b.next(b.claim(key, LongTTL))
	wantEq(t, d.Event.ID, evs[0].ID, "the alarm event runs")
	turn := b.commit(d.Delivery.TurnRef(), "rang", "")
	wantMessages(t, turn.Messages, abi.RoleAssistant, "rang")
}

func testAlarmRace(t *testing.T, b *bundle) {
	const sessions, perSession = 10, 20
	past := msAgo(time.Hour)
	var keys []store.ActorKey
	for range sessions {
		key := b.session()
		var ops []abi.AlarmOp
		for i := range perSession {
			at := past.Add(time.Duration(i) * time.Millisecond)
			ops = append(ops, abi.AlarmOp{Name: fmt.Sprintf("a%02d", i), At: &at, Data: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))})
		}
		b.setAlarms(key, ops...)
		keys = append(keys, key)
	}
	const racers = 8
	var wg sync.WaitGroup
	var mu sync.Mutex
	fired := map[store.ActorKey]bool{}
	errs := make([]error, racers)
	start := make(chan struct{})
	for r := range racers {
		wg.Go(func() {
			<-start
			for range 100 {
				got, err := b.s.FireDueAlarms(b.ctx, 25)
				if err != nil {
					errs[r] = err
					return
				}
				if len(got) == 0 {
					return
				}
				mu.Lock()
				for _, k := range got {
					fired[k] = true
				}
				mu.Unlock()
			}
		})
	}
	close(start)
	wg.Wait()
	for r, err := range errs {
		noErr(t, err, fmt.Sprintf("racer %d", r))
	}
	for _, k := range b.fire(1000) { // whatever the racers left
		fired[k] = true
	}
	wantEq(t, len(b.fire(1000)), 0, "FireDueAlarms after every alarm fired")
	for _, key := range keys {
		if !fired[key] {
			t.Fatalf("session %s never returned by FireDueAlarms", key)
		}
		wantEq(t, len(b.alarms(key)), 0, "alarms left")
		evs := b.alarmEvents(key)
		if len(evs) != perSession {
			t.Fatalf("session %s has %d alarm events, want %d (each alarm exactly once)", key, len(evs), perSession)
		}
		seen := map[string]bool{}
		for _, e := range evs {
			if seen[e.IdempotencyKey] {
				t.Fatalf("alarm %s fired twice", e.IdempotencyKey)
			}
			seen[e.IdempotencyKey] = true
		}
		for i := range perSession {
			due := past.Add(time.Duration(i) * time.Millisecond)
			name := fmt.Sprintf("a%02d", i)
			k := fmt.Sprintf("alarm:%s:%d", name, due.UnixMilli())
			if !seen[k] {
				t.Fatalf("session %s: alarm %s never fired", key, k)
			}
		}
		wantEq(t, b.getSession(key).EventCount, int64(1+perSession), "EventCount: one set-alarms message and the alarm events")
	}
}

func testAlarmRepeating(t *testing.T, b *bundle) {
	key := b.session()
	const period = 60_000
	at := msAgo(5*time.Minute + 30*time.Second) // five and a half periods ago
	b.setAlarms(key, abi.AlarmOp{Name: "tick", At: &at, EveryMs: period, Data: json.RawMessage(`"beat"`)})
	wantEq(t, fmt.Sprint(b.fire(100)), fmt.Sprint([]store.ActorKey{key}), "FireDueAlarms")
	wantEq(t, len(b.fire(100)), 0, "missed periods coalesce into one firing")
	evs := b.alarmEvents(key)
	if len(evs) != 1 {
		t.Fatalf("%d alarm events, want 1", len(evs))
	}
	wantAlarmEvent(t, evs[0], "tick", at, `"beat"`)
	as := b.alarms(key)
	if len(as) != 1 {
		t.Fatalf("alarms after a repeating firing = %+v, want tick rescheduled", as)
	}
	next := as[0]
	wantEq(t, next.EveryMs, int64(period), "EveryMs")
	if !jsonEqual(next.Data, []byte(`"beat"`)) {
		t.Fatalf("rescheduled Data = %s", next.Data)
	}
	step := next.DueAt.Sub(at)
	if step <= 0 || step%(period*time.Millisecond) != 0 {
		t.Fatalf("next DueAt %v is not the first due time a whole number of periods after %v", next.DueAt, at)
	}
	fireTime := evs[0].AcceptedAt // the DB clock at the firing
	if !next.DueAt.After(fireTime.Add(-time.Millisecond)) || next.DueAt.Sub(fireTime) > period*time.Millisecond {
		t.Fatalf("next DueAt %v is not the first period after the firing at %v", next.DueAt, fireTime)
	}
}

func testAlarmShort(t *testing.T, b *bundle) {
	key := b.session()
	b.setAlarms(key, abi.AlarmOp{Name: "soon", InMs: 150})
	due := b.alarms(key)[0].DueAt
	time.Sleep(150 * time.Millisecond)
	deadline := time.Now().Add(10 * time.Second)
	for len(b.fire(100)) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("an alarm due in 150 ms did not fire within 10 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	evs := b.alarmEvents(key)
	if len(evs) != 1 {
		t.Fatalf("%d alarm events, want 1", len(evs))
	}
	wantAlarmEvent(t, evs[0], "soon", due, "")
	if evs[0].AcceptedAt.Before(due) {
		t.Fatalf("alarm due %v fired at %v (DB clock), before it was due", due, evs[0].AcceptedAt)
	}
}

func testAlarmWakes(t *testing.T, b *bundle) {
	key := b.session()
	b.message(key, "sleep until the alarm")
	act := b.claim(key, LongTTL)
	past := msAgo(time.Minute)
	_, err := b.s.CommitTurn(b.ctx, store.CommitTurnParams{Ref: b.next(act).Delivery.TurnRef(), Outcome: abi.OutcomeSleep,
		Alarms: []abi.AlarmOp{{Name: "wake", At: &past}}})
	noErr(t, err, "CommitTurn sleep with an alarm")
	noErr(t, b.s.StopActivation(b.ctx, act.Ref()), "StopActivation")
	wantSleeping(t, b.getSession(key), "agent", "after the sleep outcome")
	if slices.Contains(b.runnable(), key) {
		t.Fatalf("a sleeping session is runnable")
	}

	wantEq(t, fmt.Sprint(b.fire(100)), fmt.Sprint([]store.ActorKey{key}), "FireDueAlarms")
	wantActive(t, b.getSession(key), "after the alarm fired")
	if !slices.Contains(b.runnable(), key) {
		t.Fatalf("the woken session is not runnable")
	}
	d := b.next(b.claim(key, LongTTL))
	wantEq(t, d.Event.Kind, abi.EventAlarm, "the alarm event runs")
}

func testAlarmDestroyed(t *testing.T, b *bundle) {
	key := b.session()
	live := b.session()
	past := msAgo(time.Hour)
	b.setAlarms(key, abi.AlarmOp{Name: "orphan", At: &past})
	b.setAlarms(live, abi.AlarmOp{Name: "kept", At: &past})
	_, err := b.s.DestroySession(b.ctx, key)
	noErr(t, err, "DestroySession")
	wantEq(t, len(b.alarms(key)), 0, "alarms of a destroyed session")
	before := b.snapshot(key)
	wantEq(t, fmt.Sprint(b.fire(100)), fmt.Sprint([]store.ActorKey{live}), "FireDueAlarms fires only the live session's")
	b.sameSnapshot(key, before, "FireDueAlarms on a destroyed session")
	wantEq(t, len(b.alarmEvents(key)), 0, "alarm events of the destroyed session")
}

// testAlarmBatch: FireDueAlarms fires the oldest due alarms first, of any
// sessions, at most limit of them per call, each once, waking a sleeping
// session and moving a repeating alarm past now in the same call, and
// returns each key that got an event once.
func testAlarmBatch(t *testing.T, b *bundle) {
	sleeper, two, three := b.session(), b.session(), b.session()
	due := func(s int) time.Time { return msAgo(time.Duration(s) * time.Second) }
	dWake, dOnce, dRep, dX1, dX2, dX3 := due(60), due(50), due(40), due(30), due(20), due(10)
	b.message(sleeper, "sleep until the alarm")
	act := b.claim(sleeper, LongTTL)
	_, err := b.s.CommitTurn(b.ctx, store.CommitTurnParams{Ref: b.next(act).Delivery.TurnRef(), Outcome: abi.OutcomeSleep,
		Alarms: []abi.AlarmOp{{Name: "wake", At: &dWake}}})
	noErr(t, err, "CommitTurn sleep with an alarm")
	noErr(t, b.s.StopActivation(b.ctx, act.Ref()), "StopActivation")
	b.setAlarms(two, abi.AlarmOp{Name: "once", At: &dOnce}, abi.AlarmOp{Name: "rep", At: &dRep, EveryMs: 3_600_000})
	b.setAlarms(three, abi.AlarmOp{Name: "x1", At: &dX1}, abi.AlarmOp{Name: "x2", At: &dX2}, abi.AlarmOp{Name: "x3", At: &dX3})

	got := b.fire(4) // wake, once, rep, x1
	slices.SortFunc(got, func(x, y store.ActorKey) int { return strings.Compare(x.String(), y.String()) })
	want := []store.ActorKey{sleeper, two, three}
	slices.SortFunc(want, func(x, y store.ActorKey) int { return strings.Compare(x.String(), y.String()) })
	wantEq(t, fmt.Sprint(got), fmt.Sprint(want), "keys of the first call (each once)")
	wantEq(t, len(b.alarmEvents(three)), 1, "alarm events of the third session after a call limited to 4")
	wantActive(t, b.getSession(sleeper), "the sleeper after its alarm fired")
	wantEq(t, fmt.Sprint(b.fire(100)), fmt.Sprint([]store.ActorKey{three}), "keys of the second call")
	wantEq(t, len(b.fire(100)), 0, "a third call fires nothing")

	for _, c := range []struct {
		key   store.ActorKey
		names []string
		dues  []time.Time
	}{
		{sleeper, []string{"wake"}, []time.Time{dWake}},
		{two, []string{"once", "rep"}, []time.Time{dOnce, dRep}},
		{three, []string{"x1", "x2", "x3"}, []time.Time{dX1, dX2, dX3}},
	} {
		evs := b.alarmEvents(c.key)
		if len(evs) != len(c.names) {
			t.Fatalf("session %s: %d alarm events, want %d", c.key, len(evs), len(c.names))
		}
		for i, e := range evs {
			wantAlarmEvent(t, e, c.names[i], c.dues[i], "")
		}
	}
	left := b.alarms(two)
	if len(left) != 1 || left[0].Name != "rep" || !left[0].DueAt.Equal(dRep.Add(time.Hour)) {
		t.Fatalf("alarms of the second session after the burst: %+v, want rep due %v", left, dRep.Add(time.Hour))
	}
	wantEq(t, len(b.alarms(sleeper))+len(b.alarms(three)), 0, "one-shot alarms left")
}
