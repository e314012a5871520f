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
	"strconv"
	"sync"
	"unicode/utf8"

	"github.com/valyala/fastjson"

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

// Agent is the bench agent: its Turn answers one job with its digest. The
// zero value is ready to use, and it is safe for concurrent use (the plugin
// worker runs turns in parallel); it keeps only parsers for reuse.
type Agent struct {
	jobs Decoder
}

// Turn answers one job with its digest. An event without job data, or
// with data that is not a job, is an agent error naming the event.
func (a *Agent) Turn(_ context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
	if len(req.Event.Data) == 0 {
		return nil, fmt.Errorf("hasher: event %d has no data: want {\"key\":…,\"seq\":…}", req.Event.ID)
	}
	j, err := a.jobs.Decode(req.Event.Data)
	if err != nil {
		return nil, fmt.Errorf("hasher: event %d data: %w", req.Event.ID, err)
	}
	return &abi.TurnResult{Messages: []abi.Message{{Role: "assistant", Content: Work(j.Key, j.Seq)}}}, nil
}

// Decoder decodes signals' data into Jobs exactly as json.Unmarshal does:
// the same job for every input json.Unmarshal accepts, and its error for
// every input it refuses (FuzzDecodeJob holds the two together). The zero
// value is ready to use; it is safe for concurrent use.
//
// In a Go wasm guest, encoding/json's reflection cost a turn about 30 µs
// of its 90 (go test -bench ModuleTurn ./examples/hasher), more than the
// SHA-256. So the shape every producer sends — one object of the four
// lowercase keys, each at most once, key a string and the others JSON
// integers, no escapes, no control bytes, valid UTF-8 — is read with
// fastjson, a parser without reflection, whose parsers the Decoder
// reuses (a new one per job cost another 10 µs); anything else goes to
// json.Unmarshal, whose answer (keys in another case, escapes, null,
// unknown keys, errors) is then the answer.
type Decoder struct {
	parsers sync.Pool // of *jobParser
}

// jobParser is a fastjson parser and the scratch space plainJob reads
// numbers' text into, reused together: in a wasm guest every allocation
// costs several times its native cost (wasm/internal/wire).
type jobParser struct {
	p   fastjson.Parser
	num []byte
}

// Decode decodes data as json.Unmarshal(data, &job) does.
func (d *Decoder) Decode(data []byte) (Job, error) {
	jp, _ := d.parsers.Get().(*jobParser)
	if jp == nil {
		jp = new(jobParser)
	}
	j, ok := plainJob(jp, data)
	d.parsers.Put(jp)
	if ok {
		return j, nil
	}
	var slow Job // not j: what json.Unmarshal decodes into lives on the heap
	err := json.Unmarshal(data, &slow)
	return slow, err
}

// plainJob reads data with p when it has the plain shape Decoder
// describes, where fastjson's answer is json.Unmarshal's; ok is false
// otherwise. fastjson is laxer than encoding/json (it takes numbers such
// as 01, inf or 1-2, control bytes in strings and unknown escapes),
// hence the checks of the raw text before and after it parses.
func plainJob(jp *jobParser, data []byte) (j Job, ok bool) {
	for _, c := range data {
		if c < 0x20 || c == '\\' {
			return Job{}, false
		}
	}
	if !utf8.Valid(data) {
		return Job{}, false
	}
	v, err := jp.p.ParseBytes(data)
	if err != nil {
		return Job{}, false
	}
	o, err := v.Object()
	if err != nil {
		return Job{}, false
	}
	// Get finds a key's first occurrence: the object has no other key, and
	// none twice, when the four found account for all of its keys.
	found := 0
	if k := o.Get("key"); k != nil {
		if k.Type() != fastjson.TypeString {
			return Job{}, false
		}
		j.Key = string(k.GetStringBytes())
		found++
	}
	var idx, seq int64
	for _, f := range [...]struct {
		name string
		p    *int64
	}{{"idx", &idx}, {"seq", &seq}, {"t", &j.T}} {
		v := o.Get(f.name)
		if v == nil {
			continue
		}
		n, isInt := jp.jsonInt(v)
		if !isInt {
			return Job{}, false
		}
		*f.p = n
		found++
	}
	j.Idx, j.Seq = int(idx), int(seq)
	if found != o.Len() || int64(j.Idx) != idx || int64(j.Seq) != seq {
		return Job{}, false
	}
	return j, true
}

// jsonInt is v's value when v is a number written as a JSON integer
// (-?(0|[1-9][0-9]*)) that fits an int64: what encoding/json decodes into
// an int64 field (the caller checks that it fits an int).
func (jp *jobParser) jsonInt(v *fastjson.Value) (int64, bool) {
	if v.Type() != fastjson.TypeNumber {
		return 0, false
	}
	raw := v.MarshalTo(jp.num[:0]) // the number's text as written
	jp.num = raw[:0]
	digits := raw
	if len(digits) > 0 && digits[0] == '-' {
		digits = digits[1:]
	}
	if len(digits) == 0 || (digits[0] == '0' && len(digits) > 1) {
		return 0, false
	}
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(string(raw), 10, 64)
	return n, err == nil
}
