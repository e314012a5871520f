package abi_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/abi"
)

// Fuzz targets of the turn contract's decoders: what a worker sends
// (TurnResult) and what a worker receives (TurnRequest). Seeds live in
// testdata/fuzz/<name>; `make fuzz` explores further.

// FuzzTurnResult decodes a worker's result as every host does (JSON, then
// Validate) and checks: no panic; a refusal wraps ErrInvalidResult; an
// accepted result round-trips through abi.Marshal unchanged, validates
// again, matches the JSON schema, and carries only storable values (text
// without NUL, alarm due times a store and RFC 3339 can hold).
func FuzzTurnResult(f *testing.F) {
	for _, s := range []string{
		`{"turn_ref":{"delivery_id":"d","activation_uid":"a","actor_epoch":3,"actor_event_id":41,"revision":1,"agent_uid":"u","session_id":"s"},"messages":[{"role":"assistant","content":"hi"}],"state":"eyJhIjoxfQ==","outcome":"ok"}`,
		`{"turn_ref":{},"outcome":"error","error":"boom"}`,
		`{"turn_ref":{},"outcome":"sleep","state":""}`,
		`{"turn_ref":{},"outcome":"ok","alarms":[{"name":"a","in_ms":1500,"data":{"x":1}},{"name":"b","at":"2026-12-01T08:00:00Z","every_ms":86400000},{"name":"c","clear":true}]}`,
		`{"outcome":"finish","messages":null,"alarms":null}`,
		`{"outcome":"ok","messages":[{"role":"robot","content":"x"}]}`,
		`{"outcome":"error","error":"nul \u0000"}`,
		`{"outcome":"ok","alarms":[{"name":"far","in_ms":9223372036854775807}]}`,
		`{"outcome":"ok","alarms":[{"name":"far","at":"9999-12-31T23:59:59Z","every_ms":9223372036854775807}]}`,
		`{"turn_ref":{},"outcome":"wait","wait":{"id":"approve-1","for":"a human's yes","data":{"amount":3},"timeout_ms":60000}}`,
		`{"outcome":"wait","wait":{}}`,
		`{"outcome":"wait"}`,
		`{"outcome":"ok","wait":{"id":"x"}}`,
		`{"outcome":"wait","wait":{"id":"bad id"}}`,
		`{"outcome":"wait","wait":{"timeout_ms":-1}}`,
		`{"outcome":"wait","wait":{"data":null,"for":"\u0000"}}`,
		`[]`, `null`, `{"outcome":1}`, `{"state":"%%%"}`,
	} {
		f.Add([]byte(s))
	}
	schema := compileSchema(f, "TurnResult")
	f.Fuzz(func(t *testing.T, b []byte) {
		res := new(abi.TurnResult)
		if err := json.Unmarshal(b, res); err != nil {
			return // not JSON of the right shape: every host fails the turn here
		}
		if err := res.Validate(); err != nil {
			if !errors.Is(err, abi.ErrInvalidResult) {
				t.Fatalf("Validate error %v does not wrap ErrInvalidResult", err)
			}
			if err.Error() == abi.ErrInvalidResult.Error() {
				t.Fatalf("Validate error %q names no problem", err)
			}
			return
		}
		out, err := abi.Marshal(res)
		if err != nil {
			t.Fatalf("an accepted result does not encode: %v", err)
		}
		again := new(abi.TurnResult)
		if err := json.Unmarshal(out, again); err != nil {
			t.Fatalf("re-decode %s: %v", out, err)
		}
		if err := again.Validate(); err != nil {
			t.Fatalf("an accepted result is refused after a round trip: %v\n%s", err, out)
		}
		if !reflect.DeepEqual(normResult(res), normResult(again)) {
			t.Fatalf("round trip changed the result:\n%+v\n%+v", res, again)
		}
		if err := validate(t, schema, out); err != nil {
			t.Fatalf("Validate accepts what the schema refuses: %v\n%s", err, out)
		}
		for i, m := range res.Messages {
			if abi.ValidText(m.Content) != nil {
				t.Fatalf("messages[%d] is not storable text", i)
			}
		}
		if abi.ValidText(res.Error) != nil {
			t.Fatal("the error text is not storable")
		}
		// A due time must stay within what RFC 3339 (and so the API and
		// the next TurnRequest) can carry: years 0000–9999.
		horizon := time.Now().AddDate(1, 0, 0)
		for i, a := range res.Alarms {
			due := horizon.Add(time.Duration(a.InMs) * time.Millisecond)
			if a.At != nil {
				due = a.At.UTC() // stores keep UTC
			}
			if a.InMs > int64(abi.MaxAlarmDelayMs) || a.EveryMs > int64(abi.MaxAlarmDelayMs) {
				t.Fatalf("alarms[%d]: in_ms %d / every_ms %d past MaxAlarmDelayMs accepted", i, a.InMs, a.EveryMs)
			}
			if _, err := due.MarshalJSON(); err != nil && !a.Clear {
				t.Fatalf("alarms[%d] would be due at a time JSON cannot carry: %v", i, err)
			}
		}
	})
}

// normResult makes decoding-equivalent results equal: nil and empty slices
// of messages and alarms mean the same; state's nil and empty do not.
func normResult(r *abi.TurnResult) abi.TurnResult {
	c := *r
	if len(c.Messages) == 0 {
		c.Messages = nil
	}
	if len(c.Alarms) == 0 {
		c.Alarms = nil
	}
	c.Alarms = append([]abi.AlarmOp(nil), c.Alarms...)
	for i := range c.Alarms {
		if c.Alarms[i].At != nil {
			at := c.Alarms[i].At.UTC()
			c.Alarms[i].At = &at
		}
		c.Alarms[i].Data = compactJSON(c.Alarms[i].Data)
	}
	if c.Wait != nil {
		w := *c.Wait
		w.Data = compactJSON(w.Data)
		c.Wait = &w
	}
	return c
}

func compactJSON(b json.RawMessage) json.RawMessage {
	if len(b) == 0 {
		return nil
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		return b
	}
	return buf.Bytes()
}

// FuzzTurnRequest decodes a request as a worker (guest SDK, plugin, remote
// worker) does and checks: no panic; a decoded request re-encodes with
// abi.Marshal, decodes to the same value, and its turn_ref survives
// byte for byte in meaning (what the fences compare).
func FuzzTurnRequest(f *testing.F) {
	for _, s := range []string{
		`{"abi_version":1,"turn_ref":{"delivery_id":"d","activation_uid":"a","actor_epoch":3,"actor_event_id":41,"revision":0,"agent_uid":"u","session_id":"s"},"session":{"agent_name":"notes","session_id":"s","key":"k","input":"AAEC"},"event":{"id":41,"kind":"message","message":"hi <b>","data":{"a":[1,2]},"accepted_at":"2026-11-30T03:00:00.123456Z"},"state":null,"transcript":[{"role":"user","content":"hi"}],"attempt":1}`,
		`{"abi_version":1,"turn_ref":{},"session":{},"event":{"id":43,"kind":"alarm","accepted_at":"2026-11-30T03:30:00.412Z","alarm":{"name":"r","due_at":"2026-11-30T03:30:00.2Z","data":{"text":"tea"}}},"state":"","transcript":null,"attempt":2,"steers":[{"turn_ref":{"revision":1},"event_id":44,"message":"louder"}]}`,
		`{"event":{"accepted_at":"0000-01-01T00:00:00Z"}}`,
		`{"turn_ref":{"actor_epoch":9007199254740993}}`,
		`{"abi_version":1,"turn_ref":{},"session":{},"event":{"id":45,"kind":"wait.resolved","accepted_at":"2026-11-30T03:30:00Z","wait":{"id":"w44","for":"a date","data":{"date":"2026-12-24"}}},"state":null,"transcript":null,"attempt":1}`,
		`{"event":{"kind":"wait.expired","wait":{"id":"w44"}}}`,
		`{"state":"!!"}`, `{}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		req := new(abi.TurnRequest)
		if err := json.Unmarshal(b, req); err != nil {
			return
		}
		out, err := abi.Marshal(req)
		if err != nil {
			// Only a time JSON cannot write (a year past 9999 after a
			// zone offset) may fail to encode.
			if !strings.Contains(err.Error(), "year outside of range") {
				t.Fatalf("a decoded request does not encode: %v", err)
			}
			return
		}
		again := new(abi.TurnRequest)
		if err := json.Unmarshal(out, again); err != nil {
			t.Fatalf("re-decode %s: %v", out, err)
		}
		if again.TurnRef != req.TurnRef {
			t.Fatalf("turn_ref changed in a round trip: %+v → %+v", req.TurnRef, again.TurnRef)
		}
		if !reflect.DeepEqual(normRequest(req), normRequest(again)) {
			t.Fatalf("round trip changed the request:\n%+v\n%+v", req, again)
		}
	})
}

func normRequest(r *abi.TurnRequest) abi.TurnRequest {
	c := *r
	c.Event.AcceptedAt = c.Event.AcceptedAt.UTC()
	c.Event.Data = compactJSON(c.Event.Data)
	if c.Event.Alarm != nil {
		a := *c.Event.Alarm
		a.DueAt = a.DueAt.UTC()
		a.Data = compactJSON(a.Data)
		c.Event.Alarm = &a
	}
	if c.Event.Wait != nil {
		w := *c.Event.Wait
		w.Data = compactJSON(w.Data)
		c.Event.Wait = &w
	}
	if len(c.Session.Input) == 0 {
		c.Session.Input = nil
	}
	if len(c.Steers) == 0 {
		c.Steers = nil
	}
	c.Steers = append([]abi.Steer(nil), c.Steers...)
	for i := range c.Steers {
		c.Steers[i].Data = compactJSON(c.Steers[i].Data)
	}
	return c
}

// FuzzCallRequest: any bytes a guest sends as a host call either fail to
// decode or give a request whose Validate answers without panicking; a
// valid request survives an encode/decode round trip still valid and
// equal, and the schema accepts what the Go types encode.
func FuzzCallRequest(f *testing.F) {
	for _, s := range []string{
		`{"kind":"http","http":{"method":"GET","url":"https://example.com/a?b=1","headers":{"Authorization":"Bearer {{secret:k}}"}}}`,
		`{"kind":"http","http":{"url":"http://x","body":"aGk="}}`,
		`{"kind":"model","model":{"endpoint":"chat","messages":[{"role":"system","content":"s"},{"role":"user","content":"u"},{"role":"assistant","tool_calls":[{"id":"1","name":"t","arguments":{"a":1}}]},{"role":"tool","tool_call_id":"1","content":"r"}],"tools":[{"name":"t","parameters":{"type":"object"}}],"max_tokens":10,"temperature":0.5,"stop":["x"]}}`,
		`{"kind":"model","model":{"endpoint":"chat","messages":[{"role":"tool","content":"no id"}]}}`,
		`{"kind":"emit","emit":{"type":"text","text":"Hel"}}`,
		`{"kind":"emit","emit":{"type":"tool","data":{"tool":"search","status":"running"}}}`,
		`{"kind":"emit","emit":{"type":"json","data":[1,2,3]}}`,
		`{"kind":"emit","emit":{"type":"json","data":null}}`,
		`{"kind":"emit","emit":{"type":"text","text":"x","data":1}}`,
		`{"kind":"emit","emit":{"type":"text","call_seq":-1}}`,
		`{"kind":"emit","emit":{"type":"image"}}`,
		`{"kind":"emit"}`, `{"kind":"emit","emit":null}`, `{"kind":"emit","emit":{"type":"text"},"http":{"url":"x"}}`,
		`{"kind":"model","http":{"url":"x"}}`, `{"kind":"ftp"}`, `{}`, `null`, `[]`,
	} {
		f.Add([]byte(s))
	}
	schema := compileSchema(f, "CallRequest")
	f.Fuzz(func(t *testing.T, b []byte) {
		req := new(abi.CallRequest)
		if err := json.Unmarshal(b, req); err != nil {
			return
		}
		if err := req.Validate(); err != nil {
			if err.Error() == "" {
				t.Fatal("Validate error names no problem")
			}
			return
		}
		out, err := json.Marshal(req)
		if err != nil {
			t.Fatalf("encode a valid request: %v", err)
		}
		again := new(abi.CallRequest)
		if err := json.Unmarshal(out, again); err != nil {
			t.Fatalf("decode %s: %v", out, err)
		}
		if err := again.Validate(); err != nil {
			t.Fatalf("a valid request is invalid after a round trip: %v\n%s", err, out)
		}
		var v any
		if err := json.Unmarshal(out, &v); err != nil {
			t.Fatal(err)
		}
		if err := schema.Validate(v); err != nil {
			t.Fatalf("the schema refuses a valid request: %v\n%s", err, out)
		}
	})
}
