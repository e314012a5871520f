package calls

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"

	"github.com/paddock-dev/paddock/abi"
)

// OpenAI chat completions, on the wire.

type oaMessage struct {
	Role       string       `json:"role"`
	Content    *string      `json:"content"`
	ToolCalls  []oaToolCall `json:"tool_calls,omitempty"`
	ToolCallID string       `json:"tool_call_id,omitempty"`
}

type oaToolCall struct {
	Index    *int   `json:"index,omitempty"`
	ID       string `json:"id,omitempty"`
	Type     string `json:"type,omitempty"`
	Function struct {
		Name      string `json:"name,omitempty"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

type oaTool struct {
	Type     string `json:"type"`
	Function struct {
		Name        string          `json:"name"`
		Description string          `json:"description,omitempty"`
		Parameters  json.RawMessage `json:"parameters,omitempty"`
	} `json:"function"`
}

type oaRequest struct {
	Model         string      `json:"model"`
	Messages      []oaMessage `json:"messages"`
	Tools         []oaTool    `json:"tools,omitempty"`
	MaxTokens     int         `json:"max_tokens,omitempty"`
	Temperature   *float64    `json:"temperature,omitempty"`
	Stop          []string    `json:"stop,omitempty"`
	Stream        bool        `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options,omitempty"`
}

type oaUsage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
}

type oaChunk struct {
	Model   string `json:"model"`
	Choices []struct {
		Index        int        `json:"index"`
		Delta        oaMessage  `json:"delta"`
		Message      *oaMessage `json:"message"`
		FinishReason *string    `json:"finish_reason"`
	} `json:"choices"`
	Usage *oaUsage `json:"usage"`
	Error *struct {
		Message string `json:"message"`
		Code    any    `json:"code"`
	} `json:"error"`
}

// openaiRequest translates a ModelRequest (max_tokens, not
// max_completion_tokens: the servers OpenAI-compatible endpoints run all
// read it).
func openaiRequest(mc *modelCall) oaRequest {
	r := mc.req
	out := oaRequest{Model: mc.model, MaxTokens: mc.maxTokens, Temperature: r.Temperature, Stop: r.Stop, Stream: true}
	out.StreamOptions = &struct {
		IncludeUsage bool `json:"include_usage"`
	}{true}
	for _, m := range r.Messages {
		content := m.Content
		om := oaMessage{Role: m.Role, Content: &content, ToolCallID: m.ToolCallID}
		if m.Role == abi.RoleAssistant && len(m.ToolCalls) > 0 {
			if content == "" {
				om.Content = nil
			}
			for _, tc := range m.ToolCalls {
				var c oaToolCall
				c.ID, c.Type = tc.ID, "function"
				c.Function.Name, c.Function.Arguments = tc.Name, string(args(string(tc.Arguments)))
				om.ToolCalls = append(om.ToolCalls, c)
			}
		}
		out.Messages = append(out.Messages, om)
	}
	for _, t := range r.Tools {
		var ot oaTool
		ot.Type = "function"
		ot.Function.Name, ot.Function.Description = t.Name, t.Description
		ot.Function.Parameters = t.Parameters
		if len(ot.Function.Parameters) == 0 {
			ot.Function.Parameters = json.RawMessage(`{"type":"object","properties":{}}`)
		}
		out.Tools = append(out.Tools, ot)
	}
	return out
}

// openaiStop maps a finish_reason.
func openaiStop(reason string, toolCalls int) string {
	switch reason {
	case "tool_calls", "function_call":
		return abi.StopToolUse
	case "length":
		return abi.StopMaxTokens
	case "stop", "":
		if toolCalls > 0 {
			return abi.StopToolUse // Ollama and others say "stop" with tool calls
		}
		return abi.StopEndTurn
	default:
		return reason
	}
}

// openaiStream reads a streamed chat completion: content deltas, tool
// calls in pieces (by index), the finish reason, and usage in the last
// chunk (stream_options.include_usage).
func openaiStream(r io.Reader, mc *modelCall) (*abi.ModelResponse, error) {
	out := &abi.ModelResponse{Message: abi.ModelMessage{Role: abi.RoleAssistant}}
	type acc struct {
		id, name, args string
	}
	calls := map[int]*acc{}
	var text []byte
	finish, finished := "", false
	err := readSSE(r, func(ev sseEvent) (bool, error) {
		if string(ev.data) == "[DONE]" {
			return true, nil
		}
		var c oaChunk
		if err := json.Unmarshal(ev.data, &c); err != nil {
			return false, streamError(mc, 0, "a chunk is not JSON: "+err.Error())
		}
		if c.Error != nil {
			return false, streamError(mc, 0, c.Error.Message)
		}
		if c.Model != "" {
			out.Model = c.Model
		}
		if c.Usage != nil {
			out.Usage = abi.Usage{InputTokens: c.Usage.PromptTokens, OutputTokens: c.Usage.CompletionTokens}
		}
		for _, ch := range c.Choices {
			if ch.Index != 0 {
				continue
			}
			if d := ch.Delta.Content; d != nil && *d != "" {
				text = append(text, *d...)
				if mc.opts.OnDelta != nil {
					mc.opts.OnDelta(*d)
				}
			}
			for i, tc := range ch.Delta.ToolCalls {
				idx := i
				if tc.Index != nil {
					idx = *tc.Index
				}
				a := calls[idx]
				if a == nil {
					a = &acc{}
					calls[idx] = a
				}
				if tc.ID != "" {
					a.id = tc.ID
				}
				if tc.Function.Name != "" {
					a.name = tc.Function.Name
				}
				a.args += tc.Function.Arguments
			}
			if ch.FinishReason != nil && *ch.FinishReason != "" {
				finish, finished = *ch.FinishReason, true
			}
		}
		return false, nil
	})
	if errors.Is(err, io.ErrUnexpectedEOF) && finished {
		err = nil // a server that sends no [DONE] after the finish reason
	}
	if err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, streamError(mc, 0, "the stream ended before the reply did")
		}
		return nil, err
	}
	idx := make([]int, 0, len(calls))
	for i := range calls {
		idx = append(idx, i)
	}
	sort.Ints(idx)
	for _, i := range idx {
		a := calls[i]
		if !json.Valid(args(a.args)) {
			return nil, streamError(mc, 0, fmt.Sprintf("tool call %q: arguments are not JSON", a.name))
		}
		out.Message.ToolCalls = append(out.Message.ToolCalls, abi.ToolCall{ID: a.id, Name: a.name, Arguments: args(a.args)})
	}
	out.Message.Content = string(text)
	out.StopReason = openaiStop(finish, len(out.Message.ToolCalls))
	return out, nil
}

// openaiWhole reads a chat completion a server sent unstreamed.
func openaiWhole(r io.Reader, mc *modelCall) (*abi.ModelResponse, error) {
	var c oaChunk
	if err := json.NewDecoder(r).Decode(&c); err != nil {
		if errors.Is(err, errStreamTooLarge) {
			return nil, err
		}
		return nil, streamError(mc, 0, "the response is not JSON: "+err.Error())
	}
	if c.Error != nil {
		return nil, streamError(mc, 0, c.Error.Message)
	}
	out := &abi.ModelResponse{Model: c.Model, Message: abi.ModelMessage{Role: abi.RoleAssistant}}
	if c.Usage != nil {
		out.Usage = abi.Usage{InputTokens: c.Usage.PromptTokens, OutputTokens: c.Usage.CompletionTokens}
	}
	finish := ""
	for _, ch := range c.Choices {
		if ch.Index != 0 || ch.Message == nil {
			continue
		}
		if ch.Message.Content != nil {
			out.Message.Content = *ch.Message.Content
			if mc.opts.OnDelta != nil && out.Message.Content != "" {
				mc.opts.OnDelta(out.Message.Content)
			}
		}
		for _, tc := range ch.Message.ToolCalls {
			out.Message.ToolCalls = append(out.Message.ToolCalls, abi.ToolCall{ID: tc.ID, Name: tc.Function.Name, Arguments: args(tc.Function.Arguments)})
		}
		if ch.FinishReason != nil {
			finish = *ch.FinishReason
		}
	}
	out.StopReason = openaiStop(finish, len(out.Message.ToolCalls))
	return out, nil
}
