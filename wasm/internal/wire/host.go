package wire

import (
	"encoding/json"
	"strconv"

	"github.com/paddock-dev/paddock/abi"
)

// The host's direction: the host encodes the TurnRequest it hands a guest
// and decodes the TurnResult the guest gives back. Natively encoding/json
// is not slow, but it was still ~17 µs of the host's CPU per turn in
// `paddock bench` (--cpuprofile: json.Unmarshal of the result and the
// json.Encoder of the request), about a twentieth of the host's share.

// AppendTurnRequest appends req encoded exactly as abi.Marshal(req)
// encodes it (encoding/json without HTML escaping, no trailing newline) to
// dst. A request with an alarm or a wait event (rare) goes through
// abi.Marshal. If a raw JSON field (session input is bytes; event or steer
// data) is not valid JSON or a time cannot be encoded, it returns
// abi.Marshal's error.
func AppendTurnRequest(dst []byte, req *abi.TurnRequest) ([]byte, error) {
	out, ok := appendTurnRequest(dst, req)
	if ok {
		return out, nil
	}
	b, err := abi.Marshal(req)
	if err != nil {
		return dst, err
	}
	return append(dst, b...), nil
}

// appendTurnRequest is the encoder's fast path; false when the request has
// an alarm or a wait event, or when a Marshaler (json.RawMessage,
// time.Time) fails, leaving the rest to abi.Marshal.
func appendTurnRequest(b []byte, r *abi.TurnRequest) ([]byte, bool) {
	e := &r.Event
	if e.Alarm != nil || e.Wait != nil {
		return b, false
	}
	b = append(b, `{"abi_version":`...)
	b = strconv.AppendInt(b, int64(r.ABIVersion), 10)
	b = append(b, `,"turn_ref":`...)
	b = appendTurnRef(b, &r.TurnRef)
	s := &r.Session
	b = append(b, `,"session":{"agent_name":`...)
	b = appendString(b, s.AgentName)
	b = append(b, `,"session_id":`...)
	b = appendString(b, s.SessionID)
	if s.Key != "" {
		b = append(b, `,"key":`...)
		b = appendString(b, s.Key)
	}
	if len(s.Input) > 0 {
		b = append(b, `,"input":`...)
		b = appendBytes(b, s.Input)
	}
	b = append(b, `},"event":{"id":`...)
	b = strconv.AppendInt(b, e.ID, 10)
	obj := objectWriter{b: b, more: true}
	obj.key("kind")
	obj.b = appendString(obj.b, e.Kind)
	if e.Message != "" {
		obj.key("message")
		obj.b = appendString(obj.b, e.Message)
	}
	if len(e.Data) > 0 && !obj.raw("data", e.Data) {
		return obj.b, false
	}
	t, err := e.AcceptedAt.MarshalJSON()
	if err != nil {
		return obj.b, false
	}
	obj.key("accepted_at")
	b = append(append(obj.b, t...), '}')
	b = append(b, `,"state":`...)
	b = appendBytes(b, r.State)
	b = append(b, `,"transcript":`...)
	b = appendMessages(b, r.Transcript)
	b = append(b, `,"attempt":`...)
	b = strconv.AppendInt(b, int64(r.Attempt), 10)
	if len(r.Steers) > 0 {
		b = append(b, `,"steers":[`...)
		for i := range r.Steers {
			if i > 0 {
				b = append(b, ',')
			}
			st := &r.Steers[i]
			b = append(b, `{"turn_ref":`...)
			b = appendTurnRef(b, &st.TurnRef)
			b = append(b, `,"event_id":`...)
			b = strconv.AppendInt(b, st.EventID, 10)
			obj := objectWriter{b: b, more: true}
			if st.Message != "" {
				obj.key("message")
				obj.b = appendString(obj.b, st.Message)
			}
			if len(st.Data) > 0 && !obj.raw("data", st.Data) {
				return obj.b, false
			}
			b = append(obj.b, '}')
		}
		b = append(b, ']')
	}
	return append(b, '}'), true
}

// DecodeTurnResult decodes data into *res, which must be the zero
// TurnResult, with the result and error json.Unmarshal(data, res) would
// give. Every string and byte slice of *res is a copy: data may be a view
// of guest memory, which the guest reuses after the turn. On the fast path
// they share one buffer of about data's size, which any one of them kept
// keeps alive (the host keeps none past the commit). The fast path
// takes results without alarms or a wait (non-null); others, and anything
// the fast path does not reproduce exactly (see DecodeTurnRequest), go to
// encoding/json.
func DecodeTurnResult(data []byte, res *abi.TurnResult) error {
	d := decoder{data: data, arena: make([]byte, 0, len(data))}
	if d.turnResult(res) && d.end() {
		return nil
	}
	*res = abi.TurnResult{}
	return json.Unmarshal(data, res)
}

// turnResult decodes the top-level result object.
func (d *decoder) turnResult(r *abi.TurnResult) bool {
	if !d.ws() || d.peek() != '{' {
		return false // null and type errors: encoding/json's business
	}
	return d.object(func(k []byte) (int, bool) {
		switch string(k) {
		case "turn_ref":
			return 0, d.null() || d.turnRef(&r.TurnRef)
		case "messages":
			return 1, d.messages(&r.Messages)
		case "state":
			return 2, d.setBytes(&r.State)
		case "outcome":
			return 3, d.setString((*string)(&r.Outcome))
		case "error":
			return 4, d.setString(&r.Error)
		case "alarms":
			return 5, d.null() // an alarm operation: encoding/json's
		case "wait":
			return 6, d.null()
		}
		return d.unknown(k, "turn_ref", "messages", "state", "outcome", "error", "alarms", "wait")
	})
}
