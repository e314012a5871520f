package host_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/store/pgtest"
	"github.com/paddock-dev/paddock/store/postgres"
)

// failing always fails its turn with an error outcome.
func failing(_ context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
	return nil, fmt.Errorf("crash on %q (attempt %d)", req.Event.Message, req.Attempt)
}

// sessionWith creates a session with a crash policy.
func (f *fixture) sessionWith(a store.Agent, policy store.CrashPolicy) store.ActorKey {
	f.t.Helper()
	s, _, err := f.st.CreateSession(context.Background(), store.CreateSessionParams{AgentUID: a.UID, SessionID: a.Name + "-" + string(policy) + fmt.Sprint(time.Now().UnixNano()), CrashPolicy: policy})
	if err != nil {
		f.t.Fatal(err)
	}
	return s.ActorKey
}

func TestCrashPolicyRestartRetriesWithGrowingDelaysThenDeadLettersAndRedriveRunsAgain(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		var fail atomic.Bool
		fail.Store(true)
		var starts []time.Time
		var mu sync.Mutex
		agentFn := func(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
			mu.Lock()
			starts = append(starts, time.Now())
			mu.Unlock()
			if fail.Load() {
				return failing(ctx, req)
			}
			return counter(ctx, req)
		}
		pol := testPolicy()
		pol.BackoffMin, pol.BackoffMax = 100*time.Millisecond, 2*time.Second
		f := start(t, st, map[string]abi.TurnFunc{"f": agentFn}, pol)
		key := f.sessionWith(f.agent("f"), store.CrashRestart)
		f.signal(key, "boom")
		f.waitFor("the dead letter", func() bool { return f.get(key).DeadLetters == 1 })
		mu.Lock()
		if len(starts) != 3 {
			t.Fatalf("%d attempts, want 3 (max_attempts)", len(starts))
		}
		d1, d2 := starts[1].Sub(starts[0]), starts[2].Sub(starts[1])
		mu.Unlock()
		// Lower bounds only (a loaded machine adds delay, never removes
		// it): the second retry waits at least the doubled backoff. The
		// growth itself is TestBackoffIsBoundedExponentialWithJitter's.
		if d1 < 80*time.Millisecond || d2 < 160*time.Millisecond {
			t.Errorf("retry delays %v then %v: want ≥ 80 ms (backoff_min 100 ms −20%% jitter) then ≥ 160 ms", d1, d2)
		}
		dls, err := st.ListDeadLetters(context.Background(), store.ListDeadLettersParams{AgentUID: key.AgentUID, Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		if len(dls) != 1 || len(dls[0].Errors) != 3 || !strings.Contains(dls[0].Errors[2].Error, "attempt 3") {
			t.Fatalf("dead letters = %+v, want one with a 3-entry error chain", dls)
		}
		if s := f.get(key); s.Status != store.SessionActive {
			t.Errorf("restart policy left the session %s", s.Status)
		}
		lastFailed := dls[0].Errors[2].ActorEpoch
		fail.Store(false)
		if _, err := st.RedriveEvent(context.Background(), key, dls[0].Event.ID); err != nil {
			t.Fatal(err)
		}
		f.h.Ensure(key)
		f.waitFor("the redriven event to commit", func() bool { return f.get(key).TurnCount == 1 })
		tr := f.transcript(key)[0]
		if tr.ActorEpoch <= lastFailed {
			t.Errorf("redrive committed under epoch %d, not above the last failed attempt's %d", tr.ActorEpoch, lastFailed)
		}
	})
}

func TestCrashPolicySleepParksTheSessionAndASignalWakesAndRetries(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		var fail atomic.Bool
		fail.Store(true)
		fn := func(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
			if fail.Load() {
				return failing(ctx, req)
			}
			return counter(ctx, req)
		}
		f := start(t, st, map[string]abi.TurnFunc{"f": fn}, testPolicy())
		key := f.sessionWith(f.agent("f"), store.CrashSleep)
		f.signal(key, "first")
		f.waitFor("the session to sleep", func() bool { return f.get(key).Status == store.SessionSleeping })
		s := f.get(key)
		if s.SleepTS == nil || s.SleepReason != "crash" || s.OpenEvents != 1 {
			t.Fatalf("sleeping session: %+v, want sleep_ts, reason crash and its event still open", s)
		}
		// Sleeping holds no controller; nothing runs until a signal.
		f.waitFor("the controller to go", func() bool { return !f.h.Running(key) })
		fail.Store(false)
		f.signal(key, "second")
		f.waitFor("both events to commit", func() bool { return f.get(key).TurnCount == 2 })
		turns := f.transcript(key)
		if turns[0].Messages[0].Content != "first" || turns[1].Messages[0].Content != "second" {
			t.Errorf("after wake the events ran out of order: %q, %q", turns[0].Messages[0].Content, turns[1].Messages[0].Content)
		}
		if s := f.get(key); s.Status != store.SessionActive || s.SleepTS != nil {
			t.Errorf("woken session: %+v", s)
		}
	})
}

func TestCrashPolicyDestroyDestroysTheSessionAndRefusesLaterSignals(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		f := start(t, st, map[string]abi.TurnFunc{"f": failing}, testPolicy())
		key := f.sessionWith(f.agent("f"), store.CrashDestroy)
		payload, _ := json.Marshal(map[string]string{"message": "x"})
		for i := range 3 {
			// The first append's store wake-up may already run (and fail)
			// the turn and destroy the session before the later appends.
			_, _, err := st.AppendEvent(context.Background(), store.AppendEventParams{Key: key, Kind: abi.EventMessage, Payload: payload})
			if i > 0 && errors.Is(err, store.ErrSessionDestroyed) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		f.h.Ensure(key)
		f.waitFor("the session to be destroyed", func() bool { return f.get(key).Status == store.SessionDestroyed })
		for _, e := range f.events(key) {
			if e.Status != store.EventDiscarded {
				t.Errorf("event %d of a destroyed session is %s, want discarded", e.ID, e.Status)
			}
		}
		_, _, err := st.AppendEvent(context.Background(), store.AppendEventParams{Key: key, Kind: abi.EventMessage, Payload: payload})
		if !errors.Is(err, store.ErrSessionDestroyed) {
			t.Errorf("signal to a destroyed session: %v, want ErrSessionDestroyed", err)
		}
	})
}

func TestDeadLetterPolicyBlockHoldsLaterEventsUntilDiscarded(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		fn := func(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
			if req.Event.Message == "poison" {
				return failing(ctx, req)
			}
			return counter(ctx, req)
		}
		pol := testPolicy()
		pol.Agents = map[string]host.AgentPolicy{}
		f := start(t, st, map[string]abi.TurnFunc{"f": fn}, pol)
		a := f.agent("f")
		blocking := pol.AgentPolicy
		blocking.BlockOnDeadLetter = true
		p := *f.h.Policy()
		p.Agents = map[string]host.AgentPolicy{a.Name: blocking}
		f.h.SetPolicy(p) // a per-agent override, as a config reload would set it
		key := f.session(a)
		f.signal(key, "poison")
		f.signal(key, "after")
		f.waitFor("the dead letter", func() bool { return f.get(key).DeadLetters == 1 })
		time.Sleep(300 * time.Millisecond) // several scan intervals: the later event must not run
		if n := f.get(key).TurnCount; n != 0 {
			t.Fatalf("%d turns ran behind a dead letter with policy block", n)
		}
		dl := f.events(key)[0]
		if _, err := st.DiscardEvent(context.Background(), key, dl.ID); err != nil {
			t.Fatal(err)
		}
		f.h.Ensure(key)
		f.waitFor("the held event to run", func() bool { return f.get(key).TurnCount == 1 })
	})
}

// blocker runs until released or cancelled, then answers.
type blocker struct {
	started chan string
	release chan struct{}
}

func (b *blocker) fn(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
	b.started <- req.Event.Message
	select {
	case <-b.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return counter(ctx, req)
}

func TestCapacityQueuesFIFOAndSleepPolicySleepsAtOnce(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		b := &blocker{started: make(chan string, 10), release: make(chan struct{})}
		pol := testPolicy()
		pol.Pools = map[string]int{"default": 1}
		pol.RestartPendingTimeout = time.Minute
		f := start(t, st, map[string]abi.TurnFunc{"b": b.fn}, pol)
		a := f.agent("b")
		first := f.sessionWith(a, store.CrashRestart)
		f.signal(first, "first")
		if got := recv(t, b.started); got != "first" {
			t.Fatalf("started %q", got)
		}
		queued := f.sessionWith(a, store.CrashRestart)
		f.signal(queued, "queued")
		f.waitFor("the second session to be pending", func() bool { return f.get(queued).PendingSince != nil })
		sleeper := f.sessionWith(a, store.CrashSleep)
		f.signal(sleeper, "sleeper")
		f.waitFor("the sleep-policy session to sleep", func() bool { return f.get(sleeper).Status == store.SessionSleeping })
		if r := f.get(sleeper).SleepReason; r != "capacity" {
			t.Errorf("sleep reason %q, want capacity", r)
		}
		close(b.release)
		if got := recv(t, b.started); got != "queued" {
			t.Fatalf("after the slot freed, %q started; want the queued session first", got)
		}
		f.waitFor("the queued session's turn", func() bool { return f.get(queued).TurnCount == 1 })
		if f.get(queued).PendingSince != nil {
			t.Error("pending_since still set after the session started")
		}
		// A forced allocation makes the sleeper wait for capacity instead.
		// The mark comes first, as in the API: the wake's own store
		// wake-up may start the controller before Ensure is called.
		f.h.Force(sleeper)
		if _, err := st.WakeSession(context.Background(), sleeper); err != nil {
			t.Fatal(err)
		}
		f.h.Ensure(sleeper)
		if got := recv(t, b.started); got != "sleeper" {
			t.Fatalf("started %q, want the woken sleeper", got)
		}
	})
}

func TestRestartPendingTimeoutPutsAWaitingSessionToSleep(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		b := &blocker{started: make(chan string, 10), release: make(chan struct{})}
		defer close(b.release)
		pol := testPolicy()
		pol.Pools = map[string]int{"default": 1}
		pol.RestartPendingTimeout = 200 * time.Millisecond
		f := start(t, st, map[string]abi.TurnFunc{"b": b.fn}, pol)
		a := f.agent("b")
		f.signal(f.sessionWith(a, store.CrashRestart), "hog")
		recv(t, b.started)
		waiting := f.sessionWith(a, store.CrashRestart)
		f.signal(waiting, "waits")
		f.waitFor("the pending timeout to put it to sleep", func() bool { return f.get(waiting).Status == store.SessionSleeping })
		if s := f.get(waiting); s.SleepReason != "pending_timeout" || s.PendingSince != nil {
			t.Errorf("session after the pending timeout: %+v", s)
		}
	})
}

// steerable polls for steers while it runs and answers with the steer.
func steerable(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
	for {
		select {
		case s := <-abi.SteersOf(ctx):
			req.TurnRef = s.TurnRef // the SDKs do this: echo the newest ref
			return &abi.TurnResult{Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "steered: " + s.Message}}}, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(5 * time.Second):
			return &abi.TurnResult{Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "not steered"}}}, nil
		}
	}
}

func TestSteerReachesTheRunningTurnUnderANewRevision(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		started := make(chan struct{}, 1)
		fn := func(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
			select { // never block the turn on a test that stopped reading
			case started <- struct{}{}:
			default:
			}
			return steerable(ctx, req)
		}
		f := start(t, st, map[string]abi.TurnFunc{"s": fn}, testPolicy())
		key := f.session(f.agent("s"))
		f.signal(key, "write a poem")
		recv(t, started)
		payload, _ := json.Marshal(map[string]string{"message": "make it rhyme"})
		res, err := st.Steer(context.Background(), store.SteerParams{Key: key, Payload: payload, DeliveryID: "steer-" + key.SessionID})
		if err != nil || !res.InFlight {
			t.Fatalf("steer: %+v %v, want it in flight", res, err)
		}
		f.h.Ensure(key)
		f.waitFor("the steered turn to commit", func() bool { return f.get(key).TurnCount == 1 })
		tr := f.transcript(key)[0]
		var got []string
		for _, m := range tr.Messages {
			got = append(got, m.Role+":"+m.Content)
		}
		want := []string{"user:write a poem", "user:make it rhyme", "assistant:steered: make it rhyme"}
		if strings.Join(got, "|") != strings.Join(want, "|") {
			t.Errorf("transcript %q, want %q", got, want)
		}
		if n := testutil.ToFloat64(f.h.Metrics().Steers); n != 1 {
			t.Errorf("steers delivered = %v, want 1", n)
		}
		for _, e := range f.events(key) {
			if e.Status != store.EventDone {
				t.Errorf("event %d (%s) is %s, want done", e.ID, e.Kind, e.Status)
			}
		}
	})
}

func TestSteerIgnoredByTheWorkerIsRejectedAsStaleRevisionAndTheTurnRerunsWithIt(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		started := make(chan struct{}, 4)
		var runs atomic.Int32
		fn := func(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
			runs.Add(1)
			select { // never block the turn on a test that stopped reading
			case started <- struct{}{}:
			default:
			}
			if len(req.Steers) == 0 {
				time.Sleep(300 * time.Millisecond) // busy, never polls
				return &abi.TurnResult{Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "unsteered"}}}, nil
			}
			return &abi.TurnResult{Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "saw " + req.Steers[0].Message}}}, nil
		}
		f := start(t, st, map[string]abi.TurnFunc{"s": fn}, testPolicy())
		key := f.session(f.agent("s"))
		f.signal(key, "go")
		recv(t, started)
		payload, _ := json.Marshal(map[string]string{"message": "left"})
		if _, err := st.Steer(context.Background(), store.SteerParams{Key: key, Payload: payload, DeliveryID: "d-" + key.SessionID}); err != nil {
			t.Fatal(err)
		}
		f.h.Ensure(key)
		f.waitFor("the rerun to commit", func() bool { return f.get(key).TurnCount == 1 })
		tr := f.transcript(key)[0]
		if last := tr.Messages[len(tr.Messages)-1].Content; last != "saw left" {
			t.Errorf("committed reply %q, want the rerun's", last)
		}
		if n := testutil.ToFloat64(f.h.Metrics().FenceRejections.WithLabelValues(string(store.FenceStaleRevision))); n != 1 {
			t.Errorf("stale_revision rejections = %v, want 1 (the unsteered reply)", n)
		}
		if runs.Load() != 2 {
			t.Errorf("%d runs, want 2", runs.Load())
		}
	})
}

func TestCancelAbortsTheRunningTurnAndItsLateReplyIsRejected(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		refs := make(chan abi.TurnRef, 4)
		aborted := make(chan struct{}, 1)
		fn := func(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
			if req.Event.Message != "long" {
				return counter(ctx, req)
			}
			refs <- req.TurnRef
			<-ctx.Done()
			aborted <- struct{}{}
			return nil, ctx.Err()
		}
		f := start(t, st, map[string]abi.TurnFunc{"c": fn}, testPolicy())
		key := f.session(f.agent("c"))
		f.signal(key, "long")
		f.signal(key, "next")
		ref := recv(t, refs)
		res, err := st.CancelEvent(context.Background(), store.CancelEventParams{Key: key, Reason: "user changed their mind"})
		if err != nil || !res.InFlight {
			t.Fatalf("cancel: %+v %v", res, err)
		}
		f.h.Ensure(key)
		select {
		case <-aborted:
		case <-time.After(5 * time.Second):
			t.Fatal("the running turn was not aborted through its context")
		}
		f.waitFor("the next event to commit", func() bool {
			ts := f.transcript(key)
			return len(ts) == 2
		})
		turns := f.transcript(key)
		if turns[0].Outcome != store.OutcomeCancelled || turns[1].Messages[0].Content != "next" {
			t.Errorf("transcript: %+v", turns)
		}
		if e := f.events(key)[0]; e.Status != store.EventCancelled {
			t.Errorf("cancelled event is %s", e.Status)
		}
		late := &abi.TurnResult{TurnRef: ref, Outcome: abi.OutcomeOK, Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "late"}}}
		if _, err := f.h.Commit(context.Background(), late); !errors.Is(err, store.ErrFence) {
			t.Errorf("late reply of the cancelled turn: %v, want a fence rejection", err)
		}
		if n := len(f.transcript(key)); n != 2 {
			t.Errorf("%d turns after the late reply, want 2", n)
		}
	})
}

func TestAlarmFiresAsAnEventAndAfterARestartExactlyOnce(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		fn := func(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
			switch {
			case req.Event.Kind == abi.EventAlarm:
				return &abi.TurnResult{Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "alarm " + req.Event.Alarm.Name}}}, nil
			case req.Event.Message == "set":
				return &abi.TurnResult{
					Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "set"}},
					Alarms:   []abi.AlarmOp{{Name: "wake-me", InMs: 600}},
				}, nil
			}
			return counter(ctx, req)
		}
		stopCtx, stop := context.WithCancel(context.Background())
		h1, err := host.New(host.Options{Store: st, Runner: funcRunner{map[string]abi.TurnFunc{"a": fn}}, Policy: testPolicy(), Logger: quietLogger()})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { _ = h1.Run(stopCtx); close(done) }()
		f := &fixture{t: t, st: st, h: h1}
		key := f.session(f.agent("a"))
		f.signal(key, "set")
		f.waitFor("the alarm to be set", func() bool {
			as, _ := st.ListAlarms(context.Background(), key)
			return len(as) == 1
		})
		stop() // the host goes away before the alarm is due
		<-done
		time.Sleep(700 * time.Millisecond)
		f2 := start(t, st, map[string]abi.TurnFunc{"a": fn}, testPolicy())
		f2.waitFor("the alarm turn", func() bool { return f2.get(key).TurnCount == 2 })
		time.Sleep(300 * time.Millisecond) // several scans: no second firing
		turns := f2.transcript(key)
		if len(turns) != 2 || turns[1].Messages[len(turns[1].Messages)-1].Content != "alarm wake-me" {
			t.Fatalf("transcript after restart: %+v", turns)
		}
		if as, _ := st.ListAlarms(context.Background(), key); len(as) != 0 {
			t.Errorf("one-shot alarm still set after firing: %+v", as)
		}
	})
}

func TestLateRepliesOfEveryKindAreRejectedAndCountedByReason(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		ctx := context.Background()
		f := &fixture{t: t, st: st}
		h, err := host.New(host.Options{Store: st, Runner: funcRunner{}, Policy: testPolicy(), Logger: quietLogger()})
		if err != nil {
			t.Fatal(err)
		}
		f.h = h // not running: this test drives the store the way controllers do
		a := f.agent("x")
		reply := func(ref abi.TurnRef) *abi.TurnResult {
			return &abi.TurnResult{TurnRef: ref, Outcome: abi.OutcomeOK, Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "late"}}}
		}
		claim := func(key store.ActorKey, ttl time.Duration) store.Activation {
			act, err := st.ClaimActivation(ctx, store.ClaimActivationParams{Key: key, UID: fmt.Sprint("act-", time.Now().UnixNano()), LeaseID: fmt.Sprint("lease-", time.Now().UnixNano()), HostID: "h", LeaseTTL: ttl})
			if err != nil {
				t.Fatal(err)
			}
			return act
		}
		dispatch := func(act store.Activation) store.Dispatch {
			d, err := st.NextDelivery(ctx, store.NextDeliveryParams{Activation: act.Ref(), DeliveryID: fmt.Sprint("d-", time.Now().UnixNano()), Binding: "x", MarkSent: true})
			if err != nil {
				t.Fatal(err)
			}
			return d
		}
		payload, _ := json.Marshal(map[string]string{"message": "m"})
		newKey := func() store.ActorKey {
			key := f.session(a)
			if _, _, err := st.AppendEvent(ctx, store.AppendEventParams{Key: key, Kind: abi.EventMessage, Payload: payload}); err != nil {
				t.Fatal(err)
			}
			return key
		}
		cases := map[string]func() (abi.TurnRef, store.FenceReason){
			"failed attempt": func() (abi.TurnRef, store.FenceReason) {
				k := newKey()
				d := dispatch(claim(k, time.Minute))
				if _, err := st.FailAttempt(ctx, store.FailAttemptParams{Ref: d.Delivery.TurnRef(), Error: "x", Counted: true, MaxAttempts: 5}); err != nil {
					t.Fatal(err)
				}
				dispatch(claim(k, time.Minute)) // the retry under a new epoch
				return d.Delivery.TurnRef(), store.FenceStaleEpoch
			},
			"superseded revision": func() (abi.TurnRef, store.FenceReason) {
				k := newKey()
				d := dispatch(claim(k, time.Minute))
				if _, err := st.Steer(ctx, store.SteerParams{Key: k, Payload: payload, DeliveryID: fmt.Sprint("s-", time.Now().UnixNano())}); err != nil {
					t.Fatal(err)
				}
				return d.Delivery.TurnRef(), store.FenceStaleRevision
			},
			"expired lease": func() (abi.TurnRef, store.FenceReason) {
				d := dispatch(claim(newKey(), 150*time.Millisecond))
				time.Sleep(300 * time.Millisecond)
				return d.Delivery.TurnRef(), store.FenceExpiredLease
			},
			"cancelled turn": func() (abi.TurnRef, store.FenceReason) {
				k := newKey()
				d := dispatch(claim(k, time.Minute))
				if _, err := st.CancelEvent(ctx, store.CancelEventParams{Key: k, Reason: "x"}); err != nil {
					t.Fatal(err)
				}
				// The cancel raised the activation's revision (and superseded
				// the delivery); revision is checked first.
				return d.Delivery.TurnRef(), store.FenceStaleRevision
			},
			"old lease term": func() (abi.TurnRef, store.FenceReason) {
				k := newKey()
				act := claim(k, 150*time.Millisecond)
				d := dispatch(act)
				time.Sleep(300 * time.Millisecond)
				if _, err := st.ExpireActivation(ctx, store.ExpireActivationParams{Ref: act.Ref(), MaxAttempts: 5}); err != nil {
					t.Fatal(err)
				}
				// A renewal from the old term cannot bring it back…
				if got, _ := st.RenewLeases(ctx, store.RenewLeasesParams{HostID: "h", LeaseTTL: time.Minute, Refs: []store.ActivationRef{act.Ref()}}); len(got) != 0 {
					t.Errorf("an old lease term was renewed: %+v", got)
				}
				dispatch(claim(k, time.Minute)) // …and a new term holds the session
				return d.Delivery.TurnRef(), store.FenceStaleEpoch
			},
		}
		for name, mk := range cases {
			ref, want := mk()
			before := testutil.ToFloat64(h.Metrics().FenceRejections.WithLabelValues(string(want)))
			_, err := h.Commit(ctx, reply(ref))
			var fe *store.FenceError
			if !errors.As(err, &fe) || fe.Reason != want {
				t.Errorf("%s: late reply → %v, want %s", name, err, want)
				continue
			}
			if after := testutil.ToFloat64(h.Metrics().FenceRejections.WithLabelValues(string(want))); after != before+1 {
				t.Errorf("%s: %s count %v → %v, want +1", name, want, before, after)
			}
			if n := len(f.transcript(store.KeyOf(ref))); n > 1 || (n == 1 && name != "cancelled turn") {
				t.Errorf("%s: the late reply wrote %d turns", name, n)
			}
		}
	})
}

func TestAPoisonedSessionDoesNotStopOthersFromRecoveringAtStart(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		fn := func(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
			if req.Event.Message == "poison" {
				panic("poison kills the worker adapter")
			}
			return counter(ctx, req)
		}
		pol := testPolicy()
		pol.RestartIntensity, pol.RestartPeriod = 0, time.Minute
		// Before any host runs: one poisoned session among twenty healthy ones.
		f := &fixture{t: t, st: st}
		a := f.agent("p")
		payload := func(m string) []byte { b, _ := json.Marshal(map[string]string{"message": m}); return b }
		var keys []store.ActorKey
		for i := range 21 {
			k := f.session(a)
			msg := "hello"
			if i == 0 {
				msg = "poison"
			}
			if _, _, err := st.AppendEvent(context.Background(), store.AppendEventParams{Key: k, Kind: abi.EventMessage, Payload: payload(msg)}); err != nil {
				t.Fatal(err)
			}
			keys = append(keys, k)
		}
		f.h = start(t, st, map[string]abi.TurnFunc{"p": fn}, pol).h
		for _, k := range keys[1:] {
			f.waitFor("every healthy session to recover", func() bool { return f.get(k).TurnCount == 1 })
		}
		f.waitFor("the poisoned event to dead-letter", func() bool { return f.get(keys[0]).DeadLetters == 1 })
	})
}

func quietLogger() *slog.Logger {
	if os.Getenv("PADDOCK_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func TestTwoHostsRacingOnAThousandDueAlarmsFireEachExactlyOnce(t *testing.T) {
	t.Parallel()
	dsn := pgtest.DSN(t)
	open := func() store.Store {
		st, err := postgres.Open(context.Background(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	st := open()
	ctx := context.Background()
	f := &fixture{t: t, st: st}
	a := f.agent("alarmed")
	payload, _ := json.Marshal(map[string]string{"message": "set"})
	const n = 1000
	keys := make([]store.ActorKey, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < n; i += 8 {
				s, _, err := st.CreateSession(ctx, store.CreateSessionParams{AgentUID: a.UID, SessionID: fmt.Sprintf("s%04d", i), CrashPolicy: store.CrashRestart})
				if err == nil {
					_, _, err = st.AppendEvent(ctx, store.AppendEventParams{Key: s.ActorKey, Kind: abi.EventMessage, Payload: payload})
				}
				var act store.Activation
				if err == nil {
					act, err = st.ClaimActivation(ctx, store.ClaimActivationParams{Key: s.ActorKey, UID: fmt.Sprintf("a%04d", i), LeaseID: fmt.Sprintf("l%04d", i), HostID: "setup", LeaseTTL: time.Minute})
				}
				var d store.Dispatch
				if err == nil {
					d, err = st.NextDelivery(ctx, store.NextDeliveryParams{Activation: act.Ref(), DeliveryID: fmt.Sprintf("d%04d", i), Binding: "alarmed", MarkSent: true})
				}
				if err == nil {
					_, err = st.CommitTurn(ctx, store.CommitTurnParams{Ref: d.Delivery.TurnRef(), KeepState: true, Outcome: abi.OutcomeOK,
						Alarms: []abi.AlarmOp{{Name: "tick", InMs: 1}}})
				}
				if err == nil {
					err = st.StopActivation(ctx, act.Ref())
				}
				if err != nil {
					errs <- err
					return
				}
				keys[i] = s.ActorKey
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	ack := func(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
		return &abi.TurnResult{Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "alarm " + req.Event.Alarm.Name}}}, nil
	}
	pol := testPolicy()
	pol.ScanInterval = 20 * time.Millisecond
	h1 := start(t, open(), map[string]abi.TurnFunc{"alarmed": ack}, pol)
	h2 := start(t, open(), map[string]abi.TurnFunc{"alarmed": ack}, pol)
	for _, k := range keys {
		f.waitFor("every alarm turn", func() bool { return f.get(k).TurnCount == 2 })
	}
	time.Sleep(200 * time.Millisecond) // more scans on both hosts: nothing fires twice
	for _, k := range keys {
		alarms := 0
		for _, e := range f.events(k) {
			if e.Kind == abi.EventAlarm {
				alarms++
			}
		}
		if alarms != 1 || f.get(k).TurnCount != 2 {
			t.Fatalf("session %s: %d alarm events, %d turns; want exactly 1 and 2", k.SessionID, alarms, f.get(k).TurnCount)
		}
	}
	f1 := testutil.ToFloat64(h1.h.Metrics().AlarmsFired)
	f2 := testutil.ToFloat64(h2.h.Metrics().AlarmsFired)
	if f1+f2 > n {
		t.Errorf("hosts report %v + %v alarm firings for %d alarms: some fired twice", f1, f2, n)
	}
	t.Logf("host 1 fired %v alarms, host 2 fired %v", f1, f2)
}

func TestLongTranscriptsAreTrimmedToFitTheRequestLimit(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		big := strings.Repeat("x", 400<<10) // 400 KiB per reply: a 20-message tail would be 8 MiB
		fn := func(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
			b, _ := json.Marshal(req)
			if len(b) > abi.MaxRequestBytes {
				return nil, fmt.Errorf("request of %d bytes over the limit", len(b))
			}
			return &abi.TurnResult{Messages: []abi.Message{{Role: abi.RoleAssistant, Content: big}}}, nil
		}
		f := start(t, st, map[string]abi.TurnFunc{"big": fn}, testPolicy())
		key := f.session(f.agent("big"))
		for i := range 12 {
			f.signal(key, fmt.Sprint(i))
		}
		f.waitFor("every turn", func() bool { s := f.get(key); return s.TurnCount+s.DeadLetters == 12 })
		if s := f.get(key); s.TurnCount != 12 {
			es := f.events(key)
			t.Fatalf("%d of 12 turns committed; last error %q", s.TurnCount, es[len(es)-1].LastError)
		}
	})
}

// A turn whose instance cannot be made (here: the runner has no such
// function; in production a plugin binary that no longer matches its
// checksum, or a worker start failure) never ran the agent: it is retried
// without consuming attempts, so it neither dead-letters the event nor
// triggers the crash policy, even destroy.
func TestInstantiateFailuresAreNotChargedToTheEvent(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		pol := testPolicy() // MaxAttempts 3
		f := start(t, st, map[string]abi.TurnFunc{}, pol)
		key := f.sessionWith(f.agent("missing"), store.CrashDestroy)
		e := f.signal(key, "hello")
		f.waitFor("several failed instantiations", func() bool {
			errs, err := st.EventErrors(context.Background(), key, e.ID)
			return err == nil && len(errs) > pol.MaxAttempts
		})
		errs, err := st.EventErrors(context.Background(), key, e.ID)
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range errs {
			if x.Counted || !strings.Contains(x.Error, "instantiate") {
				t.Fatalf("error chain entry %+v: want an uncounted instantiate failure", x)
			}
		}
		ev := f.events(key)[0]
		if ev.Status != store.EventOpen || ev.Attempts != 0 {
			t.Fatalf("event after %d instantiate failures: status %s, attempts %d; want open, 0", len(errs), ev.Status, ev.Attempts)
		}
		if s := f.get(key); s.Status != store.SessionActive {
			t.Fatalf("session %s after instantiate failures; want active (destroy policy not triggered)", s.Status)
		}
	})
}

// TestSteerHeldBackHoldsBackEveryLaterSteerOfTheTurn fills a running
// turn's steer channel while its worker does not read, so that one steer
// is held back; the worker then reads what it was handed and another
// steer arrives. Handed over, that later steer's newer turn_ref would let
// the worker commit a transcript without the steer held back. It must be
// held back too, so that the turn is fenced off and reruns with every
// steer in its request.
func TestSteerHeldBackHoldsBackEveryLaterSteerOfTheTurn(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		started, readAll, read := make(chan struct{}, 1), make(chan struct{}), make(chan int, 1)
		finish := make(chan struct{})
		fn := func(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
			answer := func(seen []string) *abi.TurnResult {
				return &abi.TurnResult{Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "saw " + strings.Join(seen, ",")}}}
			}
			if len(req.Steers) > 0 { // the rerun: every steer is in the request
				var seen []string
				for _, s := range req.Steers {
					seen = append(seen, s.Message)
				}
				return answer(seen), nil
			}
			started <- struct{}{}
			var seen []string
			take := func(s abi.Steer) {
				req.TurnRef = s.TurnRef // as the SDKs do: echo the newest ref
				seen = append(seen, s.Message)
			}
			select {
			case <-readAll:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			for len(seen) < 8 {
				select {
				case s := <-abi.SteersOf(ctx):
					take(s)
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			read <- len(seen)
			select {
			case <-finish:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			for {
				select {
				case s := <-abi.SteersOf(ctx):
					take(s)
					continue
				default:
				}
				return answer(seen), nil
			}
		}
		f := start(t, st, map[string]abi.TurnFunc{"s": fn}, testPolicy())
		key := f.session(f.agent("s"))
		f.signal(key, "go")
		recv(t, started)
		m := f.h.Metrics()
		steer := func(i int) {
			payload, _ := json.Marshal(map[string]string{"message": fmt.Sprintf("s%d", i)})
			res, err := st.Steer(context.Background(), store.SteerParams{Key: key, Payload: payload, DeliveryID: fmt.Sprintf("steer-%d-%s", i, key.SessionID)})
			if err != nil || !res.InFlight {
				t.Fatalf("steer %d: %+v %v, want it in flight", i, res, err)
			}
			f.h.Ensure(key)
		}
		for i := 1; i <= 9; i++ { // 8 fill the channel, the 9th is held back
			steer(i)
			f.waitFor(fmt.Sprintf("steer %d handed over or held back", i), func() bool {
				return testutil.ToFloat64(m.Steers)+testutil.ToFloat64(m.SteersHeldBack) >= float64(i)
			})
		}
		if got := testutil.ToFloat64(m.SteersHeldBack); got != 1 {
			t.Fatalf("steers held back = %v, want 1 (the channel holds 8)", got)
		}
		close(readAll)
		if n := recv(t, read); n != 8 {
			t.Fatalf("worker read %d steers, want 8", n)
		}
		steer(10) // the channel has room again
		f.waitFor("steer 10 handed over or held back", func() bool {
			return testutil.ToFloat64(m.Steers)+testutil.ToFloat64(m.SteersHeldBack) >= 10
		})
		if got := testutil.ToFloat64(m.SteersHeldBack); got != 2 {
			t.Errorf("steers held back = %v, want 2: steer 10 came after one held back", got)
		}
		close(finish)
		f.waitFor("the turn to commit", func() bool { return f.get(key).TurnCount == 1 })
		tr := f.transcript(key)[0]
		last := tr.Messages[len(tr.Messages)-1]
		if want := "saw s1,s2,s3,s4,s5,s6,s7,s8,s9,s10"; last.Content != want {
			t.Errorf("committed answer %q, want %q (every steer in the transcript seen by the agent)", last.Content, want)
		}
	})
}
