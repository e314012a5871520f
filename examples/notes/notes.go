// Package notes is the logic of the notes example agent: a stateful
// note-taking agent whose notes live in the session state, so they survive
// instance recycling, host restarts and moves between hosts (the host stores
// the state; the module keeps nothing between turns).
//
// Messages:
//
//	note <text>   stores a note
//	list          lists the notes, numbered from 1
//	count, other  answers with the number of notes and of turns so far
//
// Replies are one "assistant" message. The wasip1 module is built from
// ./cmd (see the Makefile); this package is plain Go and tests on the host.
package notes

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/paddock-dev/paddock/abi"
)

// State is the session state of the notes agent, encoded as JSON.
type State struct {
	// Notes are the stored notes, oldest first.
	Notes []string `json:"notes"`
	// Turns counts the committed turns of the session, this one included.
	Turns int `json:"turns"`
}

// DecodeState decodes a session state; nil or empty means a new session.
func DecodeState(b []byte) (State, error) {
	var s State
	if len(b) == 0 {
		return s, nil
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return State{}, fmt.Errorf("notes: decode state: %w", err)
	}
	return s, nil
}

// Turn is the agent's abi.TurnFunc. It fails (an error outcome) only if the
// stored state is not a notes State.
func Turn(_ context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
	s, err := DecodeState(req.State)
	if err != nil {
		return nil, err
	}
	s.Turns++
	msg := strings.TrimSpace(req.Event.Message)
	verb, rest, _ := strings.Cut(msg, " ")
	var reply string
	switch strings.ToLower(verb) {
	case "note":
		text := strings.TrimSpace(rest)
		if text == "" {
			reply = "usage: note <text>"
			break
		}
		s.Notes = append(s.Notes, text)
		reply = fmt.Sprintf("noted (%d)", len(s.Notes))
	case "list":
		if len(s.Notes) == 0 {
			reply = "no notes"
			break
		}
		var b strings.Builder
		for i, n := range s.Notes {
			if i > 0 {
				b.WriteByte('\n')
			}
			fmt.Fprintf(&b, "%d. %s", i+1, n)
		}
		reply = b.String()
	default:
		reply = fmt.Sprintf("%d notes, %d turns", len(s.Notes), s.Turns)
	}
	state, err := json.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("notes: encode state: %w", err)
	}
	return &abi.TurnResult{
		Messages: []abi.Message{{Role: abi.RoleAssistant, Content: reply}},
		State:    state,
		Outcome:  abi.OutcomeOK,
	}, nil
}
