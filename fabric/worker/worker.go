package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/fabric/internal/workerhooks"
	"github.com/paddock-dev/paddock/fabric/internal/workerkind"
	"github.com/paddock-dev/paddock/fabric/wire"
	"github.com/paddock-dev/paddock/plugins/pluginhost"
	"github.com/paddock-dev/paddock/tracing"
	"github.com/paddock-dev/paddock/wasm"
)

// Config configures Run. Zero fields take the defaults named.
type Config struct {
	// Connect is the broker's endpoint, e.g. "tcp://host:7700" (any
	// scheme registered with zmq4).
	Connect string
	// ID is the worker id (its ZMTP routing identity), as configured on
	// the host with Key.
	ID string
	// Key is the worker's 32-byte secret (wire.ParseKey reads the text
	// forms).
	Key []byte
	// Pools the worker serves (at least one).
	Pools []string
	// Capacity is how many turns it runs at once (default 1).
	Capacity int
	// CacheDir holds fetched wasm modules (CacheDir/modules/<hex>.wasm,
	// verified by sha256 on every load) and, unless Wasm.CacheDir is set,
	// wazero's compilation cache (CacheDir/compiled). Required.
	CacheDir string
	// Wasm configures the wasm runtime (limits, timeouts).
	Wasm wasm.Config
	// Plugins are the plugin workers registered on this machine; each is
	// announced as the kind "plugin:<name>@<sha256>".
	Plugins []pluginhost.Config
	// PluginOptions configure the plugin manager.
	PluginOptions pluginhost.Options
	// HeartbeatInterval and HeartbeatTimeout override the host's values
	// from WELCOME (0: use the host's).
	HeartbeatInterval, HeartbeatTimeout time.Duration
	// HelloTimeout bounds the wait for WELCOME (default 5 s).
	HelloTimeout time.Duration
	// SendTimeout bounds one send to the host (default 5 s); a send that
	// takes longer ends the session.
	SendTimeout time.Duration
	// GoodbyeTimeout bounds the GOODBYE a stopping worker sends the host
	// (default 2 s).
	GoodbyeTimeout time.Duration
	// ReconnectMin and ReconnectMax bound the backoff between connection
	// attempts (defaults 100 ms and 5 s; doubled per failure, jittered).
	ReconnectMin, ReconnectMax time.Duration
	// MaxInstances bounds the warm wasm instances kept between turns, one
	// per activation (default 2×Capacity).
	MaxInstances int
}

func (c Config) withDefaults() (Config, error) {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.HelloTimeout, 5*time.Second)
	def(&c.SendTimeout, 5*time.Second)
	def(&c.GoodbyeTimeout, 2*time.Second)
	def(&c.ReconnectMin, 100*time.Millisecond)
	def(&c.ReconnectMax, 5*time.Second)
	if c.Capacity <= 0 {
		c.Capacity = 1
	}
	if c.MaxInstances <= 0 {
		c.MaxInstances = 2 * c.Capacity
	}
	switch {
	case c.Connect == "":
		return c, &ConfigError{Field: "connect", Err: errors.New("required")}
	case len(c.Key) != wire.KeyLen:
		return c, &ConfigError{Field: "key", Err: fmt.Errorf("is %d bytes, want %d", len(c.Key), wire.KeyLen)}
	case len(c.Pools) == 0:
		return c, &ConfigError{Field: "pools", Err: errors.New("at least one pool is required")}
	case c.CacheDir == "":
		return c, &ConfigError{Field: "cache_dir", Err: errors.New("required")}
	}
	if err := wire.CheckIdentity(c.ID); err != nil {
		return c, &ConfigError{Field: "id", Err: err}
	}
	if c.Wasm.CacheDir == "" {
		c.Wasm.CacheDir = filepath.Join(c.CacheDir, "compiled")
	}
	return c, nil
}

// errSessionLost ends a session; Run reconnects.
var errSessionLost = errors.New("fabric: session lost")

// Run runs a remote worker until ctx ends: it connects a DEALER
// (identity cfg.ID) to cfg.Connect, joins with a HELLO under a fresh
// incarnation, heartbeats, answers PINGs, and runs the turns it is sent —
// wasm modules (fetched from the host by digest and cached under
// CacheDir) and the plugins of cfg.Plugins. It answers every TURN at once
// with ACCEPTED or BUSY, then RESULT or ERROR; STEER reaches the running
// turn (abi.WithSteers) and CANCEL cancels its ctx. The turn's host calls
// (abi.CallerOf its ctx, which wasm and plugin instances forward their
// guests' calls to) go to the host as CALL and wait for CALL_RESULT.
//
// When the connection breaks, the host goes silent for the heartbeat
// timeout, or the host REJECTs the session, the worker cancels the turns
// of that incarnation, waits a jittered backoff (ReconnectMin doubling to
// ReconnectMax; reset after a WELCOME) and joins again under a new
// incarnation. When ctx ends it logs "fabric worker stopping" with
// context.Cause(ctx), sends GOODBYE (within GoodbyeTimeout) so that the
// host stops routing turns to it at once, and returns nil.
//
// Errors: a *ConfigError, a plugin registration error, or a *RejectError
// (the host refuses this worker for good).
func Run(ctx context.Context, cfg Config, logger *slog.Logger) error {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	log := logger.With(slog.String("component", "fabric.worker"), slog.String("worker", cfg.ID))
	rt, err := wasm.New(ctx, cfg.Wasm, logger)
	if err != nil {
		return fmt.Errorf("fabric worker: %w", err)
	}
	defer rt.Close(context.WithoutCancel(ctx))
	pm := pluginhost.NewManager(logger, cfg.PluginOptions)
	defer pm.Close(context.WithoutCancel(ctx))
	kinds := []string{workerkind.Wasm}
	for _, pc := range cfg.Plugins {
		if err := pm.Register(ctx, pc); err != nil {
			return fmt.Errorf("fabric worker: %w", err)
		}
		reg, _ := pm.Registered(pc.Name)
		kinds = append(kinds, pluginhost.Binding(reg.Name, reg.SHA256))
	}
	w := &worker{cfg: cfg, hooks: workerhooks.From(ctx), log: log, rt: rt, pm: pm, kinds: kinds, modules: map[string]chan struct{}{},
		instances: map[string]*warmInstance{}}
	defer w.closeInstances(context.WithoutCancel(ctx))
	defer w.turnsWG.Wait() // turns are cancelled with their session; wait for them before closing the runtimes
	backoff := cfg.ReconnectMin
	for {
		welcomed, err := w.session(ctx)
		if ctx.Err() != nil {
			if !errors.Is(err, errStopped) { // the session logged its stop
				w.logStopping(ctx, false)
			}
			return nil
		}
		var rej *RejectError
		if errors.As(err, &rej) {
			switch rej.Code {
			case wire.RejectABIVersion, wire.RejectUnknownVersion, wire.RejectBadHello:
				return err
			}
		}
		if errors.Is(err, workerhooks.ErrKilled) {
			return err
		}
		if welcomed {
			backoff = cfg.ReconnectMin
		}
		wait := backoff/2 + rand.N(backoff/2+1)
		log.LogAttrs(ctx, slog.LevelWarn, "fabric worker disconnected; reconnecting", slog.String("error", fmt.Sprint(err)),
			slog.Duration("after", wait))
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			w.logStopping(ctx, false)
			return nil
		}
		backoff = min(2*backoff, cfg.ReconnectMax)
	}
}

// errStopped ends a session whose worker is stopping (ctx ended): the
// session said GOODBYE, or tried to.
var errStopped = errors.New("fabric: worker stopping")

// logStopping logs that the worker stops, and why (the cause of ctx, such
// as "interrupt signal received"); joined tells whether the host had
// admitted a session, which is then told GOODBYE.
func (w *worker) logStopping(ctx context.Context, joined bool) {
	w.log.LogAttrs(context.WithoutCancel(ctx), slog.LevelInfo, "fabric worker stopping",
		slog.String("reason", fmt.Sprint(context.Cause(ctx))), slog.Bool("joined", joined))
}

// worker is the state that outlives sessions.
type worker struct {
	cfg   Config
	hooks *workerhooks.Hooks // tests only (workerhooks.With); nil in production
	log   *slog.Logger
	rt    *wasm.Runtime
	pm    *pluginhost.Manager
	kinds []string

	modMu   sync.Mutex
	modules map[string]chan struct{} // digest → closed when a fetch ends

	instMu    sync.Mutex
	instances map[string]*warmInstance // by digest + activation

	turnsWG sync.WaitGroup // running turn goroutines
}

type warmInstance struct {
	inst *wasm.Instance
	used time.Time
}

// conn is one session: a socket, an incarnation, a host session.
type conn struct {
	w      *worker
	ctx    context.Context // ends with the session
	cancel context.CancelCauseFunc
	sock   zmq4.Socket
	inc    wire.ID
	sess   *wire.Session
	out    chan outFrame
	window int
	// welcomeBytes is the WELCOME's length: the first bytes received on
	// the session, which the flow-control count includes.
	welcomeBytes uint64

	// maxMessage is the host's max_message_bytes; callSlots bounds the
	// host calls in flight (WELCOME max_calls_in_flight), nil when the
	// host has no request lane.
	maxMessage int
	callSlots  chan struct{}

	mu       sync.Mutex
	nextReq  uint64
	waiters  map[uint64]chan fetchReply
	nextCall uint64
	calls    map[uint64]*pendingCall
}

type outFrame struct {
	kind wire.Kind
	body []byte
}

type fetchReply struct {
	kind wire.Kind // MODULE or ERROR
	body []byte
}

// running is a turn in progress on the worker.
type running struct {
	cancel context.CancelFunc
	steers chan abi.Steer
}

// session runs one connection and incarnation until it is lost, or until
// ctx ends (it then says GOODBYE and returns errStopped); welcomed reports
// whether the host admitted it.
//
// Neither the session's context (sctx, c.ctx) nor the socket's derive
// from ctx: were they cancelled with it, the session loop could take the
// worker's stop for a lost session, and the GOODBYE would have no socket
// left to go out on. The socket also outlives sctx, so that the sender
// flushes the GOODBYE after the session ended. Once the host admitted the
// session only the session loop watches ctx; until then, ctx's end closes
// the socket at once (there is no session to say GOODBYE to).
func (w *worker) session(ctx context.Context) (welcomed bool, err error) {
	cfg := w.cfg
	sctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancel(errSessionLost)
	sockCtx, closeSock := context.WithCancel(context.WithoutCancel(ctx))
	defer closeSock()
	sock := zmq4.NewDealer(sockCtx, zmq4.WithID(zmq4.SocketIdentity(cfg.ID)), zmq4.WithDialerMaxRetries(0),
		zmq4.WithDialerTimeout(cfg.HelloTimeout), zmq4.WithTimeout(cfg.SendTimeout),
		zmq4.WithLogger(slog.NewLogLogger(w.log.Handler(), slog.LevelDebug)))
	defer sock.Close()
	joining := context.AfterFunc(ctx, func() {
		cancel(context.Cause(ctx))
		closeSock()
	})
	defer joining()
	if err := sock.Dial(cfg.Connect); err != nil {
		return false, fmt.Errorf("fabric: dial %s: %w", cfg.Connect, err)
	}
	inc := wire.NewID()
	c := &conn{w: w, ctx: sctx, cancel: cancel, sock: sock, inc: inc, out: make(chan outFrame, 256), waiters: map[uint64]chan fetchReply{},
		calls: map[uint64]*pendingCall{}}

	// The receive loop: frames in, until the connection breaks.
	frames := make(chan []byte, 16)
	recvErr := make(chan error, 1)
	go func() {
		for {
			if g := w.hookRecvGate(); g != nil {
				g()
			}
			msg, err := sock.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			if len(msg.Frames) != 1 {
				continue
			}
			select {
			case frames <- msg.Frames[0]:
			case <-sctx.Done():
				return
			}
		}
	}()

	hello, err := wire.NewSession(cfg.Key, cfg.ID, inc, wire.ID{})
	if err != nil {
		return false, err
	}
	capacity := cfg.Capacity
	if w.hooks != nil && w.hooks.Capacity > 0 {
		capacity = w.hooks.Capacity
	}
	hb, _ := json.Marshal(wire.Hello{TimeMs: time.Now().UnixMilli(), ABIVersion: abi.Version, Pools: cfg.Pools,
		Kinds: w.kinds, Capacity: capacity, Software: "paddock-fabric-go/1"})
	if err := sock.Send(zmq4.NewMsg(hello.Seal(wire.ToHost, wire.KindHello, hello.NextSeq(), hb))); err != nil {
		return false, fmt.Errorf("fabric: send HELLO: %w", err)
	}
	welcome, err := c.awaitWelcome(frames, recvErr)
	if err != nil {
		return false, err
	}
	if !joining() { // ctx ended while joining: the socket is closing
		return true, fmt.Errorf("fabric: stopped while joining: %w", context.Cause(ctx))
	}
	hbInterval := time.Duration(welcome.HeartbeatIntervalMs) * time.Millisecond
	hbTimeout := time.Duration(welcome.HeartbeatTimeoutMs) * time.Millisecond
	if cfg.HeartbeatInterval > 0 {
		hbInterval = cfg.HeartbeatInterval
	}
	if cfg.HeartbeatTimeout > 0 {
		hbTimeout = cfg.HeartbeatTimeout
	}
	if hbInterval <= 0 || hbTimeout <= hbInterval {
		return true, fmt.Errorf("fabric: the host's heartbeat interval %s / timeout %s are unusable", hbInterval, hbTimeout)
	}
	c.window = max(welcome.WindowBytes, 4096)
	c.maxMessage = welcome.MaxMessageBytes
	if c.maxMessage <= 0 || c.maxMessage > wire.DefaultMaxMessageBytes {
		c.maxMessage = wire.DefaultMaxMessageBytes
	}
	if welcome.MaxCallsInFlight > 0 {
		c.callSlots = make(chan struct{}, min(welcome.MaxCallsInFlight, 4096))
	}
	w.log.LogAttrs(ctx, slog.LevelInfo, "fabric worker joined", slog.String("incarnation", inc.String()),
		slog.String("host", cfg.Connect), slog.Duration("heartbeat", hbInterval))

	sendDone := make(chan error, 1)
	go func() { sendDone <- c.sendLoop() }()
	err = c.run(ctx, frames, recvErr, sendDone, hbInterval, hbTimeout, capacity)
	cancel(err)
	return true, err
}

func (w *worker) hookRecvGate() func() {
	if w.hooks == nil {
		return nil
	}
	return w.hooks.RecvGate
}

func (w *worker) hookDie() <-chan struct{} {
	if w.hooks == nil {
		return nil
	}
	return w.hooks.Die
}

// awaitWelcome waits for the WELCOME (or REJECT) of c's HELLO.
func (c *conn) awaitWelcome(frames <-chan []byte, recvErr <-chan error) (wire.Welcome, error) {
	t := time.NewTimer(c.w.cfg.HelloTimeout)
	defer t.Stop()
	for {
		select {
		case f := <-frames:
			h, err := wire.ParseHeader(f)
			if err != nil || h.Incarnation != c.inc {
				continue
			}
			s, err := wire.NewSession(c.w.cfg.Key, c.w.cfg.ID, c.inc, h.Session)
			if err != nil {
				continue
			}
			_, body, err := s.Open(wire.ToWorker, f)
			if err != nil {
				continue
			}
			switch h.Kind {
			case wire.KindReject:
				return wire.Welcome{}, rejectErr(body)
			case wire.KindWelcome:
				var wl wire.Welcome
				if err := json.Unmarshal(body, &wl); err != nil {
					return wl, fmt.Errorf("fabric: malformed WELCOME: %w", err)
				}
				_ = s.Accept(h.Seq)
				c.sess = s
				c.welcomeBytes = uint64(len(f))
				return wl, nil
			}
		case err := <-recvErr:
			return wire.Welcome{}, fmt.Errorf("fabric: connection lost before WELCOME: %w", err)
		case <-t.C:
			return wire.Welcome{}, fmt.Errorf("fabric: no WELCOME within %s (is the host's fabric listening there, and do --id and the key match an entry of its fabric.workers? the host drops what it cannot authenticate)", c.w.cfg.HelloTimeout)
		case <-c.w.hookDie():
			return wire.Welcome{}, workerhooks.ErrKilled
		case <-c.ctx.Done(): // also when the worker stops while joining
			return wire.Welcome{}, context.Cause(c.ctx)
		}
	}
}

func rejectErr(body []byte) error {
	var r wire.Reject
	_ = json.Unmarshal(body, &r)
	return &RejectError{Code: r.Code, Message: r.Message}
}

// send queues a message for the host; it fails if the session ended or
// the queue stayed full for SendTimeout.
func (c *conn) send(kind wire.Kind, body any) error {
	raw, err := json.Marshal(body)
	if err != nil {
		return err
	}
	select {
	case c.out <- outFrame{kind, raw}:
		return nil
	case <-c.ctx.Done():
		return context.Cause(c.ctx)
	case <-time.After(c.w.cfg.SendTimeout):
		c.cancel(fmt.Errorf("%w: send queue to the host full for %s", errSessionLost, c.w.cfg.SendTimeout))
		return context.Cause(c.ctx)
	}
}

// sendLoop seals and sends c's queued messages, in order.
func (c *conn) sendLoop() error {
	for {
		select {
		case f := <-c.out:
			frame := c.sess.Seal(wire.ToHost, f.kind, c.sess.NextSeq(), f.body)
			if err := c.sock.Send(zmq4.NewMsg(frame)); err != nil {
				return fmt.Errorf("fabric: send %s: %w", f.kind, err)
			}
		case <-c.ctx.Done():
			// Flush what is queued (GOODBYE, last results) before the
			// socket closes; report the first send that failed.
			var ferr error
			for {
				select {
				case f := <-c.out:
					frame := c.sess.Seal(wire.ToHost, f.kind, c.sess.NextSeq(), f.body)
					if err := c.sock.Send(zmq4.NewMsg(frame)); err != nil && ferr == nil {
						ferr = fmt.Errorf("fabric: send %s: %w", f.kind, err)
					}
				default:
					return ferr
				}
			}
		}
	}
}

// run is the session's main loop.
func (c *conn) run(ctx context.Context, frames <-chan []byte, recvErr, sendDone <-chan error, hbInterval, hbTimeout time.Duration, capacity int) error {
	w := c.w
	turns := map[string]*running{}
	finished := make(chan finishedTurn, 64)
	rx, acked := c.welcomeBytes, uint64(0)
	lastHeard := time.Now()
	tick := time.NewTicker(hbInterval)
	defer tick.Stop()
	defer func() {
		for _, t := range turns {
			t.cancel()
		}
	}()
	heartbeat := func() error {
		acked = rx
		return c.send(wire.KindHeartbeat, wire.Heartbeat{Free: max(0, capacity-len(turns)), Running: len(turns), RxBytes: rx})
	}
	if err := heartbeat(); err != nil { // the first message admits the session
		return err
	}
	for {
		select {
		case f := <-frames:
			h, err := wire.ParseHeader(f)
			if err != nil || h.Incarnation != c.inc {
				continue
			}
			if h.Kind == wire.KindReject {
				s, err := wire.NewSession(w.cfg.Key, w.cfg.ID, c.inc, h.Session)
				if err != nil {
					continue
				}
				if _, body, err := s.Open(wire.ToWorker, f); err == nil {
					return rejectErr(body)
				}
				continue
			}
			_, body, err := c.sess.Open(wire.ToWorker, f)
			if err != nil || c.sess.Accept(h.Seq) != nil {
				w.log.LogAttrs(ctx, slog.LevelDebug, "fabric worker dropped a message", slog.String("kind", h.Kind.String()))
				continue
			}
			rx += uint64(len(f))
			lastHeard = time.Now()
			if w.log.Enabled(ctx, slog.LevelDebug) {
				w.log.LogAttrs(ctx, slog.LevelDebug, "fabric worker received", slog.String("kind", h.Kind.String()), slog.Int("bytes", len(f)))
			}
			if err := c.dispatch(ctx, h.Kind, body, turns, finished, rx, capacity); err != nil {
				return err
			}
			if rx-acked >= uint64(c.window/4) {
				if err := heartbeat(); err != nil {
					return err
				}
			}
		case d := <-finished:
			delete(turns, d.id)
			if d.msg != nil {
				if err := c.send(d.kind, d.msg); err != nil {
					return err
				}
			}
		case <-tick.C:
			if time.Since(lastHeard) > hbTimeout {
				return fmt.Errorf("%w: nothing from the host for %s", errSessionLost, hbTimeout)
			}
			if err := heartbeat(); err != nil {
				return err
			}
		case err := <-recvErr:
			return fmt.Errorf("%w: receive: %v", errSessionLost, err)
		case err := <-sendDone:
			return fmt.Errorf("%w: %v", errSessionLost, err)
		case <-w.hookDie():
			return workerhooks.ErrKilled
		case <-c.ctx.Done():
			return context.Cause(c.ctx)
		case <-ctx.Done():
			return c.goodbye(ctx, turns, sendDone)
		}
	}
}

// goodbye ends the session of a stopping worker (ctx ended): it cancels
// the running turns and sends the host a GOODBYE, so that the host counts
// the worker gone at once rather than after its heartbeat timeout, within
// GoodbyeTimeout. It returns errStopped.
func (c *conn) goodbye(ctx context.Context, turns map[string]*running, sendDone <-chan error) error {
	w := c.w
	w.logStopping(ctx, true)
	for _, t := range turns {
		t.cancel()
	}
	timeout := time.NewTimer(w.cfg.GoodbyeTimeout)
	defer timeout.Stop()
	body, _ := json.Marshal(wire.Goodbye{Reason: "worker stopping: " + fmt.Sprint(context.Cause(ctx))})
	sent := false
	select {
	case c.out <- outFrame{wire.KindGoodbye, body}:
		// The sender flushes what is queued, GOODBYE last, once the
		// session's context ends.
		c.cancel(fmt.Errorf("%w: %w", errStopped, context.Cause(ctx)))
		select {
		case err := <-sendDone:
			sent = err == nil
		case <-timeout.C:
		}
	case <-c.ctx.Done():
	case <-timeout.C:
	}
	if !sent {
		w.log.LogAttrs(context.WithoutCancel(ctx), slog.LevelWarn, "fabric worker could not say GOODBYE; the host notices after its heartbeat timeout",
			slog.Duration("timeout", w.cfg.GoodbyeTimeout))
	}
	return errStopped
}

// dispatch handles one authenticated message from the host.
func (c *conn) dispatch(ctx context.Context, kind wire.Kind, body []byte, turns map[string]*running, finished chan<- finishedTurn, rx uint64, capacity int) error {
	w := c.w
	switch kind {
	case wire.KindPing:
		var p wire.Ping
		_ = json.Unmarshal(body, &p)
		return c.send(wire.KindPong, wire.Pong{Nonce: p.Nonce, RxBytes: rx})
	case wire.KindGoodbye:
		return fmt.Errorf("%w: the host said goodbye", errSessionLost)
	case wire.KindTurn:
		var t wire.Turn
		if err := json.Unmarshal(body, &t); err != nil || t.DeliveryID == "" {
			return nil
		}
		c.startTurn(ctx, t, turns, finished, capacity)
	case wire.KindSteer:
		var s wire.Steer
		if json.Unmarshal(body, &s) != nil {
			return nil
		}
		var st abi.Steer
		if json.Unmarshal(s.Steer, &st) != nil {
			return nil
		}
		if t := turns[s.DeliveryID]; t != nil {
			select {
			case t.steers <- st:
			default: // the turn is not taking steers in; the stale reply brings it back
			}
		}
	case wire.KindCancel:
		var cl wire.Cancel
		if json.Unmarshal(body, &cl) == nil {
			if t := turns[cl.DeliveryID]; t != nil {
				t.cancel()
			}
		}
	case wire.KindCallResult:
		c.routeCallResult(body)
	case wire.KindModule, wire.KindError:
		var env struct {
			RequestID uint64 `json:"request_id"`
		}
		if json.Unmarshal(body, &env) != nil || env.RequestID == 0 {
			if kind == wire.KindError {
				w.log.LogAttrs(ctx, slog.LevelWarn, "fabric host error", slog.String("body", truncate(string(body), 512)))
			}
			return nil
		}
		// The fetching goroutine decodes the body (base64 of up to
		// MaxModuleChunk): the main loop only routes.
		r := fetchReply{kind: kind, body: body}
		c.mu.Lock()
		ch := c.waiters[env.RequestID]
		delete(c.waiters, env.RequestID)
		c.mu.Unlock()
		if ch != nil {
			ch <- r
		}
	}
	return nil
}

// startTurn answers a TURN with ACCEPTED (and runs it), BUSY or ERROR.
func (c *conn) startTurn(ctx context.Context, t wire.Turn, turns map[string]*running, finished chan<- finishedTurn, capacity int) {
	w := c.w
	refuse := func(code, msg string) {
		ref := t.TurnRef
		_ = c.send(wire.KindError, wire.Error{DeliveryID: t.DeliveryID, TurnRef: &ref, Code: code, Message: msg})
	}
	if turns[t.DeliveryID] != nil {
		refuse(wire.ErrCodeDuplicate, "this delivery is already running here")
		return
	}
	if len(turns) >= capacity || len(turns) >= w.cfg.Capacity {
		_ = c.send(wire.KindBusy, wire.Busy{DeliveryID: t.DeliveryID, TurnRef: t.TurnRef, Free: 0})
		return
	}
	kind, err := workerkind.Of(t.Binding)
	if err != nil || !slices.Contains(w.kinds, kind) {
		refuse(wire.ErrCodeUnknownBinding, fmt.Sprintf("this worker does not run %q", t.Binding))
		return
	}
	req := new(abi.TurnRequest)
	if err := json.Unmarshal(t.Request, req); err != nil {
		refuse(wire.ErrCodeBadRequest, "request does not decode: "+err.Error())
		return
	}
	if err := c.send(wire.KindAccepted, wire.Accepted{DeliveryID: t.DeliveryID, TurnRef: t.TurnRef}); err != nil {
		return
	}
	tctx, cancel := context.WithCancel(c.ctx)
	if t.DeadlineMs > 0 {
		tctx, cancel = context.WithTimeout(c.ctx, time.Duration(t.DeadlineMs)*time.Millisecond)
	}
	tctx = abi.WithCaller(tctx, hostCaller{c: c, deliveryID: t.DeliveryID})
	// The host's attempt span: the turn's own spans (a plugin's, over
	// gRPC metadata) continue the signal's trace.
	tctx = tracing.WithTraceparent(tctx, t.Traceparent)
	r := &running{cancel: cancel, steers: make(chan abi.Steer, 16)}
	turns[t.DeliveryID] = r
	w.turnsWG.Add(1)
	go func() {
		defer w.turnsWG.Done()
		defer cancel()
		// The reply is sent by the session loop after it released the
		// turn's slot: a host that sends the next TURN as soon as this
		// RESULT arrives must find the capacity free (never a BUSY).
		done := finishedTurn{id: t.DeliveryID}
		res, err := w.runTurn(tctx, c, t.Binding, req, r.steers)
		if err != nil {
			ref := req.TurnRef
			w.log.LogAttrs(ctx, slog.LevelInfo, "fabric worker turn failed", slog.String("turn_ref", ref.String()),
				slog.String("error", err.Error()))
			done.kind, done.msg = wire.KindError, wire.Error{DeliveryID: t.DeliveryID, TurnRef: &ref, Code: errorCode(err), Message: err.Error()}
		} else if body, err := abi.Marshal(res); err == nil {
			done.kind, done.msg = wire.KindResult, wire.Result{DeliveryID: t.DeliveryID, TurnRef: res.TurnRef, Result: body}
		}
		select {
		case finished <- done:
		case <-c.ctx.Done():
		}
	}()
}

// finishedTurn is a turn that ended, with the reply to send once its slot
// is free (kind 0: none).
type finishedTurn struct {
	id   string
	kind wire.Kind
	msg  any
}

// errorCode names a turn failure for the ERROR message.
func errorCode(err error) string {
	var we *wasm.TurnError
	var pe *pluginhost.TurnError
	switch {
	case errors.As(err, &we):
		return we.Kind
	case errors.As(err, &pe):
		return pe.Kind
	case errors.Is(err, errModule):
		return wire.ErrCodeModule
	case errors.Is(err, context.Canceled):
		return wasm.KindCanceled
	case errors.Is(err, context.DeadlineExceeded):
		return wasm.KindTimeout
	}
	return wire.ErrCodeInternal
}

// runTurn runs one turn on the binding's worker kind.
func (w *worker) runTurn(ctx context.Context, c *conn, binding string, req *abi.TurnRequest, steers chan abi.Steer) (*abi.TurnResult, error) {
	if w.hooks != nil && w.hooks.Turn != nil {
		return w.hooks.Turn(abi.WithSteers(ctx, steers), binding, req)
	}
	if name, sum, ok := pluginhost.ParseBinding(binding); ok {
		inst, err := w.pm.Instance(ctx, name, sum)
		if err != nil {
			return nil, err
		}
		return inst.Turn(abi.WithSteers(ctx, steers), req)
	}
	if err := w.ensureModule(ctx, c, binding); err != nil {
		return nil, err
	}
	key := binding + "/" + req.TurnRef.ActivationUID
	inst, err := w.takeInstance(ctx, key, binding)
	if err != nil {
		return nil, err
	}
	res, err := inst.Turn(abi.WithSteers(ctx, steers), req)
	if err != nil || inst.ShouldRecycle() {
		_ = inst.Close(context.WithoutCancel(ctx))
	} else {
		w.putInstance(ctx, key, inst)
	}
	return res, err
}

// takeInstance returns the warm instance of an activation, or a new one.
func (w *worker) takeInstance(ctx context.Context, key, digest string) (*wasm.Instance, error) {
	w.instMu.Lock()
	wi := w.instances[key]
	delete(w.instances, key)
	w.instMu.Unlock()
	if wi != nil && !wi.inst.Closed() {
		return wi.inst, nil
	}
	return w.rt.Instantiate(ctx, digest)
}

// putInstance keeps inst warm for the activation's next turn, closing the
// least recently used instance past MaxInstances.
func (w *worker) putInstance(ctx context.Context, key string, inst *wasm.Instance) {
	w.instMu.Lock()
	var evict []*wasm.Instance
	if old := w.instances[key]; old != nil {
		evict = append(evict, old.inst)
	}
	w.instances[key] = &warmInstance{inst: inst, used: time.Now()}
	for len(w.instances) > w.cfg.MaxInstances {
		var oldest string
		for k, x := range w.instances {
			if oldest == "" || x.used.Before(w.instances[oldest].used) {
				oldest = k
			}
		}
		evict = append(evict, w.instances[oldest].inst)
		delete(w.instances, oldest)
	}
	w.instMu.Unlock()
	for _, i := range evict {
		_ = i.Close(context.WithoutCancel(ctx))
	}
}

func (w *worker) closeInstances(ctx context.Context) {
	w.instMu.Lock()
	defer w.instMu.Unlock()
	for k, wi := range w.instances {
		_ = wi.inst.Close(ctx)
		delete(w.instances, k)
	}
}
