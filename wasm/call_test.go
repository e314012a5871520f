package wasm_test

import (
	"bytes"
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
	"github.com/paddock-dev/paddock/wasm"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// scriptedCaller is an abi.Caller that answers every call with answer and
// counts them. It stands in for the host's caller: these tests are about
// the wasm transport.
type scriptedCaller struct {
	answer func(ctx context.Context, req *abi.CallRequest) *abi.CallResult
	calls  atomic.Int64
	mu     sync.Mutex
	last   *abi.CallRequest
}

func (c *scriptedCaller) Call(ctx context.Context, req *abi.CallRequest) *abi.CallResult {
	seq := c.calls.Add(1)
	c.mu.Lock()
	c.last = req
	c.mu.Unlock()
	res := c.answer(ctx, req)
	if res.Seq == 0 {
		res.Seq = int(seq)
	}
	return res
}

// httpEcho answers an http call to https://example.test/N with status 200
// and N bytes of 'x', a model call with "hello".
func httpEcho(_ context.Context, req *abi.CallRequest) *abi.CallResult {
	switch req.Kind {
	case abi.CallKindHTTP:
		n, _ := strconv.Atoi(strings.TrimPrefix(req.HTTP.URL, "https://example.test/"))
		return &abi.CallResult{HTTP: &abi.HTTPResponse{Status: 200, Body: bytes.Repeat([]byte("x"), n)}}
	case abi.CallKindModel:
		return &abi.CallResult{Model: &abi.ModelResponse{Message: abi.ModelMessage{Role: abi.RoleAssistant, Content: "hello"},
			StopReason: abi.StopEndTurn, Usage: abi.Usage{InputTokens: 3, OutputTokens: 1}}}
	}
	return &abi.CallResult{Error: &abi.CallError{Code: abi.CallInvalid, Message: "unexpected kind"}}
}

// callGuest loads the Go host-call guest (wasm/testdata/callguest).
func (b *bundle) callGuest(t testing.TB) string { return b.load(t, wasmtest.CallGuest) }

// TestHostCallGoGuest: the guest SDK's Caller reaches the turn's Caller
// through paddock.call: small results directly, a result larger than the
// SDK's 64 KiB buffer through call_result with the call made once, seq and
// replayed passed through, and not_configured without a Caller.
func TestHostCallGoGuest(t *testing.T) {
	t.Parallel()
	b := shared(t)
	digest := b.callGuest(t)
	run := func(t *testing.T, c abi.Caller, msg string) string {
		t.Helper()
		ctx := context.Background()
		if c != nil {
			ctx = abi.WithCaller(ctx, c)
		}
		req := request(msg, nil, 1)
		res, err := b.instance(t, digest).Turn(ctx, req)
		return replyOf(t, res, err)
	}
	for _, n := range []int{0, 100, 64 << 10, 200_000} {
		t.Run(fmt.Sprintf("http %d", n), func(t *testing.T) {
			t.Parallel()
			c := &scriptedCaller{answer: httpEcho}
			if got, want := run(t, c, fmt.Sprintf("http %d", n)), fmt.Sprintf("http 200 %d true", n); got != want {
				t.Fatalf("reply %q, want %q", got, want)
			}
			if got := c.calls.Load(); got != 1 {
				t.Fatalf("the Caller was called %d times, want 1", got)
			}
			if c.last.Kind != abi.CallKindHTTP || c.last.HTTP.URL != fmt.Sprintf("https://example.test/%d", n) {
				t.Fatalf("the Caller got %+v", c.last)
			}
		})
	}
	t.Run("model", func(t *testing.T) {
		t.Parallel()
		c := &scriptedCaller{answer: httpEcho}
		if got := run(t, c, "model"); got != "model hello end_turn" {
			t.Fatalf("reply %q", got)
		}
		if m := c.last.Model; m == nil || m.Endpoint != "main" || len(m.Messages) != 1 || m.Messages[0].Content != "hi" {
			t.Fatalf("the Caller got %+v", c.last)
		}
	})
	t.Run("seq and replayed", func(t *testing.T) {
		t.Parallel()
		c := &scriptedCaller{answer: func(context.Context, *abi.CallRequest) *abi.CallResult {
			return &abi.CallResult{Seq: 7, Replayed: true, HTTP: &abi.HTTPResponse{Status: 204}}
		}}
		if got := run(t, c, "raw"); got != "raw seq=7 replayed=true error=" {
			t.Fatalf("reply %q", got)
		}
	})
	t.Run("call error", func(t *testing.T) {
		t.Parallel()
		c := &scriptedCaller{answer: func(context.Context, *abi.CallRequest) *abi.CallResult {
			return &abi.CallResult{Error: &abi.CallError{Code: abi.CallDenied, Message: "no", Reason: "destination"}}
		}}
		if got := run(t, c, "http 1"); got != "error denied" {
			t.Fatalf("reply %q", got)
		}
	})
	t.Run("no caller", func(t *testing.T) {
		t.Parallel()
		if got := run(t, nil, "http 1"); got != "error not_configured" {
			t.Fatalf("reply %q", got)
		}
	})
	t.Run("many calls in one turn", func(t *testing.T) {
		t.Parallel()
		c := &scriptedCaller{answer: httpEcho}
		if got := run(t, c, "loop 50"); got != "loop 50" || c.calls.Load() != 50 {
			t.Fatalf("reply %q after %d calls", got, c.calls.Load())
		}
	})
}

// TestEmitFromAGoGuest: the guest SDK's Emit and EmitJSON reach the
// turn's Caller through paddock.call as emit requests, in order, and the
// host's bare answer ({"seq":0}) reads as success in the guest.
func TestEmitFromAGoGuest(t *testing.T) {
	t.Parallel()
	b := shared(t)
	digest := b.callGuest(t)
	var mu sync.Mutex
	var got []string
	c := &scriptedCaller{answer: func(_ context.Context, req *abi.CallRequest) *abi.CallResult {
		if req.Kind != abi.CallKindEmit || req.Emit == nil {
			return &abi.CallResult{Error: &abi.CallError{Code: abi.CallInvalid, Message: "want emit"}}
		}
		mu.Lock()
		got = append(got, req.Emit.Type+":"+req.Emit.Text+string(req.Emit.Data))
		mu.Unlock()
		return &abi.CallResult{} // accepted
	}}
	res, err := b.instance(t, digest).Turn(abi.WithCaller(context.Background(), c), request("emit 3", nil, 1))
	if r := replyOf(t, res, err); r != "emit 3" {
		t.Fatalf("reply %q", r)
	}
	mu.Lock()
	defer mu.Unlock()
	if s := strings.Join(got, "|"); s != `text:t0 |text:t1 |text:t2 |tool:{"n":3}` {
		t.Errorf("emits %s", s)
	}
}

// TestHostCallImportIsOptional: Go guests import paddock.call and
// paddock.call_result only when they make host calls.
func TestHostCallImportIsOptional(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		pkg  string
		want bool
	}{{wasmtest.Notes, false}, {wasmtest.Faulty, false}, {wasmtest.CallGuest, true}} {
		_, body := wasmtest.BuildExample(t, c.pkg)
		list, err := importedFunctions(body)
		if err != nil {
			t.Fatal(err)
		}
		imp := map[string]bool{}
		for _, name := range list {
			imp[name] = true
		}
		if !imp["wasi_snapshot_preview1.fd_write"] {
			t.Fatalf("%s imports %v: the decoder missed fd_write", c.pkg, list)
		}
		if imp["paddock.call"] != c.want || imp["paddock.call_result"] != c.want {
			t.Errorf("%s imports %v: want paddock.call and paddock.call_result %v", c.pkg, list, c.want)
		}
	}
}

// Instructions of the hand-written host-call guests.
const (
	opLocalGet   byte = 0x20
	opLocalSet   byte = 0x21
	opI32Sub     byte = 0x6b
	opI32LeS     byte = 0x4c
	opI32GeS     byte = 0x4e
	opI32Store8  byte = 0x3a
	opI64Add     byte = 0x7c
	opI64ExtendU byte = 0xad
)

// Imports of the hand-written host-call guests: functions 0 and 1.
var (
	callImport       = wimport{module: "paddock", name: "call", params: []byte{tI32, tI32, tI32, tI32}, results: []byte{tI32}}
	callResultImport = wimport{module: "paddock", name: "call_result", params: []byte{tI32, tI32}, results: []byte{tI32}}
)

// Memory layout of relayGuest (4 pages): the result prefix at
// fixedResultAt, the call's result right after it, the turn request at
// fixedRequestAt (page 2), the call request at relayRequestAt (page 3).
const relayRequestAt = 2 << 16

// relay is a hand-written guest, as one in another language would be,
// that makes one host call with the request bytes call and hands the
// call's result back inside its TurnResult, as the data of an alarm, so
// the test reads exactly what the host wrote. With capacity ≥ the result
// it expects call to write it (n > 0); with a smaller capacity it expects
// -n, checks that call_result with a buffer one byte short answers -n
// again, collects the result with call_result, and checks that nothing is
// pending then. Any other answer traps (unreachable).
type relay struct {
	call     []byte
	capacity int32
	// code, if set, replaces the call sequence (for out-of-bounds cases);
	// it must leave the result length in local 2.
	code []byte
}

func (r relay) bytes(req *abi.TurnRequest) []byte {
	ref, _ := json.Marshal(req.TurnRef)
	prefix := []byte(`{"turn_ref":` + string(ref) + `,"outcome":"ok","alarms":[{"name":"r","in_ms":1000,"data":`)
	out := int32(fixedResultAt + len(prefix))
	const n = 2 // local 2: after paddock_turn's params ptr and len
	var c []byte
	emit := func(parts ...[]byte) {
		for _, p := range parts {
			c = append(c, p...)
		}
	}
	trapIf := func(cond ...byte) { emit(cond, []byte{opIf, blockEmpty, opUnreachable, opEnd}) }
	if r.code != nil {
		emit(r.code)
	} else {
		emit(i32Const(relayRequestAt), i32Const(int32(len(r.call))), i32Const(out), i32Const(r.capacity),
			[]byte{opCall, 0x00, opLocalSet, n})
		if r.capacity >= 4096 { // larger than every result of the tests: written at once
			emit([]byte{opLocalGet, n}, i32Const(0))
			trapIf(opI32LeS)
		} else {
			emit([]byte{opLocalGet, n}, i32Const(0))
			trapIf(opI32GeS)
			// call_result(out, N-1) == -N (local n holds -N): still pending
			emit(i32Const(out), i32Const(-1), []byte{opLocalGet, n, opI32Sub},
				[]byte{opCall, 0x01, opLocalGet, n, opI32Ne})
			trapIf()
			emit(i32Const(out), i32Const(fixedRequestAt-out), []byte{opCall, 0x01, opLocalSet, n})
			emit([]byte{opLocalGet, n}, i32Const(0))
			trapIf(opI32LeS)
			emit(i32Const(out), i32Const(fixedRequestAt-out), []byte{opCall, 0x01})
			trapIf() // anything but 0 pending
		}
	}
	for i, ch := range []byte("}]}") {
		emit([]byte{opLocalGet, n}, i32Const(int32(ch)), []byte{opI32Store8, 0x00}, uleb(uint64(int(out)+i)))
	}
	emit(i64Const(fixedResultAt<<32|int64(len(prefix)+3)), []byte{opLocalGet, n, opI64ExtendU, opI64Add})
	m := fixedGuest(1, prefix, wfunc{export: "paddock_turn", params: []byte{tI32, tI32}, results: []byte{tI64},
		locals: []byte{tI32}, body: c})
	m.memPages = 4
	m.imports = []wimport{callImport, callResultImport}
	m.data = append(m.data, wdata{relayRequestAt, r.call})
	return m.bytes()
}

// TestHostCallABI drives paddock.call and paddock.call_result from
// hand-written guests: the memory contract, the results of requests the
// host refuses, and out-of-bounds buffers.
func TestHostCallABI(t *testing.T) {
	t.Parallel()
	b := setup(t, wasm.Config{})
	httpCall := []byte(`{"kind":"http","http":{"url":"https://example.test/1000"}}`)
	// run makes one turn of the relay guest under ctx and returns the call
	// result it relayed.
	run := func(t *testing.T, ctx context.Context, r relay) (*abi.CallResult, error) {
		t.Helper()
		req := request("hi", nil, 1)
		info, err := b.rt.Validate(context.Background(), r.bytes(req))
		if err != nil {
			t.Fatal(err)
		}
		res, err := b.instance(t, info.Digest).Turn(ctx, req)
		if err != nil {
			return nil, err
		}
		if len(res.Alarms) != 1 {
			t.Fatalf("result %+v has no relayed call result", res)
		}
		var cr abi.CallResult
		if err := json.Unmarshal(res.Alarms[0].Data, &cr); err != nil {
			t.Fatalf("relayed %s: %v", res.Alarms[0].Data, err)
		}
		return &cr, nil
	}
	withCaller := func(c abi.Caller) context.Context { return abi.WithCaller(context.Background(), c) }

	for _, c := range []struct {
		name     string
		capacity int32
	}{{"written at once", 60_000}, {"through call_result", 16}, {"size probe", 0}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			caller := &scriptedCaller{answer: httpEcho}
			cr, err := run(t, withCaller(caller), relay{call: httpCall, capacity: c.capacity})
			if err != nil {
				t.Fatal(err)
			}
			if cr.Error != nil || cr.HTTP == nil || cr.HTTP.Status != 200 || len(cr.HTTP.Body) != 1000 || cr.Seq != 1 {
				t.Fatalf("relayed %+v", cr)
			}
			if got := caller.calls.Load(); got != 1 {
				t.Fatalf("the Caller was called %d times, want 1", got)
			}
		})
	}
	for _, c := range []struct{ name, call, want string }{
		{"not JSON", `{"kind":`, "not valid JSON"},
		{"unknown kind", `{"kind":"ftp"}`, `kind "ftp"`},
		{"http without url", `{"kind":"http","http":{}}`, "http.url"},
		{"model without messages", `{"kind":"model","model":{"endpoint":"main"}}`, "model.messages"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			caller := &scriptedCaller{answer: httpEcho}
			cr, err := run(t, withCaller(caller), relay{call: []byte(c.call), capacity: 60_000})
			if err != nil {
				t.Fatal(err)
			}
			if cr.Error == nil || cr.Error.Code != abi.CallInvalid || !strings.Contains(cr.Error.Message, c.want) {
				t.Fatalf("relayed %+v, want invalid_request naming %q", cr, c.want)
			}
			if caller.calls.Load() != 0 {
				t.Fatal("an invalid request reached the Caller")
			}
		})
	}
	t.Run("no caller", func(t *testing.T) {
		t.Parallel()
		cr, err := run(t, context.Background(), relay{call: httpCall, capacity: 60_000})
		if err != nil {
			t.Fatal(err)
		}
		if cr.Error == nil || cr.Error.Code != abi.CallNotConfigured {
			t.Fatalf("relayed %+v, want not_configured", cr)
		}
	})
	outOfBounds := []struct{ name, op, code string }{
		{"request", "paddock.call", "request"},
		{"result buffer", "paddock.call", "result buffer"},
		{"call_result buffer", "paddock.call_result", "result buffer"},
	}
	for i, c := range outOfBounds {
		t.Run("out of bounds "+c.name, func(t *testing.T) {
			t.Parallel()
			var code []byte
			reqPtr, bufPtr, capacity := int32(relayRequestAt), int32(fixedResultAt), int32(60_000)
			switch i {
			case 0:
				reqPtr = 0x7fff0000
			case 1:
				bufPtr = 0x7fff0000
			case 2:
				capacity = 0
			}
			code = append(append(append(append(i32Const(reqPtr), i32Const(int32(len(httpCall)))...), i32Const(bufPtr)...), i32Const(capacity)...), opCall, 0x00, opDrop)
			if i == 2 {
				code = append(append(code, i32Const(0x7fff0000)...), i32Const(1<<20)...)
				code = append(code, opCall, 0x01, opDrop)
			}
			caller := &scriptedCaller{answer: httpEcho}
			_, err := run(t, withCaller(caller), relay{call: httpCall, code: code})
			te := turnError(t, err, wasm.KindInvalidResult)
			if te.Op != c.op || !strings.Contains(te.Error(), c.code) || !strings.Contains(te.Error(), "outside") {
				t.Fatalf("error %q (op %s) does not name %s and the %s", te, te.Op, c.op, c.code)
			}
			if want := int64(min(i, 1)); caller.calls.Load() != want {
				t.Fatalf("the Caller was called %d times, want %d", caller.calls.Load(), want)
			}
		})
	}
	t.Run("wrong signature", func(t *testing.T) {
		t.Parallel()
		for _, im := range []wimport{
			{module: "paddock", name: "call", params: []byte{tI32, tI32, tI32}, results: []byte{tI32}},
			{module: "paddock", name: "call_result", params: []byte{tI32, tI32}, results: []byte{tI64}},
		} {
			m := fixedGuest(1, []byte(`{}`))
			m.imports = []wimport{im}
			_, err := b.rt.Validate(context.Background(), m.bytes())
			var me *wasm.ModuleError
			if !errors.As(err, &me) || me.Reason != wasm.ReasonBadImports || !strings.Contains(me.Error(), "paddock."+im.name+" ") {
				t.Fatalf("got %v, want bad_imports naming paddock.%s", err, im.name)
			}
		}
	})
}

// TestHostCallAbortedByTurnEnd: cancelling the turn, or its deadline,
// ends a call blocked in the Caller (which sees ctx end) and the turn, as
// canceled or timeout, and closes the instance.
func TestHostCallAbortedByTurnEnd(t *testing.T) {
	t.Parallel()
	b := setup(t, wasm.Config{TurnTimeout: 500 * time.Millisecond})
	httpCall := []byte(`{"kind":"http","http":{"url":"https://example.test/1"}}`)
	for _, c := range []struct {
		name, kind string
		cancel     bool
	}{{"cancel", wasm.KindCanceled, true}, {"deadline", wasm.KindTimeout, false}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			entered, returned := make(chan struct{}), make(chan struct{})
			caller := &scriptedCaller{answer: func(ctx context.Context, _ *abi.CallRequest) *abi.CallResult {
				close(entered)
				defer close(returned)
				<-ctx.Done()
				return &abi.CallResult{Error: &abi.CallError{Code: abi.CallCancelled, Message: ctx.Err().Error()}}
			}}
			ctx, cancel := context.WithCancel(abi.WithCaller(context.Background(), caller))
			defer cancel()
			req := request("hi", nil, 1)
			info, err := b.rt.Validate(context.Background(), relay{call: httpCall, capacity: 60_000}.bytes(req))
			if err != nil {
				t.Fatal(err)
			}
			inst := b.instance(t, info.Digest)
			if c.cancel {
				go func() {
					<-entered
					cancel()
				}()
			}
			start := time.Now()
			_, err = inst.Turn(ctx, req)
			turnError(t, err, c.kind)
			select {
			case <-returned:
			case <-time.After(10 * time.Second):
				t.Fatal("the Caller did not return")
			}
			if el := time.Since(start); el > 10*time.Second {
				t.Errorf("the turn ended %s after it started", el)
			}
			if !inst.Closed() {
				t.Error("instance not closed after an aborted call")
			}
		})
	}
}

// BenchmarkHostCall measures the wasm lane's overhead per host call: a Go
// guest (the SDK: encode, import, decode) makes 100 http calls per turn to
// a Caller that answers at once with an empty 200.
func BenchmarkHostCall(b *testing.B) {
	bn := setup(b, wasm.Config{MemoryLimitPages: wasm.DefaultMemoryLimitPages})
	inst := bn.instance(b, bn.callGuest(b))
	caller := &scriptedCaller{answer: func(context.Context, *abi.CallRequest) *abi.CallResult {
		return &abi.CallResult{HTTP: &abi.HTTPResponse{Status: 200}}
	}}
	ctx := abi.WithCaller(context.Background(), caller)
	const perTurn = 100
	req := request(fmt.Sprintf("loop %d", perTurn), nil, 1)
	res, err := inst.Turn(ctx, req)
	if got := replyOf(b, res, err); got != fmt.Sprintf("loop %d", perTurn) {
		b.Fatalf("reply %q", got)
	}
	b.ReportAllocs()
	start := time.Now()
	for b.Loop() {
		res, err := inst.Turn(ctx, req)
		replyOf(b, res, err)
	}
	b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(b.N*perTurn), "ns/call")
}

// TestGuestKeepsWhatATurnHandedIt: an agent may keep its request past the
// turn, and the SDK reuses the request and result buffers the host frees
// (wasm/guest: spares). What the agent kept must read the same after
// later turns, whose requests and results are written into those buffers:
// nothing decoded may point into them.
func TestGuestKeepsWhatATurnHandedIt(t *testing.T) {
	t.Parallel()
	b := setup(t, wasm.Config{})
	inst := b.instance(t, b.callGuest(t))
	ctx := context.Background()
	keep := request("keep "+strings.Repeat("k", 300), nil, 1)
	keep.Event.Data = json.RawMessage(`{"payload":"` + strings.Repeat("d", 300) + `"}`)
	keep.Session.AgentName = "keeper"
	want := keep.Event.Message + "|" + string(keep.Event.Data) + "|" + keep.TurnRef.DeliveryID + "|keeper"
	if res, err := inst.Turn(ctx, keep); err != nil || res.Messages[0].Content != "kept" {
		t.Fatalf("keep: %+v %v", res, err)
	}
	for i := range 5 {
		// Requests of the same size, then larger and smaller ones: each
		// is written where a spare is, over what the first one held.
		msg := "kept " + strings.Repeat(string(rune('a'+i)), 300+100*(i%3)-100)
		req := request(msg, nil, 1)
		req.Event.Message = "kept"
		req.Event.Data = json.RawMessage(`{"payload":"` + strings.Repeat(string(rune('a'+i)), 300+100*(i%3)-100) + `"}`)
		res, err := inst.Turn(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if got := res.Messages[0].Content; got != want {
			t.Fatalf("turn %d: the kept request reads %q, want %q", i+2, got, want)
		}
	}
}
