package wasm_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/examples/notes"
	"github.com/paddock-dev/paddock/wasm"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// benchRequest is a realistic turn: the notes agent with ~1 KiB of state
// and a short transcript tail.
func benchRequest(b *testing.B) *abi.TurnRequest {
	var s notes.State
	for i := range 20 {
		s.Notes = append(s.Notes, fmt.Sprintf("note %02d: call the plumber about the sink", i))
	}
	s.Turns = 20
	state, err := json.Marshal(s)
	if err != nil {
		b.Fatal(err)
	}
	req := request("count", state, 1)
	for i := range 6 {
		req.Transcript = append(req.Transcript, abi.Message{Role: abi.RoleUser, Content: fmt.Sprintf("note %d", i)},
			abi.Message{Role: abi.RoleAssistant, Content: fmt.Sprintf("noted (%d)", i)})
	}
	return req
}

// benchReply is the notes agent's answer to benchRequest: "count" on 20
// notes, this turn the 21st.
const benchReply = "20 notes, 21 turns"

// checkBenchReply fails b unless res is benchReply echoing req's turn_ref,
// so that a benchmark cannot measure a failing turn.
func checkBenchReply(b *testing.B, req *abi.TurnRequest, res *abi.TurnResult, err error) {
	if got := replyOf(b, res, err); got != benchReply || res.TurnRef != req.TurnRef {
		b.Fatalf("reply %q echoing %s, want %q echoing %s", got, res.TurnRef, benchReply, req.TurnRef)
	}
}

// BenchmarkTurnFreshInstance: a new instance for every turn (instantiate
// with _initialize, one turn, close).
func BenchmarkTurnFreshInstance(b *testing.B) {
	bn := setup(b, wasm.Config{MemoryLimitPages: wasm.DefaultMemoryLimitPages})
	digest := bn.notes(b)
	req := benchRequest(b)
	ctx := context.Background()
	b.ReportAllocs()
	var mem uint64
	var instantiate time.Duration
	for b.Loop() {
		start := time.Now()
		inst, err := bn.rt.Instantiate(ctx, digest)
		if err != nil {
			b.Fatal(err)
		}
		instantiate += time.Since(start)
		res, err := inst.Turn(ctx, req)
		checkBenchReply(b, req, res, err)
		mem = inst.MemoryBytes()
		inst.Close(ctx)
	}
	b.ReportMetric(float64(mem), "guest-mem-bytes")
	b.ReportMetric(float64(instantiate.Nanoseconds())/float64(b.N), "instantiate-ns/op")
}

// BenchmarkTurnWarmInstance: one instance serves every turn (the instance
// per activation strategy).
func BenchmarkTurnWarmInstance(b *testing.B) {
	bn := setup(b, wasm.Config{MemoryLimitPages: wasm.DefaultMemoryLimitPages})
	req := benchRequest(b)
	ctx := context.Background()
	inst := bn.instance(b, bn.notes(b))
	if _, err := inst.Turn(ctx, req); err != nil { // first turn warms the guest heap
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		res, err := inst.Turn(ctx, req)
		checkBenchReply(b, req, res, err)
	}
	b.ReportMetric(float64(inst.MemoryBytes()), "guest-mem-bytes")
}

// BenchmarkLoad compiles the notes module in a new Runtime: cold (no
// cache) and from a warm compilation cache directory (a restarted host).
func BenchmarkLoad(b *testing.B) {
	_, body := wasmtest.BuildExample(b, wasmtest.Notes)
	warmCache(b)
	ctx := context.Background()
	for _, c := range []struct{ name, dir string }{{"cold", ""}, {"cached", wasmtest.CacheDir(b)}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				rt, err := wasm.New(ctx, wasm.Config{CacheDir: c.dir}, nil)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := rt.Validate(ctx, body); err != nil {
					b.Fatal(err)
				}
				rt.Close(ctx)
			}
		})
	}
}
