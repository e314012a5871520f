package wire_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/wasm/internal/wire"
)

// checkDecode fails t unless DecodeTurnRequest and json.Unmarshal give the
// same request and the same error for data.
func checkDecode(t *testing.T, data []byte) {
	t.Helper()
	var got, want abi.TurnRequest
	gotErr := wire.DecodeTurnRequest(data, &got)
	wantErr := json.Unmarshal(data, &want)
	if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
		t.Fatalf("decode %q: error %v, encoding/json %v", data, gotErr, wantErr)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("decode %q:\n got %#v\nwant %#v", data, got, want)
	}
	var gs, ws abi.Steer
	gotErr = wire.DecodeSteer(data, &gs)
	wantErr = json.Unmarshal(data, &ws)
	if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) || !reflect.DeepEqual(gs, ws) {
		t.Fatalf("decode steer %q: %#v, %v; encoding/json %#v, %v", data, gs, gotErr, ws, wantErr)
	}
}

// checkEncode fails t unless AppendTurnResult writes what abi.Marshal
// writes for res (or fails as it does).
func checkEncode(t *testing.T, res *abi.TurnResult) {
	t.Helper()
	prefix := []byte("prefix")
	got, gotErr := wire.AppendTurnResult(prefix, res)
	want, wantErr := abi.Marshal(res)
	if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
		t.Fatalf("encode %#v: error %v, abi.Marshal %v", res, gotErr, wantErr)
	}
	if gotErr == nil && !bytes.Equal(got, append([]byte("prefix"), want...)) {
		t.Fatalf("encode %#v:\n got %s\nwant prefix%s", res, got, want)
	}
}

// checkDecodeResult fails t unless DecodeTurnResult and json.Unmarshal
// give the same result and the same error for data, and unless the result
// shares no memory with data (the host decodes from guest memory).
func checkDecodeResult(t *testing.T, data []byte) {
	t.Helper()
	var got, want abi.TurnResult
	in := bytes.Clone(data)
	gotErr := wire.DecodeTurnResult(in, &got)
	wantErr := json.Unmarshal(data, &want)
	if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
		t.Fatalf("decode result %q: error %v, encoding/json %v", data, gotErr, wantErr)
	}
	for i := range in {
		in[i] = 'X' // the guest reuses its memory
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("decode result %q (its input overwritten after):\n got %#v\nwant %#v", data, got, want)
	}
}

// checkEncodeRequest fails t unless AppendTurnRequest writes what
// abi.Marshal writes for req (or fails as it does).
func checkEncodeRequest(t *testing.T, req *abi.TurnRequest) {
	t.Helper()
	got, gotErr := wire.AppendTurnRequest([]byte("prefix"), req)
	want, wantErr := abi.Marshal(req)
	if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
		t.Fatalf("encode %#v: error %v, abi.Marshal %v", req, gotErr, wantErr)
	}
	if gotErr == nil && !bytes.Equal(got, append([]byte("prefix"), want...)) {
		t.Fatalf("encode %#v:\n got %s\nwant prefix%s", req, got, want)
	}
}

// trickyResults are results at the edges of encoding/json's semantics, as
// a hostile guest may write them.
var trickyResults = []string{
	``, ` `, `null`, `{}`, `[]`, `"x"`, `{`, `{}x`, `{}{}`,
	`{"outcome":"ok"}`, `{"outcome":"ok","outcome":"error"}`, `{"Outcome":"ok"}`, `{"OUTCOME":"ok"}`, `{"outcome":1}`, `{"outcome":null}`,
	`{"error":"e\u0000\ud800x"}`, "{\"error\":\"bad \xff utf8\"}", `{"error":null,"state":null,"messages":null,"turn_ref":null}`,
	`{"messages":[]}`, `{"messages":[null,{}]}`, `{"messages":[{"role":"assistant","content":"a","role":"user"}]}`, `{"messages":{}}`,
	`{"messages":[{"Role":"assistant"}]}`, `{"messages":[{"role":"assistant","content":"\"<&>\u2028"}],"x":[1,{"y":null}]}`,
	`{"state":""}`, `{"state":"AAEC"}`, `{"state":"AAE"}`, `{"state":"!!"}`, `{"state":1}`,
	`{"alarms":null,"wait":null}`, `{"alarms":[]}`, `{"alarms":[{"name":"a","in_ms":5}]}`, `{"alarms":5}`,
	`{"wait":{"id":"w","for":"f","data":[1],"timeout_ms":3}}`, `{"wait":{}}`, `{"wait":"x"}`,
	`{"turn_ref":{"delivery_id":"d","actor_epoch":1,"revision":2.5}}`, `{"turn_ref":{"actor_epoch":9223372036854775808}}`,
	`{"turn_ref":{"delivery_id":"d","delivery_id":"e"}}`, `{"turn_ref":[]}`, `{"ſtate":"AA=="}`,
	`{"u":` + strings.Repeat(`[`, 1100) + strings.Repeat(`]`, 1100) + `}`,
}

func TestDecodeResultTricky(t *testing.T) {
	t.Parallel()
	for _, s := range trickyResults {
		checkDecodeResult(t, []byte(s))
	}
}

func TestEncodeRequestTricky(t *testing.T) {
	t.Parallel()
	bad := time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, req := range []*abi.TurnRequest{
		{},
		{Transcript: []abi.Message{}, State: []byte{}, Session: abi.Session{Input: []byte{}}, Event: abi.Event{Data: json.RawMessage{}}},
		{Event: abi.Event{AcceptedAt: bad}},
		{Event: abi.Event{Data: json.RawMessage(`{"a":`)}},
		{Event: abi.Event{Data: json.RawMessage(" [ \"<\u2028>\" ] ")}},
		{Steers: []abi.Steer{{Data: json.RawMessage(`nope`)}}},
		{Steers: []abi.Steer{{}, {Message: "<&>\u2028", Data: json.RawMessage(`null`)}}},
		{Event: abi.Event{Alarm: &abi.AlarmFired{Name: "a"}}},
		{Event: abi.Event{Wait: &abi.WaitEvent{ID: "w"}, Data: json.RawMessage(`1`)}},
		{Session: abi.Session{AgentName: "\u2028\u2029<>&\x7f\x00\xc0\xaf😀", Key: "k", Input: []byte("in")}},
	} {
		checkEncodeRequest(t, req)
	}
}

// trickyRequests are requests at the edges of encoding/json's semantics;
// most leave the fast path, and every one must decode the same.
var trickyRequests = []string{
	``, ` `, `null`, ` null `, `{}`, `[]`, `"x"`, `1`, `{`, `{}x`, `{} `, `{}{}`, "\ufeff{}",
	`{"abi_version":1}`, `{"abi_version":1.0}`, `{"abi_version":1e2}`, `{"abi_version":-0}`, `{"abi_version":01}`,
	`{"abi_version":"1"}`, `{"abi_version":null}`, `{"abi_version":true}`, `{"abi_version":-}`,
	`{"abi_version":9223372036854775807}`, `{"abi_version":9223372036854775808}`, `{"abi_version":-9223372036854775808}`,
	`{"abi_version":-9223372036854775809}`, `{"abi_version":123456789012345678901234567890}`,
	`{"turn_ref":{"actor_epoch":1,"actor_epoch":2}}`, `{"attempt":1,"attempt":2}`,
	`{"ABI_Version":3}`, `{"Turn_Ref":{"Delivery_ID":"d"}}`, `{"turn_ref":{"DELIVERY_ID":"d"}}`,
	`{"turn\u005fref":{"delivery_id":"d"}}`, `{"ſtate":"AA=="}`, `{"ﬆ":1}`, "{\"\xff\":1}",
	`{"unknown":{"a":[1,2.5e-3,{"b":null}],"c":"\u00e9\ud83d\ude00"},"attempt":2}`,
	`{"unknown":[1,2,}`, `{"unknown":"\x"}`, `{"unknown":"\u12"}`, `{"unknown":01}`, `{"unknown":1.}`, `{"unknown":.5}`,
	`{"unknown":tru}`, `{"unknown":nul}`, "{\"unknown\":\"a\tb\"}", `{"unknown":-}`, `{"unknown":1e}`, `{"unknown":1E+2}`,
	`{"turn_ref":null,"session":null,"event":null,"state":null,"transcript":null,"steers":null}`,
	`{"turn_ref":[],"session":1}`, `{"event":"x"}`, `{"state":1}`,
	`{"state":""}`, `{"state":"AAEC"}`, `{"state":"AAE"}`, `{"state":"AA=="}`, `{"state":"A\nA=="}`, `{"state":"A\\nA=="}`, `{"state":"!!"}`,
	`{"session":{"input":"aGk=","key":"k","agent_name":"a","session_id":"s"}}`, `{"session":{"input":null}}`,
	`{"transcript":[]}`, `{"transcript":[null]}`, `{"transcript":[{}]}`, `{"transcript":[1]}`, `{"transcript":[{"role":"user","content":"a"},{"role":"assistant"}]}`,
	`{"transcript":[{"role":"user","content":"a"},]}`, `{"transcript":{}}`, `{"transcript":[{"role":null,"content":null}]}`,
	`{"transcript":[{"role":"user","content":"\"q\" \\ \/ \b\f\n\r\t \u0000 \u001f \u2028 <>&"}]}`,
	`{"transcript":[{"content":"\ud83d\ude00 \ud83d \ude00 \ud83d\u0041 \udc00\ud800 \ud800\ud800\udc00 \uD83D\uDE00"}]}`,
	"{\"transcript\":[{\"content\":\"bad \xff\xfe utf8 \xe2\x82 é\"}]}",
	"{\"transcript\":[{\"content\":\"raw\x01control\"}]}",
	`{"event":{"data":{"a" : [ 1 , 2 ]},"id":7,"kind":"message","message":"m"}}`,
	`{"event":{"data":null}}`, `{"event":{"data":"s"}}`, `{"event":{"data":12.5e3}}`, `{"event":{"data":[]}}`, `{"event":{"data":{"a":}}}`,
	`{"event":{"accepted_at":"2026-12-02T05:30:00.123456789Z"}}`, `{"event":{"accepted_at":"2026-12-02T05:30:00+01:00"}}`,
	`{"event":{"accepted_at":null}}`, `{"event":{"accepted_at":"yesterday"}}`, `{"event":{"accepted_at":1}}`, `{"event":{"accepted_at":"2026-12-02T05:30:00Z\u0000"}}`,
	`{"event":{"accepted_at":"2026-12-02T05:30:00\u005a"}}`,
	`{"event":{"alarm":{"name":"n","due_at":"2026-01-01T00:00:00Z","data":{"x":1}}}}`, `{"event":{"alarm":null}}`, `{"event":{"alarm":{}}}`, `{"event":{"alarm":5}}`,
	`{"event":{"wait":{"id":"w","for":"f","data":[1]}}}`, `{"event":{"wait":null}}`, `{"event":{"wait":{"data":null}}}`,
	`{"steers":[{"turn_ref":{"delivery_id":"d","revision":2},"event_id":9,"message":"s","data":{"k":"v"}}]}`,
	`{"steers":[]}`, `{"steers":[null,{}]}`, `{"steers":[{"turn_ref":null}]}`, `{"steers":"x"}`,
	`{"turn_ref":{"delivery_id":"d","activation_uid":"a","actor_epoch":1,"actor_event_id":2,"revision":3,"agent_uid":"u","session_id":"s","extra":true}}`,
	`{"turn_ref":{"delivery_id":1}}`, `{"turn_ref":{"revision":"3"}}`, `{"turn_ref":{"revision":1.5}}`,
	`{"event_id":5,"message":"steer","turn_ref":{"revision":4}}`, `{"event_id":5,"event_id":6}`,
	strings.Repeat(`[`, 1100) + strings.Repeat(`]`, 1100), `{"u":` + strings.Repeat(`[`, 1100) + strings.Repeat(`]`, 1100) + `}`,
	`{"u":` + strings.Repeat(`[`, 20000) + strings.Repeat(`]`, 20000) + `}`,
}

func TestDecodeTricky(t *testing.T) {
	t.Parallel()
	for _, s := range trickyRequests {
		checkDecode(t, []byte(s))
	}
}

// alphabet feeds random strings: ASCII, JSON's escapes, HTML characters,
// multi-byte runes, U+2028, invalid UTF-8.
var alphabet = []string{"a", "Z", " ", "0", `"`, `\`, "/", "\n", "\r", "\t", "\b", "\f", "\x00", "\x1f", "<", ">", "&",
	"é", "€", "😀", "\u2028", "\u2029", "\ufffd", "\xff", "\xe2\x82", "{", "}", "[", ":", ","}

func randString(r *rand.Rand) string {
	var b strings.Builder
	for range r.IntN(12) {
		b.WriteString(alphabet[r.IntN(len(alphabet))])
	}
	return b.String()
}

func randBytes(r *rand.Rand) []byte {
	switch r.IntN(4) {
	case 0:
		return nil
	case 1:
		return []byte{}
	}
	b := make([]byte, r.IntN(40))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func randInt(r *rand.Rand) int64 {
	switch r.IntN(4) {
	case 0:
		return 0
	case 1:
		return -r.Int64()
	case 2:
		return r.Int64N(1000)
	}
	return r.Int64()
}

var rawValues = []string{``, `null`, `{"a":[1,2]}`, ` { "a" : "<&>" } `, `"s\u00e9"`, `[]`, `-1.5e3`, `true`, "\t[ 1 ,\n2 ]\n"}

func randRaw(r *rand.Rand) json.RawMessage {
	s := rawValues[r.IntN(len(rawValues))]
	if s == "" {
		return nil
	}
	return json.RawMessage(s)
}

func randTime(r *rand.Rand) time.Time {
	if r.IntN(3) == 0 {
		return time.Time{}
	}
	return time.Unix(r.Int64N(4e9), r.Int64N(1e9)).In(time.FixedZone("z", 3600*(r.IntN(5)-2)))
}

func randRef(r *rand.Rand) abi.TurnRef {
	return abi.TurnRef{DeliveryID: randString(r), ActivationUID: randString(r), ActorEpoch: randInt(r),
		ActorEventID: randInt(r), Revision: randInt(r), AgentUID: randString(r), SessionID: randString(r)}
}

func randMessages(r *rand.Rand) []abi.Message {
	if r.IntN(4) == 0 {
		return nil
	}
	m := make([]abi.Message, r.IntN(5))
	for i := range m {
		m[i] = abi.Message{Role: randString(r), Content: randString(r)}
	}
	return m
}

func randRequest(r *rand.Rand) *abi.TurnRequest {
	req := &abi.TurnRequest{ABIVersion: int(randInt(r)), TurnRef: randRef(r), Attempt: int(randInt(r)),
		Session: abi.Session{AgentName: randString(r), SessionID: randString(r), Key: randString(r), Input: randBytes(r)},
		Event:   abi.Event{ID: randInt(r), Kind: randString(r), Message: randString(r), Data: randRaw(r), AcceptedAt: randTime(r)},
		State:   randBytes(r), Transcript: randMessages(r)}
	if r.IntN(3) == 0 {
		req.Event.Alarm = &abi.AlarmFired{Name: randString(r), DueAt: randTime(r), Data: randRaw(r)}
	}
	if r.IntN(3) == 0 {
		req.Event.Wait = &abi.WaitEvent{ID: randString(r), For: randString(r), Data: randRaw(r)}
	}
	for range r.IntN(3) {
		req.Steers = append(req.Steers, abi.Steer{TurnRef: randRef(r), EventID: randInt(r), Message: randString(r), Data: randRaw(r)})
	}
	return req
}

func randResult(r *rand.Rand) *abi.TurnResult {
	res := &abi.TurnResult{TurnRef: randRef(r), Messages: randMessages(r), State: randBytes(r),
		Outcome: abi.Outcome(randString(r)), Error: randString(r)}
	for range r.IntN(3) {
		a := abi.AlarmOp{Name: randString(r), InMs: randInt(r), EveryMs: randInt(r), Clear: r.IntN(2) == 0, Data: randRaw(r)}
		if r.IntN(2) == 0 {
			at := randTime(r)
			a.At = &at
		}
		res.Alarms = append(res.Alarms, a)
	}
	if r.IntN(3) == 0 {
		res.Wait = &abi.WaitSpec{ID: randString(r), For: randString(r), Data: randRaw(r), TimeoutMs: randInt(r)}
	}
	return res
}

// TestRandomRoundTrips encodes random requests as the host does
// (abi.Marshal, and json.Marshal with HTML escaping, and indented) and
// requires both decoders to agree; and random results, requiring the same
// bytes as abi.Marshal.
func TestRandomRoundTrips(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	for range 3000 {
		req := randRequest(r)
		for _, enc := range []func(any) ([]byte, error){abi.Marshal, json.Marshal, func(v any) ([]byte, error) { return json.MarshalIndent(v, "", " ") }} {
			data, err := enc(req)
			if err != nil {
				t.Fatal(err)
			}
			checkDecode(t, data)
			if !wire.FastDecode(data) {
				t.Fatalf("the fast path refused %s, which the host's encoder wrote", data)
			}
			var back abi.TurnRequest
			if err := wire.DecodeTurnRequest(data, &back); err != nil {
				t.Fatalf("decode %s: %v", data, err)
			}
		}
		checkEncodeRequest(t, req)
		if _, err := abi.Marshal(req); err == nil && req.Event.Alarm == nil && req.Event.Wait == nil && !wire.FastEncodeRequest(req) {
			t.Fatalf("the fast path refused %#v", req)
		}
		res := randResult(r)
		checkEncode(t, res)
		if _, err := abi.Marshal(res); err == nil && !wire.FastEncode(res) {
			t.Fatalf("the fast path refused %#v", res)
		}
		for _, enc := range []func(any) ([]byte, error){abi.Marshal, json.Marshal, func(v any) ([]byte, error) { return json.MarshalIndent(v, "", " ") }} {
			data, err := enc(res)
			if err != nil {
				continue // invalid raw data or time: nothing a guest could send
			}
			checkDecodeResult(t, data)
			if len(res.Alarms) == 0 && res.Wait == nil && !wire.FastDecodeResult(data) {
				t.Fatalf("the fast path refused %s, which the guest's encoder wrote", data)
			}
		}
	}
}

func TestEncodeTricky(t *testing.T) {
	t.Parallel()
	bad := time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, res := range []*abi.TurnResult{
		{},
		{Messages: []abi.Message{}, State: []byte{}, Outcome: abi.OutcomeOK},
		{Alarms: []abi.AlarmOp{{}}, Wait: &abi.WaitSpec{}},
		{Alarms: []abi.AlarmOp{{Name: "a", Data: json.RawMessage(`{"a":`)}}},
		{Alarms: []abi.AlarmOp{{Name: "a", At: &bad}}},
		{Wait: &abi.WaitSpec{Data: json.RawMessage(`nope`)}},
		{Wait: &abi.WaitSpec{Data: json.RawMessage(` [ "<\u2028>" ] `)}},
		{Wait: &abi.WaitSpec{TimeoutMs: 5}},
		{Error: "\u2028\u2029<>&\x7f\x00\xc0\xaf😀"},
	} {
		checkEncode(t, res)
	}
}

func FuzzDecodeTurnRequest(f *testing.F) {
	for _, s := range trickyRequests {
		if len(s) < 4096 {
			f.Add([]byte(s))
		}
	}
	r := rand.New(rand.NewPCG(3, 4))
	for range 20 {
		data, err := abi.Marshal(randRequest(r))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkDecode(t, data)
	})
}

func FuzzDecodeTurnResult(f *testing.F) {
	for _, s := range append(trickyResults, hostileResults...) {
		if len(s) < 4096 {
			f.Add([]byte(s))
		}
	}
	r := rand.New(rand.NewPCG(5, 6))
	for range 20 {
		if data, err := abi.Marshal(randResult(r)); err == nil {
			f.Add(data)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkDecodeResult(t, data)
		checkNoAlias(t, data)
	})
}

func FuzzAppendTurnResult(f *testing.F) {
	f.Add("d", "user", "hi \"there\"\n", []byte("state"), false, "ok", "", "alarm", int64(1000), int64(0), false, []byte(`{"a":1}`), "w", int64(5))
	f.Add("\xff", "\u2028", "<&>", []byte(nil), true, "", "boom", "", int64(-1), int64(1e18), true, []byte(` [1, 2] `), "", int64(0))
	f.Fuzz(func(t *testing.T, ref, role, content string, state []byte, stateNil bool, outcome, errMsg, alarm string, inMs, atUnix int64, clear bool, data []byte, waitID string, timeout int64) {
		if stateNil {
			state = nil
		} else if state == nil {
			state = []byte{}
		}
		at := time.Unix(atUnix, 0).UTC()
		res := &abi.TurnResult{TurnRef: abi.TurnRef{DeliveryID: ref, AgentUID: role, ActorEpoch: inMs, Revision: atUnix},
			Messages: []abi.Message{{Role: role, Content: content}}, State: state, Outcome: abi.Outcome(outcome), Error: errMsg}
		if alarm != "" {
			res.Alarms = []abi.AlarmOp{{Name: alarm, InMs: inMs, At: &at, Clear: clear, Data: data}, {Name: content}}
		}
		if waitID != "" || timeout != 0 {
			res.Wait = &abi.WaitSpec{ID: waitID, For: content, Data: data, TimeoutMs: timeout}
		}
		checkEncode(t, res)
	})
}

// BenchmarkDecode compares the codec with encoding/json natively on the
// bench agent's request with 20 transcript messages.
func BenchmarkDecode(b *testing.B) {
	req := &abi.TurnRequest{ABIVersion: 1, TurnRef: abi.TurnRef{DeliveryID: "d", AgentUID: "a", SessionID: "s", ActivationUID: "x", ActorEpoch: 1, ActorEventID: 1, Revision: 1},
		Event: abi.Event{ID: 1, Kind: abi.EventMessage, Data: json.RawMessage(`{"idx":7,"key":"k00007","seq":3,"t":1}`)}, Attempt: 1}
	for i := range 20 {
		req.Transcript = append(req.Transcript, abi.Message{Role: abi.RoleUser, Content: fmt.Sprintf(`{"idx":7,"key":"k00007","seq":%d,"t":1764490000000000000}`, i)})
	}
	data, err := abi.Marshal(req)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("wire", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var r abi.TurnRequest
			if err := wire.DecodeTurnRequest(data, &r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var r abi.TurnRequest
			if err := json.Unmarshal(data, &r); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestSpecialBytePositions puts each byte that ends a plain run (quote,
// backslash escapes, control, non-ASCII, invalid UTF-8) at every offset of
// strings up to 40 bytes long, so that the eight-bytes-at-a-time scan
// meets it in every lane and in the tail.
func TestSpecialBytePositions(t *testing.T) {
	t.Parallel()
	for _, special := range []string{`\"`, `\\`, `\n`, `\u00e9`, "\x01", "\x1f", " ", "~", "\x7f", "é", "\u2028", "\xff", `"`, "!", "#", "[", "]", "\\", "\x80"} {
		for n := range 40 {
			for at := 0; at <= n; at++ {
				content := strings.Repeat("a", at) + special + strings.Repeat("b", n-at)
				checkDecode(t, []byte(`{"transcript":[{"role":"user","content":"`+content+`"}],"x":"`+content+`"}`))
			}
		}
	}
}

// BenchmarkHostCodec compares the host's direction with encoding/json on
// the bench agent's turn: its request encoded, its result decoded.
func BenchmarkHostCodec(b *testing.B) {
	ref := abi.TurnRef{DeliveryID: "0193a6f0-7c1e-7d3a-9a51-3c1f0b6f2e11", ActivationUID: "0193a6f0-7c1e-7d3a-9a51-3c1f0b6f2e12",
		ActorEpoch: 3, ActorEventID: 123456, Revision: 17, AgentUID: "0193a6f0-7c1e-7d3a-9a51-3c1f0b6f2e13", SessionID: "bench-000123"}
	req := &abi.TurnRequest{ABIVersion: 1, TurnRef: ref, Session: abi.Session{AgentName: "hasher", SessionID: ref.SessionID},
		Event: abi.Event{ID: 123456, Kind: abi.EventMessage, Data: json.RawMessage(`{"idx":1234,"key":"bench-000123","seq":17,"t":1764812345678901234}`),
			AcceptedAt: time.Date(2026, 12, 4, 3, 5, 55, 123456000, time.UTC)}, Attempt: 1}
	out, err := abi.Marshal(&abi.TurnResult{TurnRef: ref, Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "0123456789abcdef"}}, Outcome: abi.OutcomeOK})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("wire", func(b *testing.B) {
		b.ReportAllocs()
		var buf []byte
		for b.Loop() {
			var err error
			if buf, err = wire.AppendTurnRequest(buf[:0], req); err != nil {
				b.Fatal(err)
			}
			var res abi.TurnResult
			if err := wire.DecodeTurnResult(out, &res); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := abi.Marshal(req); err != nil {
				b.Fatal(err)
			}
			var res abi.TurnResult
			if err := json.Unmarshal(out, &res); err != nil {
				b.Fatal(err)
			}
		}
	})
}
