package abi

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// Marshal keeps '<', '>' and '&' as one byte each (json.Marshal makes
// them six), and decodes back to the same value.
func TestMarshalDoesNotGrowHTMLCharacters(t *testing.T) {
	msg := strings.Repeat("<a&b>", 1000)
	req := &TurnRequest{Event: Event{Kind: EventMessage, Message: msg}}
	b, err := Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	std, _ := json.Marshal(req)
	if len(b) >= len(std) || len(b) > len(msg)+512 {
		t.Fatalf("Marshal gave %d bytes for a %d-byte message (json.Marshal: %d)", len(b), len(msg), len(std))
	}
	if bytes.HasSuffix(b, []byte("\n")) {
		t.Fatal("Marshal left the encoder's trailing newline")
	}
	var back TurnRequest
	if err := json.Unmarshal(b, &back); err != nil || back.Event.Message != msg {
		t.Fatalf("round trip: %v, message equal: %t", err, back.Event.Message == msg)
	}
}

// TestEmptyStateIsNotNull pins the abi/README contract the store keeps
// (store.StateFromColumn): a result's `state: ""` decodes to a non-nil
// empty slice (the host commits it as an empty state, not "keep"), and a
// request's empty state encodes as `""`, a nil one as `null`.
func TestEmptyStateIsNotNull(t *testing.T) {
	var res TurnResult
	if err := json.Unmarshal([]byte(`{"state":""}`), &res); err != nil {
		t.Fatal(err)
	}
	if res.State == nil || len(res.State) != 0 {
		t.Fatalf(`result state "" decoded to %#v, want []byte{}`, res.State)
	}
	for _, c := range []struct {
		state []byte
		want  string
	}{{[]byte{}, `"state":""`}, {nil, `"state":null`}} {
		b, err := Marshal(TurnRequest{State: c.state})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), c.want) {
			t.Fatalf("request with state %#v encodes as %s, want %s", c.state, b, c.want)
		}
	}
}
