package stream_test

// Attacks on the stream hub (branch breaker). Each test states what it
// tries and what the hub must do.

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/host/stream"
	"github.com/paddock-dev/paddock/host/stream/streamtest"
	"github.com/paddock-dev/paddock/store"
)

// Found by attack, fixed: a resume position past the session's head (a
// clumsy client sending the Last-Event-ID of another session's stream,
// or of a session whose store was restored from an older backup) was
// taken as is: the subscriber then skipped every new frame up to that
// number, silently — a chat that shows nothing while its turns run. A
// position past the head now gets stream.reset (reload the transcript)
// and continues after the head.
func TestAttackResumePastTheHeadSkipsNewFrames(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		w := streamtest.New(t, st)
		h := stream.New(stream.Options{Store: st})
		defer h.Close()
		key := w.Session()
		tr := w.Start(key, "hi")
		tr.Emit("a")
		tr.Commit("a") // frames 1–3
		for i, from := range []stream.Cursor{{Seq: 50}, {Seq: 60, Chunk: 2, InFrame: true}} {
			sub, err := h.Subscribe(context.Background(), key, from)
			if err != nil {
				t.Fatal(err)
			}
			tr := w.Start(key, "again")
			tr.Emit("b")
			tr.Commit("b")
			h.Poke(key)
			evs := collect(t, sub, 4)
			h0 := 3 * (i + 1) // the head when it subscribed
			wantIDs(t, evs, fmt.Sprintf("stream.reset#%d turn.started#%d chunk#%d.0 turn.committed#%d", h0, h0+1, h0+2, h0+3))
			sub.Close()
		}
	})
}

// slowStore blocks a subscriber's catch-up reads (StreamFrames after a
// frame before the head) once armed, until release is closed or the
// read's context ends.
type slowStore struct {
	store.Store
	armed   atomic.Bool
	blocked chan struct{} // closed when a read blocks
	once    sync.Once
	release chan struct{}
}

func (s *slowStore) StreamFrames(ctx context.Context, p store.StreamFramesParams) (store.StreamPage, error) {
	if s.armed.Load() && p.After < 5 {
		s.once.Do(func() { close(s.blocked) })
		select {
		case <-s.release:
		case <-ctx.Done():
			return store.StreamPage{}, ctx.Err()
		}
	}
	return s.Store.StreamFrames(ctx, p)
}

// Found by attack, fixed: the stream route calls Next with a context
// that ends at the next heartbeat (15 s) to send one, and a subscriber
// behind the cache read the store under that same context: a catch-up
// read slower than the heartbeat (a slow store, large chunk frames — 32
// frames of up to 1 MiB) was cancelled at every heartbeat and started
// again from the same place at the next call, for ever: the client never
// got past that point while the host kept reading the store. A read now
// runs to its end (bounded by its own timeout) unless the caller's
// context is cancelled; a deadline of ctx only bounds the wait for new
// frames.
func TestAttackCatchUpSlowerThanTheHeartbeatNeverEnds(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		w := streamtest.New(t, st)
		slow := &slowStore{Store: st, blocked: make(chan struct{}), release: make(chan struct{})}
		h := stream.New(stream.Options{Store: slow, PageSize: 2})
		defer h.Close()
		key := w.Session()
		tr := w.Start(key, "hi")
		for range 8 {
			tr.Emit("x")
		}
		sub, err := h.Subscribe(context.Background(), key, stream.Cursor{})
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Close()
		wantIDs(t, collect(t, sub, 2), "turn.started#1 chunk#2.0") // a page of 2 frames
		slow.armed.Store(true)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond) // the heartbeat
		defer cancel()
		type result struct {
			evs []stream.Event
			err error
		}
		done := make(chan result, 1)
		go func() {
			evs, err := sub.Next(ctx)
			done <- result{evs, err}
		}()
		<-slow.blocked
		<-ctx.Done()        // the heartbeat's deadline passes during the read …
		close(slow.release) // … and the read completes
		r := <-done
		if r.err != nil || len(r.evs) == 0 || r.evs[0].ID != "3.0" {
			t.Fatalf("Next after a read that outlived its caller's wait: %s, %v; want the frames it read (chunk#3.0 …)", ids(r.evs), r.err)
		}
	})
}
