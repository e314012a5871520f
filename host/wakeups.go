package host

import (
	"context"
	"sync"

	"github.com/paddock-dev/paddock/store"
)

// Store wake-ups (docs/DESIGN.md "The flow of one signal"). A signal appended through
// this host wakes its controller twice: once in-process, by the caller of
// the append (Appended), and once more when the store's notification of
// that append comes back to this host's own listener (PostgreSQL's NOTIFY
// reaches its sender too). Both come after the append's commit, so either
// makes the controller look at the store after it; the second only costs
// a look that finds nothing new (a read of the turn in flight, or an
// "anything due?" probe). Of the two, the first wakes the controller and
// the second is dropped, matched by (session, event seq). A hint is dropped
// only when the other one of the same append already woke the controller
// on this host: other hosts' notifications, this host's own writes other
// than those appends, and appends no caller reported (a test writing to
// the store directly) wake it as before.

// echoSetSize bounds each generation of an echoSet: a hint whose partner
// never comes (the listener reconnected and lost the notification, the
// appending call failed after the commit) is forgotten after one to two
// generations of others; its partner, should it come later, then wakes the
// controller once more: a look for nothing, never a lost wake-up.
const echoSetSize = 1024

// echoSet pairs the two wake-ups of one append (Appended and the echo of
// its notification).
type echoSet struct {
	mu        sync.Mutex
	cur, prev map[echoKey]struct{}
}

// echoKey names one appended event.
type echoKey struct {
	key store.ActorKey
	seq int64
}

// first reports whether this is the first of k's two wake-ups (and
// remembers it); the second finds and forgets it.
func (s *echoSet) first(k echoKey) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.cur[k]; ok {
		delete(s.cur, k)
		return false
	}
	if _, ok := s.prev[k]; ok {
		delete(s.prev, k)
		return false
	}
	if len(s.cur) >= echoSetSize {
		s.prev, s.cur = s.cur, nil
	}
	if s.cur == nil {
		s.cur = make(map[echoKey]struct{}, echoSetSize)
	}
	s.cur[k] = struct{}{}
	return true
}

// Appended is Ensure for the session of e, an event that AppendEvent or
// Steer of the host's store has just appended (created, not an
// idempotent re-send's first event). With a store whose notifications
// come back to their sender (store.EchoSubscriber), it and the echo of the
// append's notification wake the controller once between them; with any
// other store it is Ensure.
func (h *Host) Appended(e store.Event) {
	if !h.echoes || e.Seq <= 0 {
		h.Ensure(e.ActorKey)
		return
	}
	h.wakeOnce(echoKey{e.ActorKey, e.Seq})
}

// wakeOnce calls Ensure for the first of an append's two wake-ups and
// drops the second.
func (h *Host) wakeOnce(k echoKey) {
	if h.echoSet.first(k) {
		h.Ensure(k.key)
		return
	}
	h.metrics.WakeupsDeduplicated.Inc()
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
				h.wakeOnce(echoKey{w.Key, w.EchoSeq})
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
