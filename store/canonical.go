package store

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// SameSignal reports whether an event returned for a reused idempotency
// key (AppendEvent or Steer with created false) carries the signal a
// caller sent again: the same kind and the same payload by meaning
// (CanonicalJSON), so {"a":1,"b":2} and {"b":2,"a":1} are the same signal,
// and so is a payload PostgreSQL's jsonb gave back reformatted. A payload
// that is not JSON compares as bytes.
func SameSignal(e Event, kind string, payload []byte) bool {
	return e.Kind == kind && SamePayload(e.Payload, payload)
}

// SamePayload reports whether two JSON payloads mean the same:
// CanonicalJSON of both is equal. When either is not valid JSON the bytes
// are compared.
func SamePayload(a, b []byte) bool {
	ca, errA := CanonicalJSON(a)
	cb, errB := CanonicalJSON(b)
	if errA != nil || errB != nil {
		return bytes.Equal(a, b)
	}
	return bytes.Equal(ca, cb)
}

// CanonicalJSON re-encodes one JSON value in a canonical form, so that two
// encodings of the same value give the same bytes: no insignificant
// whitespace; object keys sorted by their UTF-8 bytes (a duplicated key
// keeps its last value); strings re-escaped the way encoding/json does
// (without HTML escaping); numbers by value in shortest exact decimal form
// ("1.0", "1e0" and "10e-1" are all "1"; "-0" is "0"; no float rounding).
// Input that is not exactly one JSON value is an error wrapping
// ErrInvalid.
func CanonicalJSON(raw []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("canonical JSON: %w: %w", ErrInvalid, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("canonical JSON: %w: trailing data after the value", ErrInvalid)
	}
	var buf bytes.Buffer
	if err := writeCanonical(&buf, v); err != nil {
		return nil, fmt.Errorf("canonical JSON: %w", err)
	}
	return buf.Bytes(), nil
}

// writeCanonical appends v (as decoded with UseNumber) to buf.
func writeCanonical(buf *bytes.Buffer, v any) error {
	switch v := v.(type) {
	case nil:
		buf.WriteString("null")
	case bool:
		buf.WriteString(strconv.FormatBool(v))
	case json.Number:
		n, err := canonicalNumber(string(v))
		if err != nil {
			return err
		}
		buf.WriteString(n)
	case string:
		writeString(buf, v)
	case []any:
		buf.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				buf.WriteByte(',')
			}
			if err := writeCanonical(buf, e); err != nil {
				return err
			}
		}
		buf.WriteByte(']')
	case map[string]any:
		buf.WriteByte('{')
		for i, k := range slices.Sorted(maps.Keys(v)) {
			if i > 0 {
				buf.WriteByte(',')
			}
			writeString(buf, k)
			buf.WriteByte(':')
			if err := writeCanonical(buf, v[k]); err != nil {
				return err
			}
		}
		buf.WriteByte('}')
	default:
		return fmt.Errorf("unexpected %T: %w", v, ErrInvalid)
	}
	return nil
}

// writeString appends s as a JSON string, escaped as encoding/json does
// without HTML escaping.
func writeString(buf *bytes.Buffer, s string) {
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)           // a string always encodes
	buf.Truncate(buf.Len() - 1) // Encode's newline
}

// canonicalNumber rewrites a JSON number literal by value: the shortest
// exact decimal, plain when its exponent is within ±21 digits, else
// <digits>e<exp> (e.g. "1.50" → "1.5", "1e3" → "1000", "1e30" → "1e30",
// "-0.0" → "0").
func canonicalNumber(lit string) (string, error) {
	s := lit
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	exp := 0
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		e, err := strconv.Atoi(strings.TrimPrefix(s[i+1:], "+"))
		if err != nil {
			return "", fmt.Errorf("number %q: %w", lit, ErrInvalid)
		}
		exp, s = e, s[:i]
	}
	digits := s
	if i := strings.IndexByte(s, '.'); i >= 0 {
		digits = s[:i] + s[i+1:]
		exp -= len(s) - i - 1
	}
	digits = strings.TrimLeft(digits, "0")
	if digits == "" {
		return "0", nil
	}
	for strings.HasSuffix(digits, "0") {
		digits, exp = digits[:len(digits)-1], exp+1
	}
	var out string
	switch {
	case exp >= 0 && exp <= 21:
		out = digits + strings.Repeat("0", exp)
	case exp < 0 && -exp <= 21:
		if n := len(digits) + exp; n > 0 {
			out = digits[:n] + "." + digits[n:]
		} else {
			out = "0." + strings.Repeat("0", -n) + digits
		}
	default:
		out = digits + "e" + strconv.Itoa(exp)
	}
	if neg {
		out = "-" + out
	}
	return out, nil
}
