package hasher_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/experimental"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/examples/hasher"
	"github.com/paddock-dev/paddock/wasm"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// want is the peers' unit of work computed independently: the key at 0,
// seq little-endian at 64, byte i at i from 72.
func want(key string, seq int) string {
	buf := make([]byte, 1024)
	copy(buf, key)
	for i := range 8 {
		buf[64+i] = byte(uint64(seq) >> (8 * i))
	}
	for i := 72; i < 1024; i++ {
		buf[i] = byte(i)
	}
	sum := sha256.Sum256(buf)
	return hex.EncodeToString(sum[:8])
}

func request(id int64, data string) *abi.TurnRequest {
	return &abi.TurnRequest{ABIVersion: abi.Version, TurnRef: abi.TurnRef{DeliveryID: "d", AgentUID: "a", SessionID: "s", ActivationUID: "x", ActorEpoch: 1, ActorEventID: id, Revision: 1},
		Event: abi.Event{ID: id, Kind: abi.EventMessage, Data: []byte(data)}, Attempt: 1}
}

func TestWorkIsThePeersWork(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		key string
		seq int
	}{{"k00000", 0}, {"k00999", 19}, {"w", 1 << 40}} {
		if got, w := hasher.Work(c.key, c.seq), want(c.key, c.seq); got != w {
			t.Errorf("Work(%q, %d) = %s, want %s", c.key, c.seq, got, w)
		}
	}
}

// warmInstance loads body in a new wasm runtime and returns an instance
// of it; both close when t ends.
func warmInstance(ctx context.Context, t *testing.T, body []byte) *wasm.Instance {
	t.Helper()
	rt, err := wasm.New(ctx, wasm.Config{CacheDir: wasmtest.CacheDir(t)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close(ctx) })
	info, err := rt.Load(ctx, wasm.Digest(body), body)
	if err != nil {
		t.Fatal(err)
	}
	inst, err := rt.Instantiate(ctx, info.Digest)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { inst.Close(ctx) })
	return inst
}

// TestModuleAnswersLikeTheLogic runs the wasm module and the logic on the
// same jobs, and a job without data.
func TestModuleAnswersLikeTheLogic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, body := wasmtest.BuildExample(t, "./examples/hasher/cmd")
	inst := warmInstance(ctx, t, body)
	for i, data := range []string{`{"idx":7,"key":"k00007","seq":3,"t":1}`, `{"key":"k00001","seq":0}`} {
		res, err := inst.Turn(ctx, request(int64(i+1), data))
		if err != nil {
			t.Fatal(err)
		}
		local := abi.Run(ctx, new(hasher.Agent).Turn, request(int64(i+1), data))
		if res.Outcome != abi.OutcomeOK || len(res.Messages) != 1 || res.Messages[0].Content != local.Messages[0].Content {
			t.Fatalf("job %s: wasm %+v, logic %+v", data, res, local)
		}
	}
	if got := inst.Turns(); got != 2 {
		t.Fatalf("instance served %d turns, want 2", got)
	}
	res, err := inst.Turn(ctx, request(9, ""))
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != abi.OutcomeError || !strings.Contains(res.Error, "event 9 has no data") {
		t.Fatalf("a job without data: %+v, want an error outcome naming the event", res)
	}
}

// rustc is the Rust compiler that builds the Rust hasher (RUSTC_WASM, by
// default Debian's /usr/bin/rustc with libstd-rust-dev-wasm32 and lld:
// the Makefile's RUSTC_WASM, with its RUSTC_WASM_TARGET).
func rustc() string {
	if r := os.Getenv("RUSTC_WASM"); r != "" {
		return r
	}
	return "/usr/bin/rustc"
}

// buildRust builds examples/hasher/rust/hasher.rs as the Makefile does,
// into a temporary directory, and returns the module. Without a Rust
// compiler for wasm32-wasi it skips tb, unless REQUIRE_RUST_WASM is set
// (CI, whose .ci/run installs one), where that is a failure.
func buildRust(tb testing.TB) []byte {
	tb.Helper()
	out := filepath.Join(tb.TempDir(), "hasher-rust.wasm")
	target := os.Getenv("RUSTC_WASM_TARGET") // the Makefile's; wasm32-wasip1 in newer compilers
	if target == "" {
		target = "wasm32-wasi"
	}
	cmd := exec.Command(rustc(), "--edition", "2021", "--target", target, "--crate-type", "cdylib",
		"-C", "opt-level=3", "-C", "panic=abort", "-C", "strip=symbols", "-o", out, "rust/hasher.rs")
	var msg bytes.Buffer
	cmd.Stdout, cmd.Stderr = &msg, &msg
	if err := cmd.Run(); err != nil {
		why := "build the Rust hasher: " + strings.Join(cmd.Args, " ") + ": " + err.Error() + "\n" + msg.String() +
			"\n(install Debian's rustc, libstd-rust-dev-wasm32 and lld, or set RUSTC_WASM)"
		if os.Getenv("REQUIRE_RUST_WASM") != "" {
			tb.Fatal(why)
		}
		tb.Skip(why)
	}
	body, err := os.ReadFile(out)
	if err != nil {
		tb.Fatal(err)
	}
	return body
}

// TestRustModuleAnswersLikeTheGoAgent runs the Rust module through the
// host's wasm runtime (its checks at load, the fuel instrumentation, the
// result's validation) on the jobs of TestModuleAnswersLikeTheLogic and
// on jobs it must refuse, and compares its answers with the Go agent's.
func TestRustModuleAnswersLikeTheGoAgent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	body := buildRust(t)
	inst := warmInstance(ctx, t, body)
	jobs := []string{`{"idx":7,"key":"k00007","seq":3,"t":1}`, `{"key":"k00001","seq":0}`,
		`{"idx":-3,"key":"k00999","seq":-1,"t":1764490000000000000}`, ` { "seq" : 19 , "key" : "k\u00e9\"\\x" } `,
		`{"key":"w","seq":1099511627776,"extra":[1,{"a":null},"]"]}`, "null",
		// Found in review, each answered unlike the Go agent at first:
		// surrogates that do not pair, invalid UTF-8, the unused fields'
		// types, keys in another case (Unicode folding included).
		`{"key":"\ud800\u0041","seq":1}`, `{"key":"\ud800\ud800\udc00","seq":1}`, `{"key":"\udc00x","seq":1}`,
		"{\"key\":\"\xff\",\"seq\":1}", "{\"key\":\"a\xe2\x82b\",\"seq\":1}", "{\"key\":\"\xed\xa0\x80\",\"seq\":1}",
		`{"key":"k","seq":1,"idx":"x"}`, `{"key":"k","seq":1,"t":1.5}`, `{"key":"k","seq":1,"idx":1e2}`,
		`{"key":"k","seq":1,"t":9223372036854775808}`, `{"key":"k","seq":1,"idx":null}`,
		`{"KEY":"k1","SEQ":3}`, `{"key":"a","Key":"b","seq":1}`, "{\"key\":\"k\",\"\u017feq\":5}", "{\"\u212aey\":\"x\"}",
		`{"key":"k","seq":1.5}`, `{"key":7,"seq":1}`, `[]`, `"x"`, `{"key":"k","seq":null}`, `{"key":"k","seq":-0}`}
	for i, data := range jobs {
		id := int64(i + 1)
		req := request(id, data)
		req.Transcript = []abi.Message{{Role: abi.RoleUser, Content: `{"key":"not this one"}`}}
		res, err := inst.Turn(ctx, req)
		if err != nil {
			t.Fatalf("job %q: %v", data, err)
		}
		if res.TurnRef != req.TurnRef {
			t.Fatalf("job %q: turn_ref %+v, want %+v", data, res.TurnRef, req.TurnRef)
		}
		local := abi.Run(ctx, new(hasher.Agent).Turn, request(id, data))
		switch {
		case local.Outcome == abi.OutcomeOK:
			if res.Outcome != abi.OutcomeOK || len(res.Messages) != 1 || res.Messages[0] != local.Messages[0] {
				t.Errorf("job %q: rust %+v, go %+v", data, res, local)
			}
		case res.Outcome != abi.OutcomeError || len(res.Messages) != 0 ||
			!strings.HasPrefix(res.Error, "hasher: event "+strconv.FormatInt(id, 10)+" "):
			t.Errorf("job %q: rust %+v, want an error outcome naming event %d like go's %q", data, res, id, local.Error)
		}
	}
	// A turn without data is the Go agent's error, word for word.
	res, err := inst.Turn(ctx, request(100, ""))
	if err != nil {
		t.Fatal(err)
	}
	if want := abi.Run(ctx, new(hasher.Agent).Turn, request(100, "")).Error; res.Outcome != abi.OutcomeError || res.Error != want {
		t.Fatalf("a job without data: %+v, want the error %q", res, want)
	}
	if got, want := inst.Turns(), len(jobs)+1; got != want {
		t.Fatalf("instance served %d turns, want %d", got, want)
	}
}

// BenchmarkModuleTurn is the wasm per-turn cost of the bench agent on a
// warm instance, with a transcript tail of tail messages in the request
// (paddock bench sends up to 20: the host's runtime.transcript_tail): the
// Go module (guest=go) and the Rust one (guest=rust).
func BenchmarkModuleTurn(b *testing.B) {
	ctx := context.Background()
	_, body := wasmtest.BuildExample(b, "./examples/hasher/cmd")
	rt, err := wasm.New(ctx, wasm.Config{CacheDir: wasmtest.CacheDir(b)}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer rt.Close(ctx)
	info, err := rt.Load(ctx, wasm.Digest(body), body)
	if err != nil {
		b.Fatal(err)
	}
	var rust []byte // built once, by the first Rust sub-benchmark: without a compiler only they skip
	for _, c := range []struct {
		guest string
		tail  int
	}{{"go", 0}, {"go", 20}, {"rust", 0}, {"rust", 20}} {
		tail := c.tail
		b.Run("guest="+c.guest+"/tail="+strconv.Itoa(tail), func(b *testing.B) {
			info := info
			if c.guest == "rust" {
				if rust == nil {
					rust = buildRust(b)
				}
				var err error
				if info, err = rt.Load(ctx, wasm.Digest(rust), rust); err != nil {
					b.Fatal(err)
				}
			}
			inst, err := rt.Instantiate(ctx, info.Digest)
			if err != nil {
				b.Fatal(err)
			}
			defer inst.Close(ctx)
			req := request(1, `{"idx":7,"key":"k00007","seq":3,"t":1}`)
			for i := range tail {
				req.Transcript = append(req.Transcript, abi.Message{Role: abi.RoleUser, Content: `{"idx":7,"key":"k00007","seq":` + strconv.Itoa(i) + `,"t":1764490000000000000}`})
			}
			want := hasher.Work("k00007", 3)
			b.ResetTimer()
			for range b.N {
				res, err := inst.Turn(ctx, req)
				if err != nil || res.Messages[0].Content != want {
					b.Fatalf("turn: %v %+v", err, res)
				}
			}
		})
	}
}

// jobSeeds are job data that tell parsers apart: the producers' shape,
// the Rust agent's comparison jobs, and text fastjson accepts where
// encoding/json refuses it (or reads it otherwise).
var jobSeeds = []string{
	`{"idx":7,"key":"k00007","seq":3,"t":1}`, `{"key":"k00001","seq":0}`, `{}`, `null`, ``, ` {"key":"x"} `,
	`{"idx":-3,"key":"k00999","seq":-1,"t":1764490000000000000}`, ` { "seq" : 19 , "key" : "k\u00e9\"\\x" } `,
	`{"key":"w","seq":1099511627776,"extra":[1,{"a":null},"]"]}`, `{"key":"\ud800\u0041","seq":1}`,
	"{\"key\":\"\xff\",\"seq\":1}", "{\"key\":\"a\xe2\x82b\",\"seq\":1}", `{"key":"k","seq":1,"idx":"x"}`,
	`{"key":"k","seq":1,"t":1.5}`, `{"key":"k","seq":1,"idx":1e2}`, `{"key":"k","seq":1,"t":9223372036854775808}`,
	`{"key":"k","seq":1,"t":-9223372036854775808}`, `{"key":"k","seq":1,"idx":null}`, `{"KEY":"k1","SEQ":3}`,
	`{"key":"a","Key":"b","seq":1}`, "{\"key\":\"k\",\"\u017feq\":5}", "{\"\u212aey\":\"x\"}", `{"key":7,"seq":1}`,
	`[]`, `"x"`, `{"key":"k","seq":null}`, `{"key":"k","seq":-0}`, `{"seq":01}`, `{"seq":inf}`, `{"seq":-}`,
	`{"seq":1-2}`, `{"seq":+1}`, `{"seq":1.0}`, "{\"key\":\"a\tb\"}", "{\"key\":\"a\"}\n", `{"key":"\q"}`,
	`{"key":"a"}x`, `{"key":"a",}`, `{"idx":1,"idx":2}`, `{"key":"a","key":"b"}`, `{"key":"a" "seq":1}`,
	`{"key":"a\u0000"}`, "{\"key\":\"a\x7f\"}", `{"seq":nan}`, `{"t":1E5}`, "\xef\xbb\xbf{}",
}

// FuzzFuzzDecodeJob holds Decoder.Decode to json.Unmarshal into a Job: the same
// job, or the same error.
func FuzzDecodeJob(f *testing.F) {
	var jobs hasher.Decoder
	for _, s := range jobSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := jobs.Decode(data)
		var want hasher.Job
		wantErr := json.Unmarshal(data, &want)
		switch {
		case (err == nil) != (wantErr == nil):
			t.Fatalf("Decode(%q): error %v, json.Unmarshal's %v", data, err, wantErr)
		case err != nil && err.Error() != wantErr.Error():
			t.Fatalf("Decode(%q): error %q, json.Unmarshal's %q", data, err, wantErr)
		case err == nil && got != want:
			t.Fatalf("Decode(%q) = %+v, json.Unmarshal gives %+v", data, got, want)
		}
	})
}

// mallocCounter counts a Go guest's heap allocations: the calls of its
// runtime.mallocgc, seen by a wazero function listener.
type mallocCounter struct{ n int }

func (c *mallocCounter) NewFunctionListener(d api.FunctionDefinition) experimental.FunctionListener {
	if !strings.HasSuffix(d.DebugName(), "runtime.mallocgc") {
		return nil
	}
	return experimental.FunctionListenerFunc(func(context.Context, api.Module, api.FunctionDefinition, []uint64, experimental.StackIterator) {
		c.n++
	})
}

// maxTurnAllocations is what a turn of the Go module may allocate in the
// guest: the request's arena and the TurnRequest (the SDK), the job's key,
// the digest, the TurnResult and its messages (the agent). In a wasm guest
// an allocation costs more than a microsecond (wasm/internal/wire); this
// session's count before the agent and the SDK reused their buffers was 13.
const maxTurnAllocations = 6

// TestModuleTurnAllocations counts the heap allocations of the Go
// module's turns on a warm instance, through the host's runtime (its
// checks, its fuel instrumentation), by listening to the guest's
// runtime.mallocgc: a count, where a timing would be noise.
func TestModuleTurnAllocations(t *testing.T) {
	t.Parallel()
	var c mallocCounter
	ctx := experimental.WithFunctionListenerFactory(context.Background(), &c)
	_, body := wasmtest.BuildExample(t, "./examples/hasher/cmd")
	inst := warmInstance(ctx, t, body) // the listener is in ctx when the module compiles
	want := hasher.Work("k00007", 3)
	turn := func() {
		res, err := inst.Turn(ctx, request(1, `{"idx":7,"key":"k00007","seq":3,"t":1764490000000000000}`))
		if err != nil || res.Outcome != abi.OutcomeOK || res.Messages[0].Content != want {
			t.Fatalf("turn: %v %+v", err, res)
		}
	}
	for range 10 { // the first turns fill the SDK's spares and the parser pool
		turn()
	}
	c.n = 0
	const turns = 100
	for range turns {
		turn()
	}
	per := float64(c.n) / turns
	if c.n == 0 || per > maxTurnAllocations {
		t.Fatalf("%.2f heap allocations per turn in the guest, want 1 to %d", per, maxTurnAllocations)
	}
}
