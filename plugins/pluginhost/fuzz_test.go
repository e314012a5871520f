package pluginhost

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/plugins/internal/wire"
)

const fuzzResultLimit = 16 << 10

var fuzzRef = abi.TurnRef{DeliveryID: "d", ActivationUID: "a", ActorEpoch: 1, ActorEventID: 2, AgentUID: "u", SessionID: "s"}

// FuzzPluginFrames is what a hostile plugin process can send on a turn's
// stream: a sequence of messages (one per line of the input), each a
// BytesValue whose bytes the host decodes as a frame (wire.Decode) and
// applies (call.frame, then call.result for the result frame), exactly as
// call.run does. Properties: no panic; a message that is not a frame is
// refused with an error naming it; accepted is set exactly by an accepted
// frame; the turn ends at the first result frame, or with a protocol error
// at the first malformed steer_taken; an accepted result is within the
// cap, validates, and echoes the request's turn_ref or that of a steer the
// plugin said it took in before; every refusal is a *TurnError of kind
// protocol or invalid_result that says what was wrong.
func FuzzPluginFrames(f *testing.F) {
	ref, _ := json.Marshal(fuzzRef)
	steered := fuzzRef
	steered.Revision, steered.DeliveryID = 1, "d2"
	sref, _ := json.Marshal(steered)
	result := func(r string) string {
		b, _ := json.Marshal(wire.Frame{Type: wire.TypeResult, Body: json.RawMessage(r)})
		return string(b)
	}
	for _, s := range []string{
		`{"type":"accepted"}` + "\n" + result(`{"turn_ref":`+string(ref)+`,"outcome":"ok","messages":[{"role":"assistant","content":"hi"}]}`),
		`{"type":"accepted"}` + "\n" + `{"type":"steer_taken","body":` + string(sref) + "}\n" + result(`{"turn_ref":`+string(sref)+`,"outcome":"ok"}`),
		`{"type":"accepted"}` + "\n" + result(`{"turn_ref":`+string(sref)+`,"outcome":"ok"}`),
		`{"type":"steer_taken","body":[]}`,
		`{"type":"steer_taken"}`,
		`{"type":"result"}`,
		`{"type":"result","body":{"outcome":"error"}}`,
		`{"type":"progress","body":1}` + "\n" + result(`{"turn_ref":`+string(ref)+`,"outcome":"error","error":"boom"}`),
		`{"type":""}`, `not json`, ``, `{"type":"accepted","body":"` + strings.Repeat("x", 100) + `"}`,
		result(`{"turn_ref":` + string(ref) + `,"outcome":"ok","messages":[{"role":"assistant","content":"` + strings.Repeat("y", fuzzResultLimit) + `"}]}`),
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		req := &abi.TurnRequest{ABIVersion: abi.Version, TurnRef: fuzzRef}
		c := &call{
			w:   &worker{m: &Manager{opts: Options{MaxResultBytes: fuzzResultLimit}}, cfg: Config{Name: "fz", SHA256: strings.Repeat("0", 64)}},
			p:   &process{pid: 42},
			req: req,
		}
		var taken []abi.TurnRef
		accepted := false
		for _, msg := range bytes.Split(data, []byte("\n")) {
			fr, err := wire.Decode(wrapperspb.Bytes(msg))
			if err != nil {
				// call.run ends the stream as a protocol failure here.
				if !strings.HasPrefix(err.Error(), "decode frame") {
					t.Fatalf("decode error %q does not say it is the frame", err)
				}
				return
			}
			if fr.Type == "" {
				t.Fatal("Decode returned a frame without a type")
			}
			if fr.Type == wire.TypeAccepted {
				accepted = true
			}
			body, ended, err := c.frame(fr)
			if c.accepted != accepted {
				t.Fatalf("accepted is %v after frames that say %v", c.accepted, accepted)
			}
			if err != nil {
				if fr.Type != wire.TypeSteerTaken || !strings.Contains(err.Error(), "steer_taken") {
					t.Fatalf("a %q frame broke the protocol with %v", fr.Type, err)
				}
				return
			}
			if fr.Type == wire.TypeSteerTaken {
				var r abi.TurnRef
				_ = json.Unmarshal(fr.Body, &r)
				taken = append(taken, r)
			}
			if !ended {
				if fr.Type == wire.TypeResult {
					t.Fatal("a result frame did not end the turn")
				}
				continue
			}
			if fr.Type != wire.TypeResult {
				t.Fatalf("a %q frame ended the turn", fr.Type)
			}
			res, err := c.result(body)
			if err != nil {
				var te *TurnError
				if !errors.As(err, &te) || te.Kind != KindInvalidResult || te.Err == nil || te.Accepted != accepted {
					t.Fatalf("result refused with %T %+v, want a TurnError of kind invalid_result (accepted %v)", err, err, accepted)
				}
				if len(body) > fuzzResultLimit && !strings.Contains(te.Error(), "limit") {
					t.Fatalf("an oversized result's error does not name the limit: %v", te)
				}
				return
			}
			if len(body) > fuzzResultLimit {
				t.Fatalf("a %d-byte result passed the %d-byte cap", len(body), fuzzResultLimit)
			}
			if err := res.Validate(); err != nil {
				t.Fatalf("an accepted result does not validate: %v", err)
			}
			echoed := res.TurnRef == fuzzRef
			for _, r := range taken {
				echoed = echoed || res.TurnRef == r
			}
			if !echoed {
				t.Fatalf("an accepted result echoes %+v, neither the request's nor a steer the plugin took in", res.TurnRef)
			}
			return
		}
	})
}

// FuzzFrameRoundTrip: whatever frame a peer builds with wire.Encode decodes
// to the same type and body (the host and the plugin SDK agree on frames).
func FuzzFrameRoundTrip(f *testing.F) {
	f.Add("result", []byte(`{"outcome":"ok"}`))
	f.Add("steer", []byte(`{"turn_ref":{},"event_id":3,"message":"<b>"}`))
	f.Add("cancel", []byte(nil))
	f.Add("x", []byte(`"\u2028"`))
	f.Fuzz(func(t *testing.T, typ string, body []byte) {
		if !utf8.ValidString(typ) {
			return // frame types are the protocol's ASCII constants
		}
		var v any
		if len(body) > 0 {
			if !json.Valid(body) {
				return
			}
			v = json.RawMessage(body)
		}
		m, err := wire.Encode(typ, v)
		if err != nil {
			t.Fatalf("encode %q %q: %v", typ, body, err)
		}
		if len(m.GetValue()) > wire.MaxFrameBytes+64 {
			t.Fatalf("frame of %d bytes", len(m.GetValue()))
		}
		fr, err := wire.Decode(m)
		if typ == "" {
			if err == nil {
				t.Fatal("a frame without a type decoded")
			}
			return
		}
		if err != nil {
			t.Fatalf("decode of an encoded frame: %v", err)
		}
		if fr.Type != typ {
			t.Fatalf("type %q came back as %q", typ, fr.Type)
		}
		var a, b bytes.Buffer
		_ = json.Compact(&a, body)
		_ = json.Compact(&b, fr.Body)
		if a.String() != b.String() {
			t.Fatalf("body %s came back as %s", body, fr.Body)
		}
	})
}
