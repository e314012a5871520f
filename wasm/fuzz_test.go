package wasm_test

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/wasm"
)

// fuzzRuntime is the Runtime of the fuzz targets: no compilation cache
// (every input is a new module), small caps.
var fuzzRuntime = sync.OnceValues(func() (*wasm.Runtime, error) {
	return wasm.New(context.Background(), wasm.Config{
		MemoryLimitPages: 8, MaxResultBytes: fuzzResultLimit, TurnTimeout: 30 * time.Second,
	}, nil)
})

const fuzzResultLimit = 16 << 10

// fuzzRef is the turn_ref of the fuzz targets' request; a result that
// echoes it can be valid.
var fuzzRef = abi.TurnRef{DeliveryID: "d", ActivationUID: "a", ActorEpoch: 1, ActorEventID: 2, AgentUID: "u", SessionID: "s"}

func fuzzValidResult() []byte {
	ref, _ := json.Marshal(fuzzRef)
	return []byte(`{"turn_ref":` + string(ref) + `,"outcome":"ok","messages":[{"role":"assistant","content":"hi"}]}`)
}

// FuzzGuestMemory is the wasm memory boundary as a hostile guest sees it: a
// hand-written module whose memory size, contents and every pointer and
// length it hands the host are the fuzzer's — the buffer paddock_alloc
// returns, the packed (ptr, len) of paddock_turn's result, the buffer it
// gives steer_poll and the message it gives log. The host must never
// panic or read outside the guest's memory: each turn either returns a
// result that validates and echoes the request's turn_ref (or the steer's),
// read from inside memory within the result cap, or fails with a
// *TurnError of kind invalid_result (naming a buffer outside memory, or
// what is wrong with the JSON) or oversized (exactly when the length passes
// the cap), and the instance is closed.
func FuzzGuestMemory(f *testing.F) {
	valid := fuzzValidResult()
	// pages, allocPtr, dataOff, content, rptr, rlen, steerPtr, steerCap, logPtr, logLen, steer
	f.Add(uint8(1), uint32(65536), uint32(1024), valid, uint32(1024), uint32(len(valid)), uint32(8192), uint32(4096), uint32(1024), uint32(10), true)
	f.Add(uint8(0), uint32(4096), uint32(100), valid, uint32(100), uint32(len(valid)), uint32(0), uint32(0), uint32(0), uint32(0), false)
	f.Add(uint8(1), uint32(65536), uint32(1024), valid, uint32(0xffffff00), uint32(0x200), uint32(0), uint32(0), uint32(0), uint32(0), false)
	f.Add(uint8(1), uint32(65536), uint32(1024), valid, uint32(1024), uint32(0xffffffff), uint32(0), uint32(0), uint32(0), uint32(0), false)
	f.Add(uint8(1), uint32(65536), uint32(1024), valid, uint32(131000), uint32(1000), uint32(0), uint32(0), uint32(0), uint32(0), false)
	f.Add(uint8(0), uint32(0), uint32(0), []byte(`{"outcome":"ok"`), uint32(0), uint32(14), uint32(0), uint32(0), uint32(0), uint32(0), false)
	f.Add(uint8(0), uint32(1024), uint32(0), []byte("{}"), uint32(0), uint32(2), uint32(65530), uint32(1<<20), uint32(65530), uint32(1<<30), true)
	f.Add(uint8(2), uint32(0xfffffff0), uint32(0), valid, uint32(0), uint32(len(valid)), uint32(0), uint32(0), uint32(0), uint32(0), false)
	f.Fuzz(func(t *testing.T, pages uint8, allocPtr, dataOff uint32, content []byte, rptr, rlen, steerPtr, steerCap, logPtr, logLen uint32, withSteer bool) {
		rt, err := fuzzRuntime()
		if err != nil {
			t.Fatal(err)
		}
		memPages := 1 + int(pages%3)
		memSize := uint32(memPages) * 65536
		if len(content) > int(memSize) {
			content = content[:memSize]
		}
		off := dataOff % (memSize - uint32(len(content)) + 1)
		body := append(append(i32Const(int32(0)), i32Const(int32(logPtr))...), i32Const(int32(logLen))...)
		body = append(body, opCall, 0x00) // log(0, logPtr, logLen)
		body = append(append(body, i32Const(int32(steerPtr))...), i32Const(int32(steerCap))...)
		body = append(body, opCall, 0x01, opDrop) // steer_poll(steerPtr, steerCap)
		body = append(body, i64Const(int64(uint64(rptr)<<32|uint64(rlen)))...)
		m := fixedGuest(1, nil,
			wfunc{export: "paddock_alloc", params: []byte{tI32}, results: []byte{tI32}, body: i32Const(int32(allocPtr))},
			wfunc{export: "paddock_turn", params: []byte{tI32, tI32}, results: []byte{tI64}, body: body})
		m.memPages = memPages
		m.data = []wdata{{int32(off), content}}
		m.imports = []wimport{
			{module: "paddock", name: "log", params: []byte{tI32, tI32, tI32}},
			steerPollImport,
		}
		ctx := context.Background()
		info, err := rt.Validate(ctx, m.bytes())
		if err != nil {
			t.Fatalf("the fuzz module does not load: %v", err)
		}
		defer rt.Unload(ctx, info.Digest)
		inst, err := rt.Instantiate(ctx, info.Digest)
		if err != nil {
			t.Fatalf("instantiate: %v", err)
		}
		defer inst.Close(ctx)
		req := &abi.TurnRequest{ABIVersion: abi.Version, TurnRef: fuzzRef, Session: abi.Session{AgentName: "f", SessionID: "s"},
			Event: abi.Event{ID: 2, Kind: abi.EventMessage, Message: "hi", AcceptedAt: time.Unix(0, 0).UTC()}, Attempt: 1}
		steerRef := fuzzRef
		steerRef.Revision, steerRef.DeliveryID = 1, "d2"
		tctx := ctx
		if withSteer {
			ch := make(chan abi.Steer, 1)
			ch <- abi.Steer{TurnRef: steerRef, EventID: 3, Message: "steer"}
			tctx = abi.WithSteers(ctx, ch)
		}
		res, err := inst.Turn(tctx, req)
		if err != nil {
			var te *wasm.TurnError
			if !errors.As(err, &te) {
				t.Fatalf("a guest's bad memory use returned %T %v, want a *wasm.TurnError", err, err)
			}
			if !inst.Closed() {
				t.Fatal("the instance survived a failed turn")
			}
			msg := te.Error()
			switch te.Kind {
			case wasm.KindOversized:
				if int64(rlen) <= fuzzResultLimit {
					t.Fatalf("oversized for a %d-byte result (cap %d): %s", rlen, fuzzResultLimit, msg)
				}
			case wasm.KindInvalidResult:
				if int64(rlen) > fuzzResultLimit && te.Op == wasm.ExportTurn {
					t.Fatalf("a %d-byte result over the cap is invalid_result, not oversized: %s", rlen, msg)
				}
			default:
				t.Fatalf("kind %s for a guest that only hands the host bad buffers: %s", te.Kind, msg)
			}
			if te.Op == wasm.ExportTurn && strings.Contains(msg, "outside") && uint64(rptr)+uint64(rlen) <= uint64(memSize) {
				t.Fatalf("a result at %#x+%d inside the %d-byte memory is called outside: %s", rptr, rlen, memSize, msg)
			}
			if te.Err == nil || te.Op == "" {
				t.Fatalf("TurnError without cause or op: %+v", te)
			}
			return
		}
		// Success: the host read only inside memory and within the cap.
		if int64(rlen) > fuzzResultLimit || uint64(rptr)+uint64(rlen) > uint64(memSize) {
			t.Fatalf("a result at %#x+%d was read from a %d-byte memory (cap %d)", rptr, rlen, memSize, fuzzResultLimit)
		}
		if err := res.Validate(); err != nil {
			t.Fatalf("an accepted result does not validate: %v", err)
		}
		if res.TurnRef != fuzzRef && !(withSteer && res.TurnRef == steerRef) {
			t.Fatalf("an accepted result echoes %+v", res.TurnRef)
		}
		// Where the result lies in the data segment, clear of what the host
		// wrote (the request at allocPtr, a steer at steerPtr), it is what
		// the guest put there.
		reqLen, _ := abi.Marshal(req)
		overlaps := func(p, n uint32) bool {
			return uint64(p) < uint64(rptr)+uint64(rlen) && uint64(rptr) < uint64(p)+uint64(n)
		}
		if rptr >= off && uint64(rptr)+uint64(rlen) <= uint64(off)+uint64(len(content)) &&
			!overlaps(allocPtr, uint32(len(reqLen))) && !(withSteer && overlaps(steerPtr, 4096)) {
			want := new(abi.TurnResult)
			if err := json.Unmarshal(content[rptr-off:rptr-off+rlen], want); err != nil {
				t.Fatalf("the host accepted bytes that do not decode: %v", err)
			}
			if !reflect.DeepEqual(want, res) {
				t.Fatalf("the host read %+v, the guest wrote %+v", res, want)
			}
		}
	})
}
