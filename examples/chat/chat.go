// Package chat is the logic of the chat example agent: a conversational
// agent that keeps its conversation in the session state, calls a model
// through the host (abi.CallModel), and runs a tool loop within one turn —
// it may fetch a web page the host allows (abi.CallHTTP) and keep notes —
// answering with the model's final reply.
//
// The agent holds no key and opens no socket: the host checks each call
// against the agent's capabilities, fills the endpoint's key from a secret
// the agent never sees, and records the call in the event's journal, so a
// retried turn replays the model's answers instead of paying for them
// again (docs/DESIGN.md invariant 12).
//
// The model endpoint is the host's endpoint named Endpoint ("chat"); see
// examples/paddock.yaml and the README for OpenAI, Anthropic and a local
// Ollama. When the endpoint is not configured or cannot be reached the
// agent answers with what to set instead of failing: a configuration
// problem must not dead-letter a conversation.
//
// The agent streams its turn to the session stream while it runs: the
// host forwards the model's text as it arrives (text chunks), and the
// agent emits a tool chunk when it starts and ends each tool call
// ({"tool":"fetch_url","status":"running"}, then "done" or "error"), so a
// chat client shows progress before the turn commits. Emitting never
// fails the turn (abi/README.md "Emit").
//
// The wasip1 module is built from ./cmd, the plugin worker from ./plugin;
// this package is plain Go and tests on the host.
package chat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/paddock-dev/paddock/abi"
)

// Endpoint is the name of the host's model endpoint the agent calls.
const Endpoint = "chat"

// Limits of the agent.
const (
	// MaxSteps bounds the model calls of one turn (the tool loop).
	MaxSteps = 8
	// MaxHistory is how many conversation messages the state keeps (the
	// oldest are dropped first, never splitting a tool exchange).
	MaxHistory = 60
	// MaxFetchChars is how much of a fetched page a tool result carries.
	MaxFetchChars = 8000
	// MaxNotes bounds the notes kept.
	MaxNotes = 200
)

// System is the system prompt.
const System = `You are a helpful assistant running inside Paddock, a host for long-lived agent sessions.
Answer briefly. You can keep notes for the user with add_note and list_notes, and read a web page with
fetch_url (only hosts the operator allowed will work; if a fetch is denied, say so).`

// State is the chat agent's session state (JSON).
type State struct {
	// Messages is the conversation without the system prompt, oldest first.
	Messages []abi.ModelMessage `json:"messages"`
	// Notes are the notes the model kept with add_note.
	Notes []string `json:"notes,omitempty"`
	// Turns counts committed turns, this one included.
	Turns int `json:"turns"`
	// Usage sums the tokens of every model call of the session.
	Usage abi.Usage `json:"usage"`
}

// Tools returns the tools offered to the model.
func Tools() []abi.ModelTool {
	return []abi.ModelTool{
		{Name: "fetch_url", Description: "Fetch a web page with GET and return its status and the start of its body.",
			Parameters: json.RawMessage(`{"type":"object","properties":{"url":{"type":"string","description":"an absolute http(s) URL"}},"required":["url"]}`)},
		{Name: "add_note", Description: "Keep a note for the user.",
			Parameters: json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}`)},
		{Name: "list_notes", Description: "List the notes kept so far.",
			Parameters: json.RawMessage(`{"type":"object","properties":{}}`)},
	}
}

// DecodeState decodes a session state; nil or empty means a new session.
func DecodeState(b []byte) (State, error) {
	var s State
	if len(b) == 0 {
		return s, nil
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return State{}, fmt.Errorf("chat: decode state: %w", err)
	}
	return s, nil
}

// Turn is the agent's abi.TurnFunc. A message (or a queued steer) is a user
// message; other events (alarms) are answered without a model call. It
// fails (an error outcome) only if the stored state is not a chat State.
func Turn(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
	s, err := DecodeState(req.State)
	if err != nil {
		return nil, err
	}
	s.Turns++
	var reply string
	switch {
	case req.Event.Kind == abi.EventAlarm:
		reply = "(alarm ignored: the chat agent sets none)"
	case strings.TrimSpace(req.Event.Message) == "":
		reply = "say something: the chat agent answers messages"
	default:
		reply = s.converse(ctx, req.Event.Message)
	}
	s.trim()
	state, err := abi.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("chat: encode state: %w", err)
	}
	return &abi.TurnResult{
		Messages: []abi.Message{{Role: abi.RoleAssistant, Content: reply}},
		State:    state,
		Outcome:  abi.OutcomeOK,
	}, nil
}

// converse appends the user's message and runs the model and its tools
// until the model answers without a tool call (or MaxSteps).
func (s *State) converse(ctx context.Context, text string) string {
	s.Messages = append(s.Messages, abi.ModelMessage{Role: abi.RoleUser, Content: text})
	for range MaxSteps {
		msgs := append([]abi.ModelMessage{{Role: abi.RoleSystem, Content: System}}, s.Messages...)
		res, err := abi.CallModel(ctx, &abi.ModelRequest{Endpoint: Endpoint, Messages: msgs, Tools: Tools(), MaxTokens: 1024})
		if err != nil {
			// The question stays in the conversation; the failure is told
			// to the user but not kept as the model's words.
			return explain(err)
		}
		s.Usage.InputTokens += res.Usage.InputTokens
		s.Usage.OutputTokens += res.Usage.OutputTokens
		msg := res.Message
		msg.Role = abi.RoleAssistant
		s.Messages = append(s.Messages, msg)
		if len(msg.ToolCalls) == 0 {
			if strings.TrimSpace(msg.Content) == "" {
				return "(the model gave an empty answer, stop reason " + res.StopReason + ")"
			}
			return msg.Content
		}
		for _, tc := range msg.ToolCalls {
			s.Messages = append(s.Messages, abi.ModelMessage{
				Role: abi.RoleTool, ToolCallID: tc.ID, Content: s.runToolStreamed(ctx, tc),
			})
		}
	}
	return fmt.Sprintf("(stopped after %d model calls without a final answer)", MaxSteps)
}

// ToolProgress is the data of the tool chunks the agent emits around each
// tool call.
type ToolProgress struct {
	Tool   string `json:"tool"`
	ID     string `json:"id"`
	Status string `json:"status"` // running, done or error
}

// runToolStreamed runs one tool call between two tool chunks on the
// session stream. A refused emit is ignored: the stream is best effort.
func (s *State) runToolStreamed(ctx context.Context, tc abi.ToolCall) string {
	_ = abi.EmitJSON(ctx, abi.ChunkTool, ToolProgress{Tool: tc.Name, ID: tc.ID, Status: "running"})
	out := s.runTool(ctx, tc)
	status := "done"
	if strings.HasPrefix(out, "error: ") {
		status = "error"
	}
	_ = abi.EmitJSON(ctx, abi.ChunkTool, ToolProgress{Tool: tc.Name, ID: tc.ID, Status: status})
	return out
}

// runTool runs one tool call and returns its result for the model.
func (s *State) runTool(ctx context.Context, tc abi.ToolCall) string {
	var args struct {
		URL  string `json:"url"`
		Text string `json:"text"`
	}
	if len(tc.Arguments) > 0 {
		if err := json.Unmarshal(tc.Arguments, &args); err != nil {
			return "error: arguments are not a JSON object: " + err.Error()
		}
	}
	switch tc.Name {
	case "fetch_url":
		res, err := abi.CallHTTP(ctx, &abi.HTTPRequest{Method: "GET", URL: args.URL})
		if err != nil {
			return "error: " + err.Error()
		}
		body := string(res.Body)
		if !utf8.ValidString(body) {
			body = strings.ToValidUTF8(body, "\uFFFD")
		}
		if len(body) > MaxFetchChars {
			body = body[:MaxFetchChars] + "…"
		}
		return fmt.Sprintf("status %d\n%s", res.Status, body)
	case "add_note":
		t := strings.TrimSpace(args.Text)
		if t == "" {
			return "error: text is empty"
		}
		if len(s.Notes) >= MaxNotes {
			return fmt.Sprintf("error: %d notes already (the limit)", MaxNotes)
		}
		s.Notes = append(s.Notes, t)
		return fmt.Sprintf("noted (%d)", len(s.Notes))
	case "list_notes":
		if len(s.Notes) == 0 {
			return "no notes"
		}
		var b strings.Builder
		for i, n := range s.Notes {
			fmt.Fprintf(&b, "%d. %s\n", i+1, n)
		}
		return b.String()
	default:
		return "error: no tool named " + tc.Name
	}
}

// explain turns a failed model call into a reply that says what to do.
func explain(err error) string {
	var ce *abi.CallError
	if !errors.As(err, &ce) {
		return "(the model call failed: " + err.Error() + ")"
	}
	switch ce.Code {
	case abi.CallNotConfigured:
		if strings.Contains(ce.Message, "secret") && !strings.Contains(ce.Message, "environment variable") {
			// The endpoint is there; its key is not (an unknown secret, or
			// a secrets_key that does not open it): the setup of the
			// endpoint would not help.
			return "(the model endpoint's key is not available: " + ce.Message + ")"
		}
		return "(no model is configured for this agent: " + ce.Message + ". " + Setup + ")"
	case abi.CallDenied:
		if ce.Reason == "endpoint" {
			return "(the host refused the model call: " + ce.Message + ". Grant the agent the endpoint \"" + Endpoint +
				"\" in its capabilities.)"
		}
		return "(the host refused the model call: " + ce.Message + ")"
	case abi.CallUpstream:
		if ce.Status == 0 {
			return "(the model endpoint cannot be reached: " + ce.Message + ". " + Setup + ")"
		}
		return fmt.Sprintf("(the model endpoint answered %d: %s)", ce.Status, ce.Message)
	case abi.CallTimeout:
		return "(the model did not answer in time: " + ce.Message + ")"
	default:
		return "(the model call failed: " + ce.Error() + ")"
	}
}

// Setup says how to give the agent a model (the README has the details).
const Setup = "Set PADDOCK_MODELS__CHAT__PROVIDER (openai or anthropic), PADDOCK_MODELS__CHAT__BASE_URL and " +
	"PADDOCK_MODELS__CHAT__MODELS (a model name) and, for a hosted API, PADDOCK_MODELS__CHAT__SECRET=chat_key with " +
	"the key in CHAT_API_KEY, then restart paddock serve; by default it uses a local Ollama at " +
	"http://127.0.0.1:11434/v1 with model llama3.2, which needs no key"

// trim keeps the conversation within MaxHistory messages, dropping the
// oldest and never starting with a tool message or an assistant message
// (a tool exchange is dropped whole).
func (s *State) trim() {
	if len(s.Messages) <= MaxHistory {
		return
	}
	m := s.Messages[len(s.Messages)-MaxHistory:]
	for len(m) > 0 && m[0].Role != abi.RoleUser {
		m = m[1:]
	}
	s.Messages = append([]abi.ModelMessage(nil), m...)
}
