// Package host is Paddock's actor runtime: a supervisor that owns one
// controller per live actor key, activation leases and their renewal, the
// lease watchdog, the scan for runnable sessions, and dispatch of turns to
// workers. It decides nothing about correctness on its own: every commit and
// every failed attempt goes through the store's fences (DESIGN invariant 3),
// so a host with empty memory decides exactly as the old one did (invariant 6).
package host

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/paddock-dev/paddock/store"
)

// Policy holds the runtime and retry settings a host runs with.
type Policy struct {
	// LeaseTTL is the activation lease length; renewed every LeaseTTL/3.
	LeaseTTL time.Duration
	// IdleTimeout stops an activation that has had no due event this long.
	IdleTimeout time.Duration
	// ScanInterval paces the runnable-session scan and the lease watchdog.
	ScanInterval time.Duration
	// TurnTimeout is the wall-time cap of one turn.
	TurnTimeout time.Duration
	// TranscriptTail is how many recent messages a TurnRequest carries.
	TranscriptTail int
	// ShutdownTimeout bounds how long in-flight turns may finish at stop.
	ShutdownTimeout time.Duration
	// MaxAttempts is the dead-letter threshold.
	MaxAttempts int
	// BackoffMin and BackoffMax bound the retry backoff.
	BackoffMin, BackoffMax time.Duration
	// RestartIntensity and RestartPeriod: more controller panics than this
	// within the period make the attempt count as a crash (OTP intensity).
	RestartIntensity int
	RestartPeriod    time.Duration
}

// DefaultPolicy returns the defaults of the configuration.
func DefaultPolicy() Policy {
	return Policy{
		LeaseTTL: 15 * time.Second, IdleTimeout: 30 * time.Second, ScanInterval: time.Second,
		TurnTimeout: 30 * time.Second, TranscriptTail: 20, ShutdownTimeout: 10 * time.Second,
		MaxAttempts: 5, BackoffMin: 5 * time.Second, BackoffMax: 120 * time.Second,
		RestartIntensity: 3, RestartPeriod: 5 * time.Second,
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
}

// Host runs the controllers of one `paddock serve` process.
type Host struct {
	st      store.Store
	runner  Runner
	pol     Policy
	id      string
	log     *slog.Logger
	metrics *Metrics

	mu     sync.Mutex
	ctrls  map[store.ActorKey]*controller
	leases map[string]*lease // by activation uid
	// runCtx ends when the host begins to stop: controllers take no new
	// turns. turnCtx ends ShutdownTimeout later: in-flight turns abort.
	runCtx, turnCtx context.Context
	wg              sync.WaitGroup
	stopping        bool

	commitMu sync.Mutex
	commitCh chan struct{}
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
	return &Host{
		st: o.Store, runner: o.Runner, pol: o.Policy, id: o.HostID,
		log: o.Logger.With("host_id", o.HostID), metrics: o.Metrics,
		ctrls: map[store.ActorKey]*controller{}, leases: map[string]*lease{},
		commitCh: make(chan struct{}),
	}, nil
}

// ID returns the host id written on this host's activations.
func (h *Host) ID() string { return h.id }

// Metrics returns the host's metrics.
func (h *Host) Metrics() *Metrics { return h.metrics }

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

	wakeups, err := h.st.Subscribe(runCtx)
	if err != nil {
		stopRun()
		return fmt.Errorf("host: subscribe to store wake-ups: %w", err)
	}
	var loops sync.WaitGroup
	loops.Add(3)
	go func() { defer loops.Done(); h.renewLoop(runCtx) }()
	go func() { defer loops.Done(); h.scanLoop(runCtx) }()
	go func() {
		defer loops.Done()
		for key := range wakeups {
			h.Ensure(key)
		}
	}()
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
	case <-time.After(h.pol.ShutdownTimeout):
		h.log.Warn("shutdown timeout: aborting in-flight turns")
		stopTurns()
		<-done
	}
	loops.Wait()
	h.log.Info("host stopped")
	return nil
}

// Ensure makes sure a controller runs for key on this host (idempotent:
// a second call wakes the existing controller). It returns at once.
func (h *Host) Ensure(key store.ActorKey) {
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
	h.ctrls[key] = c
	h.metrics.Controllers.Inc()
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		c.run(h.runCtx, h.turnCtx)
	}()
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
	h.metrics.Controllers.Dec()
	return true
}

// lease is one activation this host holds and renews.
type lease struct {
	ref  store.ActivationRef
	lost context.CancelFunc
}

func (h *Host) holdLease(ref store.ActivationRef, lost context.CancelFunc) {
	h.mu.Lock()
	h.leases[ref.UID] = &lease{ref: ref, lost: lost}
	h.mu.Unlock()
}

func (h *Host) dropLease(uid string) {
	h.mu.Lock()
	delete(h.leases, uid)
	h.mu.Unlock()
}

// renewLoop renews every lease of this host in one batched statement every
// LeaseTTL/3; an activation the store did not renew is lost, and its
// controller is told at once.
func (h *Host) renewLoop(ctx context.Context) {
	t := time.NewTicker(h.pol.LeaseTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		h.mu.Lock()
		refs := make([]store.ActivationRef, 0, len(h.leases))
		for _, l := range h.leases {
			refs = append(refs, l.ref)
		}
		h.mu.Unlock()
		if len(refs) == 0 {
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, h.pol.LeaseTTL/3)
		renewed, err := h.st.RenewLeases(rctx, store.RenewLeasesParams{HostID: h.id, LeaseTTL: h.pol.LeaseTTL, Refs: refs})
		cancel()
		if err != nil {
			// Leases run out on their own; the fences make that safe.
			h.log.Warn("lease renewal failed", "err", err, "leases", len(refs))
			continue
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

// scanLoop is the safety net behind wake-ups: it fails activations whose
// lease expired (the watchdog) and starts controllers for sessions with a
// due event and no live activation (after a restart, after a backoff, after
// another host died).
func (h *Host) scanLoop(ctx context.Context) {
	t := time.NewTicker(h.pol.ScanInterval)
	defer t.Stop()
	for {
		h.watchdog(ctx)
		h.scan(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
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
		res, err := h.st.ExpireActivation(sctx, store.ExpireActivationParams{
			Ref: ref, Backoff: h.backoff(1), MaxAttempts: h.pol.MaxAttempts,
		})
		if errors.Is(err, store.ErrNotLive) {
			continue // renewed, stopped or expired by another host meanwhile
		}
		if err != nil {
			h.log.Warn("watchdog: expire activation", "err", err, "activation", ref.UID)
			continue
		}
		h.metrics.LeasesExpired.Inc()
		if res.DeadLettered {
			h.metrics.DeadLetters.Inc()
		}
		h.log.Info("watchdog: lease expired, activation failed", "activation", ref.UID,
			"session", ref.ActorKey.String(), "epoch", ref.ActorEpoch, "event", res.EventID, "attempts", res.Attempts)
	}
}

func (h *Host) scan(ctx context.Context) {
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	keys, err := h.st.RunnableSessions(sctx, 256)
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

// backoff returns the delay before attempt n+1 after n failed attempts:
// BackoffMin·2^(n-1), jittered by ±20 %, bounded to [BackoffMin, BackoffMax]
// (DESIGN: 5 s … 120 s by default).
func (h *Host) backoff(n int) time.Duration {
	return Backoff(n, h.pol.BackoffMin, h.pol.BackoffMax, rand.Float64())
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
