package worker

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/fabric/wire"
)

func callResultMsg(t *testing.T, m wire.CallResult) []byte {
	t.Helper()
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// CALL_RESULT chunks reassemble in order; a chunk out of order fails the
// call; a whole result marked last ends a chunked one (the host's
// cancelled answer when the turn ends mid-chunks).
func TestCallResultReassembly(t *testing.T) {
	whole, err := abi.Marshal(&abi.CallResult{Seq: 3, HTTP: &abi.HTTPResponse{Status: 200, Body: []byte(strings.Repeat("z", 1000))}})
	if err != nil {
		t.Fatal(err)
	}
	chunks := func(size int) [][]byte {
		var out [][]byte
		for off := 0; off < len(whole); off += size {
			end := min(len(whole), off+size)
			out = append(out, callResultMsg(t, wire.CallResult{CallID: 1, Offset: int64(off), TotalBytes: int64(len(whole)),
				Data: whole[off:end], Last: end == len(whole)}))
		}
		return out
	}

	var buf []byte
	parts := chunks(300)
	for i, p := range parts {
		res, done, err := addPart(&buf, p)
		if err != nil {
			t.Fatalf("chunk %d: %v", i, err)
		}
		if done != (i == len(parts)-1) {
			t.Fatalf("chunk %d: done %v", i, done)
		}
		if done && (res.Seq != 3 || res.HTTP == nil || len(res.HTTP.Body) != 1000) {
			t.Fatalf("reassembled %+v", res)
		}
	}

	buf = nil
	if _, _, err := addPart(&buf, parts[1]); err == nil {
		t.Fatal("a chunk at offset 300 first was accepted")
	}

	buf = nil
	if _, done, err := addPart(&buf, parts[0]); err != nil || done {
		t.Fatalf("first chunk: done %v, %v", done, err)
	}
	cancelled, _ := abi.Marshal(&abi.CallResult{Error: &abi.CallError{Code: abi.CallCancelled, Message: "turn ended"}})
	res, done, err := addPart(&buf, callResultMsg(t, wire.CallResult{CallID: 1, Result: cancelled, Last: true}))
	if err != nil || !done || res.Error == nil || res.Error.Code != abi.CallCancelled {
		t.Fatalf("whole after a chunk: %+v %v %v", res, done, err)
	}
}
