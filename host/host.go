// Package host is Paddock's actor runtime: a supervisor that owns one
// controller per live actor key, activation leases and their renewal, the
// lease watchdog, the scan for runnable sessions, and dispatch of turns to
// workers. It decides nothing about correctness on its own: every commit and
// every failed attempt goes through the store's fences (docs/DESIGN.md invariant 3),
// so a host with empty memory decides exactly as the old one did (invariant 6).
package host

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/trace"

	"github.com/paddock-dev/paddock/host/calls"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/tracing"
)

// AgentPolicy is what an agent's sessions run with (docs/DESIGN.md "Failure, retry
// and crash policy"); config.Policy is its configuration form.
type AgentPolicy struct {
	// CrashPolicy is the default stored on sessions created without one.
	CrashPolicy store.CrashPolicy
	// MaxAttempts is the dead-letter threshold.
	MaxAttempts int
	// BackoffMin and BackoffMax bound the retry backoff.
	BackoffMin, BackoffMax time.Duration
	// BlockOnDeadLetter: later events wait behind a dead letter.
	BlockOnDeadLetter bool
	// IdleTimeout stops an activation that has had no due event this long.
	IdleTimeout time.Duration
	// TurnTimeout is the wall-time cap of one turn.
	TurnTimeout time.Duration
	// RestartPendingTimeout: a restart-policy session waiting this long for
	// capacity goes to sleep.
	RestartPendingTimeout time.Duration
	// Pool is the capacity pool of the agent's activations.
	Pool string
	// TranscriptTail, when set, overrides Policy.TranscriptTail for the
	// agent (messages per TurnRequest).
	TranscriptTail *int
	// InstanceReuse is the scope of a wasm instance (ScopeSession when
	// empty).
	InstanceReuse InstanceScope
	// MidTurn is what a message signal does while the session has a turn
	// in flight (MidTurnQueue when empty); a signal may override it.
	MidTurn MidTurn
	// Capabilities are the agent's host-call grants (docs/DESIGN.md "Host
	// calls and the journal"); the zero value denies every call.
	Capabilities calls.Capabilities
}

// MidTurn is what a message signal does when it arrives while the session
// has a turn in flight (docs/DESIGN.md "Messages that arrive mid-turn").
type MidTurn string

// The mid-turn policies.
const (
	// MidTurnQueue appends the message; it runs after the turn.
	MidTurnQueue MidTurn = "queue"
	// MidTurnSteer delivers the message to the running turn as a steer.
	MidTurnSteer MidTurn = "steer"
	// MidTurnInterrupt cancels the turn in flight, then appends the
	// message.
	MidTurnInterrupt MidTurn = "interrupt"
	// MidTurnReject refuses the message while a turn is in flight.
	MidTurnReject MidTurn = "reject"
)

// Valid says whether m is one of the mid-turn policies.
func (m MidTurn) Valid() bool {
	switch m {
	case MidTurnQueue, MidTurnSteer, MidTurnInterrupt, MidTurnReject:
		return true
	}
	return false
}

// Policy is everything a host runs with: host-wide settings, fixed at
// start, and agent policies, which SetPolicy may replace while running.
type Policy struct {
	// LeaseTTL is the activation lease length; renewed by each commit of
	// its turns, and every LeaseTTL/3 when none renewed it since.
	LeaseTTL time.Duration
	// ScanInterval paces the watchdog, alarm firing and runnable scan.
	ScanInterval time.Duration
	// TranscriptTail is how many recent messages a TurnRequest carries.
	TranscriptTail int
	// ShutdownTimeout bounds how long in-flight turns may finish at stop.
	ShutdownTimeout time.Duration
	// PromoteAfter: a turn of an in-process worker (a wasm module run here)
	// is dispatched deferred — read, not written — and written whole by
	// its commit, unless it makes a host call, streams, waits or fails
	// first, or runs this long, which promote it (docs/DESIGN.md "Deferred
	// dispatch"). 0 (or less): every dispatch is written at once. The
	// configuration bounds it to 10s and below LeaseTTL (runtime.
	// promote_after): a deferred turn is not in flight, so the lease is
	// what bounds how long its session waits after a crash.
	PromoteAfter time.Duration
	// RestartIntensity and RestartPeriod: more controller panics than this
	// within the period make the attempt count as a crash (OTP intensity).
	RestartIntensity int
	RestartPeriod    time.Duration

	// AgentPolicy is the default agent policy.
	AgentPolicy
	// Agents are per-agent policies by qualified agent name
	// (store.QualifiedName: "chat" in the default namespace, "team-a/chat"
	// in team-a), already merged over the default.
	Agents map[string]AgentPolicy
	// Pools is the capacity of each pool on this host.
	Pools map[string]int
	// Namespaces are the namespaces declared besides "default" (which
	// always exists), by name, with their quotas (config namespaces:,
	// docs/DESIGN.md "Namespaces"). Replaced by
	// SetPolicy like the agent policies.
	Namespaces map[string]NamespacePolicy
	// Stream configures the session streams (host-wide, fixed at New);
	// zero fields take DefaultStreamPolicy's.
	Stream StreamPolicy
}

// NamespacePolicy is a namespace's configuration.
type NamespacePolicy struct {
	Quotas Quotas
}

// Quotas bound what a namespace may use; 0 means unlimited. Over a quota,
// new work is refused (429 with Retry-After) and accepted work is kept.
type Quotas struct {
	// LiveSessions bounds the sessions that are not destroyed.
	LiveSessions int64
	// SignalsPerMinute bounds the signals accepted per minute.
	SignalsPerMinute int64
	// ModelTokensPerDay bounds the model tokens (input + output) its
	// agents' model calls use per UTC day.
	ModelTokensPerDay int64
}

// StreamPolicy configures the session streams (config stream:,
// docs/DESIGN.md "The session stream").
type StreamPolicy struct {
	// FlushInterval: an attempt's emitted chunks are written as one frame
	// at most this long after the previous write (sooner once 32 KiB are
	// buffered, and always before the turn commits or fails).
	FlushInterval time.Duration
	// Retention: frames older than this are compacted away (except those
	// of an event still open), by a loop that runs every minute.
	Retention time.Duration
	// MaxBytesPerTurn caps the chunk text and data one attempt may emit;
	// later emits answer too_large.
	MaxBytesPerTurn int64
}

// DefaultStreamPolicy returns the defaults of stream: 100 ms, 24 h, 8 MiB.
func DefaultStreamPolicy() StreamPolicy {
	return StreamPolicy{FlushInterval: 100 * time.Millisecond, Retention: 24 * time.Hour, MaxBytesPerTurn: 8 << 20}
}

// For returns the policy of the agent named qualified: its name in the
// default namespace, "namespace/name" in another (store.QualifiedName;
// the spelling of the config's agents: keys).
func (p *Policy) For(qualified string) AgentPolicy {
	if a, ok := p.Agents[qualified]; ok {
		return a
	}
	return p.AgentPolicy
}

// ForAgent returns the policy of agent a, of its namespace (For).
func (p *Policy) ForAgent(a store.Agent) AgentPolicy {
	return p.For(store.QualifiedName(a.Namespace, a.Name))
}

// DefaultPromoteAfter is Policy.PromoteAfter's default: long enough for
// a turn that only computes, short enough that a watcher sees a running
// turn's turn.started at once by human measure.
const DefaultPromoteAfter = 50 * time.Millisecond

// DefaultPolicy returns the defaults of the configuration.
func DefaultPolicy() Policy {
	return Policy{
		LeaseTTL: 8 * time.Second, ScanInterval: time.Second, TranscriptTail: 20, ShutdownTimeout: 10 * time.Second,
		PromoteAfter:     DefaultPromoteAfter,
		RestartIntensity: 3, RestartPeriod: 5 * time.Second,
		AgentPolicy: AgentPolicy{
			CrashPolicy: store.CrashRestart, MaxAttempts: 5, BackoffMin: 5 * time.Second, BackoffMax: 120 * time.Second,
			IdleTimeout: 30 * time.Second, TurnTimeout: 30 * time.Second, RestartPendingTimeout: 60 * time.Second,
			Pool: "default",
		},
		Pools:  map[string]int{"default": 64},
		Stream: DefaultStreamPolicy(),
	}
}

// Options configure a Host.
type Options struct {
	Store  store.Store
	Runner Runner
	Policy Policy
	// HostID names this host in activation rows; a fresh UUID when empty.
	HostID  string
	Logger  *slog.Logger
	Metrics *Metrics
	// Calls performs the host calls of running turns (nil: a turn's host
	// calls answer not_configured). Each attempt's calls go through its
	// journal (docs/DESIGN.md invariant 12).
	Calls *calls.Executor
	// OnCommit, when set, is called after each turn this host committed,
	// on the committing goroutine (keep it short). Benchmarks use it to
	// observe signal→commit latency.
	OnCommit func(store.Turn)
	// StreamNotify, when set, is called with a session's key after this
	// host wrote frames to its stream (a turn started, chunks, a commit, a
	// failed attempt, a wait expired), so that the session stream's
	// subscribers on this host wake at once (host/stream.Hub.Poke). It must
	// not block.
	StreamNotify func(store.ActorKey)
	// Tracing exports the host's spans: each turn attempt, its host
	// calls and its commit (docs/DESIGN.md "Tracing"). Nil: tracing.Off.
	Tracing *tracing.Provider
}

// Host runs the controllers of one `paddock serve` process.
type Host struct {
	st      store.Store
	runner  Runner
	set     Policy // host-wide settings, fixed at New
	pol     atomic.Pointer[Policy]
	id      string
	log     *slog.Logger
	metrics *Metrics

	mu     sync.Mutex
	ctrls  map[store.ActorKey]*controller
	leases map[string]*lease // by activation uid
	// forced marks sessions whose next allocation is forced (Force), until
	// a slot is taken for them or the mark expires.
	forced map[store.ActorKey]time.Time
	pools  map[string]*pool
	// runCtx ends when the host begins to stop: controllers take no new
	// turns. turnCtx ends ShutdownTimeout later: in-flight turns abort.
	runCtx, turnCtx context.Context
	wg              sync.WaitGroup
	stopping        bool

	// rescan asks scanLoop for a scan now (Rescan).
	rescan chan struct{}

	// expects is the last expectation of each agent in each pool (the
	// store.ExpectedBinding of its last dispatch on this host), which an
	// activation's first dispatch starts from.
	expectMu sync.Mutex
	expects  map[expectKey]store.ExpectedBinding
	// agents is each agent as this host's last look at one of its
	// sessions read it (PeekSession), by agent UID: a cold start after
	// this host's own append claims without a look (quickStart). Guarded
	// by expectMu.
	agents map[string]store.Agent

	commitMu sync.Mutex
	commitCh chan struct{}
	onCommit func(store.Turn)
	calls    *calls.Executor
	// streamNotify is Options.StreamNotify (nil: none).
	streamNotify func(store.ActorKey)
	// tracer starts the host's spans (Options.Tracing).
	tracer trace.Tracer
	// echoes: the store's wake-ups come back to their sender
	// (store.EchoSubscriber); echoSet pairs an append's two (wakeups.go).
	echoes  bool
	echoSet echoSet
}

// New creates a host. Call Run to start it.
func New(o Options) (*Host, error) {
	if o.Store == nil || o.Runner == nil {
		return nil, errors.New("host: Store and Runner are required")
	}
	if o.HostID == "" {
		o.HostID = uuid.NewString()
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Metrics == nil {
		o.Metrics = NewMetrics()
	}
	if o.Policy.RestartIntensity == 0 {
		o.Policy.RestartIntensity, o.Policy.RestartPeriod = 3, 5*time.Second
	}
	if o.Policy.Pool == "" {
		o.Policy.Pool = "default"
	}
	if len(o.Policy.Pools) == 0 {
		o.Policy.Pools = map[string]int{o.Policy.Pool: 64}
	}
	def := DefaultStreamPolicy()
	if o.Policy.Stream.FlushInterval <= 0 {
		o.Policy.Stream.FlushInterval = def.FlushInterval
	}
	if o.Policy.Stream.Retention <= 0 {
		o.Policy.Stream.Retention = def.Retention
	}
	if o.Policy.Stream.MaxBytesPerTurn <= 0 {
		o.Policy.Stream.MaxBytesPerTurn = def.MaxBytesPerTurn
	}
	h := &Host{
		st: o.Store, runner: o.Runner, set: o.Policy, id: o.HostID,
		log: o.Logger.With("host_id", o.HostID), metrics: o.Metrics,
		ctrls: map[store.ActorKey]*controller{}, leases: map[string]*lease{}, forced: map[store.ActorKey]time.Time{}, pools: map[string]*pool{},
		commitCh: make(chan struct{}), onCommit: o.OnCommit, calls: o.Calls, rescan: make(chan struct{}, 1),
		streamNotify: o.StreamNotify, tracer: o.Tracing.Tracer(),
	}
	_, h.echoes = o.Store.(store.EchoSubscriber)
	h.SetPolicy(o.Policy)
	return h, nil
}

// SetPolicy replaces the agent policies and pool capacities while the host
// runs (config reload). Host-wide settings (lease TTL, scan interval …)
// keep their values from New. Turns already running keep their policy.
func (h *Host) SetPolicy(p Policy) {
	p.LeaseTTL, p.ScanInterval, p.TranscriptTail = h.set.LeaseTTL, h.set.ScanInterval, h.set.TranscriptTail
	p.ShutdownTimeout, p.RestartIntensity, p.RestartPeriod = h.set.ShutdownTimeout, h.set.RestartIntensity, h.set.RestartPeriod
	p.Stream = h.set.Stream
	h.pol.Store(&p)
	h.mu.Lock()
	defer h.mu.Unlock()
	for name, n := range p.Pools {
		if pl, ok := h.pools[name]; ok {
			pl.setCapacity(n)
		} else {
			h.pools[name] = newPool(n)
		}
	}
}

// Policy returns the policy in force.
func (h *Host) Policy() *Policy { return h.pol.Load() }

// pool returns the named capacity pool (an unknown name: the default's).
func (h *Host) pool(name string) *pool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if p, ok := h.pools[name]; ok {
		return p
	}
	return h.pools[h.pol.Load().Pool]
}

// ID returns the host id written on this host's activations.
func (h *Host) ID() string { return h.id }

// Metrics returns the host's metrics.
func (h *Host) Metrics() *Metrics { return h.metrics }

// Tracer returns the tracer of the host's spans (Options.Tracing); its
// spans record nothing when tracing is off.
func (h *Host) Tracer() trace.Tracer { return h.tracer }

// Store returns the host's store.
func (h *Host) Store() store.Store { return h.st }

// CommitSignal returns a channel closed at the next turn committed on this
// host (used by transcript long-polls).
func (h *Host) CommitSignal() <-chan struct{} {
	h.commitMu.Lock()
	defer h.commitMu.Unlock()
	return h.commitCh
}

func (h *Host) signalCommit() {
	h.commitMu.Lock()
	close(h.commitCh)
	h.commitCh = make(chan struct{})
	h.commitMu.Unlock()
}

// Run starts the background loops (lease renewal, watchdog, runnable scan,
// store wake-ups) and blocks until ctx ends. Then it stops taking turns,
// lets in-flight turns finish for up to ShutdownTimeout, stops activations
// and returns.
func (h *Host) Run(ctx context.Context) error {
	runCtx, stopRun := context.WithCancel(context.Background())
	turnCtx, stopTurns := context.WithCancel(context.Background())
	defer stopTurns()
	h.mu.Lock()
	h.runCtx, h.turnCtx = runCtx, turnCtx
	h.mu.Unlock()

	wakeups, err := h.subscribe(runCtx)
	if err != nil {
		stopRun()
		return fmt.Errorf("host: subscribe to store wake-ups: %w", err)
	}
	// Leases are renewed until the last controller has exited, so that
	// turns finishing during a graceful stop can still commit.
	renewCtx, stopRenew := context.WithCancel(context.Background())
	defer stopRenew()
	var loops sync.WaitGroup
	loops.Add(4)
	go func() { defer loops.Done(); h.renewLoop(renewCtx) }()
	go func() { defer loops.Done(); h.scanLoop(runCtx) }()
	go func() { defer loops.Done(); h.compactLoop(runCtx) }()
	go func() { defer loops.Done(); <-wakeups }()
	h.log.Info("host running", "store", h.st.Driver())

	<-ctx.Done()
	h.mu.Lock()
	h.stopping = true
	h.mu.Unlock()
	stopRun()
	done := make(chan struct{})
	go func() { h.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(h.set.ShutdownTimeout):
		h.log.Warn("shutdown timeout: aborting in-flight turns")
		stopTurns()
		select {
		case <-done:
		case <-time.After(h.set.ShutdownTimeout):
			// A worker adapter ignores its context. Its activation's lease
			// lapses and the watchdog of the next host takes over; the
			// fences reject whatever it sends later.
			h.log.Error("shutdown: turns did not stop after being aborted; leaving them", "controllers", h.controllerCount())
		}
	}
	stopRenew()
	loops.Wait()
	h.log.Info("host stopped")
	return nil
}

// Controllers returns the number of live controllers (sessions with a
// goroutine on this host: running, waiting for a turn or idle until their
// idle timeout).
func (h *Host) Controllers() int { return h.controllerCount() }

func (h *Host) controllerCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.ctrls)
}

// Ensure makes sure a controller runs for key on this host (idempotent:
// a second call wakes the existing controller). It returns at once.
func (h *Host) Ensure(key store.ActorKey) { h.ensure(key, nil) }

// ensure is Ensure; a controller it starts holds hint, an event this host
// just appended (offer's choice), from the start: its cold start then
// needs no look at the session (quickStart).
func (h *Host) ensure(key store.ActorKey, hint *store.Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.runCtx == nil || h.stopping {
		return
	}
	if c, ok := h.ctrls[key]; ok {
		c.poke()
		return
	}
	c := newController(h, key)
	if hint != nil && offered(*hint) {
		c.hint = hint
	}
	h.ctrls[key] = c
	h.metrics.Controllers.Inc()
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		c.run(h.runCtx, h.turnCtx)
	}()
}

// Force marks key's next allocation as forced (docs/DESIGN.md "Capacity"): when
// the pool is full, a sleep-policy session waits for a slot instead of
// going to sleep at once. Call it before the store write that makes the
// session runnable (the signal or wake), then Ensure: a controller started
// by that write's wake-up then already sees the mark. The mark is consumed
// when a slot is taken for the session and expires after forceMarkTTL.
func (h *Host) Force(key store.ActorKey) {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := time.Now()
	for k, until := range h.forced {
		if now.After(until) {
			delete(h.forced, k)
		}
	}
	h.forced[key] = now.Add(forceMarkTTL)
}

// forceMarkTTL bounds how long an unconsumed Force mark lives.
const forceMarkTTL = 10 * time.Minute

// isForced reports whether key's allocation is forced.
func (h *Host) isForced(key store.ActorKey) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	until, ok := h.forced[key]
	return ok && time.Now().Before(until)
}

// consumeForce drops key's force mark once a slot was taken for it.
func (h *Host) consumeForce(key store.ActorKey) {
	h.mu.Lock()
	delete(h.forced, key)
	h.mu.Unlock()
}

// Running reports whether a controller runs for key on this host.
func (h *Host) Running(key store.ActorKey) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.ctrls[key]
	return ok
}

// exit removes c unless it was woken since its last look at the store, in
// which case it must go on (no wake-up is lost between the two).
func (h *Host) exit(c *controller) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	select {
	case <-c.wake:
		if !h.stopping {
			return false
		}
	default:
	}
	delete(h.ctrls, c.key)
	if len(h.ctrls) == 0 {
		// Go maps never shrink: after a burst of sessions, an idle host
		// would keep the burst's buckets. Start afresh.
		h.ctrls = map[store.ActorKey]*controller{}
	}
	h.metrics.Controllers.Dec()
	return true
}

// lease is one activation this host holds and renews.
type lease struct {
	ref  store.ActivationRef
	lost context.CancelFunc
	// renewedAt is when the last write known to have renewed the lease
	// was sent (the claim, a commit with CommitTurnParams.LeaseTTL), by
	// this host's monotonic clock: the database set the lease to at least
	// LeaseTTL after it. renewLoop skips a lease renewed since its last
	// round.
	renewedAt time.Time
}

// holdLease records the lease of an activation claimed by a call sent at
// sent.
func (h *Host) holdLease(ref store.ActivationRef, lost context.CancelFunc, sent time.Time) {
	h.mu.Lock()
	h.leases[ref.UID] = &lease{ref: ref, lost: lost, renewedAt: sent}
	h.mu.Unlock()
}

// holdsLease reports whether this host holds the activation's lease.
func (h *Host) holdsLease(uid string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.leases[uid]
	return ok
}

// leaseRenewed records that a commit sent at sent renewed the
// activation's lease (CommitTurnParams.LeaseTTL).
func (h *Host) leaseRenewed(uid string, sent time.Time) {
	h.mu.Lock()
	if l, ok := h.leases[uid]; ok && sent.After(l.renewedAt) {
		l.renewedAt = sent
	}
	h.mu.Unlock()
}

func (h *Host) dropLease(uid string) {
	h.mu.Lock()
	delete(h.leases, uid)
	if len(h.leases) == 0 {
		h.leases = map[string]*lease{} // see exit
	}
	h.mu.Unlock()
}

// renewLoop renews every lease of this host in one batched statement every
// LeaseTTL/3; an activation the store did not renew is lost, and its
// controller is told at once. A lease that a commit renewed since the
// round before (CommitTurnParams.LeaseTTL) is skipped: it has more than
// two thirds of a TTL left, so at the next round it still has more than a
// third — no less than a lease the store skipped at a round because a turn
// held its row (RenewLeases), and such a commit is what held it.
func (h *Host) renewLoop(ctx context.Context) {
	every := h.set.LeaseTTL / 3
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		t.Reset(every)
		round := time.Now()
		h.mu.Lock()
		refs := make([]store.ActivationRef, 0, len(h.leases))
		for _, l := range h.leases {
			if round.Sub(l.renewedAt) < every {
				continue
			}
			refs = append(refs, l.ref)
		}
		h.mu.Unlock()
		if len(refs) == 0 {
			continue
		}
		// A slice's call may take up to half a TTL (a busy store); leases
		// renewed a third of a TTL ago still have two thirds left. A slice
		// that fails keeps its leases (their fate is unknown: the next
		// round, soon, tells) and the other slices go on.
		var renewed []store.ActivationRef
		failed := false
		for chunk := range slices.Chunk(refs, renewChunk) {
			rctx, cancel := context.WithTimeout(ctx, h.set.LeaseTTL/2)
			got, err := h.st.RenewLeases(rctx, store.RenewLeasesParams{HostID: h.id, LeaseTTL: h.set.LeaseTTL, Refs: chunk})
			cancel()
			if err != nil {
				// Leases that run out meanwhile are safe to lose (the fences
				// reject their replies).
				h.log.Warn("lease renewal failed; retrying", "err", err, "leases", len(chunk))
				failed = true
				got = chunk
			}
			renewed = append(renewed, got...)
		}
		if failed {
			t.Reset(min(every, 200*time.Millisecond))
		}
		ok := make(map[string]bool, len(renewed))
		for _, r := range renewed {
			ok[r.UID] = true
		}
		h.mu.Lock()
		for _, r := range refs {
			if l, held := h.leases[r.UID]; held && !ok[r.UID] {
				h.log.Warn("lease lost", "activation", r.UID, "session", r.ActorKey.String())
				l.lost()
				delete(h.leases, r.UID)
			}
		}
		h.mu.Unlock()
	}
}

// renewChunk is how many leases one RenewLeases call renews. The rows a
// statement renews stay locked until it ends, and a turn of one of them
// waits for it (its dispatch and commit lock the activation row first):
// renewing a busy host's thousand leases in one statement put its p99
// turn latency at the renewal's length, every ttl/3. Slices of 128 bound
// that wait to one slice's.
const renewChunk = 128

// scanLoop is the safety net behind wake-ups: it fails activations whose
// lease expired (the watchdog) and starts controllers for sessions with a
// due event and no live activation (after a restart, after a backoff, after
// another host died).
func (h *Host) scanLoop(ctx context.Context) {
	t := time.NewTicker(h.set.ScanInterval)
	defer t.Stop()
	for {
		h.watchdog(ctx)
		h.fireAlarms(ctx)
		h.expireWaits(ctx)
		h.scan(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-h.rescan:
		}
	}
}

func (h *Host) watchdog(ctx context.Context) {
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	expired, err := h.st.ExpiredActivations(sctx, 100)
	if err != nil {
		if ctx.Err() == nil {
			h.log.Warn("watchdog: list expired activations", "err", err)
		}
		return
	}
	for _, ref := range expired {
		// A lost host already cost its sessions a lease TTL: the event is
		// retried at once on a live host (no further backoff), but the
		// attempt counts, so a poison event that kills every host that
		// runs it is dead-lettered (docs/DESIGN.md "What counts as an attempt").
		// The agent's own threshold is not known here without a lookup;
		// the default policy's applies to expiries.
		res, err := h.st.ExpireActivation(sctx, store.ExpireActivationParams{
			Ref: ref, Backoff: 0, MaxAttempts: h.pol.Load().MaxAttempts,
		})
		if errors.Is(err, store.ErrNotLive) {
			continue // renewed, stopped or expired by another host meanwhile, or locked by a stalled commit (the next scan looks again)
		}
		if err != nil {
			h.log.Warn("watchdog: expire activation", "err", err, "activation", ref.UID)
			continue
		}
		h.metrics.LeasesExpired.Inc()
		h.notifyStream(ref.ActorKey) // turn.retrying or turn.failed, lease_expired
		if res.DeadLettered {
			h.metrics.DeadLetters.Inc()
		}
		h.log.Info("watchdog: lease expired, activation failed", "activation", ref.UID,
			"session", ref.ActorKey.String(), "epoch", ref.ActorEpoch, "event", res.EventID, "attempts", res.Attempts,
			"session_status", res.SessionStatus)
		h.Ensure(ref.ActorKey)
	}
}

// fireAlarms fires due alarms (exactly once each, decided by the store) and
// wakes the sessions that got an alarm event.
func (h *Host) fireAlarms(ctx context.Context) {
	// Small batches, each under its own deadline, until a batch comes back
	// short: a backlog (after downtime) drains without one long call.
	const batch = 64
	for range 64 {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		keys, err := h.st.FireDueAlarms(sctx, batch)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				h.log.Warn("alarms: fire due alarms", "err", err)
			}
			return
		}
		h.metrics.AlarmsFired.Add(float64(len(keys)))
		for _, k := range keys {
			h.Ensure(k)
		}
		if len(keys) < batch {
			return
		}
	}
}

func (h *Host) scan(ctx context.Context) {
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	blocked, skip, err := h.scanFilters(sctx)
	if err != nil {
		if ctx.Err() == nil {
			h.log.Warn("scan: agents", "err", err)
		}
		return
	}
	keys, err := h.st.RunnableSessions(sctx, store.RunnableSessionsParams{Limit: 256, BlockedAgents: blocked, SkipAgents: skip})
	if err != nil {
		if ctx.Err() == nil {
			h.log.Warn("scan: runnable sessions", "err", err)
		}
		return
	}
	for _, k := range keys {
		h.Ensure(k)
	}
}

// scanFilters returns the agents the runnable scan treats apart: blocked,
// those whose dead-letter policy is "block", and skip, those whose pool
// this host cannot run now (Placer), left out so that their sessions cannot
// fill the scan's page and hide the sessions it can run (docs/DESIGN.md
// "Remote pools across hosts"). Both nil, without a store call, when no
// policy blocks and no pool of the policy may be refused.
func (h *Host) scanFilters(ctx context.Context) (blocked, skip []string, err error) {
	pol := h.pol.Load()
	placer, _ := h.runner.(Placer)
	mayRefuse := func(pool string) bool {
		if placer == nil {
			return false
		}
		if ps, ok := placer.(PoolScope); ok {
			return ps.MayRefuse(pool)
		}
		return true
	}
	anyBlock, anySkip := pol.BlockOnDeadLetter, mayRefuse(pol.Pool)
	for _, a := range pol.Agents {
		anyBlock = anyBlock || a.BlockOnDeadLetter
		anySkip = anySkip || mayRefuse(a.Pool)
	}
	if !anyBlock && !anySkip {
		return nil, nil, nil
	}
	agents, err := h.st.ListAgents(ctx, store.AnyNamespace)
	if err != nil {
		return nil, nil, err
	}
	for _, a := range agents {
		ap := pol.ForAgent(a)
		if ap.BlockOnDeadLetter {
			blocked = append(blocked, a.UID)
		}
		if mayRefuse(ap.Pool) && !h.placeable(ctx, a, ap.Pool) {
			skip = append(skip, a.UID)
		}
	}
	return blocked, skip, nil
}

// Backoff computes the bounded exponential backoff after n failed attempts
// with jitter j in [0,1): min·2^(n-1)·(0.8+0.4j), clamped to [min, max].
func Backoff(n int, min, max time.Duration, j float64) time.Duration {
	if n < 1 {
		n = 1
	}
	d := float64(min)
	for i := 1; i < n && d < float64(max); i++ {
		d *= 2
	}
	d *= 0.8 + 0.4*j
	if d < float64(min) {
		d = float64(min)
	}
	if d > float64(max) {
		d = float64(max)
	}
	return time.Duration(d)
}
