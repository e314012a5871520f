//go:build wasip1

// Command hcagent is the test agent of cmd/paddock's host-call process
// tests (hostcalls_e2e_test.go), a wasm reactor. Each event message is a
// JSON array of host calls (abi.CallRequest); the agent makes them in order
// with abi.Call and replies with a JSON array of what each returned:
//
//	{"seq":S,"replayed":R,"status":N,"content":"…","body":"…","error":"CODE: message"}
//
// so everything a call handed the agent ends up in the transcript, where
// the tests look for it. It is a testdata package: go builds it when named,
// and ./... patterns skip it.
package main

import (
	"context"
	"encoding/json"
	"fmt"

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

func turn(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
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
