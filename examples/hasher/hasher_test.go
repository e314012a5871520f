package hasher_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

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

// TestModuleAnswersLikeTheLogic runs the wasm module and the logic on the
// same jobs, and a job without data.
func TestModuleAnswersLikeTheLogic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, body := wasmtest.BuildExample(t, "./examples/hasher/cmd")
	rt, err := wasm.New(ctx, wasm.Config{CacheDir: wasmtest.CacheDir(t)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	info, err := rt.Load(ctx, wasm.Digest(body), body)
	if err != nil {
		t.Fatal(err)
	}
	inst, err := rt.Instantiate(ctx, info.Digest)
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Close(ctx)
	for i, data := range []string{`{"idx":7,"key":"k00007","seq":3,"t":1}`, `{"key":"k00001","seq":0}`} {
		res, err := inst.Turn(ctx, request(int64(i+1), data))
		if err != nil {
			t.Fatal(err)
		}
		local := abi.Run(ctx, hasher.Turn, request(int64(i+1), data))
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
// the Makefile's RUSTC_WASM).
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
	cmd := exec.Command(rustc(), "--edition", "2021", "--target", "wasm32-wasi", "--crate-type", "cdylib",
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
	rt, err := wasm.New(ctx, wasm.Config{CacheDir: wasmtest.CacheDir(t)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close(ctx)
	info, err := rt.Load(ctx, wasm.Digest(body), body)
	if err != nil {
		t.Fatal(err)
	}
	inst, err := rt.Instantiate(ctx, info.Digest)
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Close(ctx)
	for i, data := range []string{`{"idx":7,"key":"k00007","seq":3,"t":1}`, `{"key":"k00001","seq":0}`,
		`{"idx":-3,"key":"k00999","seq":-1,"t":1764490000000000000}`, ` { "seq" : 19 , "key" : "k\u00e9\"\\x" } `,
		`{"key":"w","seq":1099511627776,"extra":[1,{"a":null},"]"]}`} {
		req := request(int64(i+1), data)
		req.Transcript = []abi.Message{{Role: abi.RoleUser, Content: `{"key":"not this one"}`}}
		res, err := inst.Turn(ctx, req)
		if err != nil {
			t.Fatalf("job %s: %v", data, err)
		}
		local := abi.Run(ctx, hasher.Turn, request(int64(i+1), data))
		if res.Outcome != abi.OutcomeOK || len(res.Messages) != 1 || res.Messages[0] != local.Messages[0] || res.TurnRef != req.TurnRef {
			t.Fatalf("job %s: rust %+v, go %+v", data, res, local)
		}
	}
	for i, c := range []struct{ data, want string }{
		{"", "hasher: event 20 has no data"},
		{"null", "hasher: event 21 has no data"},
		{`{"key":"k","seq":1.5}`, "hasher: event 22 data: want an integer"},
		{`{"key":7,"seq":1}`, "hasher: event 23 data: want '\"'"},
	} {
		res, err := inst.Turn(ctx, request(int64(20+i), c.data))
		if err != nil {
			t.Fatalf("job %q: %v", c.data, err)
		}
		if res.Outcome != abi.OutcomeError || !strings.Contains(res.Error, c.want) || len(res.Messages) != 0 {
			t.Fatalf("job %q: %+v, want an error outcome with %q", c.data, res, c.want)
		}
	}
	if got := inst.Turns(); got != 9 {
		t.Fatalf("instance served %d turns, want 9", got)
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
	rust := buildRust(b)
	rinfo, err := rt.Load(ctx, wasm.Digest(rust), rust)
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		guest string
		tail  int
	}{{"go", 0}, {"go", 20}, {"rust", 0}, {"rust", 20}} {
		info := info
		if c.guest == "rust" {
			info = rinfo
		}
		tail := c.tail
		b.Run("guest="+c.guest+"/tail="+strconv.Itoa(tail), func(b *testing.B) {
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
