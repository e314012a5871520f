package abi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
)

// Host calls: the one way a running turn reaches the outside world
// (abi/README.md "Host calls", docs/DESIGN.md invariants 12 and 13). The
// worker sends a CallRequest; the host checks it against the agent's
// capabilities, fills secrets, performs it, records it in the event's
// journal under the attempt's fences, and answers with a CallResult. The
// same JSON travels over every worker kind: the wasm import paddock.call,
// the plugin channel and the fabric's request lane.

// Limits of the host-call contract, in bytes.
const (
	// MaxCallRequestBytes bounds an encoded CallRequest.
	MaxCallRequestBytes = 4 << 20
	// MaxCallResultBytes bounds an encoded CallResult (hosts cap response
	// bodies lower by capability; this is the contract's ceiling).
	MaxCallResultBytes = 8 << 20
)

// CallKind names what a host call does.
type CallKind string

const (
	// CallKindHTTP is an outbound HTTP request to an allowed destination.
	CallKindHTTP CallKind = "http"
	// CallKindModel is a provider-neutral chat call to a named model
	// endpoint.
	CallKindModel CallKind = "model"
	// CallKindEmit sends a Chunk of the turn's output to the session
	// stream (abi/stream.go). It is not journaled and needs no capability.
	CallKindEmit CallKind = "emit"
)

// CallRequest is one host call. Exactly the field of its Kind is set.
type CallRequest struct {
	Kind  CallKind      `json:"kind"`
	HTTP  *HTTPRequest  `json:"http,omitempty"`
	Model *ModelRequest `json:"model,omitempty"`
	Emit  *Chunk        `json:"emit,omitempty"`
}

// HTTPRequest is an outbound HTTP request. Header values may contain
// secret placeholders "{{secret:NAME}}", which the host replaces with the
// secret's value after the destination check, for secrets the agent was
// granted; the agent never sees the value.
type HTTPRequest struct {
	// Method is the HTTP method, upper case; default GET.
	Method string `json:"method,omitempty"`
	// URL is an absolute http or https URL.
	URL string `json:"url"`
	// Headers are request headers, one value each. Names and values
	// must not contain CR, LF or NUL.
	Headers map[string]string `json:"headers,omitempty"`
	// Body is the request body (base64 in JSON).
	Body []byte `json:"body,omitempty"`
}

// HTTPResponse is the answer to an HTTPRequest, after redirects (followed
// only to allowed destinations).
type HTTPResponse struct {
	Status int `json:"status"`
	// Headers are the response headers, multiple values joined by ", ".
	Headers map[string]string `json:"headers,omitempty"`
	// Body is the response body (base64 in JSON), at most the agent's
	// response-bytes capability.
	Body []byte `json:"body,omitempty"`
}

// ModelRequest is a provider-neutral chat call. The host translates it for
// the endpoint's provider (OpenAI-compatible chat completions, or
// Anthropic's Messages API).
type ModelRequest struct {
	// Endpoint names a model endpoint the agent's capabilities grant.
	Endpoint string `json:"endpoint"`
	// Model is one of the endpoint's models; empty means its first.
	Model string `json:"model,omitempty"`
	// Messages are the conversation, oldest first: roles system, user,
	// assistant (with ToolCalls when it asked for tools) and tool (with
	// ToolCallID, the answer to one tool call).
	Messages []ModelMessage `json:"messages"`
	// Tools the model may call.
	Tools []ModelTool `json:"tools,omitempty"`
	// MaxTokens caps the reply's tokens; 0 means the endpoint's default.
	MaxTokens int `json:"max_tokens,omitempty"`
	// Temperature, when set, is passed to the provider.
	Temperature *float64 `json:"temperature,omitempty"`
	// Stop sequences end the reply when generated.
	Stop []string `json:"stop,omitempty"`
}

// ModelMessage is one message of a model conversation.
type ModelMessage struct {
	// Role is system, user, assistant or tool.
	Role    string `json:"role"`
	Content string `json:"content,omitempty"`
	// ToolCalls are the tools an assistant message asked for.
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
	// ToolCallID is the id of the ToolCall a tool message answers.
	ToolCallID string `json:"tool_call_id,omitempty"`
}

// ToolCall is a model's request to run a tool.
type ToolCall struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	// Arguments is a JSON object (the tool's parameters).
	Arguments json.RawMessage `json:"arguments"`
}

// Validate checks a tool call: an id, a name, and arguments that are a
// JSON object.
func (tc ToolCall) Validate() error {
	if tc.ID == "" {
		return errors.New("id is empty")
	}
	if tc.Name == "" {
		return errors.New("name is empty")
	}
	var args map[string]json.RawMessage
	if err := json.Unmarshal(tc.Arguments, &args); err != nil || args == nil {
		return errors.New("arguments must be a JSON object")
	}
	return nil
}

// ModelTool is a tool the model may call.
type ModelTool struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	// Parameters is the JSON Schema of the tool's arguments (an object).
	Parameters json.RawMessage `json:"parameters,omitempty"`
}

// Stop reasons of a ModelResponse (the provider's, mapped).
const (
	StopEndTurn      = "end_turn"
	StopToolUse      = "tool_use"
	StopMaxTokens    = "max_tokens"
	StopStopSequence = "stop_sequence"
)

// ModelResponse is a model's reply.
type ModelResponse struct {
	// Message is the assistant's message: its text and/or tool calls.
	Message ModelMessage `json:"message"`
	// StopReason is end_turn, tool_use, max_tokens or stop_sequence (or
	// the provider's own word when it has no equivalent).
	StopReason string `json:"stop_reason"`
	// Model is the model that answered, as the provider named it.
	Model string `json:"model,omitempty"`
	Usage Usage  `json:"usage"`
}

// Usage counts a model call's tokens.
type Usage struct {
	InputTokens  int64 `json:"input_tokens"`
	OutputTokens int64 `json:"output_tokens"`
}

// CallResult is the host's answer to a CallRequest: the response of its
// kind, or Error. It is never a trap: a refused or failed call is an
// Error the agent can handle.
type CallResult struct {
	// Seq is the call's sequence number within the turn's event, from 1.
	Seq   int            `json:"seq"`
	HTTP  *HTTPResponse  `json:"http,omitempty"`
	Model *ModelResponse `json:"model,omitempty"`
	Error *CallError     `json:"error,omitempty"`
	// Replayed: the result was recorded by an earlier attempt of this
	// event and returned without sending the request again.
	Replayed bool `json:"replayed,omitempty"`
}

// CallErrorCode says why a host call gave no response.
type CallErrorCode string

const (
	// CallDenied: the agent's capabilities do not allow the call
	// (destination, method, endpoint, model, secret, or a limit), or an
	// approver did not approve it.
	CallDenied CallErrorCode = "denied"
	// CallNotConfigured: the host has no such endpoint or secret, or this
	// turn's worker has no host-call channel.
	CallNotConfigured CallErrorCode = "not_configured"
	// CallTimeout: the call's or the turn's deadline passed.
	CallTimeout CallErrorCode = "timeout"
	// CallTooLarge: the request or the response exceeds a size cap.
	CallTooLarge CallErrorCode = "too_large"
	// CallUpstream: the destination failed (Status holds its HTTP status,
	// 0 for a connection failure).
	CallUpstream CallErrorCode = "upstream"
	// CallInvalid: the request is malformed (the message names the field).
	CallInvalid CallErrorCode = "invalid_request"
	// CallCancelled: the turn was cancelled or its attempt lost its fence
	// (the attempt's result will not commit).
	CallCancelled CallErrorCode = "cancelled"
)

// CallError is a host call's failure. It implements error.
type CallError struct {
	Code CallErrorCode `json:"code"`
	// Message explains, naming what was wrong; it never holds a secret.
	Message string `json:"message"`
	// Status is the upstream HTTP status for CallUpstream.
	Status int `json:"status,omitempty"`
	// Reason refines CallDenied: destination, private_address, method,
	// endpoint, model, secret, calls_per_turn, response_bytes_per_turn,
	// tokens_per_turn, tokens_per_day, approval (an approver rejected the
	// call or its approval expired; Message holds the approver's reason).
	Reason string `json:"reason,omitempty"`
}

func (e *CallError) Error() string {
	s := fmt.Sprintf("host call %s: %s", e.Code, e.Message)
	if e.Status != 0 {
		s += fmt.Sprintf(" (status %d)", e.Status)
	}
	return s
}

// Caller performs host calls for the turn running under a context. The
// host makes one per attempt (it numbers the calls, checks capabilities
// and keeps the journal); a worker kind that runs the turn elsewhere
// forwards each call to it. Call blocks until the result is known or ctx
// ends; it never returns nil and never panics on bad input.
type Caller interface {
	Call(ctx context.Context, req *CallRequest) *CallResult
}

// callerKey is the context key of WithCaller.
type callerKey struct{}

// WithCaller returns a copy of ctx whose turn makes host calls through c.
// It is how every worker kind reaches the host's caller, as WithSteers is
// for steers: the controller sets it, each worker kind's transport reads
// it with CallerOf and forwards its guest's calls.
func WithCaller(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// CallerOf returns ctx's Caller, nil if none.
func CallerOf(ctx context.Context) Caller {
	c, _ := ctx.Value(callerKey{}).(Caller)
	return c
}

// NoCaller is the result of a host call made where no Caller is set.
func NoCaller() *CallResult {
	return &CallResult{Error: &CallError{Code: CallNotConfigured,
		Message: "this turn has no host-call channel (the host or worker does not serve host calls)"}}
}

// Call makes a host call through ctx's Caller (NoCaller's result without
// one). Agents use CallHTTP and CallModel.
func Call(ctx context.Context, req *CallRequest) *CallResult {
	c := CallerOf(ctx)
	if c == nil {
		return NoCaller()
	}
	res := c.Call(ctx, req)
	if res == nil {
		return &CallResult{Error: &CallError{Code: CallUpstream, Message: "the host call channel returned no result"}}
	}
	return res
}

// CallHTTP makes an http host call under ctx (a turn's context, in any
// worker kind's SDK). A refused or failed call returns a *CallError; a
// response with any status, 4xx and 5xx included, is a response.
func CallHTTP(ctx context.Context, req *HTTPRequest) (*HTTPResponse, error) {
	res := Call(ctx, &CallRequest{Kind: CallKindHTTP, HTTP: req})
	if res.Error != nil {
		return nil, res.Error
	}
	if res.HTTP == nil {
		return nil, &CallError{Code: CallUpstream, Message: "http call result has no response"}
	}
	return res.HTTP, nil
}

// CallModel makes a model host call under ctx. A refused or failed call
// returns a *CallError (errors.As).
func CallModel(ctx context.Context, req *ModelRequest) (*ModelResponse, error) {
	res := Call(ctx, &CallRequest{Kind: CallKindModel, Model: req})
	if res.Error != nil {
		return nil, res.Error
	}
	if res.Model == nil {
		return nil, &CallError{Code: CallUpstream, Message: "model call result has no response"}
	}
	return res.Model, nil
}

// Validate checks a CallRequest's shape (not its permission): a known
// kind with exactly its field set, and the fields each kind requires. The
// error names the field.
func (r *CallRequest) Validate() error {
	if r == nil {
		return errors.New("call request is null")
	}
	switch r.Kind {
	case CallKindEmit:
		if r.HTTP != nil || r.Model != nil {
			return errors.New(`kind "emit" needs "emit" and no "http" or "model"`)
		}
		return r.Emit.Validate()
	case CallKindHTTP:
		if r.HTTP == nil || r.Model != nil || r.Emit != nil {
			return errors.New(`kind "http" needs "http" and no "model" or "emit"`)
		}
		if r.HTTP.URL == "" {
			return errors.New("http.url is empty")
		}
	case CallKindModel:
		if r.Model == nil || r.HTTP != nil || r.Emit != nil {
			return errors.New(`kind "model" needs "model" and no "http" or "emit"`)
		}
		if r.Model.Endpoint == "" {
			return errors.New("model.endpoint is empty")
		}
		if len(r.Model.Messages) == 0 {
			return errors.New("model.messages is empty")
		}
		for i, m := range r.Model.Messages {
			switch m.Role {
			case RoleSystem, RoleUser, RoleAssistant, RoleTool:
			default:
				return fmt.Errorf("model.messages[%d].role %q: want system, user, assistant or tool", i, m.Role)
			}
			if m.Role == RoleTool && m.ToolCallID == "" {
				return fmt.Errorf("model.messages[%d]: a tool message needs tool_call_id", i)
			}
			for j, tc := range m.ToolCalls {
				if err := tc.Validate(); err != nil {
					return fmt.Errorf("model.messages[%d].tool_calls[%d]: %w", i, j, err)
				}
			}
		}
		for i, t := range r.Model.Tools {
			if t.Name == "" {
				return fmt.Errorf("model.tools[%d].name is empty", i)
			}
		}
	default:
		return fmt.Errorf("kind %q: want http, model or emit", r.Kind)
	}
	return nil
}
