package fabric

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/paddock-dev/paddock/fabric/wire"
)

// outMsg is one message waiting to be sent: either a kind and JSON body
// for a session (sealed by the sender, so seqs follow the wire order), or
// a pre-sealed frame (raw) for a worker identity.
type outMsg struct {
	sess     *session
	kind     wire.Kind
	body     []byte
	worker   string // raw messages
	raw      []byte
	deadline time.Time
	done     chan<- error // buffered 1, optional
	onSent   func(at time.Time)
	onFail   func()
}

func (m *outMsg) finish(err error) {
	if err != nil && m.onFail != nil {
		m.onFail()
	}
	if err == nil && m.onSent != nil {
		m.onSent(time.Now())
	}
	if m.done != nil {
		m.done <- err
	}
}

// sendState is the socket send in progress, watched by the lifecycle clock.
type sendState struct {
	sess    *session
	worker  string
	start   time.Time
	flagged atomic.Bool
}

// enqueue marshals body and queues it for session s. A pending session
// accepts messages only when early is set (WELCOME; GOODBYE at close).
// done, if not nil, receives the send's outcome.
func (b *Broker) enqueue(s *session, kind wire.Kind, body any, done chan<- error, early bool) error {
	raw, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("fabric: encode %s: %w", kind, err)
	}
	return b.push(&outMsg{sess: s, kind: kind, body: raw, done: done, deadline: time.Now().Add(b.cfg.SendTimeout)}, early)
}

// push queues m on its session. Errors: ErrWorkerGone (the session is not
// live: the broker never sends outside its live set), ErrSendStalled (the
// socket is stuck behind another worker), ErrQueueFull, ErrRequestTooLarge.
func (b *Broker) push(m *outMsg, early bool) error {
	s := m.sess
	if len(m.body)+wire.MinMessageLen > b.cfg.MaxMessageBytes {
		return fmt.Errorf("%w: %s of %d bytes, limit %d", ErrRequestTooLarge, m.kind, len(m.body), b.cfg.MaxMessageBytes)
	}
	b.mu.Lock()
	state, reason := s.state, s.reason
	b.mu.Unlock()
	if state == stateDead || (state == statePending && !early) {
		b.st.sendFailed.Add(1)
		if reason == "" {
			reason = "not admitted"
		}
		return fmt.Errorf("%w: %s/%s (%s)", ErrWorkerGone, s.worker, s.key.incarnation, reason)
	}
	if st := b.sending.Load(); st != nil && st.flagged.Load() {
		b.st.sendFailed.Add(1)
		return fmt.Errorf("%w: behind worker %s for %s", ErrSendStalled, st.worker, time.Since(st.start).Round(time.Millisecond))
	}
	b.sendMu.Lock()
	if len(s.queue) >= b.cfg.QueueLen {
		b.sendMu.Unlock()
		b.st.queueFull.Add(1)
		return fmt.Errorf("%w: worker %s has %d messages queued", ErrQueueFull, s.worker, b.cfg.QueueLen)
	}
	if len(s.queue) == 0 {
		b.sendable = append(b.sendable, s)
	}
	s.queue = append(s.queue, m)
	b.sendMu.Unlock()
	b.wakeSender()
	return nil
}

func (b *Broker) wakeSender() {
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

// next picks the next message to send: pre-sealed control messages first,
// then the sessions' queues round robin, each within its flow-control
// window. Messages of ended sessions and messages past their deadline
// are failed here. It returns nil when nothing can go now.
func (b *Broker) next(now time.Time) *outMsg {
	var failed []struct {
		m   *outMsg
		err error
	}
	defer func() {
		for _, f := range failed {
			f.m.finish(f.err)
		}
	}()
	b.sendMu.Lock()
	defer b.sendMu.Unlock()
	for len(b.control) > 0 {
		m := b.control[0]
		b.control = b.control[1:]
		if now.After(m.deadline) {
			b.st.expired.Add(1)
			continue
		}
		return m
	}
	n := len(b.sendable)
	for i := 0; i < n && len(b.sendable) > 0; i++ {
		if b.rr >= len(b.sendable) {
			b.rr = 0
		}
		s := b.sendable[b.rr]
		dead := s.isDead()
		// Drop what cannot go: an ended session's messages, expired ones.
		for len(s.queue) > 0 {
			m := s.queue[0]
			var err error
			switch {
			case dead:
				err = fmt.Errorf("%w: %s/%s (%s)", ErrWorkerGone, s.worker, s.key.incarnation, "ended")
				b.st.sendFailed.Add(1)
			case now.After(m.deadline):
				err = fmt.Errorf("%w: %s to %s after %s", ErrSendExpired, m.kind, s.worker, b.cfg.SendTimeout)
				b.st.expired.Add(1)
			}
			if err == nil {
				break
			}
			s.queue = s.queue[1:]
			failed = append(failed, struct {
				m   *outMsg
				err error
			}{m, err})
		}
		if len(s.queue) == 0 {
			b.sendable = slices.Delete(b.sendable, b.rr, b.rr+1)
			continue
		}
		m := s.queue[0]
		size := uint64(len(m.body) + wire.MinMessageLen)
		outstanding := s.txBytes - min(s.ackBytes.Load(), s.txBytes)
		if outstanding > 0 && outstanding+size > uint64(b.cfg.WindowBytes) {
			// Window full: the worker has not acknowledged enough yet.
			s.blockedNs.CompareAndSwap(0, now.UnixNano())
			b.rr++
			continue
		}
		s.blockedNs.Store(0)
		s.queue = s.queue[1:]
		s.txBytes += size
		if len(s.queue) == 0 {
			b.sendable = slices.Delete(b.sendable, b.rr, b.rr+1)
		} else {
			b.rr++
		}
		return m
	}
	return nil
}

// sendLoop is the only goroutine that sends on the socket.
func (b *Broker) sendLoop() {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		m := b.next(time.Now())
		if m == nil {
			select {
			case <-b.kick:
			case <-t.C:
			case <-b.ctx.Done():
				return
			}
			continue
		}
		b.send(m)
	}
}

// send seals m (session messages get the session's next seq here, so seqs
// follow the wire order) and hands it to the socket, recording the send in
// progress for the stall watchdog.
func (b *Broker) send(m *outMsg) {
	frame, worker := m.raw, m.worker
	if m.sess != nil {
		worker = m.sess.route()
		frame = m.sess.ws.Seal(wire.ToWorker, m.kind, m.sess.ws.NextSeq(), m.body)
	}
	st := &sendState{sess: m.sess, worker: worker, start: time.Now()}
	b.sending.Store(st)
	err := b.sock.Send(zmq4.NewMsgFrom([]byte(worker), frame))
	b.sending.Store(nil)
	if d := time.Since(st.start); st.flagged.Load() {
		b.log.LogAttrs(b.ctx, slog.LevelWarn, "fabric stalled send returned", slog.String("worker", worker),
			slog.Duration("stalled_for", d))
	}
	if err != nil {
		b.st.sendFailed.Add(1)
		m.finish(fmt.Errorf("fabric: send %s to %s: %w", m.kind, worker, err))
		return
	}
	b.st.out.Add(1)
	if b.log.Enabled(b.ctx, slog.LevelDebug) {
		b.log.LogAttrs(b.ctx, slog.LevelDebug, "fabric sent", slog.String("worker", worker), slog.String("kind", m.kind.String()),
			slog.Int("bytes", len(frame)), slog.Duration("took", time.Since(st.start)))
	}
	m.finish(nil)
}
