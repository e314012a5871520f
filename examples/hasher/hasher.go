// Package hasher is the benchmark agent of `paddock bench`: the unit of
// work of the peers' durable-turn workload (../shared/peers/README.md),
// SHA-256 of a 1 KiB buffer derived from the job's key and seq, answered
// as one assistant message with the first 8 bytes of the digest in hex.
//
// A signal's data is the peers' job arguments, {"idx","key","seq","t"}; the
// agent keeps no session state. The wasip1 module is built from ./cmd and
// the plugin worker from ./plugin (see the Makefile). ./rust/hasher.rs is
// the same agent in Rust, the guest ABI implemented by hand (make
// rust-examples builds hasher-rust.wasm; TestRustModuleAnswersLikeTheGoAgent
// holds the two to the same answers).
package hasher

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"github.com/paddock-dev/paddock/abi"
)

// Job is a signal's data: the peers' job arguments.
type Job struct {
	Idx int    `json:"idx"`
	Key string `json:"key"`
	Seq int    `json:"seq"`
	// T is the sender's wall clock (unix ns) just before the signal call.
	T int64 `json:"t"`
}

// Work is the peers' unit of work, byte for byte: the key at offset 0, seq
// little-endian at offset 64, then bytes i at i for i ≥ 72; the first 8
// bytes of the SHA-256 in hex.
func Work(key string, seq int) string {
	var buf [1024]byte
	copy(buf[:], key)
	binary.LittleEndian.PutUint64(buf[64:], uint64(seq))
	for i := 72; i < len(buf); i++ {
		buf[i] = byte(i)
	}
	sum := sha256.Sum256(buf[:])
	return hex.EncodeToString(sum[:8])
}

// Turn answers one job with its digest. An event without job data is an
// agent error naming what is missing.
func Turn(_ context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
	var j Job
	if len(req.Event.Data) == 0 {
		return nil, fmt.Errorf("hasher: event %d has no data: want {\"key\":…,\"seq\":…}", req.Event.ID)
	}
	if err := json.Unmarshal(req.Event.Data, &j); err != nil {
		return nil, fmt.Errorf("hasher: event %d data: %w", req.Event.ID, err)
	}
	return &abi.TurnResult{Messages: []abi.Message{{Role: "assistant", Content: Work(j.Key, j.Seq)}}}, nil
}
