package fabric

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/fabric/guard"
	"github.com/paddock-dev/paddock/fabric/internal/workerkind"
	"github.com/paddock-dev/paddock/fabric/wire"
)

// Broker is the host side of the RuntimeFabric: it binds a ZeroMQ ROUTER,
// admits authenticated workers, and runs turns on them (Instance). It is
// safe for concurrent use.
//
// Goroutines: one receives from the socket, authenticates and routes (it
// runs no callback); one applies worker lifecycle (hello, heartbeat, pong,
// goodbye, timeouts) in order; one sends, from per-worker queues; a pool
// of RPCWorkers serves module fetches; one calls LateResult.
type Broker struct {
	cfg    BrokerConfig
	log    *slog.Logger
	sock   zmq4.Socket
	ep     string
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	st     counters

	life chan lifeEvent
	rpc  chan rpcRequest
	late chan lateResult
	kick chan struct{}

	mu       sync.Mutex // guards the fields below and session.state/turns/inflight/ping fields
	peers    map[string]*peer
	sessions map[sessKey]*session
	closed   bool

	sendMu   sync.Mutex // guards every session's queue and txBytes, and control
	control  []*outMsg  // pre-sealed messages (REJECT) outside any admitted session
	rr       int        // round-robin cursor over sendable sessions
	sendable []*session // sessions with queued messages
	sending  atomic.Pointer[sendState]

	modules moduleCache

	// Receive-goroutine state (no lock).
	helloSeen  map[wire.ID]time.Time // incarnations seen in HELLOs → forget after
	helloRate  map[string]*bucket
	rejectRate map[string]time.Time // last unsolicited REJECT per worker id
	dropLog    map[string]time.Time // last "dropped" warning per reason+id
}

// peer is one configured worker id.
type peer struct {
	id      string
	key     []byte
	cur     *session   // the admitted session, nil if none
	pending []*session // sessions welcomed but not yet confirmed
}

type sessKey struct {
	worker      string
	incarnation wire.ID
	session     wire.ID
}

type sessState int

const (
	statePending sessState = iota // WELCOME sent; admitted on its first message
	stateLive
	stateDead // ended; kept SessionRetention for late results
)

// session is one incarnation of a worker on this broker.
type session struct {
	worker string
	// routeID is the transport routing identity the session's messages
	// go to: the worker id, or with the guard's DuplicateDistinct policy
	// the id of the connection that last sent an authentic message.
	routeID atomic.Pointer[string]
	key     sessKey
	ws      *wire.Session // Open: any goroutine; Accept: receiver; NextSeq: sender
	hello   wire.Hello
	dead    chan struct{} // closed when the session ends

	// Guarded by Broker.mu.
	state       sessState
	reason      string // why it ended
	created     time.Time
	endedAt     time.Time
	turns       map[string]*call // by delivery id
	inflight    int
	calls       int // CALLs being answered (request lane)
	lastPick    time.Time
	pingNonce   uint64
	pingSent    time.Time // zero: no PING outstanding on the wire
	pingQueued  bool
	lastPing    time.Time
	hbFree      int
	hbRunning   int
	lastHeardNs atomic.Int64 // any authentic message (unix ns)
	ackBytes    atomic.Uint64
	// blockedNs is when a message for the session started waiting on a
	// full flow-control window (unix ns; 0: not blocked). It resets when
	// the worker acknowledges more bytes or a message goes out. Blocked
	// for HeartbeatTimeout means the worker stopped reading.
	blockedNs atomic.Int64

	// Guarded by Broker.sendMu.
	queue   []*outMsg
	txBytes uint64
}

// route returns the routing identity to send the session's messages to.
func (s *session) route() string { return *s.routeID.Load() }

func (s *session) setRoute(r string) { s.routeID.Store(&r) }

func (s *session) isDead() bool {
	select {
	case <-s.dead:
		return true
	default:
		return false
	}
}

// counters are the atomics behind Stats.
type counters struct {
	oversized, malformed, unknownVersion, unauthenticated, forged, replayed, flood, unknownSession, staleSession, noTurn atomic.Uint64

	in, out, admitted, rejected                                                              atomic.Uint64
	lostHB, lostPing, lostNotReading, lostGoodbye, lostSuperseded, lostStalled, lostRejected atomic.Uint64
	sendStalls, queueFull, expired, sendFailed, late, lateDropped, turns, busy, acc          atomic.Uint64
	moduleChunks, hostCalls, callChunks                                                      atomic.Uint64
}

type lifeKind int

const (
	lifeHello lifeKind = iota
	lifeAdmit
	lifeHeartbeat
	lifePong
	lifeGoodbye
)

type lifeEvent struct {
	kind  lifeKind
	id    string
	route string // routing identity a HELLO came from
	inc   wire.ID
	hello wire.Hello
	sess  *session
	hb    wire.Heartbeat
	pong  wire.Pong
	why   string
}

type lateResult struct {
	worker string
	body   json.RawMessage
}

// NewBroker binds the ROUTER at cfg.Endpoint and starts the broker's
// goroutines; it runs until ctx ends or Close. logger nil discards logs.
// Errors: a *ConfigError, or the bind's error.
func NewBroker(ctx context.Context, cfg BrokerConfig, logger *slog.Logger) (*Broker, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	bctx, cancel := context.WithCancel(ctx)
	b := &Broker{
		cfg: cfg, log: logger.With(slog.String("component", "fabric.broker")), ctx: bctx, cancel: cancel,
		life:       make(chan lifeEvent, 1024),
		rpc:        make(chan rpcRequest, 4*cfg.RPCWorkers),
		late:       make(chan lateResult, 64),
		kick:       make(chan struct{}, 1),
		peers:      map[string]*peer{},
		sessions:   map[sessKey]*session{},
		helloSeen:  map[wire.ID]time.Time{},
		helloRate:  map[string]*bucket{},
		rejectRate: map[string]time.Time{},
	}
	for id, k := range cfg.Workers {
		b.peers[id] = &peer{id: id, key: k}
	}
	b.modules.fetch = cfg.Modules
	b.sock = zmq4.NewRouter(bctx,
		zmq4.WithTimeout(cfg.SendTimeout),
		zmq4.WithLogger(slog.NewLogLogger(b.log.Handler(), slog.LevelWarn)))
	if err := b.sock.Listen(cfg.Endpoint); err != nil {
		cancel()
		_ = b.sock.Close()
		return nil, fmt.Errorf("fabric: listen on %s: %w", cfg.Endpoint, err)
	}
	scheme, _, _ := strings.Cut(cfg.Endpoint, "://")
	b.ep = scheme + "://" + b.sock.Addr().String()
	b.goRun(b.recvLoop)
	b.goRun(b.lifecycleLoop)
	b.goRun(b.sendLoop)
	b.goRun(b.lateLoop)
	for range cfg.RPCWorkers {
		b.goRun(b.rpcLoop)
	}
	b.log.LogAttrs(ctx, slog.LevelInfo, "fabric broker listening", slog.String("endpoint", b.ep),
		slog.Int("workers", len(cfg.Workers)))
	return b, nil
}

func (b *Broker) goRun(f func()) {
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		f()
	}()
}

// Endpoint returns the bound endpoint, e.g. "tcp://127.0.0.1:41234".
func (b *Broker) Endpoint() string { return b.ep }

// Config returns the effective configuration (defaults applied).
func (b *Broker) Config() BrokerConfig { return b.cfg }

// Stats returns a snapshot of the counters.
func (b *Broker) Stats() Stats {
	c := &b.st
	s := Stats{
		Dropped: Drops{
			Oversized: c.oversized.Load(), Malformed: c.malformed.Load(), UnknownVersion: c.unknownVersion.Load(),
			Unauthenticated: c.unauthenticated.Load(), Forged: c.forged.Load(), Replayed: c.replayed.Load(),
			Flood: c.flood.Load(), UnknownSession: c.unknownSession.Load(), StaleSession: c.staleSession.Load(),
			NoTurn: c.noTurn.Load(),
		},
		MessagesIn: c.in.Load(), MessagesOut: c.out.Load(), Admitted: c.admitted.Load(), Rejected: c.rejected.Load(),
		Lost: LostCounts{
			HeartbeatTimeout: c.lostHB.Load(), PingTimeout: c.lostPing.Load(), NotReading: c.lostNotReading.Load(), Goodbye: c.lostGoodbye.Load(),
			Superseded: c.lostSuperseded.Load(), SendStalled: c.lostStalled.Load(), Rejected: c.lostRejected.Load(),
		},
		SendStalls: c.sendStalls.Load(), SendQueueFull: c.queueFull.Load(), SendExpired: c.expired.Load(),
		SendFailed: c.sendFailed.Load(), LateResults: c.late.Load(), LateDropped: c.lateDropped.Load(),
		Turns: c.turns.Load(), Busy: c.busy.Load(), AcceptTimeouts: c.acc.Load(), ModuleChunks: c.moduleChunks.Load(),
		HostCalls: c.hostCalls.Load(), CallResultChunks: c.callChunks.Load(),
	}
	b.mu.Lock()
	for _, p := range b.peers {
		if p.cur != nil {
			s.LiveWorkers++
		}
	}
	b.mu.Unlock()
	if st := b.sending.Load(); st != nil && time.Since(st.start) > b.cfg.SendTimeout {
		s.Stalled = true
	}
	return s
}

// WorkerStatus describes an admitted worker session.
type WorkerStatus struct {
	ID          string
	Incarnation string
	Pools       []string
	Kinds       []string
	Capacity    int
	// InFlight is the broker's count of turns dispatched and not finished;
	// Accepted, of those, the ones the worker acknowledged (ACCEPTED).
	InFlight, Accepted int
	// Free and Running are from the worker's last HEARTBEAT.
	Free, Running int
	LastHeard     time.Time
}

// Workers lists the admitted worker sessions, by id.
func (b *Broker) Workers() []WorkerStatus {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []WorkerStatus
	for _, p := range b.peers {
		s := p.cur
		if s == nil {
			continue
		}
		accepted := 0
		for _, c := range s.turns {
			if c.accepted.Load() {
				accepted++
			}
		}
		out = append(out, WorkerStatus{
			ID: p.id, Incarnation: s.key.incarnation.String(), Pools: slices.Clone(s.hello.Pools),
			Kinds: slices.Clone(s.hello.Kinds), Capacity: s.hello.Capacity, InFlight: s.inflight, Accepted: accepted,
			Free: s.hbFree, Running: s.hbRunning, LastHeard: time.Unix(0, s.lastHeardNs.Load()),
		})
	}
	slices.SortFunc(out, func(a, b WorkerStatus) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// Serves reports whether a live (admitted) worker session announces pool
// and the worker kind of binding (a module digest or
// "plugin:<name>@<sha256>"; "" matches any kind): whether a turn of
// binding on pool could be dispatched now, capacity aside. A host asks it
// before it claims a session of a remote pool (docs/DESIGN.md "Remote pools
// across hosts"). A malformed binding matches no worker.
func (b *Broker) Serves(pool, binding string) bool {
	kind := ""
	if binding != "" {
		k, err := workerkind.Of(binding)
		if err != nil {
			return false
		}
		kind = k
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return false
	}
	for _, p := range b.peers {
		s := p.cur
		if s == nil || s.state != stateLive || !slices.Contains(s.hello.Pools, pool) {
			continue
		}
		if kind == "" || slices.Contains(s.hello.Kinds, kind) {
			return true
		}
	}
	return false
}

// Close says GOODBYE to every admitted worker (best effort, until ctx
// ends or 500 ms), fails the turns in flight (KindWorkerLost,
// broker_closed), closes the socket and waits for the broker's
// goroutines. Calling it again returns nil.
func (b *Broker) Close(ctx context.Context) error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	var live []*session
	for _, p := range b.peers {
		if p.cur != nil {
			live = append(live, p.cur)
		}
	}
	b.mu.Unlock()
	var dones []chan error
	for _, s := range live {
		done := make(chan error, 1)
		if b.enqueue(s, wire.KindGoodbye, wire.Goodbye{Reason: "host shutting down"}, done, true) == nil {
			dones = append(dones, done)
		}
	}
	wait, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	for _, d := range dones {
		select {
		case <-d:
		case <-wait.Done():
		}
	}
	cancel()
	b.mu.Lock()
	for _, s := range live {
		b.endLocked(s, ReasonBrokerClosed)
	}
	b.mu.Unlock()
	b.cancel()
	closed := make(chan error, 1)
	go func() { closed <- b.sock.Close() }()
	var err error
	select {
	case err = <-closed:
	case <-ctx.Done():
		// zmq4's Close can block behind a send stuck on a peer that does
		// not read (go-zeromq/zmq4#132): give up waiting for it.
		return fmt.Errorf("fabric: close socket: %w", ctx.Err())
	}
	done := make(chan struct{})
	go func() { b.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		return fmt.Errorf("fabric: waiting for broker goroutines: %w", ctx.Err())
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		b.log.LogAttrs(ctx, slog.LevelDebug, "fabric socket close", slog.String("error", err.Error()))
	}
	return nil
}

// recvLoop owns the socket's receive side: it authenticates and routes.
func (b *Broker) recvLoop() {
	prune := time.Now()
	for {
		msg, err := b.sock.Recv()
		if err != nil {
			if b.ctx.Err() != nil {
				return
			}
			b.log.LogAttrs(b.ctx, slog.LevelWarn, "fabric receive", slog.String("error", err.Error()))
			time.Sleep(10 * time.Millisecond)
			continue
		}
		b.handle(msg)
		if now := time.Now(); now.Sub(prune) > time.Second {
			prune = now
			for inc, until := range b.helloSeen {
				if now.After(until) {
					delete(b.helloSeen, inc)
				}
			}
		}
	}
}

// handle authenticates one received message and routes it. It never
// blocks on anything but the broker's mutex.
func (b *Broker) handle(msg zmq4.Msg) {
	if msg.Type != zmq4.UsrMsg || len(msg.Frames) < 1 {
		b.st.malformed.Add(1)
		return
	}
	// The routing identity is the worker id, or the id extended per
	// connection by the guard (DuplicateDistinct): then a client claiming a
	// worker's id without its key gets a connection of its own and cannot
	// displace the worker's.
	route := string(msg.Frames[0])
	id := guard.BaseIdentity(route)
	size := 0
	for _, f := range msg.Frames[1:] {
		size += len(f)
	}
	if size > b.cfg.MaxMessageBytes {
		b.st.oversized.Add(1)
		b.log.LogAttrs(b.ctx, slog.LevelWarn, "fabric dropped oversized message", slog.String("peer", printable(id)), slog.Int("bytes", size))
		return
	}
	if len(msg.Frames) != 2 {
		b.st.malformed.Add(1)
		return
	}
	data := msg.Frames[1]
	h, err := wire.ParseHeader(data)
	var verr *wire.VersionError
	switch {
	case errors.As(err, &verr):
		b.st.unknownVersion.Add(1)
		b.rejectVersion(id, route, int(verr.Got))
		return
	case err != nil:
		b.st.malformed.Add(1)
		return
	}
	p := b.peers[id] // the map never changes after NewBroker
	if p == nil {
		b.st.unauthenticated.Add(1)
		b.warnDrop("unauthenticated", id, "a client connected under an id that is not in the host's fabric.workers")
		return
	}
	if h.Kind == wire.KindHello {
		b.handleHello(p, route, h, data)
		return
	}
	b.mu.Lock()
	s := b.sessions[sessKey{id, h.Incarnation, h.Session}]
	b.mu.Unlock()
	if s == nil {
		b.handleUnknownSession(p, route, h, data)
		return
	}
	_, body, err := s.ws.Open(wire.ToHost, data)
	if err != nil {
		b.st.forged.Add(1)
		return
	}
	if err := s.ws.Accept(h.Seq); err != nil {
		b.st.replayed.Add(1)
		return
	}
	if !h.Kind.FromWorker() {
		b.st.malformed.Add(1)
		return
	}
	if route != s.route() {
		// The worker reconnected (a new transport connection, same
		// session): answer on the connection it now uses.
		s.setRoute(route)
	}
	b.st.in.Add(1)
	s.lastHeardNs.Store(time.Now().UnixNano())
	b.mu.Lock()
	state := s.state
	b.mu.Unlock()
	if state == stateDead {
		if h.Kind == wire.KindResult {
			b.routeResult(s, body)
			return
		}
		b.st.staleSession.Add(1)
		b.rejectLimited(p, route, h.Incarnation, wire.RejectEvicted, "this session ended: "+s.reason)
		return
	}
	if state == statePending {
		b.lifecycle(lifeEvent{kind: lifeAdmit, sess: s})
	}
	b.route(s, h.Kind, body)
}

// route dispatches an authenticated message of a live or pending session.
func (b *Broker) route(s *session, kind wire.Kind, body []byte) {
	switch kind {
	case wire.KindHeartbeat:
		var hb wire.Heartbeat
		if json.Unmarshal(body, &hb) != nil {
			b.st.malformed.Add(1)
			return
		}
		b.ack(s, hb.RxBytes)
		b.lifecycle(lifeEvent{kind: lifeHeartbeat, sess: s, hb: hb})
	case wire.KindPong:
		var pg wire.Pong
		if json.Unmarshal(body, &pg) != nil {
			b.st.malformed.Add(1)
			return
		}
		b.ack(s, pg.RxBytes)
		b.lifecycle(lifeEvent{kind: lifePong, sess: s, pong: pg})
	case wire.KindGoodbye:
		var g wire.Goodbye
		_ = json.Unmarshal(body, &g)
		b.lifecycle(lifeEvent{kind: lifeGoodbye, sess: s, why: g.Reason})
	case wire.KindAccepted, wire.KindBusy, wire.KindError:
		var env struct {
			DeliveryID string `json:"delivery_id"`
			RequestID  uint64 `json:"request_id"`
		}
		if json.Unmarshal(body, &env) != nil {
			b.st.malformed.Add(1)
			return
		}
		if env.DeliveryID == "" {
			if kind == wire.KindError {
				b.log.LogAttrs(b.ctx, slog.LevelWarn, "fabric worker error", slog.String("worker", s.worker),
					slog.String("body", truncate(string(body), 512)))
				return
			}
			b.st.malformed.Add(1)
			return
		}
		b.deliver(s, env.DeliveryID, laneEvent{kind: kind, body: body})
	case wire.KindResult:
		b.routeResult(s, body)
	case wire.KindCall:
		b.routeCall(s, body)
	case wire.KindProgress:
		if b.log.Enabled(b.ctx, slog.LevelDebug) {
			b.log.LogAttrs(b.ctx, slog.LevelDebug, "fabric turn progress", slog.String("worker", s.worker),
				slog.String("body", truncate(string(body), 512)))
		}
	case wire.KindFetchModule:
		var req wire.FetchModule
		if json.Unmarshal(body, &req) != nil {
			b.st.malformed.Add(1)
			return
		}
		select {
		case b.rpc <- rpcRequest{sess: s, fetch: req}:
		default:
			b.st.flood.Add(1)
			_ = b.enqueue(s, wire.KindError, wire.Error{RequestID: req.RequestID, Code: wire.ErrCodeBusy,
				Message: "the host's RPC queue is full; retry"}, nil, false)
		}
	default:
		b.st.malformed.Add(1)
	}
}

// ack records the bytes a worker acknowledged and wakes the sender.
func (b *Broker) ack(s *session, rx uint64) {
	for {
		old := s.ackBytes.Load()
		if rx <= old {
			return
		}
		if s.ackBytes.CompareAndSwap(old, rx) {
			break
		}
	}
	s.blockedNs.Store(0)
	b.wakeSender()
}

// routeResult hands a RESULT to its waiting turn, or to LateResult.
func (b *Broker) routeResult(s *session, body []byte) {
	var env struct {
		DeliveryID string          `json:"delivery_id"`
		Result     json.RawMessage `json:"result"`
	}
	if json.Unmarshal(body, &env) != nil || len(env.Result) == 0 {
		b.st.malformed.Add(1)
		return
	}
	if b.deliver(s, env.DeliveryID, laneEvent{kind: wire.KindResult, body: env.Result}) {
		return
	}
	select {
	case b.late <- lateResult{worker: s.worker, body: env.Result}:
	default:
		b.st.lateDropped.Add(1)
	}
}

// deliver hands ev to the turn waiting on deliveryID in s; false if none.
func (b *Broker) deliver(s *session, deliveryID string, ev laneEvent) bool {
	b.mu.Lock()
	c := s.turns[deliveryID]
	b.mu.Unlock()
	if c == nil {
		return false
	}
	select {
	case c.events <- ev:
	default:
		// A worker sending more lane messages than the protocol allows.
		b.st.flood.Add(1)
	}
	return true
}

// lifecycle queues ev for the lifecycle goroutine; a full queue drops it.
func (b *Broker) lifecycle(ev lifeEvent) {
	select {
	case b.life <- ev:
	default:
		b.st.flood.Add(1)
	}
}

// handleHello authenticates a HELLO and hands it to the lifecycle.
func (b *Broker) handleHello(p *peer, route string, h wire.Header, data []byte) {
	if len(data) > wire.MaxHelloBytes {
		b.st.oversized.Add(1)
		return
	}
	if !h.Session.IsZero() {
		b.st.malformed.Add(1)
		return
	}
	ws, err := wire.NewSession(p.key, p.id, h.Incarnation, wire.ID{})
	if err != nil {
		b.st.malformed.Add(1)
		return
	}
	_, body, err := ws.Open(wire.ToHost, data)
	if err != nil {
		b.st.forged.Add(1)
		b.warnDrop("forged", p.id, "a HELLO under this id does not open with its key: the worker's key differs from the host's fabric.workers entry")
		return
	}
	now := time.Now()
	if _, seen := b.helloSeen[h.Incarnation]; seen {
		b.st.replayed.Add(1)
		return
	}
	if !b.helloBucket(p.id, now).take(now) {
		b.st.flood.Add(1)
		return
	}
	b.helloSeen[h.Incarnation] = now.Add(2*b.cfg.ClockSkew + time.Minute)
	b.st.in.Add(1)
	var hello wire.Hello
	if err := json.Unmarshal(body, &hello); err != nil {
		b.st.malformed.Add(1)
		b.reject(p, route, h.Incarnation, wire.Reject{Code: wire.RejectBadHello, Message: "HELLO body does not decode: " + err.Error()})
		return
	}
	skew := now.Sub(time.UnixMilli(hello.TimeMs))
	if skew > b.cfg.ClockSkew || -skew > b.cfg.ClockSkew {
		// An old HELLO replayed after its incarnation left the seen-set, or
		// a worker whose clock is off: either way it cannot join.
		b.st.replayed.Add(1)
		b.reject(p, route, h.Incarnation, wire.Reject{Code: wire.RejectClockSkew, TimeMs: now.UnixMilli(),
			Message: fmt.Sprintf("HELLO time is %s from the host's clock; the limit is %s", skew.Round(time.Millisecond), b.cfg.ClockSkew)})
		return
	}
	if msg := checkHello(hello); msg != "" {
		code := wire.RejectBadHello
		if hello.ABIVersion != abi.Version {
			code = wire.RejectABIVersion
		}
		b.reject(p, route, h.Incarnation, wire.Reject{Code: code, Message: msg})
		return
	}
	b.lifecycle(lifeEvent{kind: lifeHello, id: p.id, route: route, inc: h.Incarnation, hello: hello})
}

// checkHello validates a HELLO body; "" if acceptable.
func checkHello(h wire.Hello) string {
	switch {
	case h.ABIVersion != abi.Version:
		return fmt.Sprintf("the worker speaks turn contract v%d, the host v%d", h.ABIVersion, abi.Version)
	case h.Capacity < 1 || h.Capacity > 4096:
		return fmt.Sprintf("capacity %d is outside 1..4096", h.Capacity)
	case len(h.Pools) == 0 || len(h.Pools) > 32:
		return fmt.Sprintf("%d pools announced; 1..32 required", len(h.Pools))
	case len(h.Kinds) == 0 || len(h.Kinds) > 256:
		return fmt.Sprintf("%d kinds announced; 1..256 required", len(h.Kinds))
	}
	for _, p := range h.Pools {
		if p == "" || len(p) > 100 {
			return fmt.Sprintf("pool name %q must be 1–100 bytes", p)
		}
	}
	for _, k := range h.Kinds {
		if k != workerkind.Wasm && !strings.HasPrefix(k, "plugin:") {
			return fmt.Sprintf("kind %q is neither %q nor plugin:<name>@<sha256>", k, workerkind.Wasm)
		}
	}
	return ""
}

// handleUnknownSession answers an authentic message of a session this
// broker does not know (it restarted, or ended the session long ago) with
// a REJECT, so the worker starts over at once instead of after its
// heartbeat timeout.
func (b *Broker) handleUnknownSession(p *peer, route string, h wire.Header, data []byte) {
	ws, err := wire.NewSession(p.key, p.id, h.Incarnation, h.Session)
	if err != nil {
		b.st.malformed.Add(1)
		return
	}
	if _, _, err := ws.Open(wire.ToHost, data); err != nil {
		b.st.forged.Add(1)
		return
	}
	b.st.unknownSession.Add(1)
	b.rejectLimited(p, route, h.Incarnation, wire.RejectUnknownSession, "the host does not know this session (it restarted?); send a new HELLO")
}

// rejectVersion answers a message of an unknown protocol version from an
// admitted worker with a REJECT naming both versions; other senders get
// nothing (they are not authenticated).
func (b *Broker) rejectVersion(id, route string, got int) {
	p := b.peers[id]
	if p == nil {
		return
	}
	b.mu.Lock()
	s := p.cur
	b.mu.Unlock()
	if s == nil {
		return
	}
	now := time.Now()
	if last, ok := b.rejectRate[id]; ok && now.Sub(last) < time.Second {
		return
	}
	b.rejectRate[id] = now
	b.reject(p, route, s.key.incarnation, wire.Reject{Code: wire.RejectUnknownVersion, Versions: []int{wire.Version}, GotVersion: got,
		Message: fmt.Sprintf("received wire protocol version %d; this host speaks %d", got, wire.Version)})
}

// rejectLimited sends at most one unsolicited REJECT per worker id and second.
func (b *Broker) rejectLimited(p *peer, route string, inc wire.ID, code, msg string) {
	now := time.Now()
	if last, ok := b.rejectRate[p.id]; ok && now.Sub(last) < time.Second {
		return
	}
	b.rejectRate[p.id] = now
	b.reject(p, route, inc, wire.Reject{Code: code, Message: msg})
}

// reject sends a REJECT to incarnation inc of worker p over routing
// identity route, sealed under a fresh session id (wire: a REJECT is
// accepted under any session id).
func (b *Broker) reject(p *peer, route string, inc wire.ID, r wire.Reject) {
	ws, err := wire.NewSession(p.key, p.id, inc, wire.NewID())
	if err != nil {
		return
	}
	body, err := json.Marshal(r)
	if err != nil {
		return
	}
	b.st.rejected.Add(1)
	frame := ws.Seal(wire.ToWorker, wire.KindReject, ws.NextSeq(), body)
	b.sendMu.Lock()
	if len(b.control) < b.cfg.QueueLen {
		b.control = append(b.control, &outMsg{worker: route, raw: frame, kind: wire.KindReject, deadline: time.Now().Add(b.cfg.SendTimeout)})
	} else {
		b.st.queueFull.Add(1)
	}
	b.sendMu.Unlock()
	b.wakeSender()
	b.log.LogAttrs(b.ctx, slog.LevelInfo, "fabric rejected worker", slog.String("worker", p.id),
		slog.String("incarnation", inc.String()), slog.String("code", r.Code), slog.String("message", r.Message))
}

// lifecycleLoop applies worker lifecycle events in order and runs the
// heartbeat clock.
func (b *Broker) lifecycleLoop() {
	tick := min(b.cfg.HeartbeatInterval/4, b.cfg.HeartbeatTimeout/8, 250*time.Millisecond)
	t := time.NewTicker(max(tick, 5*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case ev := <-b.life:
			b.apply(ev)
		case now := <-t.C:
			b.clock(now)
		case <-b.ctx.Done():
			b.mu.Lock()
			for _, s := range b.sessions {
				b.endLocked(s, ReasonBrokerClosed)
			}
			b.mu.Unlock()
			return
		}
	}
}

func (b *Broker) apply(ev lifeEvent) {
	now := time.Now()
	switch ev.kind {
	case lifeHello:
		p := b.peers[ev.id]
		sid := wire.NewID()
		ws, err := wire.NewSession(p.key, p.id, ev.inc, sid)
		if err != nil {
			return
		}
		s := &session{worker: p.id, key: sessKey{p.id, ev.inc, sid}, ws: ws, hello: ev.hello, dead: make(chan struct{}),
			state: statePending, created: now, turns: map[string]*call{}}
		s.setRoute(ev.route)
		s.lastHeardNs.Store(now.UnixNano())
		b.mu.Lock()
		if b.closed {
			b.mu.Unlock()
			return
		}
		b.sessions[s.key] = s
		p.pending = append(p.pending, s)
		b.mu.Unlock()
		_ = b.enqueue(s, wire.KindWelcome, wire.Welcome{
			TimeMs: now.UnixMilli(), HeartbeatIntervalMs: b.cfg.HeartbeatInterval.Milliseconds(),
			HeartbeatTimeoutMs: b.cfg.HeartbeatTimeout.Milliseconds(), MaxMessageBytes: b.cfg.MaxMessageBytes,
			WindowBytes: b.cfg.WindowBytes, MaxCallsInFlight: b.cfg.MaxCallsInFlight,
		}, nil, true)
	case lifeAdmit:
		s := ev.sess
		b.mu.Lock()
		if s.state != statePending || b.closed {
			b.mu.Unlock()
			return
		}
		p := b.peers[s.worker]
		p.pending = slices.DeleteFunc(p.pending, func(x *session) bool { return x == s })
		old := p.cur
		s.state = stateLive
		p.cur = s
		if old != nil {
			b.endLocked(old, ReasonSuperseded)
		}
		b.mu.Unlock()
		if old != nil && old.route() != s.route() {
			// The new incarnation came over another connection: the old
			// one is of no more use (a dead process's half-open socket, or
			// a copy of the worker that lost the race).
			b.disconnect(old.route())
		}
		b.st.admitted.Add(1)
		attrs := []slog.Attr{slog.String("worker", s.worker), slog.String("incarnation", s.key.incarnation.String()),
			slog.Any("pools", s.hello.Pools), slog.Any("kinds", s.hello.Kinds), slog.Int("capacity", s.hello.Capacity)}
		if old != nil {
			attrs = append(attrs, slog.String("superseded", old.key.incarnation.String()))
		}
		b.log.LogAttrs(b.ctx, slog.LevelInfo, "fabric worker admitted", attrs...)
		if b.cfg.Admitted != nil {
			b.cfg.Admitted(s.worker, slices.Clone(s.hello.Pools))
		}
	case lifeHeartbeat:
		b.mu.Lock()
		ev.sess.hbFree, ev.sess.hbRunning = ev.hb.Free, ev.hb.Running
		b.mu.Unlock()
	case lifePong:
		b.mu.Lock()
		if ev.pong.Nonce == ev.sess.pingNonce {
			ev.sess.pingSent, ev.sess.pingQueued = time.Time{}, false
		}
		b.mu.Unlock()
	case lifeGoodbye:
		b.mu.Lock()
		b.endLocked(ev.sess, ReasonGoodbye)
		b.mu.Unlock()
		b.log.LogAttrs(b.ctx, slog.LevelInfo, "fabric worker said goodbye", slog.String("worker", ev.sess.worker),
			slog.String("reason", ev.why))
	}
}

// clock runs the heartbeat checks: it ends silent sessions, sends PINGs,
// forgets old sessions, and marks a stalled send's worker lost.
func (b *Broker) clock(now time.Time) {
	var pings []*session
	type ended struct {
		s      *session
		reason string
	}
	var lost []ended
	b.mu.Lock()
	for k, s := range b.sessions {
		switch s.state {
		case statePending:
			if now.Sub(s.created) > b.cfg.HeartbeatTimeout {
				p := b.peers[s.worker]
				p.pending = slices.DeleteFunc(p.pending, func(x *session) bool { return x == s })
				b.endLocked(s, ReasonHeartbeatTimeout)
			}
		case stateLive:
			heard := time.Unix(0, s.lastHeardNs.Load())
			switch {
			case now.Sub(heard) > b.cfg.HeartbeatTimeout:
				b.endLocked(s, ReasonHeartbeatTimeout)
				lost = append(lost, ended{s, ReasonHeartbeatTimeout})
			case !s.pingSent.IsZero() && now.Sub(s.pingSent) > b.cfg.HeartbeatTimeout:
				b.endLocked(s, ReasonPingTimeout)
				lost = append(lost, ended{s, ReasonPingTimeout})
			case s.blockedNs.Load() != 0 && now.Sub(time.Unix(0, s.blockedNs.Load())) > b.cfg.HeartbeatTimeout:
				// Its window is full and it acknowledged nothing: the
				// PING cannot even go out. The same verdict as a lost PONG.
				b.endLocked(s, ReasonNotReading)
				lost = append(lost, ended{s, ReasonNotReading})
			case !s.pingQueued && now.Sub(s.lastPing) >= b.cfg.HeartbeatInterval:
				s.pingQueued = true
				s.pingNonce++
				s.lastPing = now
				pings = append(pings, s)
			}
		case stateDead:
			if now.Sub(s.endedAt) > b.cfg.SessionRetention {
				delete(b.sessions, k)
			}
		}
	}
	b.mu.Unlock()
	for _, l := range lost {
		b.log.LogAttrs(b.ctx, slog.LevelWarn, "fabric worker lost", slog.String("worker", l.s.worker),
			slog.String("incarnation", l.s.key.incarnation.String()), slog.String("reason", l.reason))
		if l.reason != ReasonHeartbeatTimeout {
			// It still sends but does not read: cut its connection too.
			b.disconnect(l.s.route())
		}
		b.reject(b.peers[l.s.worker], l.s.route(), l.s.key.incarnation, wire.Reject{Code: wire.RejectEvicted,
			Message: "the host ended this session: " + l.reason})
	}
	for _, s := range pings {
		b.mu.Lock()
		nonce := s.pingNonce
		b.mu.Unlock()
		s := s
		m := &outMsg{sess: s, kind: wire.KindPing, deadline: now.Add(b.cfg.SendTimeout), onSent: func(at time.Time) {
			b.mu.Lock()
			if s.pingNonce == nonce && s.pingQueued {
				s.pingSent = at
			}
			b.mu.Unlock()
		}, onFail: func() {
			b.mu.Lock()
			if s.pingNonce == nonce {
				s.pingQueued = false
			}
			b.mu.Unlock()
		}}
		if body, err := json.Marshal(wire.Ping{Nonce: nonce}); err == nil {
			m.body = body
			if err := b.push(m, false); err != nil {
				m.onFail()
			}
		}
	}
	// A send stuck past SendTimeout: its worker stopped reading. Mark it
	// lost now so its turns fail; the socket stays stuck until the
	// connection breaks (the library's global send lock; package doc).
	if st := b.sending.Load(); st != nil && now.Sub(st.start) > b.cfg.SendTimeout && st.flagged.CompareAndSwap(false, true) {
		b.st.sendStalls.Add(1)
		if st.sess != nil {
			b.mu.Lock()
			b.endLocked(st.sess, ReasonSendStalled)
			b.mu.Unlock()
		}
		b.log.LogAttrs(b.ctx, slog.LevelError, "fabric send stalled: worker stopped reading; cutting its connection (zmq4 global send lock)",
			slog.String("worker", st.worker), slog.Duration("stalled_for", now.Sub(st.start)))
		b.disconnect(st.worker)
	}
}

// disconnect closes a worker's transport connections through the
// configured hook (outside b.mu), if any.
func (b *Broker) disconnect(route string) {
	if b.cfg.Disconnect != nil && route != "" {
		n := b.cfg.Disconnect(route)
		b.log.LogAttrs(b.ctx, slog.LevelInfo, "fabric worker connection cut", slog.String("worker", printable(route)), slog.Int("connections", n))
	}
}

// endLocked ends session s (b.mu held): its turns fail with reason, it
// leaves the live set, and its keys stay SessionRetention for late results.
func (b *Broker) endLocked(s *session, reason string) {
	if s.state == stateDead {
		return
	}
	wasLive := s.state == stateLive
	s.state = stateDead
	s.reason = reason
	s.endedAt = time.Now()
	close(s.dead)
	if p := b.peers[s.worker]; p != nil && p.cur == s {
		p.cur = nil
	}
	if !wasLive {
		return
	}
	switch reason {
	case ReasonHeartbeatTimeout:
		b.st.lostHB.Add(1)
	case ReasonPingTimeout:
		b.st.lostPing.Add(1)
	case ReasonGoodbye:
		b.st.lostGoodbye.Add(1)
	case ReasonSuperseded:
		b.st.lostSuperseded.Add(1)
	case ReasonSendStalled:
		b.st.lostStalled.Add(1)
	case ReasonNotReading:
		b.st.lostNotReading.Add(1)
	case ReasonRejected:
		b.st.lostRejected.Add(1)
	}
}

// lateLoop hands late results to the LateResult callback, one at a time.
func (b *Broker) lateLoop() {
	for {
		select {
		case l := <-b.late:
			res := new(abi.TurnResult)
			if err := json.Unmarshal(l.body, res); err != nil {
				b.st.lateDropped.Add(1)
				continue
			}
			b.st.late.Add(1)
			b.log.LogAttrs(b.ctx, slog.LevelInfo, "fabric late result", slog.String("worker", l.worker),
				slog.String("turn_ref", res.TurnRef.String()))
			if b.cfg.LateResult != nil {
				b.cfg.LateResult(res)
			}
		case <-b.ctx.Done():
			return
		}
	}
}

// bucket is a token bucket for HELLO rate limiting.
type bucket struct {
	tokens float64
	last   time.Time
}

func (b *Broker) helloBucket(id string, now time.Time) *bucket {
	bk := b.helloRate[id]
	if bk == nil {
		bk = &bucket{tokens: DefaultHelloBurst, last: now}
		b.helloRate[id] = bk
	}
	return bk
}

func (bk *bucket) take(now time.Time) bool {
	bk.tokens = min(float64(DefaultHelloBurst), bk.tokens+now.Sub(bk.last).Seconds()*DefaultHelloPerSecond)
	bk.last = now
	if bk.tokens < 1 {
		return false
	}
	bk.tokens--
	return true
}

// printable makes a peer identity safe to log.
func printable(s string) string {
	s = truncate(s, 64)
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f || r == 0xfffd {
			return '?'
		}
		return r
	}, s)
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// warnDrop logs a dropped message's reason at warn, at most once a minute
// per reason and worker id (a misconfigured worker should be told in the
// host's log; a flood must not flood it). Receive goroutine only.
func (b *Broker) warnDrop(reason, id, why string) {
	if b.dropLog == nil {
		b.dropLog = map[string]time.Time{}
	}
	k := reason + "\x00" + id
	now := time.Now()
	if last, ok := b.dropLog[k]; ok && now.Sub(last) < time.Minute {
		return
	}
	if len(b.dropLog) > 1024 {
		clear(b.dropLog)
	}
	b.dropLog[k] = now
	b.log.LogAttrs(b.ctx, slog.LevelWarn, "fabric dropped a message", slog.String("reason", reason),
		slog.String("worker", printable(id)), slog.String("why", why))
}
