package wire

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/tracing"
)

// LogLevelEnv names the environment variable that sets the plugin's hclog
// level (trace, debug, info, warn, error; default info). The host passes a
// plugin only the environment registered for it.
const LogLevelEnv = "PADDOCK_PLUGIN_LOG_LEVEL"

// ParentPoll is how often a serving plugin checks that the host that
// started it is still its parent.
const ParentPoll = 200 * time.Millisecond

// steerQueue bounds the steers a turn has received but not yet taken in.
// The host sends a steer only after persisting it, so one dropped here
// comes back in TurnRequest.Steers when the stale reply is rejected.
const steerQueue = 64

// Serve serves f as a go-plugin gRPC plugin speaking ABI major version
// version, until the host closes the connection or the host process goes
// away. It never returns normally when started by a host; run by hand (no
// magic cookie) it prints an explanation and exits with status 1.
func Serve(f abi.TurnFunc, version int) {
	level := hclog.LevelFromString(os.Getenv(LogLevelEnv))
	if level == hclog.NoLevel {
		level = hclog.Info
	}
	// hclog keeps this *os.File; go-plugin later points os.Stderr elsewhere
	// (its stdio stream), but these JSON lines keep going to fd 2, which the
	// host parses into its structured log.
	logger := hclog.New(&hclog.LoggerOptions{
		Name:       filepath.Base(os.Args[0]),
		Level:      level,
		Output:     os.Stderr,
		JSONFormat: true,
	})
	watchParent(logger)
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig: Handshake(version),
		Plugins:         plugin.PluginSet{PluginName: &Plugin{Turns: &server{f: f, log: logger}}},
		GRPCServer: func(opts []grpc.ServerOption) *grpc.Server {
			return grpc.NewServer(append(opts, grpc.MaxRecvMsgSize(MaxFrameBytes), grpc.MaxSendMsgSize(MaxFrameBytes))...)
		},
		Logger: logger,
	})
}

// watchParent exits the process when its parent changes (the host died,
// even by SIGKILL, and the plugin was re-parented). The host also asks the
// kernel for a parent-death signal; this is the portable backstop.
func watchParent(logger hclog.Logger) {
	ppid := os.Getppid()
	if ppid <= 1 {
		return // started by init: nothing to watch
	}
	go func() {
		t := time.NewTicker(ParentPoll)
		defer t.Stop()
		for range t.C {
			if now := os.Getppid(); now != ppid {
				logger.Error("host process is gone; plugin exiting", "host_pid", ppid, "new_parent_pid", now)
				os.Exit(3)
			}
		}
	}()
}

// server is the plugin side of the turn service.
type server struct {
	f   abi.TurnFunc
	log hclog.Logger
}

// turnKey is the context key of the running turn.
type turnKey struct{}

// turn is the plugin-side state of one Turn stream.
type turn struct {
	stream grpc.ServerStream
	log    hclog.Logger
	steers chan abi.Steer

	sendMu sync.Mutex // serialises stream.SendMsg

	mu  sync.Mutex // guards req's TurnRef and Steers against PollSteer misuse
	req *abi.TurnRequest

	// Host calls (caller). callsOK: the host answers calls (request
	// frame's Calls). slots bounds the calls in flight.
	callsOK bool
	slots   chan struct{}

	callMu   sync.Mutex
	nextCall uint64
	pending  map[uint64]chan *abi.CallResult
	ended    bool // the stream's receive side ended: no answer will come
}

func (t *turn) send(typ string, v any) error {
	m, err := Encode(typ, v)
	if err != nil {
		return err
	}
	t.sendMu.Lock()
	defer t.sendMu.Unlock()
	return t.stream.SendMsg(m)
}

// Turn serves one turn: it reads the request frame, answers accepted, runs
// the TurnFunc through abi.Run while relaying steers and a cancel frame
// from the host, and sends the result frame.
func (s *server) Turn(stream grpc.ServerStream) error {
	in := new(wrapperspb.BytesValue)
	if err := stream.RecvMsg(in); err != nil {
		return err
	}
	fr, err := Decode(in)
	if err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	if fr.Type != TypeRequest {
		return status.Errorf(codes.InvalidArgument, "first frame is %q, want %q", fr.Type, TypeRequest)
	}
	req := new(abi.TurnRequest)
	if err := json.Unmarshal(fr.Body, req); err != nil {
		return status.Errorf(codes.InvalidArgument, "decode turn request: %v", err)
	}
	t := &turn{stream: stream, log: s.log, steers: make(chan abi.Steer, steerQueue), req: req,
		callsOK: fr.Calls, slots: make(chan struct{}, MaxCallsInFlight), pending: map[uint64]chan *abi.CallResult{}}
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	if md, ok := metadata.FromIncomingContext(stream.Context()); ok {
		if tp := md.Get(TraceparentKey); len(tp) == 1 {
			// The host's turn span: a plugin's own spans continue its trace.
			ctx = tracing.WithTraceparent(ctx, tp[0])
		}
	}
	defer t.endCalls()
	if err := t.send(TypeAccepted, nil); err != nil {
		return err
	}
	go t.recv(cancel)
	done := make(chan *abi.TurnResult, 1)
	tctx := abi.WithCaller(context.WithValue(ctx, turnKey{}, t), caller{t})
	go func() { done <- abi.Run(tctx, s.f, req) }()
	select {
	case res := <-done:
		return t.send(TypeResult, res)
	case <-stream.Context().Done():
		// The host cancelled the stream (or went away). A TurnFunc that
		// ignores its ctx keeps running in the background; the host
		// replaces a process whose turns do not stop.
		return status.FromContextError(stream.Context().Err()).Err()
	}
}

// recv relays the host's frames after the request: steers to the queue
// PollSteer reads, a cancel frame (or a broken stream) to cancel.
func (t *turn) recv(cancel context.CancelFunc) {
	defer t.endCalls()
	for {
		in := new(wrapperspb.BytesValue)
		if err := t.stream.RecvMsg(in); err != nil {
			if !errors.Is(err, io.EOF) {
				cancel()
			}
			return
		}
		fr, err := Decode(in)
		if err != nil {
			t.log.Error("paddock plugin: bad frame from host", "error", err)
			continue
		}
		switch fr.Type {
		case TypeSteer:
			var st abi.Steer
			if err := json.Unmarshal(fr.Body, &st); err != nil {
				t.log.Error("paddock plugin: bad steer from host", "error", err)
				continue
			}
			select {
			case t.steers <- st:
			default:
				t.log.Warn("paddock plugin: steer queue full; steer dropped (the host re-runs the turn with it)",
					"turn_ref", st.TurnRef.String())
			}
		case TypeCancel:
			cancel()
		case TypeCallResult:
			var cr CallResultBody
			if err := json.Unmarshal(fr.Body, &cr); err != nil {
				t.log.Error("paddock plugin: bad call_result from host", "error", err)
				continue
			}
			res := new(abi.CallResult)
			if err := json.Unmarshal(cr.Result, res); err != nil {
				res = &abi.CallResult{Error: &abi.CallError{Code: abi.CallUpstream,
					Message: "the host's call result does not decode: " + err.Error()}}
			}
			t.callMu.Lock()
			ch := t.pending[cr.ID]
			delete(t.pending, cr.ID)
			t.callMu.Unlock()
			if ch != nil {
				ch <- res // buffered 1, one send per id
			}
		}
	}
}

// endCalls answers every call waiting for the host with cancelled and
// makes later calls of the turn return cancelled: the turn ended, or the
// stream can carry no more answers.
func (t *turn) endCalls() {
	t.callMu.Lock()
	defer t.callMu.Unlock()
	t.ended = true
	for id, ch := range t.pending {
		ch <- cancelled("the turn ended before the host answered the call")
		delete(t.pending, id)
	}
}

// cancelled is the result of a call its turn can no longer wait for.
func cancelled(msg string) *abi.CallResult {
	return &abi.CallResult{Error: &abi.CallError{Code: abi.CallCancelled, Message: msg}}
}

// ctxResult is the result of a call whose ctx ended first.
func ctxResult(ctx context.Context) *abi.CallResult {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return &abi.CallResult{Error: &abi.CallError{Code: abi.CallTimeout, Message: "the call's deadline passed: " + ctx.Err().Error()}}
	}
	return cancelled("the turn was cancelled: " + context.Cause(ctx).Error())
}

// caller is the abi.Caller of a plugin turn: it sends each call to the
// host as a call frame on the turn's stream and waits for its
// call_result frame, the turn's end or ctx's end.
type caller struct{ t *turn }

// Call sends req to the host and waits for its result; see abi.Caller.
func (c caller) Call(ctx context.Context, req *abi.CallRequest) *abi.CallResult {
	t := c.t
	if !t.callsOK {
		return abi.NoCaller()
	}
	if req == nil {
		return &abi.CallResult{Error: &abi.CallError{Code: abi.CallInvalid, Message: "call request is null"}}
	}
	body, err := abi.Marshal(req)
	if err != nil {
		return &abi.CallResult{Error: &abi.CallError{Code: abi.CallInvalid, Message: "encode call request: " + err.Error()}}
	}
	if len(body) > abi.MaxCallRequestBytes {
		return &abi.CallResult{Error: &abi.CallError{Code: abi.CallTooLarge,
			Message: fmt.Sprintf("call request is %d bytes, limit %d", len(body), abi.MaxCallRequestBytes)}}
	}
	if ctx.Err() != nil {
		return ctxResult(ctx)
	}
	select {
	case t.slots <- struct{}{}:
	case <-ctx.Done():
		return ctxResult(ctx)
	}
	ch := make(chan *abi.CallResult, 1)
	t.callMu.Lock()
	if t.ended {
		t.callMu.Unlock()
		<-t.slots
		return cancelled("the turn has ended")
	}
	t.nextCall++
	id := t.nextCall
	t.pending[id] = ch
	t.callMu.Unlock()
	if err := t.send(TypeCall, CallBody{ID: id, Request: body}); err != nil {
		t.callMu.Lock()
		delete(t.pending, id)
		t.callMu.Unlock()
		<-t.slots
		return cancelled("cannot send the call to the host: " + err.Error())
	}
	select {
	case res := <-ch:
		<-t.slots
		return res
	case <-ctx.Done():
		// The host's answer, if it comes, finds no waiter; the slot is
		// freed then (or when the turn ends), so the host never sees more
		// than MaxCallsInFlight calls of this turn.
		go func() {
			<-ch
			<-t.slots
		}()
		return ctxResult(ctx)
	}
}

// PollSteer takes in the next steer of the turn running under ctx, without
// waiting; see plugins.PollSteer.
func PollSteer(ctx context.Context) (abi.Steer, bool) {
	t, _ := ctx.Value(turnKey{}).(*turn)
	if t == nil {
		return abi.Steer{}, false
	}
	select {
	case st := <-t.steers:
		// Tell the host first: it accepts the steer's ref in the result
		// only once it knows the steer was taken in.
		if err := t.send(TypeSteerTaken, st.TurnRef); err != nil {
			t.log.Error("paddock plugin: cannot acknowledge steer", "error", err)
			return abi.Steer{}, false
		}
		t.mu.Lock()
		t.req.TurnRef = st.TurnRef
		t.req.Steers = append(t.req.Steers, st)
		t.mu.Unlock()
		return st, true
	default:
		return abi.Steer{}, false
	}
}

// Logger returns the plugin's hclog logger, tagged with the turn_ref of the
// turn running under ctx (if any); see plugins.Logger.
func Logger(ctx context.Context) hclog.Logger {
	t, _ := ctx.Value(turnKey{}).(*turn)
	if t == nil {
		return hclog.New(&hclog.LoggerOptions{Output: os.Stderr, JSONFormat: true,
			Level: hclog.LevelFromString(os.Getenv(LogLevelEnv))})
	}
	t.mu.Lock()
	ref := t.req.TurnRef.String()
	t.mu.Unlock()
	return t.log.With("turn_ref", ref)
}
