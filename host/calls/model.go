package calls

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/paddock-dev/paddock/abi"
)

// Providers of model endpoints.
const (
	// ProviderOpenAI speaks OpenAI's chat completions (POST
	// <base_url>/chat/completions, streamed): OpenAI itself, Ollama, vLLM,
	// llama.cpp server, OpenRouter. base_url ends with the API's version
	// path, e.g. https://api.openai.com/v1 or http://127.0.0.1:11434/v1.
	ProviderOpenAI = "openai"
	// ProviderAnthropic speaks Anthropic's Messages API (POST
	// <base_url>/v1/messages, streamed); base_url is e.g.
	// https://api.anthropic.com.
	ProviderAnthropic = "anthropic"
)

// AnthropicVersion is the anthropic-version header sent to Messages API
// endpoints.
const AnthropicVersion = "2023-06-01"

// DefaultMaxTokens caps a reply when neither the request nor the endpoint
// says (Anthropic's API requires a cap).
const DefaultMaxTokens = 4096

// maxErrorBodyBytes bounds what is read of an upstream error response.
const maxErrorBodyBytes = 64 << 10

// Endpoint is a named model endpoint (config models:). Endpoints are
// operator-configured: the host reaches them directly (not through Egress
// and its private-address rule), so a local Ollama works.
type Endpoint struct {
	// Provider is ProviderOpenAI or ProviderAnthropic.
	Provider string
	// BaseURL is the provider's API root (see the Provider constants).
	BaseURL string
	// Models are the model names the endpoint may be asked for; the first
	// is the default.
	Models []string
	// Secret names the secret holding the API key; empty sends none (a
	// local server).
	Secret string
	// MaxTokens is the reply cap when a request gives none; 0 means
	// DefaultMaxTokens.
	MaxTokens int
	// Timeout bounds one call to this endpoint; 0 means the host's
	// host-call timeout.
	Timeout time.Duration
}

// CallOptions are per-call settings the integrator gives Executor.Do.
type CallOptions struct {
	// Budget is the attempt's budget (NewBudget, one per attempt); nil
	// means only this call's own caps apply and nothing is counted.
	Budget *Budget
	// IdempotencyKey identifies the call across attempts (the integrator
	// passes "<agent>-<event id>-<seq>-<request digest>": the same request
	// at the same place, never a different one); a model call sends an Idempotency-Key
	// header derived from it, so a provider that honours it does not bill
	// a retried call twice. Empty sends none.
	IdempotencyKey string
	// OnDelta, when set, receives a model reply's text as it streams, in
	// order, on the calling goroutine.
	OnDelta func(text string)
}

// IdempotencyHeader derives the Idempotency-Key header value from a
// caller's key: "paddock-" and the first 32 hex digits of its SHA-256.
func IdempotencyHeader(key string) string {
	sum := sha256.Sum256([]byte("paddock-host-call\x00" + key))
	return "paddock-" + hex.EncodeToString(sum[:16])
}

// modelCall is one resolved model call.
type modelCall struct {
	ep        Endpoint
	name      string
	model     string
	apiKey    string
	req       *abi.ModelRequest
	maxTokens int
	maxBytes  int64
	opts      CallOptions
	scrub     *scrubber
}

// doModel performs a resolved model call against its endpoint; it returns
// the response and the bytes read.
func doModel(ctx context.Context, client *http.Client, mc *modelCall) (*abi.ModelResponse, int64, error) {
	var (
		path string
		body any
	)
	switch mc.ep.Provider {
	case ProviderOpenAI:
		path, body = "/chat/completions", openaiRequest(mc)
	case ProviderAnthropic:
		path, body = "/v1/messages", anthropicRequest(mc)
	default:
		return nil, 0, callErr(abi.CallNotConfigured, "model endpoint %q: provider %q", mc.name, mc.ep.Provider)
	}
	raw, err := json.Marshal(body)
	if err != nil {
		return nil, 0, callErr(abi.CallInvalid, "model request: %v", err)
	}
	url := strings.TrimSuffix(mc.ep.BaseURL, "/") + path
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(raw))
	if err != nil {
		return nil, 0, callErr(abi.CallNotConfigured, "model endpoint %q: %s", mc.name, mc.scrub.str(err.Error()))
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "text/event-stream")
	hreq.Header.Set("User-Agent", "paddock-host-call")
	if mc.opts.IdempotencyKey != "" {
		hreq.Header.Set("Idempotency-Key", IdempotencyHeader(mc.opts.IdempotencyKey))
	}
	if mc.ep.Provider == ProviderAnthropic {
		hreq.Header.Set("anthropic-version", AnthropicVersion)
		if mc.apiKey != "" {
			hreq.Header.Set("x-api-key", mc.apiKey)
		}
	} else if mc.apiKey != "" {
		hreq.Header.Set("Authorization", "Bearer "+mc.apiKey)
	}
	resp, err := client.Do(hreq)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	cr := &cappedReader{r: resp.Body, max: mc.maxBytes}
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(io.LimitReader(cr, maxErrorBodyBytes))
		return nil, cr.n, upstreamError(mc, resp, b)
	}
	var out *abi.ModelResponse
	streamed := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	switch {
	case mc.ep.Provider == ProviderOpenAI && streamed:
		out, err = openaiStream(cr, mc)
	case mc.ep.Provider == ProviderOpenAI:
		out, err = openaiWhole(cr, mc)
	case streamed:
		out, err = anthropicStream(cr, mc)
	default:
		out, err = anthropicWhole(cr, mc)
	}
	if errors.Is(err, errStreamTooLarge) {
		return nil, cr.n, callErr(abi.CallTooLarge, "the model's response exceeds %d bytes", mc.maxBytes)
	}
	if err != nil {
		return nil, cr.n, err
	}
	if out.Model == "" {
		out.Model = mc.model
	}
	return out, cr.n, nil
}

// upstreamError maps a non-2xx answer, naming the provider's message.
func upstreamError(mc *modelCall, resp *http.Response, body []byte) *abi.CallError {
	var e struct {
		Error json.RawMessage `json:"error"`
	}
	msg := ""
	if json.Unmarshal(body, &e) == nil && len(e.Error) > 0 {
		var inner struct {
			Message string `json:"message"`
			Type    string `json:"type"`
		}
		if json.Unmarshal(e.Error, &inner) == nil && inner.Message != "" {
			msg = inner.Message
		} else {
			var s string
			if json.Unmarshal(e.Error, &s) == nil {
				msg = s
			}
		}
	}
	if msg == "" {
		// Scrubbed whole before it is cut: a key that the cut split would
		// keep its first part, which no longer matches the scrubber
		// (found in review: 22 of a key's 23 characters reached the
		// transcript, the journal and the log).
		msg = clipText(mc.scrub.str(strings.TrimSpace(string(body))), maxErrorTextBytes)
	}
	text := fmt.Sprintf("model endpoint %q answered %s", mc.name, resp.Status)
	if ra := resp.Header.Get("Retry-After"); ra != "" {
		text += " (retry after " + ra + ")"
	}
	if msg != "" {
		text += ": " + msg
	}
	return &abi.CallError{Code: abi.CallUpstream, Status: resp.StatusCode, Message: mc.scrub.str(text)}
}

// maxErrorTextBytes bounds the text of an error answer that is not the
// provider's JSON error, as the call's error message quotes it.
const maxErrorTextBytes = 512

// clipText cuts s to at most n bytes at a character boundary, marking the
// cut with "…". Cut only what is already scrubbed: a cut secret value
// escapes the scrubber.
func clipText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// model scrubs a model's reply of the endpoint's key: an endpoint (or a
// proxy in front of it) that echoes the credential in an answer must not
// hand it to the agent, the journal or the transcript (invariant 13). A
// tool call's arguments are scrubbed as raw JSON: the placeholder has no
// character JSON escapes, so a string holding the key stays valid.
func (s *scrubber) model(resp *abi.ModelResponse) {
	resp.Model = s.str(resp.Model)
	resp.StopReason = s.str(resp.StopReason)
	resp.Message.Content = s.str(resp.Message.Content)
	for i := range resp.Message.ToolCalls {
		tc := &resp.Message.ToolCalls[i]
		tc.ID, tc.Name = s.str(tc.ID), s.str(tc.Name)
		tc.Arguments = s.bytes(tc.Arguments)
	}
}

// streamError is an error event inside a stream.
func streamError(mc *modelCall, status int, msg string) *abi.CallError {
	return &abi.CallError{Code: abi.CallUpstream, Status: status,
		Message: mc.scrub.str(fmt.Sprintf("model endpoint %q: error in the stream: %s", mc.name, msg))}
}

// args returns a tool call's arguments as a JSON object ("{}" if empty).
func args(s string) json.RawMessage {
	if strings.TrimSpace(s) == "" {
		return json.RawMessage("{}")
	}
	return json.RawMessage(s)
}

// checkModel picks the model: the request's, or the endpoint's first.
func checkModel(name string, ep Endpoint, model string) (string, *abi.CallError) {
	if model == "" {
		if len(ep.Models) == 0 {
			return "", callErr(abi.CallNotConfigured, "model endpoint %q lists no models", name)
		}
		return ep.Models[0], nil
	}
	if !slices.Contains(ep.Models, model) {
		return "", denied(ReasonModel, "model %q is not one of endpoint %q's models", model, name)
	}
	return model, nil
}
