package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"syscall"
	"time"
)

// injector injects the faults: at random intervals it picks the kind
// furthest from its target and does it to a random eligible target.
// Restarts (of a killed host or worker) and SIGCONTs (of a stalled process)
// run in the background, so faults overlap.
type injector struct {
	e   *env
	rnd *rand.Rand

	mu      sync.Mutex
	targets map[string]int
	counts  map[string]int
	// stallsOf counts stalls by target kind: worker, plugin.
	stallsOf map[string]int
	// stopped are the pids this injector SIGSTOPped and has not yet
	// SIGCONTed (plugin processes; stopped workers are busy).
	stopped map[int]bool
	// unexpected are exits of hosts or workers that no fault caused.
	unexpected []string
	errs       []error
	bg         sync.WaitGroup
	// bgCtx is the run's context, for the background restarts and
	// SIGCONTs: they outlive the injection loop's own deadline.
	bgCtx context.Context
}

func newInjector(ctx context.Context, e *env, seed int64) *injector {
	in := &injector{e: e, bgCtx: ctx, rnd: rand.New(rand.NewPCG(uint64(seed), 1)), targets: map[string]int{},
		counts: map[string]int{}, stallsOf: map[string]int{}, stopped: map[int]bool{}}
	for _, k := range e.cfg.Kinds {
		switch k {
		case kindPGRestart:
			if e.cluster != nil {
				in.targets[k] = 1 // once, by design
			}
		default:
			if e.cfg.Faults > 0 {
				in.targets[k] = e.cfg.Faults
			}
		}
	}
	return in
}

// planned is the expected length of the chaos phase: every fault at the
// mean interval.
func (in *injector) planned() time.Duration {
	n := 0
	for _, t := range in.targets {
		n += t
	}
	return time.Duration(max(n, 1)) * in.e.cfg.FaultInterval
}

func (in *injector) logf(format string, args ...any) { in.e.cfg.logf(format, args...) }

func (in *injector) randDur(lo, hi time.Duration) time.Duration {
	in.mu.Lock()
	defer in.mu.Unlock()
	return lo + time.Duration(in.rnd.Int64N(int64(hi-lo)+1))
}

func (in *injector) total() (done, want int) {
	in.mu.Lock()
	defer in.mu.Unlock()
	for k, t := range in.targets {
		done += min(in.counts[k], t)
		want += t
	}
	return done, want
}

// run injects until every kind reached its target or ctx ends.
func (in *injector) run(ctx context.Context) {
	iv := in.e.cfg.FaultInterval
	for {
		done, want := in.total()
		if done >= want {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(in.randDur(iv/2, iv*3/2)):
		}
		in.supervise(in.bgCtx)
		// PostgreSQL restarts once, half-way through.
		if in.targets[kindPGRestart] > 0 && in.count(kindPGRestart) == 0 && done >= want/2 {
			in.pgRestart(in.bgCtx)
			continue
		}
		for _, k := range in.order() {
			if in.inject(in.bgCtx, k) {
				break
			}
		}
	}
}

func (in *injector) count(kind string) int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.counts[kind]
}

func (in *injector) add(kind, what string) {
	in.mu.Lock()
	in.counts[kind]++
	n := in.counts[kind]
	in.mu.Unlock()
	in.logf("fault %s #%d: %s", kind, n, what)
}

// order lists the kinds below target, least done (relative to target)
// first, ties in random order.
func (in *injector) order() []string {
	in.mu.Lock()
	defer in.mu.Unlock()
	var ks []string
	for k, t := range in.targets {
		if k != kindPGRestart && in.counts[k] < t {
			ks = append(ks, k)
		}
	}
	in.rnd.Shuffle(len(ks), func(i, j int) { ks[i], ks[j] = ks[j], ks[i] })
	sort.SliceStable(ks, func(i, j int) bool {
		return float64(in.counts[ks[i]])/float64(in.targets[ks[i]]) < float64(in.counts[ks[j]])/float64(in.targets[ks[j]])
	})
	return ks
}

// inject does one fault of kind; false when no target is eligible now.
func (in *injector) inject(ctx context.Context, kind string) bool {
	switch kind {
	case kindHostKill:
		return in.hostKill(ctx)
	case kindHostStall:
		return in.hostStall(ctx)
	case kindPluginKill:
		return in.pluginKill()
	case kindWorkerKill:
		return in.workerKill(ctx)
	case kindStall:
		return in.stall(ctx)
	}
	return false
}

// quietHost picks a random host when every host is up and none is held
// by a fault (so at most one host is ever down or stalled), and marks it
// busy and down.
func (in *injector) quietHost() *host {
	for _, h := range in.e.hosts {
		h.mu.Lock()
		ok := h.up && !h.busy && h.p != nil && !h.p.exited()
		h.mu.Unlock()
		if !ok {
			return nil
		}
	}
	in.mu.Lock()
	h := in.e.hosts[in.rnd.IntN(len(in.e.hosts))]
	in.mu.Unlock()
	h.mu.Lock()
	h.busy, h.up = true, false
	h.mu.Unlock()
	return h
}

// hostKill: kill -9 of a host, restarted after a short downtime.
func (in *injector) hostKill(ctx context.Context) bool {
	h := in.quietHost()
	if h == nil {
		return false
	}
	p, inc := h.current()
	p.kill()
	down := in.randDur(300*time.Millisecond, 1500*time.Millisecond)
	in.add(kindHostKill, fmt.Sprintf("kill -9 %s (pid %d, incarnation %d); restart in %v", h.name(), p.pid, inc, down))
	in.bg.Add(1)
	go func() {
		defer in.bg.Done()
		select {
		case <-ctx.Done():
			return
		case <-time.After(down):
		}
		in.restartHost(ctx, h)
	}()
	return true
}

func (in *injector) restartHost(ctx context.Context, h *host) {
	t := time.Now()
	err := h.start(ctx, in.e.cfg.Paddock, 2*time.Minute)
	if err != nil {
		// It stays busy: no further fault picks it, nor a supervisor
		// restart; heal reports it down.
		if ctx.Err() == nil {
			in.fail(fmt.Errorf("restart %s: %w", h.name(), err))
		}
		return
	}
	h.mu.Lock()
	h.busy = false
	h.mu.Unlock()
	_, inc := h.current()
	in.logf("%s back (incarnation %d) after %v", h.name(), inc, time.Since(t).Round(time.Millisecond))
}

// hostStall: SIGSTOP of a host, then SIGCONT. Most stalls outlast its
// lease: its leases expire, other hosts take its sessions over, and
// whatever it still tries to commit when it wakes must be refused by the
// fences. Some end just before or around the expiry, where its renewals
// and commits race the other hosts' watchdogs.
func (in *injector) hostStall(ctx context.Context) bool {
	h := in.quietHost()
	if h == nil {
		return false
	}
	p, inc := h.current()
	ttl := in.e.cfg.LeaseTTL
	d := in.randDur(ttl/2, 2*ttl+500*time.Millisecond)
	_ = syscall.Kill(p.pid, syscall.SIGSTOP)
	in.add(kindHostStall, fmt.Sprintf("SIGSTOP %s (pid %d, incarnation %d) for %v", h.name(), p.pid, inc, d))
	in.bg.Add(1)
	go func() {
		defer in.bg.Done()
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
		_ = syscall.Kill(p.pid, syscall.SIGCONT)
		h.mu.Lock()
		h.busy, h.up = false, !p.exited()
		h.mu.Unlock()
	}()
	return true
}

// plugins lists the plugin processes of live hosts that are not stopped.
func (in *injector) plugins() []int {
	var out []int
	comm := pluginComm(in.e.cfg.Plugin)
	for _, h := range in.e.hosts {
		h.mu.Lock()
		p, ok := h.p, h.up && !h.busy
		h.mu.Unlock()
		if !ok || p == nil {
			continue
		}
		for _, pid := range childrenNamed(p.pid, comm) {
			in.mu.Lock()
			stopped := in.stopped[pid]
			in.mu.Unlock()
			if !stopped {
				out = append(out, pid)
			}
		}
	}
	return out
}

// pluginKill: kill -9 of a plugin process; its host starts a new one.
func (in *injector) pluginKill() bool {
	pids := in.plugins()
	if len(pids) == 0 {
		return false
	}
	in.mu.Lock()
	pid := pids[in.rnd.IntN(len(pids))]
	in.mu.Unlock()
	_, _, ppid, _ := procStat(pid)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return false
	}
	in.add(kindPluginKill, fmt.Sprintf("kill -9 plugin process %d (of host pid %d)", pid, ppid))
	return true
}

// quietWorker picks a random running worker not held by a fault and marks
// it busy.
func (in *injector) quietWorker() *worker {
	var ws []*worker
	for _, w := range in.e.workers {
		w.mu.Lock()
		if !w.busy && w.p != nil && !w.p.exited() {
			ws = append(ws, w)
		}
		w.mu.Unlock()
	}
	if len(ws) == 0 {
		return nil
	}
	in.mu.Lock()
	w := ws[in.rnd.IntN(len(ws))]
	in.mu.Unlock()
	w.mu.Lock()
	w.busy = true
	w.mu.Unlock()
	return w
}

// workerKill: kill -9 of a remote worker, restarted after a short pause.
func (in *injector) workerKill(ctx context.Context) bool {
	w := in.quietWorker()
	if w == nil {
		return false
	}
	p := w.current()
	p.kill()
	down := in.randDur(200*time.Millisecond, time.Second)
	in.add(kindWorkerKill, fmt.Sprintf("kill -9 worker %s (pid %d); restart in %v", w.id, p.pid, down))
	in.bg.Add(1)
	go func() {
		defer in.bg.Done()
		select {
		case <-ctx.Done():
		case <-time.After(down):
		}
		err := w.start(in.e.cfg.Paddock)
		w.mu.Lock()
		w.busy = false
		w.mu.Unlock()
		if err != nil {
			in.fail(err)
		}
	}()
	return true
}

// stall: SIGSTOP of a remote worker or a plugin process (alternately, when
// both can be had) for around the heartbeat timeout, then SIGCONT: some
// stalls outlast the timeout (the worker is lost, its turn retried
// elsewhere, and its late reply refused), some do not (the turn is only
// late).
func (in *injector) stall(ctx context.Context) bool {
	in.mu.Lock()
	preferPlugin := in.stallsOf["plugin"] < in.stallsOf["worker"]
	in.mu.Unlock()
	hb := in.e.cfg.HeartbeatTimeout
	d := in.randDur(hb/2, 2*hb)
	stallPlugin := func() bool {
		pids := in.plugins()
		if len(pids) == 0 {
			return false
		}
		in.mu.Lock()
		pid := pids[in.rnd.IntN(len(pids))]
		in.stopped[pid] = true
		in.stallsOf["plugin"]++
		in.mu.Unlock()
		_ = syscall.Kill(pid, syscall.SIGSTOP)
		in.add(kindStall, fmt.Sprintf("SIGSTOP plugin process %d for %v", pid, d))
		in.bg.Add(1)
		go func() {
			defer in.bg.Done()
			select {
			case <-ctx.Done():
			case <-time.After(d):
			}
			_ = syscall.Kill(pid, syscall.SIGCONT)
			in.mu.Lock()
			delete(in.stopped, pid)
			in.mu.Unlock()
		}()
		return true
	}
	stallWorker := func() bool {
		w := in.quietWorker()
		if w == nil {
			return false
		}
		p := w.current()
		in.mu.Lock()
		in.stallsOf["worker"]++
		in.mu.Unlock()
		_ = syscall.Kill(p.pid, syscall.SIGSTOP)
		in.add(kindStall, fmt.Sprintf("SIGSTOP worker %s (pid %d) for %v", w.id, p.pid, d))
		in.bg.Add(1)
		go func() {
			defer in.bg.Done()
			select {
			case <-ctx.Done():
			case <-time.After(d):
			}
			_ = syscall.Kill(p.pid, syscall.SIGCONT)
			w.mu.Lock()
			w.busy = false
			w.mu.Unlock()
		}()
		return true
	}
	if preferPlugin {
		return stallPlugin() || stallWorker()
	}
	return stallWorker() || stallPlugin()
}

// pgRestart restarts PostgreSQL (once per run).
func (in *injector) pgRestart(ctx context.Context) {
	t := time.Now()
	in.add(kindPGRestart, fmt.Sprintf("pg_ctl restart -m %s", in.e.cfg.PGRestartMode))
	if err := in.e.cluster.restart(ctx, in.e.cfg.PGRestartMode); err != nil {
		in.fail(err)
		return
	}
	in.logf("PostgreSQL back after %v", time.Since(t).Round(time.Millisecond))
}

func (in *injector) fail(err error) {
	in.mu.Lock()
	in.errs = append(in.errs, err)
	in.mu.Unlock()
	in.logf("ERROR: %v", err)
}

// supervise notices hosts and workers that exited although no fault held
// them (a crash of Paddock's own), records it and starts them again.
func (in *injector) supervise(ctx context.Context) {
	for _, h := range in.e.hosts {
		h.mu.Lock()
		p, inc, crashed := h.p, h.inc, !h.busy && h.p != nil && h.p.exited()
		if crashed {
			h.busy, h.up = true, false
		}
		h.mu.Unlock()
		if crashed {
			in.mu.Lock()
			in.unexpected = append(in.unexpected, fmt.Sprintf("%s (pid %d, incarnation %d) exited on its own; log %s:\n%s",
				h.name(), p.pid, inc, h.logPath(inc), tail(h.logPath(inc), 1500)))
			in.mu.Unlock()
			in.logf("ERROR: %s exited on its own (log %s)", h.name(), h.logPath(inc))
			in.bg.Add(1)
			go func() { defer in.bg.Done(); in.restartHost(ctx, h) }()
		}
	}
	for _, w := range in.e.workers {
		w.mu.Lock()
		p, inc, crashed := w.p, w.inc, !w.busy && w.p != nil && w.p.exited()
		w.mu.Unlock()
		if crashed {
			in.mu.Lock()
			in.unexpected = append(in.unexpected, fmt.Sprintf("worker %s (pid %d, incarnation %d) exited on its own", w.id, p.pid, inc))
			in.mu.Unlock()
			in.logf("ERROR: worker %s exited on its own", w.id)
			if err := w.start(in.e.cfg.Paddock); err != nil {
				in.fail(err)
			}
		}
	}
}

// heal waits for the background restarts and SIGCONTs, then makes sure
// every host and worker runs.
func (in *injector) heal(ctx context.Context) error {
	in.bg.Wait()
	in.supervise(ctx)
	in.bg.Wait()
	in.mu.Lock()
	defer in.mu.Unlock()
	for pid := range in.stopped { // unreachable after bg.Wait, but cheap
		_ = syscall.Kill(pid, syscall.SIGCONT)
	}
	errs := in.errs
	for _, h := range in.e.hosts {
		if !h.isUp() {
			errs = append(errs, fmt.Errorf("%s is down", h.name()))
		}
	}
	for _, w := range in.e.workers {
		if p := w.current(); p == nil || p.exited() {
			errs = append(errs, fmt.Errorf("worker %s is down", w.id))
		}
	}
	return errors.Join(errs...)
}
