// Package stream serves session streams to many subscribers on one host
// (docs/DESIGN.md "The session stream"): a Hub keeps one reader per watched
// session that reads new frames from the store once per wake-up and fans
// them out, from a small per-session cache of recent frames, to that
// session's subscribers.
//
// Wake-ups come from Poke (this host wrote frames: host.Options.StreamNotify,
// or the service after a write of its own) and from a poll of
// store.StreamHeads every PollInterval over the watched sessions (frames
// written by other hosts). A subscriber that falls behind the cache (a slow
// client, or one resuming from an old position) reads the store on its own
// goroutine until it reaches the cache again, so it slows nobody else.
//
// Goroutines: one per watched session and one poller while any session is
// watched; none per subscriber (a subscriber is driven by its caller's
// goroutine through Next). They end when the last subscriber of a session
// closes, and all of them at Close.
package stream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/paddock-dev/paddock/store"
)

// ErrClosed is returned by Subscribe and Next once the hub is closed.
var ErrClosed = errors.New("stream hub closed")

// Defaults of Options.
const (
	DefaultPollInterval = 100 * time.Millisecond
	DefaultCacheFrames  = 256
	DefaultCacheBytes   = 4 << 20
	DefaultPageSize     = 256
	// readTimeout bounds one store read of the hub.
	readTimeout = 10 * time.Second
	// headsBatch bounds the keys of one StreamHeads call.
	headsBatch = 1000
	// catchUpPage bounds the frames a subscriber reads from the store at
	// once while it catches up (a chunk frame may hold up to 1 MiB).
	catchUpPage = 32
)

// Options configure a Hub.
type Options struct {
	// Store is read for frames and heads (required).
	Store store.Store
	// PollInterval is how often the heads of watched sessions are polled
	// for frames written by other hosts (config stream.poll_interval;
	// 0: DefaultPollInterval).
	PollInterval time.Duration
	// CacheFrames and CacheBytes bound each watched session's cache of
	// recent frames, in frames and in body bytes (0: the defaults); the
	// newest frame is always kept.
	CacheFrames, CacheBytes int
	// PageSize is the Limit of each StreamFrames read (0: DefaultPageSize).
	PageSize int
	Logger   *slog.Logger
}

// Hub fans session streams out to subscribers. It is safe for concurrent
// use; Close it to end every subscription and goroutine.
type Hub struct {
	o      Options
	log    *slog.Logger
	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc

	mu       sync.RWMutex
	sessions map[store.ActorKey]*session
	polling  bool
	closed   bool
	wg       sync.WaitGroup
}

// New returns a hub reading o.Store.
func New(o Options) *Hub {
	if o.PollInterval <= 0 {
		o.PollInterval = DefaultPollInterval
	}
	if o.CacheFrames <= 0 {
		o.CacheFrames = DefaultCacheFrames
	}
	if o.CacheBytes <= 0 {
		o.CacheBytes = DefaultCacheBytes
	}
	if o.PageSize <= 0 {
		o.PageSize = DefaultPageSize
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Hub{o: o, log: o.Logger, ctx: ctx, cancel: cancel, sessions: map[store.ActorKey]*session{}}
}

// session is one watched session: its tail (the reader goroutine), its
// cache of recent frames and its subscribers.
type session struct {
	key  store.ActorKey
	wake chan struct{} // cap 1: read the store now
	stop chan struct{} // closed when the last subscriber left

	mu    sync.Mutex
	subs  map[*Subscription]struct{}
	ready bool // base and last are known
	// The cache holds the frames (base, last], by Seq, as events.
	base, last int64
	cache      []cached
	cacheBytes int
}

type cached struct {
	seq  int64
	evs  []Event // FrameEvents(frame, zero cursor)
	size int
}

// Poke wakes the reader of session key, if it is watched, to read new
// frames at once. It never blocks.
func (h *Hub) Poke(key store.ActorKey) {
	h.mu.RLock()
	s := h.sessions[key]
	h.mu.RUnlock()
	if s != nil {
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

// Watched returns how many sessions have subscribers.
func (h *Hub) Watched() int {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return len(h.sessions)
}

// Subscribers returns how many subscriptions are open.
func (h *Hub) Subscribers() int {
	h.mu.RLock()
	defer h.mu.RUnlock()
	n := 0
	for _, s := range h.sessions {
		s.mu.Lock()
		n += len(s.subs)
		s.mu.Unlock()
	}
	return n
}

// Close ends every subscription (Next returns ErrClosed) and waits for the
// hub's goroutines to return.
func (h *Hub) Close() {
	h.mu.Lock()
	h.closed = true
	h.mu.Unlock()
	h.cancel()
	h.wg.Wait()
}

// Subscription is one subscriber's view of a session stream, positioned
// after what it has received. Drive it from one goroutine with Next; Close
// it when done.
type Subscription struct {
	h    *Hub
	key  store.ActorKey
	s    *session
	pos  Cursor
	wake chan struct{} // cap 1: the session's cache changed
	// fresh: subscribed from the start and nothing received yet (a fresh
	// reader gets no stream.reset).
	fresh bool
	// backlog holds events read but not yet returned.
	backlog []Event
	once    sync.Once
}

// Subscribe starts a subscription to session key's stream after position
// after (the zero Cursor: from the oldest kept frame). It reads the store
// once, so an unknown session is refused at once (store.ErrNotFound). A
// position older than the oldest kept frame gets an EventReset first, and
// so does one past the session's last frame (the subscription then
// follows from the head).
func (h *Hub) Subscribe(ctx context.Context, key store.ActorKey, after Cursor) (*Subscription, error) {
	sub := &Subscription{h: h, key: key, pos: after, wake: make(chan struct{}, 1), fresh: after.IsZero()}
	if err := sub.readStore(ctx); err != nil {
		return nil, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, ErrClosed
	}
	s := h.sessions[key]
	if s == nil {
		s = &session{key: key, wake: make(chan struct{}, 1), stop: make(chan struct{}), subs: map[*Subscription]struct{}{}}
		h.sessions[key] = s
		h.wg.Add(1)
		go h.tail(s)
		if !h.polling {
			h.polling = true
			h.wg.Add(1)
			go h.poll()
		}
	}
	s.mu.Lock()
	s.subs[sub] = struct{}{}
	s.mu.Unlock()
	sub.s = s
	return sub, nil
}

// SubscribeAtHead subscribes to session key's stream after its last
// frame: only frames written from now on (a client that just loaded the
// transcript, or one about to send a signal and follow its turn). Unknown
// session: store.ErrNotFound.
func (h *Hub) SubscribeAtHead(ctx context.Context, key store.ActorKey) (*Subscription, error) {
	rctx, cancel := context.WithTimeout(ctx, readTimeout)
	page, err := h.o.Store.StreamFrames(rctx, store.StreamFramesParams{Key: key, After: 0, Limit: 1})
	cancel()
	if err != nil {
		return nil, fmt.Errorf("read stream head: %w", err)
	}
	return h.Subscribe(ctx, key, Cursor{Seq: page.Head})
}

// Position returns the position after the last event Next returned.
func (sub *Subscription) Position() Cursor { return sub.pos }

// Close ends the subscription; the session's reader stops with its last
// subscriber. Close is idempotent.
func (sub *Subscription) Close() {
	sub.once.Do(func() {
		if sub.s == nil {
			return
		}
		h, s := sub.h, sub.s
		h.mu.Lock()
		s.mu.Lock()
		delete(s.subs, sub)
		last := len(s.subs) == 0
		s.mu.Unlock()
		if last && h.sessions[s.key] == s {
			delete(h.sessions, s.key)
			close(s.stop)
		}
		h.mu.Unlock()
	})
}

// Next returns the next events of the stream, in order, at least one,
// waiting until there is one. It returns ctx's error when ctx ends first,
// ErrClosed when the hub closes, or the store's error of a read the
// subscriber made to catch up (the subscription stays usable).
func (sub *Subscription) Next(ctx context.Context) ([]Event, error) {
	for {
		if len(sub.backlog) > 0 {
			evs := sub.backlog
			sub.backlog = nil
			sub.pos = evs[len(evs)-1].Cursor
			sub.fresh = false
			return evs, nil
		}
		evs, behind := sub.s.since(sub.pos)
		if behind {
			if err := sub.readStore(readContext(ctx)); err != nil {
				if ctx.Err() != nil {
					// The caller left while the store was read: say so,
					// as the wait below does.
					return nil, ctx.Err()
				}
				return nil, err
			}
			if len(sub.backlog) > 0 {
				continue
			}
		} else if len(evs) > 0 {
			sub.backlog = evs
			continue
		}
		select {
		case <-sub.wake:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-sub.h.ctx.Done():
			return nil, ErrClosed
		}
	}
}

// readContext returns the context of a store read Next makes for a
// caller's ctx: cancelled with ctx, but not ended by ctx's deadline. A
// deadline bounds the caller's wait for new frames (the stream route's
// heartbeat); a read cut by it would start again from the same place at
// the next call, so a catch-up read slower than the wait would never
// finish. The read has its own timeout (readTimeout).
func readContext(ctx context.Context) context.Context {
	if _, ok := ctx.Deadline(); !ok {
		return ctx
	}
	rctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	context.AfterFunc(ctx, func() {
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			cancel(ctx.Err())
		}
	})
	return rctx
}

// readStore reads the next page after the subscriber's position into its
// backlog, with a stream.reset first when frames it needs are gone.
func (sub *Subscription) readStore(ctx context.Context) error {
	key := sub.key
	need := sub.pos.need()
	ctx, cancel := context.WithTimeout(ctx, readTimeout)
	defer cancel()
	page, err := sub.h.o.Store.StreamFrames(ctx, store.StreamFramesParams{Key: key, After: need - 1, Limit: min(sub.h.o.PageSize, catchUpPage)})
	if err != nil {
		return fmt.Errorf("read stream: %w", err)
	}
	pos := sub.pos
	if pos.Seq > page.Head {
		// A position past the head is not of this stream (another
		// session's id, a store restored from an older backup): taken as
		// is, it would skip every new frame up to it. The client reloads
		// the transcript and follows from the head.
		r := resetEvent(page.Head + 1)
		sub.backlog = append(sub.backlog, r)
		pos, need = r.Cursor, page.Head+1
	}
	if !sub.fresh && page.Oldest > need {
		r := resetEvent(page.Oldest)
		sub.backlog = append(sub.backlog, r)
		pos = r.Cursor
	}
	expect := pos.need()
	for i, f := range page.Frames {
		// Compaction keeps an open event's frames and deletes older ones
		// around them: a frame missing before f was lost to this reader
		// as well.
		if f.Seq > expect && !(sub.fresh && i == 0 && len(sub.backlog) == 0) {
			r := resetEvent(f.Seq)
			sub.backlog = append(sub.backlog, r)
			pos = r.Cursor
		}
		expect = f.Seq + 1
		evs := FrameEvents(f, pos)
		if len(evs) > 0 {
			sub.backlog = append(sub.backlog, evs...)
			pos = evs[len(evs)-1].Cursor
		}
	}
	return nil
}

// since returns the cached events after pos, or behind when the cache
// does not reach back to pos (read the store).
func (s *session) since(pos Cursor) (evs []Event, behind bool) {
	need := pos.need()
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ready || need-1 < s.base {
		return nil, true
	}
	// The cache is contiguous: frame base+1+i is at index i.
	from := max(int(need-s.base-1), 0)
	if from >= len(s.cache) {
		return nil, false
	}
	for _, c := range s.cache[from:] {
		for _, e := range c.evs {
			if c.seq == pos.Seq && pos.InFrame && e.Cursor.InFrame && e.Cursor.Chunk <= pos.Chunk {
				continue
			}
			if c.seq == pos.Seq && pos.InFrame && !e.Cursor.InFrame {
				continue // a non-chunk frame addressed by a chunk id: seen
			}
			evs = append(evs, e)
		}
	}
	return evs, false
}

// tail is the session's reader: it reads new frames into the cache at
// every wake-up and wakes the subscribers.
func (h *Hub) tail(s *session) {
	defer h.wg.Done()
	for {
		h.read(s)
		select {
		case <-s.wake:
		case <-s.stop:
			return
		case <-h.ctx.Done():
			return
		}
	}
}

// read brings session s's cache up to the store's head.
func (h *Hub) read(s *session) {
	ctx, cancel := context.WithTimeout(h.ctx, readTimeout)
	defer cancel()
	s.mu.Lock()
	ready, last := s.ready, s.last
	s.mu.Unlock()
	if !ready {
		heads, err := h.o.Store.StreamHeads(ctx, []store.ActorKey{s.key})
		if err != nil {
			if h.ctx.Err() == nil {
				h.log.Warn("stream: reading a session's head failed; retrying at the next poll", "agent_uid", s.key.AgentUID, "session", s.key.SessionID, "err", err)
			}
			return
		}
		s.mu.Lock()
		s.ready, s.base, s.last = true, heads[s.key], heads[s.key]
		last = s.last
		s.wakeSubs()
		s.mu.Unlock()
	}
	for {
		page, err := h.o.Store.StreamFrames(ctx, store.StreamFramesParams{Key: s.key, After: last, Limit: h.o.PageSize})
		if err != nil {
			if h.ctx.Err() == nil {
				h.log.Warn("stream: reading a session's frames failed; retrying at the next poll", "agent_uid", s.key.AgentUID, "session", s.key.SessionID, "err", err)
			}
			return
		}
		if len(page.Frames) == 0 {
			return
		}
		s.mu.Lock()
		for _, f := range page.Frames {
			if f.Seq != s.last+1 {
				// Frames before f were compacted away: the cache restarts
				// at f, so that it stays contiguous (subscribers behind it
				// read the store and get their stream.reset there).
				s.cache, s.cacheBytes, s.base = nil, 0, f.Seq-1
			}
			s.cache = append(s.cache, cached{seq: f.Seq, evs: FrameEvents(f, Cursor{}), size: len(f.Body) + 128})
			s.cacheBytes += len(f.Body) + 128
			s.last = f.Seq
		}
		h.trim(s)
		last = s.last
		s.wakeSubs()
		s.mu.Unlock()
		if len(page.Frames) < h.o.PageSize {
			return
		}
	}
}

// trim drops the oldest cached frames over the cache's bounds, keeping the
// newest. s.mu is held.
func (h *Hub) trim(s *session) {
	drop := 0
	for len(s.cache)-drop > 1 && (len(s.cache)-drop > h.o.CacheFrames || s.cacheBytes > h.o.CacheBytes) {
		s.cacheBytes -= s.cache[drop].size
		s.base = s.cache[drop].seq
		drop++
	}
	if drop > 0 {
		s.cache = append(s.cache[:0:0], s.cache[drop:]...)
	}
}

// wakeSubs wakes every subscriber of s without blocking. s.mu is held.
func (s *session) wakeSubs() {
	for sub := range s.subs {
		select {
		case sub.wake <- struct{}{}:
		default:
		}
	}
}

// poll wakes the readers of watched sessions whose head moved (frames
// written by another host) every PollInterval; it returns when no session
// is watched.
func (h *Hub) poll() {
	defer h.wg.Done()
	t := time.NewTicker(h.o.PollInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-h.ctx.Done():
			return
		}
		h.mu.Lock()
		if len(h.sessions) == 0 {
			h.polling = false
			h.mu.Unlock()
			return
		}
		keys := make([]store.ActorKey, 0, len(h.sessions))
		for k := range h.sessions {
			keys = append(keys, k)
		}
		h.mu.Unlock()
		for len(keys) > 0 {
			n := min(len(keys), headsBatch)
			h.pollHeads(keys[:n])
			keys = keys[n:]
		}
	}
}

func (h *Hub) pollHeads(keys []store.ActorKey) {
	ctx, cancel := context.WithTimeout(h.ctx, readTimeout)
	defer cancel()
	heads, err := h.o.Store.StreamHeads(ctx, keys)
	if err != nil {
		if h.ctx.Err() == nil {
			h.log.Warn("stream: polling stream heads failed", "sessions", len(keys), "err", err)
		}
		return
	}
	for k, head := range heads {
		h.mu.RLock()
		s := h.sessions[k]
		h.mu.RUnlock()
		if s == nil {
			continue
		}
		s.mu.Lock()
		moved := !s.ready || head > s.last
		s.mu.Unlock()
		if moved {
			h.Poke(k)
		}
	}
}
