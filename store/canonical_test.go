package store

import (
	"errors"
	"testing"
)

func TestCanonicalJSON(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`{"b":2,"a":1}`, `{"a":1,"b":2}`},
		{` { "data" : { "b" : [1, 2.50, {"y":null,"x":true}], "a" : "x<y&z" } } `, `{"data":{"a":"x<y&z","b":[1,2.5,{"x":true,"y":null}]}}`},
		{`{"a":1,"a":2}`, `{"a":2}`},
		{`"\u00e9\n"`, `"é\n"`},
		{`1.0`, `1`}, {`1e0`, `1`}, {`10e-1`, `1`}, {`-0.0`, `0`}, {`0`, `0`}, {`1E+3`, `1000`},
		{`0.0015`, `0.0015`}, {`-12.340`, `-12.34`}, {`1e30`, `1e30`}, {`1.5e-30`, `15e-31`},
		{`123456789012345678901234567890`, `123456789012345678901234567890`},
	} {
		got, err := CanonicalJSON([]byte(c.in))
		if err != nil {
			t.Fatalf("CanonicalJSON(%s): %v", c.in, err)
		}
		if string(got) != c.want {
			t.Errorf("CanonicalJSON(%s) = %s, want %s", c.in, got, c.want)
		}
	}
	for _, in := range []string{``, `{`, `{"a":1} x`, `{"a":1}}`, `1 2`} {
		if _, err := CanonicalJSON([]byte(in)); !errors.Is(err, ErrInvalid) {
			t.Errorf("CanonicalJSON(%q) = %v, want ErrInvalid", in, err)
		}
	}
}

func TestSameSignal(t *testing.T) {
	e := Event{Kind: "message", Payload: []byte(`{"data":{"a": 1, "b": 2}}`)}
	for _, c := range []struct {
		kind, payload string
		want          bool
	}{
		{"message", `{"data":{"b":2,"a":1}}`, true},
		{"message", `{"data":{"a":1,"b":2.0}}`, true},
		{"message", `{"data":{"a":1,"b":3}}`, false},
		{"message", `{"data":{"a":1}}`, false},
		{"steer", `{"data":{"a":1,"b":2}}`, false},
	} {
		if got := SameSignal(e, c.kind, []byte(c.payload)); got != c.want {
			t.Errorf("SameSignal(%s %s) = %v, want %v", c.kind, c.payload, got, c.want)
		}
	}
	if SamePayload([]byte("not json"), []byte("not json ")) || !SamePayload([]byte("x"), []byte("x")) {
		t.Error("SamePayload of non-JSON does not compare bytes")
	}
}
