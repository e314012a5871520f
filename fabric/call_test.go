package fabric

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/fabric/internal/workerhooks"
	"github.com/paddock-dev/paddock/fabric/wire"
	"github.com/paddock-dev/paddock/fabric/worker"
	"github.com/paddock-dev/paddock/plugins/pluginhost"
	"github.com/paddock-dev/paddock/tracing"
)

// hookBinding is a wasm binding no module stands behind: turns of it run
// on the workerhooks Turn function of a hooked worker.
var hookBinding = "sha256:" + strings.Repeat("0", 64)

// scriptCaller is an in-test abi.Caller (the real host-side caller is
// tested end to end in host/): it scripts results by URL path and counts
// calls.
//
//	/echo/<x>       200, body "<name>:<x>"
//	/wait/<ms>/<x>  the same after ms milliseconds
//	/big/<n>        200, n bytes of body
//	/block          waits for ctx's end, reports it on aborted
type scriptCaller struct {
	name    string
	calls   atomic.Int64
	started chan struct{}
	aborted chan error
}

func newScriptCaller(name string) *scriptCaller {
	return &scriptCaller{name: name, started: make(chan struct{}, 64), aborted: make(chan error, 64)}
}

func (c *scriptCaller) Call(ctx context.Context, req *abi.CallRequest) *abi.CallResult {
	n := int(c.calls.Add(1))
	if err := req.Validate(); err != nil || req.Kind != abi.CallKindHTTP {
		return &abi.CallResult{Seq: n, Error: &abi.CallError{Code: abi.CallInvalid, Message: fmt.Sprint(err)}}
	}
	_, path, _ := strings.Cut(strings.TrimPrefix(req.HTTP.URL, "https://"), "/")
	verb, arg, _ := strings.Cut(path, "/")
	ok := func(body string) *abi.CallResult {
		return &abi.CallResult{Seq: n, HTTP: &abi.HTTPResponse{Status: 200, Body: []byte(body)}}
	}
	switch verb {
	case "echo":
		return ok(c.name + ":" + arg)
	case "wait":
		ms, x, _ := strings.Cut(arg, "/")
		d, _ := strconv.Atoi(ms)
		select {
		case <-time.After(time.Duration(d) * time.Millisecond):
			return ok(c.name + ":" + x)
		case <-ctx.Done():
		}
	case "big":
		size, _ := strconv.Atoi(arg)
		return ok(strings.Repeat("b", size))
	case "block":
		c.started <- struct{}{}
		<-ctx.Done()
		c.aborted <- ctx.Err()
	default:
		return &abi.CallResult{Seq: n, HTTP: &abi.HTTPResponse{Status: 404}}
	}
	return &abi.CallResult{Seq: n, Error: &abi.CallError{Code: abi.CallCancelled, Message: ctx.Err().Error()}}
}

// callTurn runs msg on binding with c as the turn's caller (nil: none).
func (e *env) callTurn(ctx context.Context, binding string, c abi.Caller, msg string) (*abi.TurnResult, error) {
	if c != nil {
		ctx = abi.WithCaller(ctx, c)
	}
	inst, err := e.b.Instance("p", binding)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, turnDeadline)
	defer cancel()
	return inst.Turn(ctx, e.request("", msg))
}

// A plugin turn on a remote worker makes host calls that reach the Caller
// of the host's Turn ctx, through both lanes (plugin channel on the
// worker's machine, then the fabric's CALL/CALL_RESULT): results round
// trip, two turns at once each get their own Caller's answers, a result
// over 1 MiB comes back in chunks, and without a Caller a call answers
// not_configured.
func TestHostCallsOverFabricReachTheTurnsCaller(t *testing.T) {
	e := newEnv(t)
	pc, binding := e.plugin("agent", "./plugins/internal/testplugins/agent")
	e.startWorker("w1", func(c *worker.Config) { c.Plugins = []pluginhost.Config{pc} })
	a := newScriptCaller("A")
	res, err := e.callTurn(context.Background(), binding, a, "call https://h/echo/hi")
	if got := reply(t, res, err); got != "200 A:hi" {
		t.Fatalf("reply %q, want %q", got, "200 A:hi")
	}

	callers := []*scriptCaller{newScriptCaller("B"), newScriptCaller("C")}
	replies := make([]string, len(callers))
	var wg sync.WaitGroup
	for i, c := range callers {
		wg.Go(func() {
			res, err := e.callTurn(context.Background(), binding, c, fmt.Sprintf("call https://h/wait/%d/t%d", 300-100*i, i))
			if err != nil {
				t.Errorf("turn %d: %v", i, err)
				return
			}
			replies[i] = res.Messages[0].Content
		})
	}
	wg.Wait()
	for i, c := range callers {
		if want := fmt.Sprintf("200 %s:t%d", c.name, i); replies[i] != want {
			t.Errorf("turn %d: reply %q, want %q", i, replies[i], want)
		}
		if n := c.calls.Load(); n != 1 {
			t.Errorf("caller %s saw %d calls, want 1", c.name, n)
		}
	}

	const big = 3 << 20 // 4 MiB of base64 in the CallResult JSON
	before := e.b.Stats()
	res, err = e.callTurn(context.Background(), binding, a, fmt.Sprintf("calllen https://h/big/%d", big))
	if got, want := reply(t, res, err), fmt.Sprintf("200 len %d", big); got != want {
		t.Fatalf("reply %q, want %q", got, want)
	}
	if chunks := e.b.Stats().CallResultChunks - before.CallResultChunks; chunks < 4 {
		t.Fatalf("%d CALL_RESULT chunks for a 4 MiB result, want ≥ 4", chunks)
	}

	res, err = e.callTurn(context.Background(), binding, nil, "call https://h/echo/x")
	if got := reply(t, res, err); !strings.HasPrefix(got, "error not_configured:") {
		t.Fatalf("reply without a caller %q, want error not_configured", got)
	}
	if st := e.b.Stats(); st.HostCalls != 5 || st.Dropped.Total() != 0 {
		t.Fatalf("stats %+v: want 5 host calls answered, nothing dropped", st)
	}
}

// hookTurn is a workerhooks Turn: "call <url>" makes one http host call
// and reports the worker side's outcome on outcomes ("<status> <body>" or
// the error code); "calls <n> <url>" makes n calls one after the other.
func hookTurn(outcomes chan<- string) func(context.Context, string, *abi.TurnRequest) (*abi.TurnResult, error) {
	return func(ctx context.Context, _ string, req *abi.TurnRequest) (*abi.TurnResult, error) {
		verb, arg, _ := strings.Cut(req.Event.Message, " ")
		n := 1
		if verb == "calls" {
			count, url, _ := strings.Cut(arg, " ")
			n, _ = strconv.Atoi(count)
			arg = url
		}
		var out string
		for range n {
			resp, err := abi.CallHTTP(ctx, &abi.HTTPRequest{URL: arg})
			var ce *abi.CallError
			switch {
			case errors.As(err, &ce):
				out = string(ce.Code)
			case err != nil:
				out = err.Error()
			default:
				out = fmt.Sprintf("%d %s", resp.Status, resp.Body)
			}
		}
		if outcomes != nil {
			outcomes <- out
		}
		return &abi.TurnResult{TurnRef: req.TurnRef, Outcome: abi.OutcomeOK, Messages: []abi.Message{{Role: abi.RoleAssistant, Content: out}}}, nil
	}
}

// A turn's cancellation aborts its host call on both sides, and a lost
// connection ends a call in flight on the worker as cancelled.
func TestHostCallAbortedByCancelAndConnectionLoss(t *testing.T) {
	e := newEnv(t)
	outcomes := make(chan string, 4)
	hook := func(h *workerhooks.Hooks) { h.Turn = hookTurn(outcomes) }
	first := e.startHookedWorker("w1", hook)
	c := newScriptCaller("A")

	// Cancel.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := e.callTurn(ctx, hookBinding, c, "call https://h/block")
		done <- err
	}()
	waitStarted(t, c)
	cancel()
	if err := <-c.aborted; !errors.Is(err, context.Canceled) {
		t.Fatalf("host-side call ended with %v, want context.Canceled", err)
	}
	if te := turnError(t, <-done); te.Kind != KindCanceled {
		t.Fatalf("turn error %v, want %s", te, KindCanceled)
	}
	select {
	case out := <-outcomes:
		if out != string(abi.CallCancelled) {
			t.Fatalf("worker-side outcome %q, want cancelled", out)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the worker's call did not end after the turn's cancel")
	}

	// Connection loss: the worker process dies (an in-process kill -9).
	w1 := first
	go func() {
		_, err := e.callTurn(context.Background(), hookBinding, c, "call https://h/block")
		done <- err
	}()
	waitStarted(t, c)
	start := time.Now()
	w1.kill()
	select {
	case out := <-outcomes:
		if out != string(abi.CallCancelled) {
			t.Fatalf("worker-side outcome after connection loss %q, want cancelled", out)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the worker's call did not end after its connection was lost")
	}
	t.Logf("worker-side call cancelled %s after the connection loss", time.Since(start))
	if te := turnError(t, <-done); te.Kind != KindWorkerLost {
		t.Fatalf("turn error %v, want %s", te, KindWorkerLost)
	}
	if err := <-c.aborted; !errors.Is(err, context.Canceled) {
		t.Fatalf("host-side call ended with %v, want context.Canceled", err)
	}
}

func waitStarted(t *testing.T, c *scriptCaller) {
	t.Helper()
	select {
	case <-c.started:
	case <-time.After(20 * time.Second):
		t.Fatal("the blocking call never reached the host's caller")
	}
}

// A CALL for a delivery not in flight on the session is answered
// cancelled and counted (NoTurn); CALLs above the host's
// max_calls_in_flight (announced in WELCOME) are answered denied at once
// and counted as flood, while those within it reach the turn's caller and
// end, cancelled, with the turn.
func TestCallForUnknownDeliveryAndCallFloodAreBounded(t *testing.T) {
	const maxCalls = 4
	e := newEnv(t, func(c *BrokerConfig) { c.MaxCallsInFlight = maxCalls })
	r := e.raw("w1")
	r.joinCap(e.keys["w1"], "p", 1)
	e.waitFor("raw worker admitted", 10*time.Second, func() bool { return e.incarnation("w1") != "" })

	if r.welcome.MaxCallsInFlight != maxCalls {
		t.Fatalf("WELCOME %+v: want max_calls_in_flight %d", r.welcome, maxCalls)
	}
	r.msg(wire.KindCall, wire.Call{DeliveryID: "nope", CallID: 1, Request: json.RawMessage(`{"kind":"http","http":{"url":"https://h/echo/x"}}`)})
	var cr wire.CallResult
	if err := json.Unmarshal(r.await(e.keys["w1"], wire.KindCallResult, 5*time.Second), &cr); err != nil {
		t.Fatal(err)
	}
	var res abi.CallResult
	if err := json.Unmarshal(cr.Result, &res); err != nil || cr.CallID != 1 || !cr.Last || res.Error == nil || res.Error.Code != abi.CallCancelled {
		t.Fatalf("CALL_RESULT %+v / %+v (%v), want call 1 cancelled", cr, res, err)
	}
	if st := e.b.Stats(); st.Dropped.NoTurn != 1 || st.HostCalls != 0 {
		t.Fatalf("stats %+v: want NoTurn 1, no host call answered", st)
	}

	// A turn in flight on the raw worker, whose calls block.
	c := newScriptCaller("A")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := e.callTurn(ctx, hookBinding, c, "flood")
		done <- err
	}()
	var turn wire.Turn
	if err := json.Unmarshal(r.await(e.keys["w1"], wire.KindTurn, 5*time.Second), &turn); err != nil {
		t.Fatal(err)
	}
	r.msg(wire.KindAccepted, wire.Accepted{DeliveryID: turn.DeliveryID, TurnRef: turn.TurnRef})
	const sent = maxCalls + 3
	for i := range sent {
		r.msg(wire.KindCall, wire.Call{DeliveryID: turn.DeliveryID, CallID: uint64(10 + i),
			Request: json.RawMessage(`{"kind":"http","http":{"url":"https://h/block"}}`)})
	}
	for range maxCalls {
		waitStarted(t, c)
	}
	denied := 0
	for range sent - maxCalls {
		if err := json.Unmarshal(r.await(e.keys["w1"], wire.KindCallResult, 5*time.Second), &cr); err != nil {
			t.Fatal(err)
		}
		res = abi.CallResult{}
		if json.Unmarshal(cr.Result, &res) == nil && res.Error != nil && res.Error.Code == abi.CallDenied {
			denied++
		}
	}
	if denied != sent-maxCalls || c.calls.Load() != maxCalls {
		t.Fatalf("%d denied, %d reached the caller; want %d and %d", denied, c.calls.Load(), sent-maxCalls, maxCalls)
	}
	if st := e.b.Stats(); st.Dropped.Flood != uint64(sent-maxCalls) {
		t.Fatalf("flood %d, want %d", st.Dropped.Flood, sent-maxCalls)
	}
	cancel()
	for range maxCalls {
		if err := <-c.aborted; !errors.Is(err, context.Canceled) {
			t.Fatalf("blocked call ended with %v", err)
		}
	}
	cancelled := 0
	for range maxCalls {
		if err := json.Unmarshal(r.await(e.keys["w1"], wire.KindCallResult, 5*time.Second), &cr); err != nil {
			t.Fatal(err)
		}
		res = abi.CallResult{}
		if json.Unmarshal(cr.Result, &res) == nil && res.Error != nil && res.Error.Code == abi.CallCancelled {
			cancelled++
		}
	}
	if cancelled != maxCalls {
		t.Fatalf("%d blocked calls answered cancelled, want %d", cancelled, maxCalls)
	}
	if te := turnError(t, <-done); te.Kind != KindCanceled {
		t.Fatalf("turn error %v", te)
	}
	e.waitFor("call slots freed", 5*time.Second, func() bool {
		e.b.mu.Lock()
		defer e.b.mu.Unlock()
		for _, s := range e.b.sessions {
			if s.calls != 0 {
				return false
			}
		}
		return true
	})
}

// BenchmarkFabricHostCall is the overhead of one host call over the
// fabric's request lane: a turn on a real worker (its workerhooks Turn,
// no wasm or plugin in the way) makes 100 http calls one after the
// other, each answered at once by an in-memory Caller on the host (CALL
// sealed, routed, answered, CALL_RESULT sealed, both over loopback
// ZeroMQ through the guard transport). ns/call is per call, turn included.
//
//	go test -run '^$' -bench FabricHostCall ./fabric/
func BenchmarkFabricHostCall(b *testing.B) {
	e := newEnv(b, withGuard)
	e.startHookedWorker("w1", func(h *workerhooks.Hooks) { h.Turn = hookTurn(nil) })
	c := newScriptCaller("A")
	const perTurn = 100
	msg := fmt.Sprintf("calls %d https://h/echo/x", perTurn)
	for b.Loop() {
		res, err := e.callTurn(context.Background(), hookBinding, c, msg)
		if err != nil || res.Messages[0].Content != "200 A:x" {
			b.Fatalf("turn: %v %+v", err, res)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*perTurn), "ns/call")
}

// TestTheTurnsTraceCrossesToARemotePlugin: the traceparent of the host's
// turn ctx travels in the TURN frame to the remote worker, which puts it
// in the turn's context; the plugin it runs gets it as gRPC metadata and
// answers it (docs/DESIGN.md "Tracing", abi/FABRIC.md TURN). A turn
// without one gives the plugin none.
func TestTheTurnsTraceCrossesToARemotePlugin(t *testing.T) {
	e := newEnv(t)
	pc, binding := e.plugin("agent", "./plugins/internal/testplugins/agent")
	e.startWorker("w1", func(c *worker.Config) { c.Plugins = []pluginhost.Config{pc} })
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	res, err := e.callTurn(tracing.WithTraceparent(context.Background(), tp), binding, nil, "traceparent")
	if got := reply(t, res, err); got != tp {
		t.Errorf("the remote plugin saw traceparent %q, want %q", got, tp)
	}
	res, err = e.callTurn(context.Background(), binding, nil, "traceparent")
	if got := reply(t, res, err); got != "none" {
		t.Errorf("without a trace the remote plugin saw %q, want none", got)
	}
}
