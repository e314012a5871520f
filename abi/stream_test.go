package abi_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/paddock-dev/paddock/abi"
)

// TestChunkValidate: each refused chunk's error names the field that is
// wrong; the limit is on text plus data bytes.
func TestChunkValidate(t *testing.T) {
	big := strings.Repeat("x", abi.MaxChunkBytes)
	for name, tc := range map[string]struct {
		c    *abi.Chunk
		want string // "" = valid
	}{
		"text":              {&abi.Chunk{Type: abi.ChunkText, Text: "héllo"}, ""},
		"empty text":        {&abi.Chunk{Type: abi.ChunkText}, ""},
		"text at the limit": {&abi.Chunk{Type: abi.ChunkText, Text: big}, ""},
		"tool":              {&abi.Chunk{Type: abi.ChunkTool, Data: json.RawMessage(`{"tool":"s"}`)}, ""},
		"json":              {&abi.Chunk{Type: abi.ChunkJSON, Data: json.RawMessage(`3`)}, ""},
		"null":              {nil, "emit is null"},
		"text over":         {&abi.Chunk{Type: abi.ChunkText, Text: big + "y"}, "limit"},
		"json over":         {&abi.Chunk{Type: abi.ChunkJSON, Data: json.RawMessage(`"` + big + `"`)}, "limit"},
		"text with data":    {&abi.Chunk{Type: abi.ChunkText, Data: json.RawMessage(`1`)}, "emit.type"},
		"tool without data": {&abi.Chunk{Type: abi.ChunkTool}, "emit.data"},
		"json not json":     {&abi.Chunk{Type: abi.ChunkJSON, Data: json.RawMessage(`{`)}, "emit.data"},
		"json with text":    {&abi.Chunk{Type: abi.ChunkJSON, Text: "x", Data: json.RawMessage(`1`)}, "emit.type"},
		"unknown type":      {&abi.Chunk{Type: "image"}, "emit.type"},
		"NUL in text":       {&abi.Chunk{Type: abi.ChunkText, Text: "a\x00b"}, "emit.text"},
		"invalid UTF-8":     {&abi.Chunk{Type: abi.ChunkText, Text: "\xff"}, "emit.text"},
		"negative call_seq": {&abi.Chunk{Type: abi.ChunkText, CallSeq: -1}, "emit.call_seq"},
	} {
		err := tc.c.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: refused: %v", name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: Validate() = %v, want an error naming %q", name, err, tc.want)
		}
	}
}

// TestWaitOutcome: outcome wait takes a WaitSpec and only it does; the
// spec's fields are checked with the result.
func TestWaitOutcome(t *testing.T) {
	for name, tc := range map[string]struct {
		r  abi.TurnResult
		ok bool
	}{
		"wait":               {abi.TurnResult{Outcome: abi.OutcomeWait, Wait: &abi.WaitSpec{ID: "a.b:c-d_1", For: "x", TimeoutMs: 1000}}, true},
		"wait unnamed":       {abi.TurnResult{Outcome: abi.OutcomeWait, Wait: &abi.WaitSpec{}}, true},
		"wait without spec":  {abi.TurnResult{Outcome: abi.OutcomeWait}, false},
		"ok with spec":       {abi.TurnResult{Outcome: abi.OutcomeOK, Wait: &abi.WaitSpec{}}, false},
		"bad id":             {abi.TurnResult{Outcome: abi.OutcomeWait, Wait: &abi.WaitSpec{ID: "a b"}}, false},
		"long id":            {abi.TurnResult{Outcome: abi.OutcomeWait, Wait: &abi.WaitSpec{ID: strings.Repeat("a", 101)}}, false},
		"long for":           {abi.TurnResult{Outcome: abi.OutcomeWait, Wait: &abi.WaitSpec{For: strings.Repeat("a", 1001)}}, false},
		"data not json":      {abi.TurnResult{Outcome: abi.OutcomeWait, Wait: &abi.WaitSpec{Data: json.RawMessage(`{`)}}, false},
		"data too large":     {abi.TurnResult{Outcome: abi.OutcomeWait, Wait: &abi.WaitSpec{Data: json.RawMessage(`"` + strings.Repeat("a", 64<<10) + `"`)}}, false},
		"negative timeout":   {abi.TurnResult{Outcome: abi.OutcomeWait, Wait: &abi.WaitSpec{TimeoutMs: -1}}, false},
		"timeout beyond max": {abi.TurnResult{Outcome: abi.OutcomeWait, Wait: &abi.WaitSpec{TimeoutMs: abi.MaxAlarmDelayMs + 1}}, false},
	} {
		err := tc.r.Validate()
		if tc.ok != (err == nil) {
			t.Errorf("%s: Validate() = %v, want ok=%v", name, err, tc.ok)
		}
		if err != nil && !errors.Is(err, abi.ErrInvalidResult) {
			t.Errorf("%s: %v does not wrap ErrInvalidResult", name, err)
		}
	}
}
