// Package wire is the JSON codec of the two messages of a wasm turn,
// without reflection, producing exactly what encoding/json (and
// abi.Marshal) produce for the same input. The guest SDK (wasm/guest)
// decodes an abi.TurnRequest and encodes an abi.TurnResult with it; the
// host (package wasm) encodes the request and decodes the result (host.go).
//
// Why: inside a wasm guest run by wazero, encoding/json's reflection is
// slow. Measured on 12-04 (wazero 1.12, Go 1.26, 2 cores; a host loop
// timing the guest's exports on a warm instance), json.Unmarshal of the
// hasher bench agent's request takes ~78 µs (586 bytes, no transcript) to
// ~307 µs (2,493 bytes, 20 transcript messages); this codec decodes the
// same requests in ~10 / ~55 µs (natively, ~0.9 µs for the first). When
// it was written, on a busier machine, the figures were ~300 / ~1,450 µs
// against ~50 / ~260 µs, and github.com/go-json-experiment/json only
// halved encoding/json's. What is left is the per-byte and per-call cost
// of Go's wasm code, and allocation (0.13–0.24 µs per small object,
// ~0.55 µs for 600 bytes), which the decoder keeps to a handful per
// request.
//
// Equivalence: DecodeTurnRequest takes a fast path only over input whose
// meaning it reproduces exactly — well-formed JSON, each object key once,
// keys that match a field exactly (or no field even case-insensitively),
// integers that fit, valid base64 and timestamps. On anything else (a
// syntax error, a type mismatch, a duplicate key, a key that matches a
// field only by case folding, …) it decodes again with encoding/json from
// a zero request, so results and error messages stay those of
// encoding/json. AppendTurnResult likewise leaves the errors of invalid
// raw JSON to abi.Marshal. The equivalence tests and fuzz targets in this
// package compare both with encoding/json on random and tricky inputs.
//
// The package imports only the standard library and abi, like the SDK,
// which is built into every Go guest module.
package wire

import (
	"encoding/base64"
	"encoding/json"
	"time"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"

	"github.com/paddock-dev/paddock/abi"
)

// maxDepth is the nesting depth the fast path accepts in skipped or raw
// values; deeper input goes to encoding/json (which allows 10,000).
const maxDepth = 1000

// DecodeTurnRequest decodes data into *req, which must be the zero
// TurnRequest, with the result and error json.Unmarshal(data, req) would
// give.
func DecodeTurnRequest(data []byte, req *abi.TurnRequest) error {
	d := decoder{data: data, arena: make([]byte, 0, len(data))}
	if d.turnRequest(req) && d.end() {
		return nil
	}
	*req = abi.TurnRequest{}
	return json.Unmarshal(data, req)
}

// DecodeSteer decodes a steer the way json.Unmarshal(data, s) does; s must
// be the zero Steer.
func DecodeSteer(data []byte, s *abi.Steer) error {
	d := decoder{data: data, arena: make([]byte, 0, len(data))}
	if d.ws() && d.peek() == '{' && d.steer(s) && d.end() {
		return nil
	}
	*s = abi.Steer{}
	return json.Unmarshal(data, s)
}

// decoder is the fast path's cursor over the input. Its methods return
// false when the input leaves the fast path; the caller then falls back
// to encoding/json.
//
// Every string, raw value and byte slice it decodes lives in arena, one
// allocation of the input's size, instead of one allocation each: in a
// wasm guest an allocation costs 0.13–0.24 µs (measured when this was
// written: ~1.4 µs, and 600 small strings took ~830 µs, which dominated
// a request's decoding). The price is that a string an
// agent keeps past its turn keeps the whole arena (at most the request's
// size) alive. Bytes are only ever appended to arena, never rewritten, so
// the strings made from it stay immutable; raw values and byte slices
// handed out are capped at their length, so appending to one copies it.
type decoder struct {
	data  []byte
	i     int
	arena []byte
}

// isSpace reports JSON whitespace.
func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// ws skips whitespace; it reports whether input remains.
func (d *decoder) ws() bool {
	for d.i < len(d.data) && isSpace(d.data[d.i]) {
		d.i++
	}
	return d.i < len(d.data)
}

// peek returns the next byte (0 at the end).
func (d *decoder) peek() byte {
	if d.i < len(d.data) {
		return d.data[d.i]
	}
	return 0
}

// end reports whether only whitespace is left.
func (d *decoder) end() bool { return !d.ws() }

// literal consumes lit if it comes next.
func (d *decoder) literal(lit string) bool {
	if len(d.data)-d.i >= len(lit) && string(d.data[d.i:d.i+len(lit)]) == lit {
		d.i += len(lit)
		return true
	}
	return false
}

// null consumes a null literal if one comes next (after whitespace).
func (d *decoder) null() bool {
	d.ws()
	return d.literal("null")
}

// object walks an object, calling field for each key with the decoder at
// the value; field returns false to leave the fast path. A key seen twice
// leaves it too (encoding/json merges duplicates into the same field; the
// fast path does not reproduce that). seen tracks keys by the index field
// returns through idx; unknown keys are skipped by field itself.
func (d *decoder) object(field func(key []byte) (idx int, ok bool)) bool {
	if !d.ws() || d.data[d.i] != '{' {
		return false
	}
	d.i++
	var seen uint64
	if !d.ws() {
		return false
	}
	if d.data[d.i] == '}' {
		d.i++
		return true
	}
	for {
		if !d.ws() || d.data[d.i] != '"' {
			return false
		}
		key, ok := d.key()
		if !ok || !d.ws() || d.data[d.i] != ':' {
			return false
		}
		d.i++
		idx, ok := field(key)
		if !ok {
			return false
		}
		if idx >= 0 {
			if seen&(1<<idx) != 0 {
				return false
			}
			seen |= 1 << idx
		}
		if !d.ws() {
			return false
		}
		switch d.data[d.i] {
		case ',':
			d.i++
		case '}':
			d.i++
			return true
		default:
			return false
		}
	}
}

// key reads an object key (the decoder at its opening quote); the bytes
// may alias the input.
func (d *decoder) key() ([]byte, bool) {
	start := d.i + 1
	for j := start; j < len(d.data); j++ {
		c := d.data[j]
		if c == '"' {
			d.i = j + 1
			return d.data[start:j], true
		}
		if c == '\\' || c < ' ' || c >= utf8.RuneSelf {
			break
		}
	}
	b, _, ok := d.strBytes()
	return b, ok
}

// unknown handles a key that matches no field exactly: it skips the value
// unless the key matches one of names case-insensitively (as
// encoding/json's field matching does) or is not ASCII (Unicode case
// folding is left to encoding/json).
func (d *decoder) unknown(key []byte, names ...string) (int, bool) {
	for _, c := range key {
		if c >= utf8.RuneSelf {
			return 0, false
		}
	}
	for _, n := range names {
		if asciiEqualFold(key, n) {
			return 0, false
		}
	}
	return -1, d.skip(0)
}

// asciiEqualFold compares ASCII a and b ignoring case.
func asciiEqualFold(a []byte, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// plainRun returns the end of the run of plain ASCII string bytes in data
// from j: the index of the first quote, backslash, control or non-ASCII
// byte (or len(data)). It tests eight bytes at a time: in a wasm guest a
// byte-at-a-time loop cost ~60 ns a byte; with it, a request of 20
// messages of 450 bytes of prose decodes in ~280 µs instead of ~570 µs.
func plainRun(data []byte, j int) int {
	const lsb, msb = 0x0101010101010101, 0x8080808080808080
	for ; j+8 <= len(data); j += 8 {
		x := *(*uint64)(unsafe.Pointer(&data[j])) // unaligned loads are fine on wasm and amd64 alike
		q := x ^ (lsb * '"')
		b := x ^ (lsb * '\\')
		// A byte < 0x20, == '"', == '\\' or >= 0x80 sets its high bit here
		// (bytes after it may be flagged too; the byte loop below sorts
		// them out).
		if ((x-lsb*0x20)&^x|(q-lsb)&^q|(b-lsb)&^b|x)&msb != 0 {
			break
		}
	}
	for ; j < len(data); j++ {
		if c := data[j]; c < ' ' || c == '"' || c == '\\' || c >= utf8.RuneSelf {
			break
		}
	}
	return j
}

// str reads a JSON string (after whitespace) and unquotes it like
// encoding/json into the arena.
func (d *decoder) str() (string, bool) {
	b, inArena, ok := d.strBytes()
	if !ok || len(b) == 0 {
		return "", ok
	}
	if !inArena {
		start := len(d.arena)
		d.arena = append(d.arena, b...)
		b = d.arena[start:]
	}
	return unsafe.String(&b[0], len(b)), true
}

// strBytes reads a JSON string (after whitespace) and unquotes it like
// encoding/json: escapes decoded, a lone surrogate or invalid UTF-8 byte
// becomes U+FFFD. The bytes alias the input when the string has nothing
// to unquote (inArena false), else they were appended to the arena.
func (d *decoder) strBytes() (b []byte, inArena, ok bool) {
	if !d.ws() || d.data[d.i] != '"' {
		return nil, false, false
	}
	start := d.i + 1
	j := start
	for j < len(d.data) {
		j = plainRun(d.data, j)
		if j == len(d.data) {
			break
		}
		c := d.data[j]
		if c == '"' {
			d.i = j + 1
			return d.data[start:j], false, true
		}
		if c == '\\' || c < ' ' {
			break
		}
		if c < utf8.RuneSelf {
			j++
			continue
		}
		r, size := utf8.DecodeRune(d.data[j:])
		if r == utf8.RuneError && size == 1 {
			break
		}
		j += size
	}
	at := len(d.arena)
	u := append(d.arena, d.data[start:j]...)
	for j < len(d.data) {
		c := d.data[j]
		switch {
		case c == '"':
			d.i = j + 1
			d.arena = u
			return u[at:len(u):len(u)], true, true
		case c < ' ':
			return nil, false, false
		case c == '\\':
			if j+1 >= len(d.data) {
				return nil, false, false
			}
			j++
			switch e := d.data[j]; e {
			case '"', '\\', '/':
				u = append(u, e)
			case 'b':
				u = append(u, '\b')
			case 'f':
				u = append(u, '\f')
			case 'n':
				u = append(u, '\n')
			case 'r':
				u = append(u, '\r')
			case 't':
				u = append(u, '\t')
			case 'u':
				r := hex4(d.data[j+1:])
				if r < 0 {
					return nil, false, false
				}
				j += 4
				if utf16.IsSurrogate(r) {
					if len(d.data)-j > 6 && d.data[j+1] == '\\' && d.data[j+2] == 'u' {
						if r2 := hex4(d.data[j+3:]); r2 >= 0 {
							if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
								u = utf8.AppendRune(u, dec)
								j += 7
								continue
							}
						}
					}
					r = utf8.RuneError
				}
				u = utf8.AppendRune(u, r)
			default:
				return nil, false, false
			}
			j++
		case c < utf8.RuneSelf:
			// Copy the run of plain ASCII up to the next quote, escape,
			// control or multi-byte character at once: appending byte by
			// byte costs much more in a wasm guest.
			k := plainRun(d.data, j+1)
			u = append(u, d.data[j:k]...)
			j = k
		default:
			r, size := utf8.DecodeRune(d.data[j:])
			if r == utf8.RuneError && size == 1 {
				u = append(u, "\uFFFD"...)
			} else {
				u = append(u, d.data[j:j+size]...)
			}
			j += size
		}
	}
	return nil, false, false
}

// hex4 decodes four hex digits, -1 if there are not four.
func hex4(b []byte) rune {
	if len(b) < 4 {
		return -1
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			c = c - 'A' + 10
		default:
			return -1
		}
		r = r<<4 | rune(c)
	}
	return r
}

// setString decodes a string field: a string sets it, null leaves it.
func (d *decoder) setString(p *string) bool {
	if d.null() {
		return true
	}
	s, ok := d.str()
	*p = s
	return ok
}

// setInt64 decodes an integer field: a JSON integer that fits sets it,
// null leaves it; a fraction or exponent (a type error in encoding/json)
// leaves the fast path.
func (d *decoder) setInt64(p *int64) bool {
	if d.null() {
		return true
	}
	neg := d.peek() == '-'
	if neg {
		d.i++
	}
	digits := d.i
	var n uint64
	for d.i < len(d.data) && '0' <= d.data[d.i] && d.data[d.i] <= '9' {
		if n > (1<<63)/10 {
			return false
		}
		n = n*10 + uint64(d.data[d.i]-'0')
		d.i++
	}
	switch {
	case d.i == digits, d.data[digits] == '0' && d.i-digits > 1:
		return false // no digits, or a leading zero: not JSON
	case d.i < len(d.data) && (d.data[d.i] == '.' || d.data[d.i] == 'e' || d.data[d.i] == 'E'):
		return false
	case neg && n > 1<<63, !neg && n > 1<<63-1:
		return false
	}
	if neg {
		*p = -int64(n)
	} else {
		*p = int64(n)
	}
	return true
}

// setInt decodes an int field like setInt64 (int is 64 bits on wasm).
func (d *decoder) setInt(p *int) bool {
	if d.null() {
		return true
	}
	var n int64
	if !d.setInt64(&n) || int64(int(n)) != n {
		return false
	}
	*p = int(n)
	return true
}

// setBytes decodes a []byte field: base64 (standard encoding) like
// encoding/json, null leaves it nil.
func (d *decoder) setBytes(p *[]byte) bool {
	if d.null() {
		*p = nil
		return true
	}
	// What an encoder writes is plain ASCII; escapes, control and
	// non-ASCII bytes (never valid base64) are encoding/json's business,
	// unquoted (up to 3x the input for invalid UTF-8) for nothing here.
	if !d.ws() || d.data[d.i] != '"' {
		return false
	}
	j := plainRun(d.data, d.i+1)
	if j == len(d.data) || d.data[j] != '"' {
		return false
	}
	s := d.data[d.i+1 : j]
	d.i = j + 1
	start := len(d.arena)
	out, err := base64.StdEncoding.AppendDecode(d.arena, s)
	if err != nil {
		return false
	}
	d.arena = out
	*p = out[start:len(out):len(out)]
	return true
}

// setRaw decodes a json.RawMessage field: a copy of the value's bytes
// (null included, as RawMessage.UnmarshalJSON gets it).
func (d *decoder) setRaw(p *json.RawMessage) bool {
	if !d.ws() {
		return false
	}
	start := d.i
	if !d.skip(0) {
		return false
	}
	at := len(d.arena)
	d.arena = append(d.arena, d.data[start:d.i]...)
	*p = json.RawMessage(d.arena[at:len(d.arena):len(d.arena)])
	return true
}

// setTime decodes a time.Time field with its UnmarshalJSON, which
// encoding/json calls with the raw value (null leaves the time).
func (d *decoder) setTime(p *time.Time) bool {
	if !d.ws() {
		return false
	}
	start := d.i
	if !d.skip(0) {
		return false
	}
	return p.UnmarshalJSON(d.data[start:d.i]) == nil
}

// skip consumes one JSON value, checking its syntax as encoding/json's
// scanner does.
func (d *decoder) skip(depth int) bool {
	if !d.ws() || depth > maxDepth {
		return false
	}
	switch c := d.data[d.i]; c {
	case '{':
		d.i++
		if !d.ws() {
			return false
		}
		if d.data[d.i] == '}' {
			d.i++
			return true
		}
		for {
			if !d.ws() || d.data[d.i] != '"' || !d.skipString() || !d.ws() || d.data[d.i] != ':' {
				return false
			}
			d.i++
			if !d.skip(depth+1) || !d.ws() {
				return false
			}
			switch d.data[d.i] {
			case ',':
				d.i++
			case '}':
				d.i++
				return true
			default:
				return false
			}
		}
	case '[':
		d.i++
		if !d.ws() {
			return false
		}
		if d.data[d.i] == ']' {
			d.i++
			return true
		}
		for {
			if !d.skip(depth+1) || !d.ws() {
				return false
			}
			switch d.data[d.i] {
			case ',':
				d.i++
			case ']':
				d.i++
				return true
			default:
				return false
			}
		}
	case '"':
		return d.skipString()
	case 't':
		return d.literal("true")
	case 'f':
		return d.literal("false")
	case 'n':
		return d.literal("null")
	default:
		return d.skipNumber()
	}
}

// skipString consumes a string (the decoder at its quote), checking
// escapes and control characters; like encoding/json's scanner it lets
// invalid UTF-8 through.
func (d *decoder) skipString() bool {
	for j := d.i + 1; j < len(d.data); j++ {
		if j = plainRun(d.data, j); j == len(d.data) {
			break
		}
		switch c := d.data[j]; {
		case c == '"':
			d.i = j + 1
			return true
		case c < ' ':
			return false
		case c == '\\':
			j++
			if j >= len(d.data) {
				return false
			}
			switch d.data[j] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if hex4(d.data[j+1:]) < 0 {
					return false
				}
				j += 4
			default:
				return false
			}
		}
	}
	return false
}

// skipNumber consumes a number of JSON's grammar.
func (d *decoder) skipNumber() bool {
	digits := func() int {
		n := 0
		for d.i < len(d.data) && '0' <= d.data[d.i] && d.data[d.i] <= '9' {
			d.i++
			n++
		}
		return n
	}
	if d.peek() == '-' {
		d.i++
	}
	switch c := d.peek(); {
	case c == '0':
		d.i++
	case '1' <= c && c <= '9':
		digits()
	default:
		return false
	}
	if d.peek() == '.' {
		d.i++
		if digits() == 0 {
			return false
		}
	}
	if c := d.peek(); c == 'e' || c == 'E' {
		d.i++
		if c := d.peek(); c == '+' || c == '-' {
			d.i++
		}
		if digits() == 0 {
			return false
		}
	}
	return true
}

// turnRequest decodes the top-level request object.
func (d *decoder) turnRequest(r *abi.TurnRequest) bool {
	if !d.ws() {
		return false
	}
	if d.peek() != '{' {
		return false // null and type errors: encoding/json's business
	}
	return d.object(func(k []byte) (int, bool) {
		switch string(k) {
		case "abi_version":
			return 0, d.setInt(&r.ABIVersion)
		case "turn_ref":
			return 1, d.null() || d.turnRef(&r.TurnRef)
		case "session":
			return 2, d.null() || d.session(&r.Session)
		case "event":
			return 3, d.null() || d.event(&r.Event)
		case "state":
			return 4, d.setBytes(&r.State)
		case "transcript":
			return 5, d.messages(&r.Transcript)
		case "attempt":
			return 6, d.setInt(&r.Attempt)
		case "steers":
			return 7, d.steers(&r.Steers)
		}
		return d.unknown(k, "abi_version", "turn_ref", "session", "event", "state", "transcript", "attempt", "steers")
	})
}

func (d *decoder) turnRef(r *abi.TurnRef) bool {
	return d.object(func(k []byte) (int, bool) {
		switch string(k) {
		case "delivery_id":
			return 0, d.setString(&r.DeliveryID)
		case "activation_uid":
			return 1, d.setString(&r.ActivationUID)
		case "actor_epoch":
			return 2, d.setInt64(&r.ActorEpoch)
		case "actor_event_id":
			return 3, d.setInt64(&r.ActorEventID)
		case "revision":
			return 4, d.setInt64(&r.Revision)
		case "agent_uid":
			return 5, d.setString(&r.AgentUID)
		case "session_id":
			return 6, d.setString(&r.SessionID)
		}
		return d.unknown(k, "delivery_id", "activation_uid", "actor_epoch", "actor_event_id", "revision", "agent_uid", "session_id")
	})
}

func (d *decoder) session(s *abi.Session) bool {
	return d.object(func(k []byte) (int, bool) {
		switch string(k) {
		case "agent_name":
			return 0, d.setString(&s.AgentName)
		case "session_id":
			return 1, d.setString(&s.SessionID)
		case "key":
			return 2, d.setString(&s.Key)
		case "input":
			return 3, d.setBytes(&s.Input)
		}
		return d.unknown(k, "agent_name", "session_id", "key", "input")
	})
}

func (d *decoder) event(e *abi.Event) bool {
	return d.object(func(k []byte) (int, bool) {
		switch string(k) {
		case "id":
			return 0, d.setInt64(&e.ID)
		case "kind":
			return 1, d.setString(&e.Kind)
		case "message":
			return 2, d.setString(&e.Message)
		case "data":
			return 3, d.setRaw(&e.Data)
		case "accepted_at":
			return 4, d.setTime(&e.AcceptedAt)
		case "alarm":
			if d.null() {
				e.Alarm = nil
				return 5, true
			}
			e.Alarm = new(abi.AlarmFired)
			return 5, d.alarmFired(e.Alarm)
		case "wait":
			if d.null() {
				e.Wait = nil
				return 6, true
			}
			e.Wait = new(abi.WaitEvent)
			return 6, d.waitEvent(e.Wait)
		}
		return d.unknown(k, "id", "kind", "message", "data", "accepted_at", "alarm", "wait")
	})
}

func (d *decoder) alarmFired(a *abi.AlarmFired) bool {
	return d.object(func(k []byte) (int, bool) {
		switch string(k) {
		case "name":
			return 0, d.setString(&a.Name)
		case "due_at":
			return 1, d.setTime(&a.DueAt)
		case "data":
			return 2, d.setRaw(&a.Data)
		}
		return d.unknown(k, "name", "due_at", "data")
	})
}

func (d *decoder) waitEvent(w *abi.WaitEvent) bool {
	return d.object(func(k []byte) (int, bool) {
		switch string(k) {
		case "id":
			return 0, d.setString(&w.ID)
		case "for":
			return 1, d.setString(&w.For)
		case "data":
			return 2, d.setRaw(&w.Data)
		}
		return d.unknown(k, "id", "for", "data")
	})
}

func (d *decoder) message(m *abi.Message) bool {
	return d.object(func(k []byte) (int, bool) {
		switch string(k) {
		case "role":
			return 0, d.setString(&m.Role)
		case "content":
			return 1, d.setString(&m.Content)
		}
		return d.unknown(k, "role", "content")
	})
}

func (d *decoder) steer(s *abi.Steer) bool {
	return d.object(func(k []byte) (int, bool) {
		switch string(k) {
		case "turn_ref":
			return 0, d.null() || d.turnRef(&s.TurnRef)
		case "event_id":
			return 1, d.setInt64(&s.EventID)
		case "message":
			return 2, d.setString(&s.Message)
		case "data":
			return 3, d.setRaw(&s.Data)
		}
		return d.unknown(k, "turn_ref", "event_id", "message", "data")
	})
}

// messages decodes a []Message: null is nil, [] is empty (not nil), a
// null element is a zero Message, as in encoding/json.
func (d *decoder) messages(p *[]abi.Message) bool {
	return array(d, p, func(m *abi.Message) bool { return d.null() || d.message(m) })
}

// steers decodes a []Steer like messages.
func (d *decoder) steers(p *[]abi.Steer) bool {
	return array(d, p, func(s *abi.Steer) bool { return d.null() || d.steer(s) })
}

// array decodes a JSON array into *p with elem per element.
func array[T any](d *decoder, p *[]T, elem func(*T) bool) bool {
	if d.null() {
		*p = nil
		return true
	}
	if !d.ws() || d.data[d.i] != '[' {
		return false
	}
	d.i++
	s := []T{}
	if !d.ws() {
		return false
	}
	if d.data[d.i] == ']' {
		d.i++
		*p = s
		return true
	}
	for {
		s = append(s, *new(T))
		if !elem(&s[len(s)-1]) || !d.ws() {
			return false
		}
		switch d.data[d.i] {
		case ',':
			d.i++
		case ']':
			d.i++
			*p = s
			return true
		default:
			return false
		}
	}
}
