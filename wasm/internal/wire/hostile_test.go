package wire_test

// Adversarial tests of the host's direction (written in review): a
// hostile guest's result bytes, and requests encoded into a dst with spare
// capacity.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/wasm/internal/wire"
)

func nest(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }

// hostileResults are results a hostile guest may write, beyond trickyResults.
var hostileResults = []string{
	// keys: escaped, case-folded (ASCII and Unicode), invalid UTF-8, NUL
	`{"outc\u006fme":"ok"}`, `{"\u004futcome":"ok"}`, `{"outcome":"ok","OUTCOME":"x"}`, `{"OUTCOME":"x","outcome":"ok"}`,
	`{"ſtate":"AA==","state":"AQ=="}`, `{"state":"AQ==","ſtate":"AA=="}`, `{"\u017ftate":"AA=="}`,
	`{"meſſages":[{"role":"user"}]}`, `{"meſſages":[{"role":"user"}],"messages":[]}`,
	`{"turn_ref":{"ſession_id":"x"}}`, `{"turn_ref":{"seſſion_id":"x","session_id":"y"}}`, `{"turn_ref":{"\u017fession_id":"x"}}`,
	`{"turn_ref":{"Session_Id":"x","session_id":"y"}}`, `{"turn_ref":{"session_id":"y","SESSION_ID":"x"}}`,
	`{"messages":[{"rOle":"user","role":"assistant"}]}`, `{"messages":[{"content":"a","cOntent":"b"}]}`,
	"{\"outcome\xff\":\"ok\"}", "{\"\xffoutcome\":\"ok\"}", "{\"outcom\xc5\xbf\":\"ok\"}", `{"outcome\u0000":"ok"}`, `{"":1,"outcome":"ok"}`,
	`{"turn_ref":{"KELVIN\u212a":1}}`, `{"alarms":[{"\u212aey":1}]}`, `{"errOr":"e"}`, `{"error_":"e","error":"f"}`,
	`{"outcome":"ok","outcome":"ok"}`, `{"alarms":null,"alarms":null}`, `{"wait":null,"wait":null}`, `{"turn_ref":null,"turn_ref":{"revision":1}}`,
	`{"turn_ref":{"revision":1},"turn_ref":null}`, `{"messages":null,"messages":[{}]}`, `{"state":null,"state":"AA=="}`, `{"state":"AA==","state":null}`,
	// numbers
	`{"turn_ref":{"revision":-0}}`, `{"turn_ref":{"revision":-9223372036854775808}}`, `{"turn_ref":{"revision":9223372036854775807}}`,
	`{"turn_ref":{"revision":9223372036854775808}}`, `{"turn_ref":{"revision":-9223372036854775809}}`, `{"turn_ref":{"revision":18446744073709551616}}`,
	`{"turn_ref":{"revision":99999999999999999999}}`, `{"turn_ref":{"revision":1e0}}`, `{"turn_ref":{"revision":1E0}}`, `{"turn_ref":{"revision":1.0}}`,
	`{"turn_ref":{"revision":00}}`, `{"turn_ref":{"revision":-}}`, `{"turn_ref":{"revision":+1}}`, `{"turn_ref":{"revision":0x10}}`, `{"turn_ref":{"revision":-01}}`,
	`{"turn_ref":{"revision":- 1}}`, `{"turn_ref":{"revision":1 }}`, `{"turn_ref":{"revision":true}}`, `{"turn_ref":{"revision":"1"}}`, `{"turn_ref":{"revision":[1]}}`,
	`{"turn_ref":{"revision":1,"revision":1}}`, `{"turn_ref":{"revision":null}}`, `{"turn_ref":{"revision":nul}}`, `{"turn_ref":{"revision":nullx}}`,
	// base64
	`{"state":"AA==\\n"}`, `{"state":"\\r\\nAA=="}`, `{"state":"A\u000aA=="}`, `{"state":"AA=\u003d"}`, `{"state":"AAA"}`, `{"state":"AAB="}`,
	`{"state":"AA==AA=="}`, `{"state":"AA"}`, `{"state":"A"}`, `{"state":"===="}`, `{"state":"AA-_"}`, `{"state":"\u0041\u0041=="}`, `{"state":"AA\u00e9=="}`,
	"{\"state\":\"AA\xff==\"}", `{"state":" AA=="}`, `{"state":"AA==\\t"}`,
	// strings
	`{"error":"\ud800\udc00\ud800"}`, `{"error":"\ud800\\"}`, `{"error":"\ud800\u"}`, `{"error":"\ud800\u00"}`, `{"error":"\ud800\u0041"}`, `{"error":"\udbff\udfff"}`,
	`{"error":"\ud800\uDC00"}`, `{"error":"\uD800"}`, `{"error":"\ud800`, `{"error":"\`, `{"error":"\u`, `{"error":"\u12`, `{"error":"abc`, `{"error":"\ud800\ud800\udc00"}`,
	"{\"error\":\"\xed\xa0\x80\"}", "{\"error\":\"\xf4\x90\x80\x80\"}", "{\"error\":\"\xc0\xaf\"}", "{\"error\":\"a\x7fb\"}", "{\"error\":\"\xe2\x80\xa8\"}",
	"{\"error\":\"\xf0\x9f\x98\"}", "{\"error\":\"\xf0\x9f\x98\x80\xf0\"}",
	// whitespace, framing
	" \t\r\n{ \"outcome\" : \"ok\" , \"messages\" : [ { \"role\" : \"x\" } , null ] } \n", "{\f}", "{\v}", "\ufeff{}", "{}\x00", `{"outcome":"ok"}garbage`,
	`{"outcome":"ok"} {}`, `{"outcome":"ok",}`, `{,"outcome":"ok"}`, `{"outcome" "ok"}`, `{"outcome":"ok" "error":"e"}`, `{"outcome"::"ok"}`, `{outcome:"ok"}`,
	`{'outcome':'ok'}`, `{"messages":[,]}`, `{"messages":[{}{}]}`, `{"messages":[{}`, `{"messages":[`, `{"messages":`, `{"messages"`, `{"messages`,
	`{"messages":[{"role":"a"},]}`, `{"x":[1,]}`, `{"x":{"a":1,}}`, `{"x":{1:2}}`, `{"x":[1 2]}`, `{"x":tRue}`, `{"x":NaN}`, `{"x":Infinity}`, `{"x":-Infinity}`,
	`{"x":1.5e+}`, `{"x":-0.0e-0}`, `{"x":"\/"}`, `{"x":"\'"}`, `{"x":"\a"}`,
	// values of the wrong type, partially decoded by encoding/json
	`{"outcome":"ok","messages":[{"role":1,"content":"c"}],"error":"e"}`, `{"messages":[{"role":"r"},5,{"content":"c"}],"outcome":"ok"}`,
	`{"turn_ref":{"delivery_id":"d","revision":"x","session_id":"s"},"outcome":"ok"}`, `{"state":"!!","outcome":"ok"}`,
	`{"alarms":[{"name":"a","in_ms":"5"}],"outcome":"ok"}`, `{"alarms":[{"at":"2026-01-01T00:00:00Z","data":{"x":"\ud800"}}]}`, `{"alarms":[null]}`,
	`{"wait":{"data":01}}`, `{"wait":{}, "outcome":"wait"}`,
	// depth: the fast path gives up beyond maxDepth, encoding/json at 10000
	`{"x":` + nest(999) + `}`, `{"x":` + nest(1000) + `}`, `{"x":` + nest(1001) + `}`, `{"x":` + nest(1002) + `}`,
	`{"messages":[{"x":` + nest(1001) + `}]}`, `{"x":` + nest(9998) + `}`, `{"x":` + nest(9999) + `}`, `{"x":` + nest(10000) + `}`,
	`{"x":` + strings.Repeat(`{"a":`, 1001) + `1` + strings.Repeat(`}`, 1001) + `}`,
	`{"x":` + strings.Repeat(`[`, 5000) + `}`,
}

func TestDecodeResultHostile(t *testing.T) {
	t.Parallel()
	for _, s := range hostileResults {
		checkDecodeResult(t, []byte(s))
		checkNoAlias(t, []byte(s))
	}
}

// checkNoAlias fails t if any string or byte slice of the decoded result
// points into the input buffer.
func checkNoAlias(t *testing.T, data []byte) {
	t.Helper()
	in := bytes.Clone(data)
	var res abi.TurnResult
	_ = wire.DecodeTurnResult(in, &res)
	if len(in) == 0 {
		return
	}
	lo := uintptr(unsafe.Pointer(unsafe.SliceData(in)))
	hi := lo + uintptr(cap(in))
	inside := func(p unsafe.Pointer, n int) bool {
		a := uintptr(p)
		return n > 0 && a < hi && a+uintptr(n) > lo
	}
	check := func(what, s string) {
		if inside(unsafe.Pointer(unsafe.StringData(s)), len(s)) {
			t.Fatalf("decode %q: %s aliases the input", data, what)
		}
	}
	checkB := func(what string, b []byte) {
		if inside(unsafe.Pointer(unsafe.SliceData(b)), cap(b)) {
			t.Fatalf("decode %q: %s aliases the input", data, what)
		}
	}
	r := res.TurnRef
	for i, s := range []string{r.DeliveryID, r.ActivationUID, r.AgentUID, r.SessionID, string(res.Outcome), res.Error} {
		check(fmt.Sprint("string ", i), s)
	}
	for _, m := range res.Messages {
		check("role", m.Role)
		check("content", m.Content)
	}
	checkB("state", res.State)
	for _, a := range res.Alarms {
		check("alarm name", a.Name)
		checkB("alarm data", a.Data)
	}
	if res.Wait != nil {
		check("wait id", res.Wait.ID)
		check("wait for", res.Wait.For)
		checkB("wait data", res.Wait.Data)
	}
}

// TestDecodeResultHostileSizes: results of 1 MiB (a guest may return up
// to abi.MaxResultBytes; the ratios do not depend on the size) built to
// stress the decoder; the codec must agree with encoding/json and not
// allocate much more than it (a bound on what a hostile guest can make
// the host allocate, not a timing).
func TestDecodeResultHostileSizes(t *testing.T) {
	const n = 1 << 20
	fill := func(prefix, unit, suffix string) []byte {
		var b strings.Builder
		b.WriteString(prefix)
		for b.Len()+len(unit)+len(suffix) <= n {
			b.WriteString(unit)
		}
		b.WriteString(suffix)
		return []byte(b.String())
	}
	cases := map[string][]byte{
		"invalid utf8":          fill(`{"outcome":"ok","error":"`, "\xff", `"}`),
		"invalid utf8 in state": fill(`{"outcome":"ok","state":"`, "\xff", `"}`),
		"escaped surrogates":    fill(`{"outcome":"ok","error":"`, `\ud800`, `"}`),
		"empty messages":        fill(`{"outcome":"ok","messages":[{}`, `,{}`, `]}`),
		"null messages":         fill(`{"outcome":"ok","messages":[null`, `,null`, `]}`),
		"many keys":             fill(`{"outcome":"ok"`, `,"a":1`, `}`),
		"many escaped keys":     fill(`{"outcome":"ok"`, `,"\u0061":1`, `}`),
		"dup at end":            fill(`{"outcome":"ok","messages":[{}`, `,{}`, `],"outcome":"ok"}`),
		"deep":                  fill(`{"x":`, `[`, ``),
		"many strings":          fill(`{"outcome":"ok","x":[""`, `,"\u00e9"`, `]}`),
	}
	for name, data := range cases {
		t.Run(strings.ReplaceAll(name, " ", "_"), func(t *testing.T) {
			measure := func(f func()) (time.Duration, uint64) {
				runtime.GC()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				start := time.Now()
				f()
				d := time.Since(start)
				runtime.ReadMemStats(&after)
				return d, after.TotalAlloc - before.TotalAlloc
			}
			var got, want abi.TurnResult
			var gotErr, wantErr error
			dw, aw := measure(func() { gotErr = wire.DecodeTurnResult(data, &got) })
			dj, aj := measure(func() { wantErr = json.Unmarshal(data, &want) })
			if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) || !reflect.DeepEqual(got, want) {
				t.Fatalf("differs from encoding/json: %v vs %v", gotErr, wantErr)
			}
			t.Logf("%d bytes: wire %v %d KiB, encoding/json %v %d KiB", len(data), dw, aw>>10, dj, aj>>10)
			if aw > 5*aj/2+1<<20 { // "dup at end" costs ~2x by design (fast path, then encoding/json)
				t.Errorf("wire allocated %d bytes, encoding/json %d", aw, aj)
			}
		})
	}
}

// checkEncodeRequestDst is checkEncodeRequest with a dst that has spare
// capacity filled with a sentinel; the prefix must survive whatever path
// AppendTurnRequest takes.
func checkEncodeRequestDst(t *testing.T, req *abi.TurnRequest) {
	t.Helper()
	for _, capExtra := range []int{0, 7, 4096} {
		back := make([]byte, 6, 6+capExtra)
		copy(back, "prefix")
		for i := 6; i < cap(back); i++ {
			back[:cap(back)][i] = '#'
		}
		got, gotErr := wire.AppendTurnRequest(back, req)
		want, wantErr := abi.Marshal(req)
		if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
			t.Fatalf("encode %#v: error %v, abi.Marshal %v", req, gotErr, wantErr)
		}
		if string(back) != "prefix" {
			t.Fatalf("prefix overwritten: %q", back)
		}
		if gotErr != nil {
			if string(got) != "prefix" {
				t.Fatalf("error %v with %q", gotErr, got)
			}
			continue
		}
		if !bytes.Equal(got, append([]byte("prefix"), want...)) {
			t.Fatalf("encode %#v:\n got %s\nwant prefix%s", req, got, want)
		}
	}
}

func TestEncodeRequestIntoDst(t *testing.T) {
	t.Parallel()
	bad := time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)
	neg := time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC)
	odd := time.Date(2026, 1, 1, 0, 0, 0, 1, time.FixedZone("", 59))    // offset with seconds
	odd2 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.FixedZone("EST", 0)) // named zero offset
	odd3 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.FixedZone("", -(23*3600+59*60)))
	odd4 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.FixedZone("", 24*3600))
	reqs := []*abi.TurnRequest{
		{Event: abi.Event{AcceptedAt: neg}}, {Event: abi.Event{AcceptedAt: odd}}, {Event: abi.Event{AcceptedAt: odd2}},
		{Event: abi.Event{AcceptedAt: odd3}}, {Event: abi.Event{AcceptedAt: odd4}}, {Event: abi.Event{AcceptedAt: time.Now()}},
		{Event: abi.Event{Data: json.RawMessage(`{"a":1} x`)}}, {Event: abi.Event{Data: json.RawMessage(" ")}},
		{Event: abi.Event{Data: json.RawMessage("\"\xff\"")}}, {Event: abi.Event{Data: json.RawMessage("\"\u2028<>&\"")}},
		{Event: abi.Event{Data: json.RawMessage(`"\u2028"`)}}, {Event: abi.Event{Data: json.RawMessage(nest(10001))}},
		{Event: abi.Event{Data: json.RawMessage(nest(9999))}},
		{Steers: []abi.Steer{{Message: "ok"}, {Data: json.RawMessage(`{`)}}}, {Steers: []abi.Steer{{Data: json.RawMessage(`1`)}, {Data: json.RawMessage(`[}`)}}},
		{Event: abi.Event{AcceptedAt: bad}, Steers: []abi.Steer{{Data: json.RawMessage(`{`)}}},
		{Event: abi.Event{Data: json.RawMessage(`{`), AcceptedAt: bad}},
		{Event: abi.Event{Alarm: &abi.AlarmFired{DueAt: bad}}}, {Event: abi.Event{Wait: &abi.WaitEvent{Data: json.RawMessage(`x`)}}},
		{Session: abi.Session{Input: make([]byte, 1<<16)}, State: make([]byte, 3<<16)},
		{ABIVersion: -1 << 63, Attempt: 1<<63 - 1, Event: abi.Event{ID: -1 << 63}},
		{Transcript: []abi.Message{{}, {Role: "\x00\x1f\x7f", Content: "\xed\xa0\x80\xf4\x90\x80\x80"}}},
	}
	for _, req := range reqs {
		checkEncodeRequestDst(t, req)
	}
	r := rand.New(rand.NewPCG(9, 9))
	for range 3000 {
		checkEncodeRequestDst(t, randRequest(r))
	}
}

func FuzzAppendTurnRequest(f *testing.F) {
	f.Add(int64(1), "d", "agent", "key", []byte("in"), true, int64(7), "message", "hi <&>", []byte(`{"a":1}`), int64(1764812345), int64(5), 3600,
		[]byte("state"), false, "user", "text", int64(1), "steer", []byte(` [1, 2] `), 1)
	f.Add(int64(-1), "\xff", "\u2028", "", []byte(nil), false, int64(0), "", "", []byte(nil), int64(-62135596800), int64(0), 0,
		[]byte(nil), true, "", "", int64(0), "", []byte(`{`), 0)
	f.Fuzz(func(t *testing.T, ver int64, ref, agent, key string, input []byte, inputEmpty bool, id int64, kind, msg string, data []byte,
		sec, nsec int64, zone int, state []byte, stateNil bool, role, content string, steerID int64, steerMsg string, steerData []byte, nSteers int) {
		if inputEmpty && input == nil {
			input = []byte{}
		}
		if stateNil {
			state = nil
		} else if state == nil {
			state = []byte{}
		}
		at := time.Unix(sec, nsec).In(time.FixedZone("z", zone%(48*3600)))
		req := &abi.TurnRequest{ABIVersion: int(ver), TurnRef: abi.TurnRef{DeliveryID: ref, AgentUID: agent, ActorEpoch: id, Revision: sec},
			Session: abi.Session{AgentName: agent, SessionID: ref, Key: key, Input: input},
			Event:   abi.Event{ID: id, Kind: kind, Message: msg, Data: data, AcceptedAt: at},
			State:   state, Transcript: []abi.Message{{Role: role, Content: content}}, Attempt: int(steerID)}
		for i := range nSteers % 4 {
			req.Steers = append(req.Steers, abi.Steer{TurnRef: abi.TurnRef{SessionID: steerMsg, Revision: int64(i)}, EventID: steerID, Message: steerMsg, Data: steerData})
		}
		checkEncodeRequestDst(t, req)
	})
}
