// Package notes is the logic of the notes example agent: a stateful
// note-taking agent whose notes live in the session state, so they survive
// instance recycling, host restarts and moves between hosts (the host stores
// the state; the module keeps nothing between turns).
//
// Messages:
//
//	note <text>             stores a note
//	list                    lists the notes, numbered from 1
//	remind <seconds> <text> sets a one-shot alarm "remind-<n>" (n counts the
//	                        session's reminders) that replies "reminder: <text>"
//	every <seconds> <name>  sets a repeating alarm <name> that replies
//	                        "tick <name>" each time it fires
//	stop <name>             clears the alarm <name>
//	ask [<seconds>s] <text> asks a human: the turn ends with outcome wait,
//	                        a wait "ask-<n>" (n counts the session's
//	                        questions) for <text>, expiring after <seconds>
//	                        when given; its answer (paddock wait resolve …
//	                        --data JSON) is stored as a note "<text> → <answer>"
//	count, other            answers with the number of notes and of turns so far
//
// Alarms live in the host (abi.AlarmOp), not in the state: the agent sets
// them through its result and hears of them as abi.EventAlarm events. A
// reminder carries its text in the alarm's data, {"text": …}. Steer events
// queued while no turn ran are handled like messages.
//
// Replies are one "assistant" message. The wasip1 module is built from
// ./cmd (see the Makefile); this package is plain Go and tests on the host.
package notes

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/paddock-dev/paddock/abi"
)

// State is the session state of the notes agent, encoded as JSON.
type State struct {
	// Notes are the stored notes, oldest first.
	Notes []string `json:"notes"`
	// Turns counts the committed turns of the session, this one included.
	Turns int `json:"turns"`
	// Reminders counts the reminders set, which names them: remind-<n>.
	Reminders int `json:"reminders,omitempty"`
	// Asks counts the questions asked, which names their waits: ask-<n>.
	Asks int `json:"asks,omitempty"`
}

// MaxAlarmSeconds bounds the delay and period of remind and every: one
// year.
const MaxAlarmSeconds = 366 * 24 * 3600

// Reminder is the data of a reminder alarm.
type Reminder struct {
	Text string `json:"text"`
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
	var reply string
	var alarms []abi.AlarmOp
	var wait *abi.WaitSpec
	switch req.Event.Kind {
	case abi.EventAlarm:
		reply = alarmReply(req.Event.Alarm)
	case abi.EventWaitResolved, abi.EventWaitExpired:
		reply = s.answer(req.Event.Kind, req.Event.Wait)
	default:
		reply, alarms = s.command(req.Event.Message)
		if strings.EqualFold(firstWord(req.Event.Message), "ask") {
			reply, wait = s.ask(req.Event.Message)
		}
	}
	state, err := abi.Marshal(s) // no HTML escaping: a note of "<" stays one byte
	if err != nil {
		return nil, fmt.Errorf("notes: encode state: %w", err)
	}
	out := &abi.TurnResult{
		Messages: []abi.Message{{Role: abi.RoleAssistant, Content: reply}},
		State:    state,
		Outcome:  abi.OutcomeOK,
		Alarms:   alarms,
	}
	if wait != nil {
		out.Outcome, out.Wait = abi.OutcomeWait, wait
	}
	return out, nil
}

func firstWord(msg string) string {
	verb, _, _ := strings.Cut(strings.TrimSpace(msg), " ")
	return verb
}

// ask handles "ask [<seconds>s] <question>": the reply, and the wait the
// turn ends with (nil after a usage error).
func (s *State) ask(msg string) (string, *abi.WaitSpec) {
	_, rest, _ := strings.Cut(strings.TrimSpace(msg), " ")
	rest = strings.TrimSpace(rest)
	var timeoutMs int64
	if num, q, ok := strings.Cut(rest, " "); ok && strings.HasSuffix(num, "s") {
		if n, err := strconv.ParseInt(strings.TrimSuffix(num, "s"), 10, 64); err == nil {
			if n < 1 || n > MaxAlarmSeconds {
				return fmt.Sprintf("usage: ask [<seconds 1-%d>s] <question>", MaxAlarmSeconds), nil
			}
			timeoutMs, rest = n*1000, strings.TrimSpace(q)
		}
	}
	if rest == "" || len(rest) > 1000 {
		return "usage: ask [<seconds>s] <question of 1-1000 bytes>", nil
	}
	s.Asks++
	id := fmt.Sprintf("ask-%d", s.Asks)
	reply := fmt.Sprintf("waiting for an answer to %s: %s", id, rest)
	if timeoutMs > 0 {
		reply += fmt.Sprintf(" (for %d s)", timeoutMs/1000)
	}
	return reply, &abi.WaitSpec{ID: id, For: rest, TimeoutMs: timeoutMs}
}

// answer handles a wait.resolved or wait.expired event: the answer (a
// JSON string's text, else the JSON) is stored as a note.
func (s *State) answer(kind string, w *abi.WaitEvent) string {
	if w == nil {
		return "wait event without details"
	}
	var text string
	switch {
	case kind == abi.EventWaitExpired:
		text = "(no answer: the wait expired)"
	case len(w.Data) == 0 || string(w.Data) == "null":
		text = "(answered without data)"
	case json.Unmarshal(w.Data, &text) == nil:
	default:
		text = string(w.Data)
	}
	s.Notes = append(s.Notes, w.For+" → "+text)
	return fmt.Sprintf("%s: noted (%d) %s → %s", w.ID, len(s.Notes), w.For, text)
}

// alarmReply answers an alarm event: a reminder's text, or a tick of a
// repeating alarm.
func alarmReply(a *abi.AlarmFired) string {
	if a == nil {
		return "alarm without details"
	}
	var r Reminder
	if len(a.Data) > 0 && json.Unmarshal(a.Data, &r) == nil && r.Text != "" {
		return "reminder: " + r.Text
	}
	return "tick " + a.Name
}

// command runs one message command on s and returns the reply and the
// alarm operations it asks for.
func (s *State) command(msg string) (string, []abi.AlarmOp) {
	msg = strings.TrimSpace(msg)
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
	case "remind":
		secs, text, ok := seconds(rest)
		if !ok || text == "" {
			return fmt.Sprintf("usage: remind <seconds 1-%d> <text>", MaxAlarmSeconds), nil
		}
		data, err := json.Marshal(Reminder{Text: text})
		if err != nil || len(data) > maxAlarmData {
			return "reminder text too long", nil
		}
		s.Reminders++
		name := fmt.Sprintf("remind-%d", s.Reminders)
		return fmt.Sprintf("reminder %s set in %d s", name, secs),
			[]abi.AlarmOp{{Name: name, InMs: secs * 1000, Data: data}}
	case "every":
		secs, name, ok := seconds(rest)
		if !ok || !validName(name) {
			return fmt.Sprintf("usage: every <seconds 1-%d> <name of 1-100 bytes>", MaxAlarmSeconds), nil
		}
		return fmt.Sprintf("tick %s every %d s", name, secs),
			[]abi.AlarmOp{{Name: name, InMs: secs * 1000, EveryMs: secs * 1000}}
	case "stop":
		name := strings.TrimSpace(rest)
		if !validName(name) {
			return "usage: stop <name>", nil
		}
		return "stopped " + name, []abi.AlarmOp{{Name: name, Clear: true}}
	default:
		reply = fmt.Sprintf("%d notes, %d turns", len(s.Notes), s.Turns)
	}
	return reply, nil
}

// maxAlarmData is the limit of an alarm's data (abi.AlarmOp).
const maxAlarmData = 64 << 10

// seconds parses "<seconds> <rest>" with seconds in 1..MaxAlarmSeconds.
func seconds(args string) (secs int64, rest string, ok bool) {
	num, rest, _ := strings.Cut(strings.TrimSpace(args), " ")
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 1 || n > MaxAlarmSeconds {
		return 0, "", false
	}
	return n, strings.TrimSpace(rest), true
}

// validName reports whether name is a valid alarm name (abi.AlarmOp).
func validName(name string) bool { return name != "" && len(name) <= 100 }
