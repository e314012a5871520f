//go:build wasip1

// Command hcagent is the test agent of cmd/paddock's host-call process
// tests (hostcalls_e2e_test.go), a wasm reactor. Each event message is a
// JSON array of host calls (abi.CallRequest); the agent makes them in order
// with abi.Call and replies with a JSON array of what each returned:
//
//	{"seq":S,"replayed":R,"status":N,"content":"…","body":"…","error":"CODE: message"}
//
// so everything a call handed the agent ends up in the transcript, where
// the tests look for it. A message that is a JSON object is a command
// instead: {"wait": WaitSpec} ends the turn with outcome wait;
// {"emit": {"n": N, "interval_ms": M}} emits N json chunks
// {"t": unix nanoseconds at the emit, "i": i}, M ms apart (the stream
// benchmark's token source). A wait.resolved or wait.expired event is
// answered with {"wait": the event's WaitEvent, "kind": its kind}. It is a testdata package: go builds it when named,
// and ./... patterns skip it.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/wasm/guest"
)

func init() { guest.Handle(turn) }

func main() {}

type outcome struct {
	Seq      int    `json:"seq"`
	Replayed bool   `json:"replayed"`
	Status   int    `json:"status,omitempty"`
	Content  string `json:"content,omitempty"`
	Body     string `json:"body,omitempty"`
	Error    string `json:"error,omitempty"`
}

// command is an hcagent message that is a JSON object.
type command struct {
	Wait *abi.WaitSpec `json:"wait"`
	Emit *struct {
		N          int `json:"n"`
		IntervalMS int `json:"interval_ms"`
	} `json:"emit"`
}

func reply(text string) *abi.TurnResult {
	return &abi.TurnResult{Messages: []abi.Message{{Role: abi.RoleAssistant, Content: text}}}
}

func turn(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
	if k := req.Event.Kind; k == abi.EventWaitResolved || k == abi.EventWaitExpired {
		b, err := json.Marshal(map[string]any{"kind": k, "wait": req.Event.Wait})
		if err != nil {
			return nil, err
		}
		return reply(string(b)), nil
	}
	if m := strings.TrimSpace(req.Event.Message); strings.HasPrefix(m, "{") {
		var c command
		if err := json.Unmarshal([]byte(m), &c); err != nil {
			return nil, fmt.Errorf("the message is not a command: %w", err)
		}
		switch {
		case c.Wait != nil:
			res := reply("waiting for " + c.Wait.For)
			res.Outcome, res.Wait = abi.OutcomeWait, c.Wait
			return res, nil
		case c.Emit != nil:
			for i := range c.Emit.N {
				if i > 0 && c.Emit.IntervalMS > 0 {
					time.Sleep(time.Duration(c.Emit.IntervalMS) * time.Millisecond)
				}
				_ = abi.EmitJSON(ctx, abi.ChunkJSON, map[string]int64{"t": time.Now().UnixNano(), "i": int64(i)})
			}
			return reply(fmt.Sprintf("emitted %d", c.Emit.N)), nil
		}
		return nil, fmt.Errorf("the command %s names nothing to do", m)
	}
	var reqs []abi.CallRequest
	if err := json.Unmarshal([]byte(req.Event.Message), &reqs); err != nil {
		return nil, fmt.Errorf("the message is not a JSON array of call requests: %w", err)
	}
	out := make([]outcome, 0, len(reqs))
	for i := range reqs {
		res := abi.Call(ctx, &reqs[i])
		o := outcome{Seq: res.Seq, Replayed: res.Replayed}
		switch {
		case res.Error != nil:
			o.Error = string(res.Error.Code) + ": " + res.Error.Message
			o.Status = res.Error.Status
		case res.HTTP != nil:
			o.Status, o.Body = res.HTTP.Status, string(res.HTTP.Body)
		case res.Model != nil:
			o.Content = res.Model.Message.Content
		}
		out = append(out, o)
	}
	b, err := json.Marshal(out)
	if err != nil {
		return nil, err
	}
	return &abi.TurnResult{Messages: []abi.Message{{Role: abi.RoleAssistant, Content: string(b)}}}, nil
}
