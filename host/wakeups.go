package host

import (
	"context"
	"sync"
	"time"

	"github.com/paddock-dev/paddock/store"
)

// Store wake-ups (docs/DESIGN.md "The flow of one signal"). A signal appended through
// this host wakes its controller twice: once in-process, by the caller of
// the append (Appended), and once more when the store's notification of
// that append comes back to this host's own listener (PostgreSQL's NOTIFY
// reaches its sender too). Both come after the append's commit, so either
// makes the controller look at the store after it; the second only costs
// a look that finds nothing new (a read of the turn in flight, or an
// "anything due?" probe). Of the two, one wakes the controller and the
// other is dropped, matched by (session, event seq). The one that wakes
// is the caller's report when it comes within echoGrace of the echo,
// since it carries the event (Host.offer: the controller may then
// dispatch it without a read, wakedispatch.go); the two often race, and
// the echo comes first about as often as not. An echo that comes first
// therefore wakes the controller only if no report follows within
// echoGrace (the appending call failed after its commit, or a test wrote
// to the store directly): later, never lost. A hint is dropped only when
// the other one of the same append wakes the controller on this host:
// other hosts' notifications and this host's own writes other than those
// appends wake it as before.

// echoSetSize bounds each generation of an echoSet: a hint whose partner
// never comes (the listener reconnected and lost the notification, the
// appending call failed after the commit) is forgotten after one to two
// generations of others; its partner, should it come later, then wakes the
// controller once more: a look for nothing, never a lost wake-up.
const echoSetSize = 1024

// echoGrace is how long the echo of an append's notification, come before
// the append's report (Appended), waits for it before it wakes the
// controller itself: the report normally follows within a millisecond.
const echoGrace = 20 * time.Millisecond

// echoSet pairs the two wake-ups of one append (Appended and the echo of
// its notification). An entry is the first one seen: nil for a report,
// which woke the controller; the pending wake-up for an echo.
type echoSet struct {
	mu        sync.Mutex
	cur, prev map[echoKey]*time.Timer
}

// echoKey names one appended event.
type echoKey struct {
	key store.ActorKey
	seq int64
}

// take finds and forgets k's entry.
func (s *echoSet) take(k echoKey) (t *time.Timer, ok bool) {
	if t, ok = s.cur[k]; ok {
		delete(s.cur, k)
	} else if t, ok = s.prev[k]; ok {
		delete(s.prev, k)
	}
	return t, ok
}

// put remembers k's first wake-up.
func (s *echoSet) put(k echoKey, t *time.Timer) {
	if len(s.cur) >= echoSetSize {
		s.prev, s.cur = s.cur, nil
	}
	if s.cur == nil {
		s.cur = make(map[echoKey]*time.Timer, echoSetSize)
	}
	s.cur[k] = t
}

// reported is the append's report of k. wake: it must wake the
// controller — it is the first of the two, or the echo came first and
// its wake-up was still pending (now cancelled: dropped); false when the
// echo already woke it (the report is dropped). dropped says one of the
// two was.
func (s *echoSet) reported(k echoKey) (wake, dropped bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.take(k)
	if !ok {
		s.put(k, nil)
		return true, false
	}
	return t != nil && t.Stop(), true
}

// echoed is the echo of k's notification: when it is the first of the
// two, it calls wake after grace unless the report comes first, and
// returns true; false when the report already woke the controller.
func (s *echoSet) echoed(k echoKey, grace time.Duration, wake func()) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.take(k); ok {
		return false
	}
	s.put(k, time.AfterFunc(grace, wake))
	return true
}

// Appended is Ensure for the session of e, an event that AppendEvent or
// Steer of the host's store has just appended (created, not an
// idempotent re-send's first event), and offers e to the session's
// controller (wakedispatch.go). With a store whose notifications come
// back to their sender (store.EchoSubscriber), it and the echo of the
// append's notification wake the controller once between them; with any
// other store it is Ensure.
func (h *Host) Appended(e store.Event) {
	h.offer(e) // before the wake-up: the controller takes both
	if !h.echoes || e.Seq <= 0 {
		h.ensure(e.ActorKey, &e)
		return
	}
	wake, dropped := h.echoSet.reported(echoKey{e.ActorKey, e.Seq})
	if dropped {
		h.metrics.WakeupsDeduplicated.Inc()
	}
	if wake {
		h.ensure(e.ActorKey, &e)
	}
}

// echo is the echo of this host's own append's notification (k): it wakes
// the controller unless Appended reported the append first, after
// echoGrace unless Appended reports it meanwhile.
func (h *Host) echo(k echoKey) {
	if !h.echoSet.echoed(k, echoGrace, func() { h.Ensure(k.key) }) {
		h.metrics.WakeupsDeduplicated.Inc()
	}
}

// subscribe subscribes to the store's wake-ups; each one that is not the
// echo of an append already reported by Appended calls Ensure. The
// returned channel closes when the subscription ends (ctx).
func (h *Host) subscribe(ctx context.Context) (<-chan struct{}, error) {
	done := make(chan struct{})
	if es, ok := h.st.(store.EchoSubscriber); ok && h.echoes {
		ch, err := es.SubscribeEchoes(ctx)
		if err != nil {
			return nil, err
		}
		go func() {
			defer close(done)
			for w := range ch {
				if w.EchoSeq <= 0 {
					h.Ensure(w.Key)
					continue
				}
				h.echo(echoKey{w.Key, w.EchoSeq})
			}
		}()
		return done, nil
	}
	ch, err := h.st.Subscribe(ctx)
	if err != nil {
		return nil, err
	}
	go func() {
		defer close(done)
		for key := range ch {
			h.Ensure(key)
		}
	}()
	return done, nil
}
