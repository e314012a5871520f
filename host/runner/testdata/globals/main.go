//go:build wasip1

// Command globals is a test guest that remembers, in package variables,
// the last session and message it served and whether it ever failed, and
// says so in every reply: it shows which turns an instance served.
package main

import (
	"context"
	"fmt"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/wasm/guest"
)

var (
	lastSession, lastMessage string
	failed                   bool
)

func turn(_ context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
	out := fmt.Sprintf("prev=%s/%s failed=%v", lastSession, lastMessage, failed)
	if req.Event.Message == "fail" {
		failed = true
		return &abi.TurnResult{Outcome: abi.OutcomeError, Error: "failing as asked"}, nil
	}
	lastSession, lastMessage = req.Session.SessionID, req.Event.Message
	return &abi.TurnResult{Messages: []abi.Message{{Role: abi.RoleAssistant, Content: out}}}, nil
}

func init() { guest.Handle(turn) }

func main() {}
