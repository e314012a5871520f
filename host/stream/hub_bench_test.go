package stream_test

import (
	"context"
	"sync"
	"testing"

	"github.com/paddock-dev/paddock/host/stream"
	"github.com/paddock-dev/paddock/host/stream/streamtest"
	"github.com/paddock-dev/paddock/store"
)

// BenchmarkFanOut measures one chunk frame reaching 1,000 subscribers of
// one session on SQLite: per op, the frame is written (AppendChunks),
// the hub is poked, its one reader reads it once, and every subscriber's
// Next returns it. It reports the store reads per op (the reader's, not
// one per subscriber).
func BenchmarkFanOut(b *testing.B) {
	st := drivers["sqlite"](b)
	w := streamtest.New(b, st)
	key := w.Session()
	counting := &countingStore{Store: st}
	h := stream.New(stream.Options{Store: counting})
	defer h.Close()
	const n = 1000
	tr := w.Start(key, "hi")
	subs := make([]*stream.Subscription, n)
	for i := range subs {
		var err error
		if subs[i], err = h.Subscribe(context.Background(), key, stream.Cursor{Seq: 1}); err != nil {
			b.Fatal(err)
		}
		defer subs[i].Close()
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var got sync.WaitGroup
	var wg sync.WaitGroup
	for _, sub := range subs {
		wg.Go(func() {
			for {
				if _, err := sub.Next(ctx); err != nil {
					return
				}
				got.Done()
			}
		})
	}
	counting.reset()
	for b.Loop() {
		got.Add(n)
		tr.Emit("tok")
		h.Poke(key)
		got.Wait()
	}
	b.ReportMetric(float64(counting.reads())/float64(b.N), "store-reads/op")
	cancel()
	wg.Wait()
}

// countingStore counts StreamFrames calls.
type countingStore struct {
	store.Store
	mu sync.Mutex
	n  int
}

func (c *countingStore) StreamFrames(ctx context.Context, p store.StreamFramesParams) (store.StreamPage, error) {
	c.mu.Lock()
	c.n++
	c.mu.Unlock()
	return c.Store.StreamFrames(ctx, p)
}

func (c *countingStore) reset() { c.mu.Lock(); c.n = 0; c.mu.Unlock() }
func (c *countingStore) reads() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}
