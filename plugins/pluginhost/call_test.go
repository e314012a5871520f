package pluginhost_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/plugins/pluginhost"
	"github.com/paddock-dev/paddock/tracing"
)

// scriptCaller is an abi.Caller that scripts results by URL path and
// counts calls (the real host-side caller is tested end to end in host/):
//
//	/echo/<x>   200, body "<name>:<x>"
//	/wait/<ms>/<x>  the same after ms milliseconds
//	/big/<n>    200, n bytes of body
//	/block      waits for ctx's end, reports it on aborted, answers cancelled
//
// A model call answers "<name> model <endpoint>".
type scriptCaller struct {
	name    string
	calls   atomic.Int64
	started chan struct{} // one value per /block call that began
	aborted chan error    // ctx.Err() of each /block call that ended

	mu   sync.Mutex
	reqs []*abi.CallRequest
}

func newScriptCaller(name string) *scriptCaller {
	return &scriptCaller{name: name, started: make(chan struct{}, 16), aborted: make(chan error, 16)}
}

func (c *scriptCaller) Call(ctx context.Context, req *abi.CallRequest) *abi.CallResult {
	n := c.calls.Add(1)
	c.mu.Lock()
	c.reqs = append(c.reqs, req)
	c.mu.Unlock()
	if err := req.Validate(); err != nil {
		return &abi.CallResult{Seq: int(n), Error: &abi.CallError{Code: abi.CallInvalid, Message: err.Error()}}
	}
	if req.Kind == abi.CallKindModel {
		return &abi.CallResult{Seq: int(n), Model: &abi.ModelResponse{StopReason: abi.StopEndTurn,
			Message: abi.ModelMessage{Role: abi.RoleAssistant, Content: c.name + " model " + req.Model.Endpoint}}}
	}
	_, path, _ := strings.Cut(strings.TrimPrefix(req.HTTP.URL, "https://"), "/")
	verb, arg, _ := strings.Cut(path, "/")
	ok := func(body []byte) *abi.CallResult {
		return &abi.CallResult{Seq: int(n), HTTP: &abi.HTTPResponse{Status: 200, Body: body}}
	}
	switch verb {
	case "echo":
		return ok([]byte(c.name + ":" + arg))
	case "wait":
		ms, x, _ := strings.Cut(arg, "/")
		d, _ := strconv.Atoi(ms)
		select {
		case <-time.After(time.Duration(d) * time.Millisecond):
			return ok([]byte(c.name + ":" + x))
		case <-ctx.Done():
			return &abi.CallResult{Seq: int(n), Error: &abi.CallError{Code: abi.CallCancelled, Message: ctx.Err().Error()}}
		}
	case "big":
		size, _ := strconv.Atoi(arg)
		return ok([]byte(strings.Repeat("b", size)))
	case "block":
		c.started <- struct{}{}
		<-ctx.Done()
		c.aborted <- ctx.Err()
		return &abi.CallResult{Seq: int(n), Error: &abi.CallError{Code: abi.CallCancelled, Message: ctx.Err().Error()}}
	}
	return &abi.CallResult{Seq: int(n), HTTP: &abi.HTTPResponse{Status: 404}}
}

// callTurn runs msg as event ev with c as the turn's caller (nil: none)
// and returns the reply.
func callTurn(t testing.TB, inst *pluginhost.Instance, c abi.Caller, msg string, ev int64) string {
	t.Helper()
	ctx := context.Background()
	if c != nil {
		ctx = abi.WithCaller(ctx, c)
	}
	res, err := inst.Turn(ctx, request(msg, ev, nil))
	if err != nil {
		t.Fatalf("turn %q: %v", msg, err)
	}
	if res.Outcome != abi.OutcomeOK || len(res.Messages) != 1 {
		t.Fatalf("turn %q: outcome %s (%s), %d messages", msg, res.Outcome, res.Error, len(res.Messages))
	}
	return res.Messages[0].Content
}

// A plugin turn's host calls reach the Caller of the ctx its Turn runs
// under and their results come back: http and model kinds, the request
// intact; without a Caller a call answers not_configured.
func TestHostCallRoundTrip(t *testing.T) {
	m, _ := newManager(t, pluginhost.Options{})
	register(t, m, "agent", agentPkg, pluginhost.Config{})
	inst := instance(t, m, "agent")
	c := newScriptCaller("A")
	if got := callTurn(t, inst, c, "call https://h/echo/hi", 1); got != "200 A:hi" {
		t.Fatalf("reply %q, want %q", got, "200 A:hi")
	}
	if got := callTurn(t, inst, c, "callmodel chat", 2); got != "A model chat" {
		t.Fatalf("reply %q, want %q", got, "A model chat")
	}
	if n := c.calls.Load(); n != 2 {
		t.Fatalf("caller saw %d calls, want 2", n)
	}
	c.mu.Lock()
	first, second := c.reqs[0], c.reqs[1]
	c.mu.Unlock()
	if first.Kind != abi.CallKindHTTP || first.HTTP == nil || first.HTTP.URL != "https://h/echo/hi" {
		t.Fatalf("first request %+v", first)
	}
	if second.Kind != abi.CallKindModel || second.Model == nil || second.Model.Endpoint != "chat" ||
		len(second.Model.Messages) != 1 || second.Model.Messages[0].Content != "hello" {
		t.Fatalf("second request %+v", second)
	}
	if got := callTurn(t, inst, nil, "call https://h/echo/hi", 3); !strings.HasPrefix(got, "error not_configured:") {
		t.Fatalf("reply without a caller %q, want error not_configured", got)
	}
}

// Turns sharing one plugin process each reach their own Caller: eight
// concurrent turns, each with its own, make calls that overlap in time;
// every reply carries its own caller's name and every caller saw exactly
// its turn's call.
func TestHostCallsOfConcurrentTurnsReachTheirOwnCaller(t *testing.T) {
	m, _ := newManager(t, pluginhost.Options{})
	register(t, m, "agent", agentPkg, pluginhost.Config{Processes: 1})
	inst := instance(t, m, "agent")
	const n = 8
	callers := make([]*scriptCaller, n)
	replies := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		callers[i] = newScriptCaller(fmt.Sprintf("C%d", i))
		wg.Go(func() {
			replies[i] = callTurn(t, inst, callers[i], fmt.Sprintf("call https://h/wait/%d/t%d", 100+10*(n-i), i), int64(i+1))
		})
	}
	wg.Wait()
	for i := range n {
		if want := fmt.Sprintf("200 C%d:t%d", i, i); replies[i] != want {
			t.Errorf("turn %d: reply %q, want %q", i, replies[i], want)
		}
		if got := callers[i].calls.Load(); got != 1 {
			t.Errorf("caller %d saw %d calls, want 1", i, got)
		}
	}
	st, err := m.Status("agent")
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Processes) != 1 || st.Failures != 0 {
		t.Fatalf("status %+v: want the turns on one process, no failure", st)
	}
}

// Cancelling a turn aborts its host call in flight: the host's call sees
// its ctx end, the turn returns canceled, the plugin stops the turn in
// its grace (the process serves the next turn), and a call the plugin
// makes after its turn ended returns cancelled without reaching the host.
func TestHostCallAbortedByTurnCancel(t *testing.T) {
	m, buf := newManager(t, pluginhost.Options{CancelGrace: 5 * time.Second})
	register(t, m, "agent", agentPkg, pluginhost.Config{})
	inst := instance(t, m, "agent")
	c := newScriptCaller("A")
	ctx, cancel := context.WithCancel(abi.WithCaller(context.Background(), c))
	done := make(chan error, 1)
	go func() {
		_, err := inst.Turn(ctx, request("call https://h/block", 1, nil))
		done <- err
	}()
	select {
	case <-c.started:
	case <-time.After(10 * time.Second):
		t.Fatal("the blocking call never reached the caller")
	}
	start := time.Now()
	cancel()
	select {
	case err := <-c.aborted:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("host call ended with %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the host call was not aborted by the turn's cancel")
	}
	err := <-done
	turnError(t, err, pluginhost.KindCanceled)
	t.Logf("call aborted %s after the cancel", time.Since(start))
	before := c.calls.Load()
	if got := callTurn(t, inst, c, "callafter https://h/echo/late", 2); got != "answered" {
		t.Fatalf("reply %q", got)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(buf.String(), "late call: error cancelled") {
		if time.Now().After(deadline) {
			t.Fatalf("no log of the late call being cancelled:\n%s", buf.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := c.calls.Load(); got != before {
		t.Fatalf("the late call reached the host (%d calls, were %d)", got, before)
	}
	if got := callTurn(t, inst, c, "call https://h/echo/again", 3); got != "200 A:again" {
		t.Fatalf("after the cancel: reply %q", got)
	}
	if st, _ := m.Status("agent"); st.Failures != 0 {
		t.Fatalf("the process was replaced: %+v", st)
	}
}

// Results above 1 MiB travel (the gRPC limits allow abi.MaxCallResultBytes);
// one whose encoding exceeds it comes back too_large.
func TestHostCallLargeResults(t *testing.T) {
	m, _ := newManager(t, pluginhost.Options{})
	register(t, m, "agent", agentPkg, pluginhost.Config{})
	inst := instance(t, m, "agent")
	c := newScriptCaller("A")
	const big = 5 << 20 // 6.7 MiB once base64 in JSON
	if got, want := callTurn(t, inst, c, fmt.Sprintf("calllen https://h/big/%d", big), 1), fmt.Sprintf("200 len %d", big); got != want {
		t.Fatalf("reply %q, want %q", got, want)
	}
	if got := callTurn(t, inst, c, fmt.Sprintf("calllen https://h/big/%d", 7<<20), 2); !strings.HasPrefix(got, "error too_large:") {
		t.Fatalf("reply %q, want error too_large", got)
	}
}

// BenchmarkPluginHostCall is the overhead of one host call over the
// plugin channel: a turn makes 100 http calls one after the other, each
// answered at once by an in-memory Caller (call frame, host goroutine,
// call_result frame, JSON both ways). ns/call is per call, turn included.
//
//	go test -run '^$' -bench PluginHostCall ./plugins/pluginhost/
func BenchmarkPluginHostCall(b *testing.B) {
	inst, _, _ := benchPlugin(b, "bench-call", 1)
	c := newScriptCaller("A")
	const perTurn = 100
	var n int64
	for b.Loop() {
		n++
		if got := callTurn(b, inst, c, fmt.Sprintf("callloop %d https://h/echo/x", perTurn), n); got != fmt.Sprintf("%d calls", perTurn) {
			b.Fatalf("reply %q", got)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*perTurn), "ns/call")
}

// TestTheTurnsTraceCrossesToThePlugin: the W3C traceparent of the turn's
// ctx reaches the plugin process as gRPC metadata and is the span context
// of its TurnFunc's ctx (docs/DESIGN.md "Tracing"); a turn without one
// gives the plugin none.
func TestTheTurnsTraceCrossesToThePlugin(t *testing.T) {
	m, _ := newManager(t, pluginhost.Options{})
	register(t, m, "agent", agentPkg, pluginhost.Config{})
	inst := instance(t, m, "agent")
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	res, err := inst.Turn(tracing.WithTraceparent(context.Background(), tp), request("traceparent", 1, nil))
	if err != nil {
		t.Fatal(err)
	}
	if got := res.Messages[0].Content; got != tp {
		t.Errorf("the plugin saw traceparent %q, want %q", got, tp)
	}
	if got := reply(t, inst, "traceparent"); got != "none" {
		t.Errorf("without a trace the plugin saw %q, want none", got)
	}
}
