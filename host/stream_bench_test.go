package host_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

// writeCountingStore counts the chunk frames written through it.
type writeCountingStore struct {
	store.Store
	appends atomic.Int64
	chunks  atomic.Int64
}

func (s *writeCountingStore) AppendChunks(ctx context.Context, p store.AppendChunksParams) (store.Frame, error) {
	f, err := s.Store.AppendChunks(ctx, p)
	if err == nil {
		s.appends.Add(1)
		s.chunks.Add(int64(len(p.Chunks)))
	}
	return f, err
}

// streamTokens is how many tokens one benchmark turn streams, and
// tokenEvery the pace of a fast model (1,000 tokens a second).
const (
	streamTokens = 1000
	tokenEvery   = time.Millisecond
)

// BenchmarkStreamedTurn streams 1,000 tokens through a guest, one emit per
// token at a fast model's pace, and reports the store writes the stream
// costs per 1,000 tokens (chunk frames: one per flush interval, 50 ms by
// default, instead of one per token) and the emit call's mean latency as
// the guest sees it, in µs. One op is one turn.
func BenchmarkStreamedTurn(b *testing.B) {
	benchStores(b, func(b *testing.B, st store.Store) {
		cs := &writeCountingStore{Store: st}
		var emitNanos, emits atomic.Int64
		f := benchHost(b, cs, map[string]abi.TurnFunc{"stream": func(ctx context.Context, r *abi.TurnRequest) (*abi.TurnResult, error) {
			next := time.Now()
			for i := range streamTokens {
				start := time.Now()
				if err := abi.Emit(ctx, "tok "); err != nil {
					return nil, err
				}
				emitNanos.Add(int64(time.Since(start)))
				emits.Add(1)
				if i < streamTokens-1 {
					next = next.Add(tokenEvery)
					time.Sleep(time.Until(next))
				}
			}
			return &abi.TurnResult{Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "streamed"}}}, nil
		}}, instantChat(b, 0).URL)
		a := f.agent("stream")
		b.ResetTimer()
		for range b.N {
			key := f.session(a)
			f.signal(key)
			f.committed(key)
		}
		b.StopTimer()
		if got := cs.chunks.Load(); got != int64(b.N*streamTokens) {
			b.Fatalf("%d chunks stored, want %d", got, b.N*streamTokens)
		}
		b.ReportMetric(float64(cs.appends.Load())/float64(b.N)*1000/streamTokens, "writes/1000tokens")
		b.ReportMetric(float64(emitNanos.Load())/float64(emits.Load())/1e3, "µs/emit")
	})
}
