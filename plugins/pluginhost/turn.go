package pluginhost

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/plugins/internal/wire"
	"github.com/paddock-dev/paddock/tracing"
)

// Instance runs turns of one plugin binding (name and sha256). It holds no
// process: each Turn runs on the least loaded process of the plugin, so an
// Instance is cheap, and turns of one Instance may run concurrently.
type Instance struct {
	m      *Manager
	name   string
	sum    string
	closed atomic.Bool
}

// Binding returns the instance's binding, "plugin:<name>@<sha256>".
func (i *Instance) Binding() string { return Binding(i.name, i.sum) }

// Close marks the instance closed; it stops no process (the Manager owns
// them). Calling it again returns nil.
func (i *Instance) Close(context.Context) error {
	i.closed.Store(true)
	return nil
}

// Turn runs one turn on a process of the plugin and returns the plugin's
// result after checking it: size (Options.MaxResultBytes),
// abi.TurnResult.Validate, and the echoed turn_ref (the request's or that
// of a steer the plugin took in). An "error" outcome is a valid result,
// not an error.
//
// ctx carries the turn's deadline (capped by Options.TurnTimeout), steers
// (abi.WithSteers) and the turn's host-call channel (abi.WithCaller): the
// plugin's host calls (call frames on the turn's stream) are answered
// through ctx's abi.Caller under ctx — none answers not_configured — so
// that they reach this turn's caller only, and the turn's cancellation,
// deadline or end aborts them. A turn has at most 16 calls answered at
// once; an excess call is answered denied, a result over
// abi.MaxCallResultBytes too_large.
//
// When ctx ends, Turn returns at once with KindTimeout or KindCanceled; the plugin is told to cancel the turn (its
// TurnFunc's ctx is cancelled) and a process that does not stop it within
// Options.CancelGrace is replaced.
//
// Errors: a *TurnError for every failure of the plugin or its process
// (Sent and Accepted say whether the plugin may have run the turn, which
// decides whether the attempt counts); ErrInstanceClosed,
// ErrUnknownPlugin, ErrBindingChanged, ErrClosed or ErrRequestTooLarge
// (wrapped) before anything ran; or a JSON encoding error of req.
func (i *Instance) Turn(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
	if i.closed.Load() {
		return nil, ErrInstanceClosed
	}
	w, err := i.m.lookup(i.name, i.sum)
	if err != nil {
		return nil, err
	}
	body, err := abi.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("plugins: encode turn request: %w", err)
	}
	if len(body) > abi.MaxRequestBytes {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrRequestTooLarge, len(body), abi.MaxRequestBytes)
	}
	in, err := wire.EncodeFrame(wire.Frame{Type: wire.TypeRequest, Calls: true}, json.RawMessage(body))
	if err != nil {
		return nil, err
	}
	ref := req.TurnRef.String()
	ctx, cancel := context.WithTimeout(ctx, w.m.opts.TurnTimeout)
	defer cancel()
	res, err := w.turn(ctx, req, in)
	if err != nil {
		var te *TurnError
		if !errors.As(err, &te) {
			return nil, err
		}
		te.TurnRef = ref
		level := slog.LevelWarn
		if te.Kind == KindCanceled || te.Kind == KindClosed {
			level = slog.LevelInfo
		}
		w.log.LogAttrs(ctx, level, "plugin turn failed", slog.String("turn_ref", ref), slog.String("kind", te.Kind),
			slog.Int("pid", te.PID), slog.Bool("sent", te.Sent), slog.Bool("accepted", te.Accepted),
			slog.String("error", te.Error()))
		return nil, te
	}
	return res, nil
}

// turn runs one turn on a process of w.
func (w *worker) turn(ctx context.Context, req *abi.TurnRequest, in *wrapperspb.BytesValue) (*abi.TurnResult, error) {
	p, err := w.acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer w.release(p)
	c := &call{w: w, p: p, req: req}
	return c.run(ctx, in)
}

// call is one turn on one process.
type call struct {
	w        *worker
	p        *process
	req      *abi.TurnRequest
	sent     bool
	accepted bool
	taken    []abi.TurnRef // turn_refs of the steers the plugin took in
	calls    atomic.Int32  // host calls being answered
}

// fail returns a TurnError of kind about this call.
func (c *call) fail(kind string, err error) *TurnError {
	return &TurnError{Kind: kind, Op: "turn", Plugin: c.w.cfg.Name, SHA256: c.w.cfg.SHA256, PID: c.p.pid,
		Sent: c.sent, Accepted: c.accepted, Err: err}
}

// run exchanges the frames of one turn.
func (c *call) run(ctx context.Context, in *wrapperspb.BytesValue) (*abi.TurnResult, error) {
	sctx, scancel := context.WithCancel(c.p.ctx)
	if tp := tracing.Traceparent(ctx); tp != "" {
		// The turn's trace crosses to the plugin process (docs/DESIGN.md
		// "Tracing"): its SDK makes it the parent of the turn's context.
		sctx = metadata.AppendToOutgoingContext(sctx, wire.TraceparentKey, tp)
	}
	stream, err := wire.NewTurnStream(sctx, c.p.conn)
	if err != nil {
		scancel()
		return nil, c.streamFailure(ctx, err)
	}
	out := newOutbox(stream)
	go out.run(sctx)
	out.push(in)
	c.sent = true

	frames := make(chan wire.Frame)
	abandon := make(chan struct{})
	recvDone := make(chan error, 1)
	go func() {
		for {
			m := new(wrapperspb.BytesValue)
			if err := stream.RecvMsg(m); err != nil {
				recvDone <- err
				return
			}
			f, err := wire.Decode(m)
			if err != nil {
				recvDone <- status.Error(codes.InvalidArgument, err.Error())
				return
			}
			select {
			case frames <- f:
			case <-abandon:
			}
		}
	}()

	steers := abi.SteersOf(ctx)
	for {
		select {
		case f := <-frames:
			if f.Type == wire.TypeCall {
				if err := c.hostCall(ctx, f, out); err != nil {
					close(abandon)
					scancel()
					c.w.retire(c.p, err.Error(), true)
					return nil, c.fail(KindProtocol, err)
				}
				continue
			}
			result, ended, err := c.frame(f)
			switch {
			case err != nil:
				close(abandon)
				scancel()
				c.w.retire(c.p, err.Error(), true)
				return nil, c.fail(KindProtocol, err)
			case ended:
				close(abandon)
				out.close()
				scancel()
				return c.result(result)
			}
		case st, ok := <-steers:
			if !ok {
				steers = nil
				continue
			}
			m, err := wire.Encode(wire.TypeSteer, st)
			if err != nil {
				c.w.log.LogAttrs(ctx, slog.LevelError, "plugin steer not deliverable",
					slog.String("turn_ref", st.TurnRef.String()), slog.String("error", err.Error()))
				continue
			}
			out.push(m)
		case err := <-recvDone:
			close(abandon)
			scancel()
			return nil, c.streamFailure(ctx, err)
		case <-ctx.Done():
			close(abandon)
			if m, err := wire.Encode(wire.TypeCancel, nil); err == nil {
				out.push(m)
			}
			out.close()
			c.awaitStop(recvDone, scancel)
			te := ctxError(c.w, ctx)
			te.PID, te.Sent, te.Accepted = c.p.pid, c.sent, c.accepted
			return nil, te
		}
	}
}

// frame applies one frame from the plugin: accepted and steer_taken update
// the call; a result frame ends the turn (ended, with its body, for
// result). err is a frame that breaks the protocol (the process is then
// replaced). Frames of a later protocol version are ignored.
func (c *call) frame(f wire.Frame) (result json.RawMessage, ended bool, err error) {
	switch f.Type {
	case wire.TypeAccepted:
		c.accepted = true
	case wire.TypeSteerTaken:
		var ref abi.TurnRef
		if err := json.Unmarshal(f.Body, &ref); err != nil {
			return nil, false, fmt.Errorf("malformed steer_taken frame: %w", err)
		}
		c.taken = append(c.taken, ref)
	case wire.TypeResult:
		return f.Body, true, nil
	}
	return nil, false, nil
}

// hostCall answers a call frame of the plugin in the background, through
// the abi.Caller of ctx (the turn's: abi.WithCaller; none answers
// not_configured), under ctx, so that the turn's cancellation or deadline
// aborts it and its end cancels it. The call_result goes out on the
// turn's stream; after the turn ended it is dropped (the plugin has
// answered its own waiting calls "cancelled"). A frame without a call id
// breaks the protocol (err); a request that does not decode is answered
// invalid_request, one above the per-turn bound of calls in flight denied.
func (c *call) hostCall(ctx context.Context, f wire.Frame, out *outbox) error {
	var body wire.CallBody
	if err := json.Unmarshal(f.Body, &body); err != nil || body.ID == 0 {
		return fmt.Errorf("malformed call frame (no call id): %v", err)
	}
	answer := func(res *abi.CallResult) {
		b, err := abi.Marshal(res)
		if err == nil && len(b) > abi.MaxCallResultBytes {
			b, err = abi.Marshal(&abi.CallResult{Seq: res.Seq, Error: &abi.CallError{Code: abi.CallTooLarge,
				Message: fmt.Sprintf("call result is %d bytes, limit %d", len(b), abi.MaxCallResultBytes)}})
		}
		if err != nil {
			c.w.log.LogAttrs(ctx, slog.LevelError, "plugin host call result not encodable", slog.String("error", err.Error()))
			return
		}
		m, err := wire.Encode(wire.TypeCallResult, wire.CallResultBody{ID: body.ID, Result: b})
		if err != nil {
			return
		}
		out.push(m)
	}
	invalid := func(code abi.CallErrorCode, msg string) {
		answer(&abi.CallResult{Error: &abi.CallError{Code: code, Message: msg}})
	}
	if len(body.Request) > abi.MaxCallRequestBytes {
		invalid(abi.CallTooLarge, fmt.Sprintf("call request is %d bytes, limit %d", len(body.Request), abi.MaxCallRequestBytes))
		return nil
	}
	req := new(abi.CallRequest)
	if err := json.Unmarshal(body.Request, req); err != nil {
		invalid(abi.CallInvalid, "call request does not decode: "+err.Error())
		return nil
	}
	if c.calls.Add(1) > wire.MaxCallsInFlight {
		c.calls.Add(-1)
		invalid(abi.CallDenied, fmt.Sprintf("more than %d host calls of this turn in flight", wire.MaxCallsInFlight))
		return nil
	}
	go func() {
		defer c.calls.Add(-1)
		answer(abi.Call(ctx, req))
	}()
	return nil
}

// result decodes and checks the plugin's result.
func (c *call) result(body json.RawMessage) (*abi.TurnResult, error) {
	if limit := c.w.m.opts.MaxResultBytes; len(body) > limit {
		return nil, c.fail(KindInvalidResult, fmt.Errorf("result is %d bytes, limit %d", len(body), limit))
	}
	res := new(abi.TurnResult)
	if err := json.Unmarshal(body, res); err != nil {
		return nil, c.fail(KindInvalidResult, fmt.Errorf("malformed result JSON: %w", err))
	}
	if err := res.Validate(); err != nil {
		return nil, c.fail(KindInvalidResult, err)
	}
	if res.TurnRef != c.req.TurnRef && !c.tookIn(res.TurnRef) {
		msg := fmt.Sprintf("result turn_ref %s does not echo the request's %s or that of a steer the plugin took in",
			res.TurnRef, c.req.TurnRef)
		if res.Error != "" {
			msg += " (plugin error: " + res.Error + ")"
		}
		return nil, c.fail(KindInvalidResult, errors.New(msg))
	}
	return res, nil
}

func (c *call) tookIn(ref abi.TurnRef) bool {
	for _, r := range c.taken {
		if r == ref {
			return true
		}
	}
	return false
}

// awaitStop waits in the background, up to Options.CancelGrace, for the
// plugin to end a cancelled turn's stream; a process that does not is
// hung in the turn and is replaced.
func (c *call) awaitStop(recvDone <-chan error, scancel context.CancelFunc) {
	m, w, p := c.w.m, c.w, c.p
	m.bg.goTracked(func() {
		defer scancel()
		t := time.NewTimer(m.opts.CancelGrace)
		defer t.Stop()
		select {
		case <-recvDone:
		case <-p.dead:
		case <-m.ctx.Done():
		case <-t.C:
			w.retire(p, fmt.Sprintf("turn %s did not stop within %s of its cancellation (hung plugin)",
				c.req.TurnRef, m.opts.CancelGrace), true)
		}
	})
}

// streamFailure classifies the end of a turn's stream without a result.
func (c *call) streamFailure(ctx context.Context, err error) *TurnError {
	w, p := c.w, c.p
	if w.m.closing() {
		return c.fail(KindClosed, fmt.Errorf("the plugin manager closed: %w", err))
	}
	if ctx.Err() != nil {
		te := ctxError(w, ctx)
		te.PID, te.Sent, te.Accepted = p.pid, c.sent, c.accepted
		return te
	}
	code := status.Code(err)
	if errors.Is(err, io.EOF) {
		w.retire(p, "the plugin ended a turn without a result", true)
		return c.fail(KindProtocol, errors.New("the plugin ended the turn without a result"))
	}
	if code != codes.Unavailable && code != codes.Canceled {
		w.retire(p, fmt.Sprintf("turn stream failed: %v", err), true)
		return c.fail(KindProtocol, fmt.Errorf("turn stream failed: %w", err))
	}
	// The connection broke: the process died, was killed as
	// unresponsive, or is about to be reported dead. Give the exit a
	// moment to be observed so the error says how it ended.
	deadline := time.Now().Add(time.Second)
	for !p.client.Exited() && p.failureOf() == nil && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if f := p.failureOf(); f != nil && f.Kind != KindCrash {
		te := c.fail(f.Kind, fmt.Errorf("%w (turn stream: %v)", f.Err, err))
		te.Output = p.stderr.String()
		return te
	}
	var cause error
	if p.client.Exited() {
		cause = fmt.Errorf("plugin process exited during the turn (%s)", p.exitStatus())
	} else {
		cause = fmt.Errorf("connection to the plugin process broke during the turn: %w", err)
	}
	p.fail(KindCrash, cause)
	te := c.fail(KindCrash, cause)
	te.Output = p.stderr.String()
	return te
}

// outbox sends frames on a turn stream from one goroutine, so that the
// turn's main loop never blocks on a send (a frozen plugin stops reading)
// and stops reading the steer channel the moment it returns.
type outbox struct {
	stream grpc.ClientStream
	mu     sync.Mutex
	queue  []*wrapperspb.BytesValue
	closed bool
	kick   chan struct{}
}

func newOutbox(stream grpc.ClientStream) *outbox {
	return &outbox{stream: stream, kick: make(chan struct{}, 1)}
}

// push queues m; after close it does nothing.
func (o *outbox) push(m *wrapperspb.BytesValue) {
	o.mu.Lock()
	if !o.closed {
		o.queue = append(o.queue, m)
	}
	o.mu.Unlock()
	o.signal()
}

// close sends the queued frames, then half-closes the stream.
func (o *outbox) close() {
	o.mu.Lock()
	o.closed = true
	o.mu.Unlock()
	o.signal()
}

func (o *outbox) signal() {
	select {
	case o.kick <- struct{}{}:
	default:
	}
}

// run sends until closed and drained, or ctx (the stream's) ends.
func (o *outbox) run(ctx context.Context) {
	for {
		o.mu.Lock()
		q, closed := o.queue, o.closed
		o.queue = nil
		o.mu.Unlock()
		for _, m := range q {
			if err := o.stream.SendMsg(m); err != nil {
				return // the receive side reports the stream's end
			}
		}
		if closed && len(q) == 0 {
			_ = o.stream.CloseSend()
			return
		}
		if len(q) > 0 {
			continue
		}
		select {
		case <-o.kick:
		case <-ctx.Done():
			return
		}
	}
}
