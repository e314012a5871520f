package wire

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"strconv"
	"unicode/utf8"

	"github.com/paddock-dev/paddock/abi"
)

// AppendTurnResult appends res encoded exactly as abi.Marshal(res) encodes
// it (encoding/json without HTML escaping, no trailing newline) to dst. If
// a raw JSON field (alarm or wait data) is not valid JSON or a time cannot
// be encoded, it returns abi.Marshal's error.
func AppendTurnResult(dst []byte, res *abi.TurnResult) ([]byte, error) {
	out, ok := appendTurnResult(dst, res)
	if ok {
		return out, nil
	}
	b, err := abi.Marshal(res)
	if err != nil {
		return dst, err
	}
	return append(dst, b...), nil
}

// appendTurnResult is the encoder's fast path; false when a Marshaler
// (json.RawMessage, time.Time) fails, leaving the error to abi.Marshal.
func appendTurnResult(b []byte, r *abi.TurnResult) ([]byte, bool) {
	b = append(b, `{"turn_ref":`...)
	b = appendTurnRef(b, &r.TurnRef)
	b = append(b, `,"messages":`...)
	b = appendMessages(b, r.Messages)
	b = append(b, `,"state":`...)
	b = appendBytes(b, r.State)
	b = append(b, `,"outcome":`...)
	b = appendString(b, string(r.Outcome))
	if r.Error != "" {
		b = append(b, `,"error":`...)
		b = appendString(b, r.Error)
	}
	if len(r.Alarms) > 0 {
		b = append(b, `,"alarms":[`...)
		for i := range r.Alarms {
			if i > 0 {
				b = append(b, ',')
			}
			var ok bool
			if b, ok = appendAlarmOp(b, &r.Alarms[i]); !ok {
				return b, false
			}
		}
		b = append(b, ']')
	}
	if r.Wait != nil {
		w := r.Wait
		b = append(b, `,"wait":{`...)
		obj := objectWriter{b: b}
		if w.ID != "" {
			obj.key("id")
			obj.b = appendString(obj.b, w.ID)
		}
		if w.For != "" {
			obj.key("for")
			obj.b = appendString(obj.b, w.For)
		}
		if len(w.Data) > 0 && !obj.raw("data", w.Data) {
			return obj.b, false
		}
		if w.TimeoutMs != 0 {
			obj.key("timeout_ms")
			obj.b = strconv.AppendInt(obj.b, w.TimeoutMs, 10)
		}
		b = append(obj.b, '}')
	}
	return append(b, '}'), true
}

// appendMessages writes a []Message as encoding/json does: null when nil.
func appendMessages(b []byte, msgs []abi.Message) []byte {
	if msgs == nil {
		return append(b, "null"...)
	}
	b = append(b, '[')
	for i, m := range msgs {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"role":`...)
		b = appendString(b, m.Role)
		b = append(b, `,"content":`...)
		b = appendString(b, m.Content)
		b = append(b, '}')
	}
	return append(b, ']')
}

// objectWriter writes the members of an object whose fields may all be
// omitted, with commas between them.
type objectWriter struct {
	b    []byte
	more bool
}

func (o *objectWriter) key(k string) {
	if o.more {
		o.b = append(o.b, ',')
	}
	o.more = true
	o.b = append(o.b, '"')
	o.b = append(o.b, k...)
	o.b = append(o.b, `":`...)
}

// raw writes a json.RawMessage member compacted (json.Compact: no HTML
// escaping), as encoding/json does with a Marshaler's output; false if it
// is not valid JSON.
func (o *objectWriter) raw(k string, v json.RawMessage) bool {
	o.key(k)
	return o.compact(v)
}

func (o *objectWriter) compact(v []byte) bool {
	buf := bytes.NewBuffer(o.b)
	if err := json.Compact(buf, v); err != nil {
		return false
	}
	o.b = buf.Bytes()
	return true
}

func appendAlarmOp(b []byte, a *abi.AlarmOp) ([]byte, bool) {
	b = append(b, `{"name":`...)
	b = appendString(b, a.Name)
	obj := objectWriter{b: b, more: true}
	if a.InMs != 0 {
		obj.key("in_ms")
		obj.b = strconv.AppendInt(obj.b, a.InMs, 10)
	}
	if a.At != nil {
		t, err := a.At.MarshalJSON()
		if err != nil {
			return obj.b, false
		}
		obj.key("at")
		obj.b = append(obj.b, t...)
	}
	if a.EveryMs != 0 {
		obj.key("every_ms")
		obj.b = strconv.AppendInt(obj.b, a.EveryMs, 10)
	}
	if a.Clear {
		obj.key("clear")
		obj.b = append(obj.b, "true"...)
	}
	if len(a.Data) > 0 && !obj.raw("data", a.Data) {
		return obj.b, false
	}
	return append(obj.b, '}'), true
}

func appendTurnRef(b []byte, r *abi.TurnRef) []byte {
	b = append(b, `{"delivery_id":`...)
	b = appendString(b, r.DeliveryID)
	b = append(b, `,"activation_uid":`...)
	b = appendString(b, r.ActivationUID)
	b = append(b, `,"actor_epoch":`...)
	b = strconv.AppendInt(b, r.ActorEpoch, 10)
	b = append(b, `,"actor_event_id":`...)
	b = strconv.AppendInt(b, r.ActorEventID, 10)
	b = append(b, `,"revision":`...)
	b = strconv.AppendInt(b, r.Revision, 10)
	b = append(b, `,"agent_uid":`...)
	b = appendString(b, r.AgentUID)
	b = append(b, `,"session_id":`...)
	b = appendString(b, r.SessionID)
	return append(b, '}')
}

// appendBytes writes a []byte as encoding/json does: null when nil, else
// standard base64 in a string.
func appendBytes(b, v []byte) []byte {
	if v == nil {
		return append(b, "null"...)
	}
	b = append(b, '"')
	b = base64.StdEncoding.AppendEncode(b, v)
	return append(b, '"')
}

const hexDigits = "0123456789abcdef"

// appendString quotes s as encoding/json does without HTML escaping: \" \\
// \b \f \n \r \t, other control characters as \u00XX, invalid UTF-8 bytes
// as \ufffd, U+2028 and U+2029 escaped.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= ' ' && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '\\', '"':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i++
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
