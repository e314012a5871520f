package faulty_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/examples/faulty"
)

// errCrash stands in for the misbehaviours that end a real module.
type errCrash struct{ what string }

// fake returns an Agent whose misbehaviours panic with errCrash, which the
// test recovers, instead of ending the test binary.
func fake() *faulty.Agent {
	crash := func(what string) func() { return func() { panic(errCrash{what}) } }
	return &faulty.Agent{
		Trap:  crash("trap"),
		Crash: crash("crash"),
		Exit:  func(code int) { panic(errCrash{"exit " + strconv.Itoa(code)}) },
		Loop:  crash("loop"),
		OOM:   crash("oom"),
	}
}

func turn(t *testing.T, msg string, attempt int) (res *abi.TurnResult, crashed string) {
	t.Helper()
	defer func() {
		if p := recover(); p != nil {
			c, ok := p.(errCrash)
			if !ok {
				panic(p)
			}
			crashed = c.what
		}
	}()
	req := &abi.TurnRequest{ABIVersion: abi.Version, TurnRef: abi.TurnRef{DeliveryID: "d"},
		Event: abi.Event{Kind: abi.EventMessage, Message: msg}, Attempt: attempt}
	res, err := fake().Turn(context.Background(), req)
	if err != nil {
		return &abi.TurnResult{Outcome: abi.OutcomeError, Error: err.Error()}, ""
	}
	return res, ""
}

func TestCrashModesCallTheirMisbehaviour(t *testing.T) {
	t.Parallel()
	for msg, want := range map[string]string{
		"trap": "trap", "crash": "crash", "exit": "exit 3", "exit 5": "exit 5", "loop": "loop", "oom": "oom",
	} {
		if _, crashed := turn(t, msg, 1); crashed != want {
			t.Errorf("%q: crashed %q, want %q", msg, crashed, want)
		}
	}
}

func TestOutcomes(t *testing.T) {
	t.Parallel()
	res, _ := turn(t, "hello world", 1)
	if res.Outcome != abi.OutcomeOK || res.Messages[0].Content != "ok: hello world" || res.State != nil {
		t.Errorf("echo: %+v", res)
	}
	if res, _ := turn(t, "error", 1); res.Outcome != abi.OutcomeError || !strings.Contains(res.Error, "error requested") {
		t.Errorf("error: %+v", res)
	}
	for attempt, want := range map[int]abi.Outcome{1: abi.OutcomeError, 2: abi.OutcomeError, 3: abi.OutcomeOK, 4: abi.OutcomeOK} {
		if res, _ := turn(t, "flaky 3", attempt); res.Outcome != want {
			t.Errorf("flaky 3 attempt %d: %s, want %s", attempt, res.Outcome, want)
		}
	}
	if res, _ := turn(t, "big 1000", 1); len(res.Messages[0].Content) != 1000 {
		t.Errorf("big 1000: %d bytes", len(res.Messages[0].Content))
	}
	if res, _ := turn(t, "big", 1); len(res.Messages[0].Content) != abi.MaxResultBytes+1 {
		t.Errorf("big: %d bytes", len(res.Messages[0].Content))
	}
	if res, _ := turn(t, "bigstate", 1); !errors.Is(res.Validate(), abi.ErrInvalidResult) {
		t.Errorf("bigstate validates")
	}
	start := time.Now()
	if res, _ := turn(t, "sleep 30", 1); res.Messages[0].Content != "slept 30 ms" || time.Since(start) < 30*time.Millisecond {
		t.Errorf("sleep: %+v after %s", res, time.Since(start))
	}
}

func TestPanicIsRecoveredByRun(t *testing.T) {
	t.Parallel()
	req := &abi.TurnRequest{TurnRef: abi.TurnRef{DeliveryID: "d"}, Event: abi.Event{Message: "panic"}, Attempt: 1}
	res := abi.Run(context.Background(), fake().Turn, req)
	if res.Outcome != abi.OutcomeError || !strings.Contains(res.Error, "panic requested") || res.TurnRef != req.TurnRef {
		t.Fatalf("%+v", res)
	}
}

// TestThink: think busy-waits, polling for steers every ~10 ms; a steer
// ends it at once with the steer's message.
func TestThink(t *testing.T) {
	t.Parallel()
	req := func(msg string) *abi.TurnRequest {
		return &abi.TurnRequest{TurnRef: abi.TurnRef{DeliveryID: "d"}, Event: abi.Event{Kind: abi.EventMessage, Message: msg}, Attempt: 1}
	}
	t.Run("unsteered", func(t *testing.T) {
		t.Parallel()
		a := fake()
		polls := 0
		a.PollSteer = func() (abi.Steer, bool) { polls++; return abi.Steer{}, false }
		start := time.Now()
		res, err := a.Turn(context.Background(), req("think 200"))
		el := time.Since(start)
		if err != nil || res.Messages[0].Content != "thought for 200 ms" {
			t.Fatalf("%+v, %v", res, err)
		}
		if el < 200*time.Millisecond {
			t.Errorf("think 200 took %s", el)
		}
		// It polls while it thinks (about every 10 ms; only "at all" is
		// asserted, a loaded machine may stretch the spacing).
		if polls < 1 {
			t.Errorf("no steer poll in %s of thinking", el)
		}
	})
	t.Run("steered", func(t *testing.T) {
		t.Parallel()
		a := fake()
		polls := 0
		a.PollSteer = func() (abi.Steer, bool) {
			polls++
			if polls < 3 {
				return abi.Steer{}, false
			}
			return abi.Steer{TurnRef: abi.TurnRef{DeliveryID: "d2", Revision: 1}, EventID: 9, Message: "go left"}, true
		}
		start := time.Now()
		res, err := a.Turn(context.Background(), req("think 60000"))
		if err != nil || res.Messages[0].Content != "steered: go left" {
			t.Fatalf("%+v, %v", res, err)
		}
		if el := time.Since(start); el > 20*time.Second { // far below the 60 s think
			t.Errorf("steered think took %s", el)
		}
	})
	t.Run("no poll outside wasm", func(t *testing.T) {
		t.Parallel()
		// New's PollSteer is guest.PollSteer, which reports no steer on the
		// host.
		res, err := faulty.New().Turn(context.Background(), req("think 20"))
		if err != nil || res.Messages[0].Content != "thought for 20 ms" {
			t.Fatalf("%+v, %v", res, err)
		}
	})
}
