package calls

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/paddock-dev/paddock/abi"
)

// Anthropic's Messages API, on the wire.

type anBlock struct {
	Type      string          `json:"type"`
	Text      string          `json:"text,omitempty"`
	ID        string          `json:"id,omitempty"`
	Name      string          `json:"name,omitempty"`
	Input     json.RawMessage `json:"input,omitempty"`
	ToolUseID string          `json:"tool_use_id,omitempty"`
	Content   string          `json:"content,omitempty"`
}

type anMessage struct {
	Role    string    `json:"role"`
	Content []anBlock `json:"content"`
}

type anTool struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	InputSchema json.RawMessage `json:"input_schema"`
}

type anRequest struct {
	Model         string      `json:"model"`
	MaxTokens     int         `json:"max_tokens"`
	System        string      `json:"system,omitempty"`
	Messages      []anMessage `json:"messages"`
	Tools         []anTool    `json:"tools,omitempty"`
	Temperature   *float64    `json:"temperature,omitempty"`
	StopSequences []string    `json:"stop_sequences,omitempty"`
	Stream        bool        `json:"stream"`
}

type anUsage struct {
	InputTokens  int64 `json:"input_tokens"`
	OutputTokens int64 `json:"output_tokens"`
}

// anthropicRequest translates a ModelRequest: system messages become the
// system prompt, assistant tool calls tool_use blocks, tool messages
// tool_result blocks in a user turn; consecutive messages of one role are
// merged (the API wants user and assistant to alternate).
func anthropicRequest(mc *modelCall) anRequest {
	r := mc.req
	out := anRequest{Model: mc.model, MaxTokens: mc.maxTokens, Temperature: r.Temperature, StopSequences: r.Stop, Stream: true}
	var system []string
	for _, m := range r.Messages {
		var role string
		var blocks []anBlock
		switch m.Role {
		case abi.RoleSystem:
			system = append(system, m.Content)
			continue
		case abi.RoleTool:
			role = "user"
			blocks = []anBlock{{Type: "tool_result", ToolUseID: m.ToolCallID, Content: m.Content}}
		case abi.RoleAssistant:
			role = "assistant"
			if m.Content != "" {
				blocks = append(blocks, anBlock{Type: "text", Text: m.Content})
			}
			for _, tc := range m.ToolCalls {
				blocks = append(blocks, anBlock{Type: "tool_use", ID: tc.ID, Name: tc.Name, Input: args(string(tc.Arguments))})
			}
		default:
			role = "user"
			if m.Content != "" {
				blocks = []anBlock{{Type: "text", Text: m.Content}}
			}
		}
		if len(blocks) == 0 {
			continue
		}
		if n := len(out.Messages); n > 0 && out.Messages[n-1].Role == role {
			out.Messages[n-1].Content = append(out.Messages[n-1].Content, blocks...)
			continue
		}
		out.Messages = append(out.Messages, anMessage{Role: role, Content: blocks})
	}
	out.System = strings.Join(system, "\n\n")
	for _, t := range r.Tools {
		schema := t.Parameters
		if len(schema) == 0 {
			schema = json.RawMessage(`{"type":"object","properties":{}}`)
		}
		out.Tools = append(out.Tools, anTool{Name: t.Name, Description: t.Description, InputSchema: schema})
	}
	return out
}

// anthropicStatus maps an error event's type to the HTTP status the API
// uses for it (0 when unknown).
func anthropicStatus(typ string) int {
	switch typ {
	case "overloaded_error":
		return 529
	case "rate_limit_error":
		return 429
	case "api_error":
		return 500
	case "invalid_request_error":
		return 400
	}
	return 0
}

// anthropicStream reads a streamed Messages reply: message_start (model,
// input tokens), content blocks (text deltas, tool_use input as
// input_json_delta pieces), message_delta (stop reason, output tokens),
// message_stop.
func anthropicStream(r io.Reader, mc *modelCall) (*abi.ModelResponse, error) {
	out := &abi.ModelResponse{Message: abi.ModelMessage{Role: abi.RoleAssistant}}
	type block struct {
		typ, id, name string
		text, input   strings.Builder
		startInput    json.RawMessage
	}
	blocks := map[int]*block{}
	var ev struct {
		Type    string `json:"type"`
		Index   int    `json:"index"`
		Message *struct {
			Model string   `json:"model"`
			Usage *anUsage `json:"usage"`
		} `json:"message"`
		ContentBlock *anBlock `json:"content_block"`
		Delta        *struct {
			Type        string `json:"type"`
			Text        string `json:"text"`
			PartialJSON string `json:"partial_json"`
			StopReason  string `json:"stop_reason"`
		} `json:"delta"`
		Usage *anUsage `json:"usage"`
		Error *struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	err := readSSE(r, func(e sseEvent) (bool, error) {
		ev.Message, ev.ContentBlock, ev.Delta, ev.Usage, ev.Error, ev.Index, ev.Type = nil, nil, nil, nil, nil, 0, ""
		if err := json.Unmarshal(e.data, &ev); err != nil {
			return false, streamError(mc, 0, "an event is not JSON: "+err.Error())
		}
		switch ev.Type {
		case "message_start":
			if ev.Message != nil {
				out.Model = ev.Message.Model
				if u := ev.Message.Usage; u != nil {
					out.Usage.InputTokens, out.Usage.OutputTokens = u.InputTokens, u.OutputTokens
				}
			}
		case "content_block_start":
			if ev.ContentBlock != nil {
				b := &block{typ: ev.ContentBlock.Type, id: ev.ContentBlock.ID, name: ev.ContentBlock.Name, startInput: ev.ContentBlock.Input}
				b.text.WriteString(ev.ContentBlock.Text)
				blocks[ev.Index] = b
			}
		case "content_block_delta":
			b := blocks[ev.Index]
			if b == nil || ev.Delta == nil {
				return false, streamError(mc, 0, fmt.Sprintf("a delta for content block %d, which did not start", ev.Index))
			}
			switch ev.Delta.Type {
			case "text_delta":
				b.text.WriteString(ev.Delta.Text)
				if mc.opts.OnDelta != nil && ev.Delta.Text != "" {
					mc.opts.OnDelta(ev.Delta.Text)
				}
			case "input_json_delta":
				b.input.WriteString(ev.Delta.PartialJSON)
			}
		case "message_delta":
			if ev.Delta != nil && ev.Delta.StopReason != "" {
				out.StopReason = ev.Delta.StopReason
			}
			if ev.Usage != nil {
				out.Usage.OutputTokens = ev.Usage.OutputTokens
				if ev.Usage.InputTokens > 0 {
					out.Usage.InputTokens = ev.Usage.InputTokens
				}
			}
		case "message_stop":
			return true, nil
		case "error":
			if ev.Error != nil {
				return false, streamError(mc, anthropicStatus(ev.Error.Type), ev.Error.Type+": "+ev.Error.Message)
			}
			return false, streamError(mc, 0, string(e.data))
		}
		return false, nil
	})
	if err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, streamError(mc, 0, "the stream ended before message_stop")
		}
		return nil, err
	}
	idx := make([]int, 0, len(blocks))
	for i := range blocks {
		idx = append(idx, i)
	}
	sort.Ints(idx)
	var text strings.Builder
	for _, i := range idx {
		b := blocks[i]
		switch b.typ {
		case "text":
			text.WriteString(b.text.String())
		case "tool_use":
			in := b.input.String()
			if strings.TrimSpace(in) == "" && len(b.startInput) > 0 {
				in = string(b.startInput)
			}
			a := args(in)
			if !json.Valid(a) {
				return nil, streamError(mc, 0, fmt.Sprintf("tool_use %q: input is not JSON", b.name))
			}
			out.Message.ToolCalls = append(out.Message.ToolCalls, abi.ToolCall{ID: b.id, Name: b.name, Arguments: a})
		}
	}
	out.Message.Content = text.String()
	if out.StopReason == "" {
		out.StopReason = abi.StopEndTurn
	}
	return out, nil
}

// anthropicWhole reads a Messages reply a server sent unstreamed.
func anthropicWhole(r io.Reader, mc *modelCall) (*abi.ModelResponse, error) {
	var m struct {
		Model      string    `json:"model"`
		Content    []anBlock `json:"content"`
		StopReason string    `json:"stop_reason"`
		Usage      anUsage   `json:"usage"`
	}
	if err := json.NewDecoder(r).Decode(&m); err != nil {
		if errors.Is(err, errStreamTooLarge) {
			return nil, err
		}
		return nil, streamError(mc, 0, "the response is not JSON: "+err.Error())
	}
	out := &abi.ModelResponse{Model: m.Model, StopReason: m.StopReason, Message: abi.ModelMessage{Role: abi.RoleAssistant},
		Usage: abi.Usage{InputTokens: m.Usage.InputTokens, OutputTokens: m.Usage.OutputTokens}}
	var text strings.Builder
	for _, b := range m.Content {
		switch b.Type {
		case "text":
			text.WriteString(b.Text)
		case "tool_use":
			out.Message.ToolCalls = append(out.Message.ToolCalls, abi.ToolCall{ID: b.ID, Name: b.Name, Arguments: args(string(b.Input))})
		}
	}
	out.Message.Content = text.String()
	if mc.opts.OnDelta != nil && out.Message.Content != "" {
		mc.opts.OnDelta(out.Message.Content)
	}
	if out.StopReason == "" {
		out.StopReason = abi.StopEndTurn
	}
	return out, nil
}
