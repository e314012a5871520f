package hasher_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
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

// BenchmarkModuleTurn is the wasm per-turn cost of the bench agent on a
// warm instance, with a transcript tail of tail messages in the request
// (paddock bench sends up to 20: the host's runtime.transcript_tail).
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
	for _, tail := range []int{0, 20} {
		b.Run("tail="+strconv.Itoa(tail), func(b *testing.B) {
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
