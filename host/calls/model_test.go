package calls

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/paddock-dev/paddock/abi"
)

func TestOpenAIRoundTripWithToolLoop(t *testing.T) {
	f := newFake(t, false,
		reply{events: []string{
			`{"id":"c1","model":"gpt-test","choices":[{"index":0,"delta":{"role":"assistant","content":"Let me "}}]}`,
			`{"id":"c1","model":"gpt-test","choices":[{"index":0,"delta":{"content":"look."}}]}`,
			`{"id":"c1","model":"gpt-test","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"weather","arguments":""}}]}}]}`,
			`{"id":"c1","model":"gpt-test","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\":"}}]}}]}`,
			`{"id":"c1","model":"gpt-test","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"Paris\"}"}}]}}]}`,
			`{"id":"c1","model":"gpt-test","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`,
			`{"id":"c1","model":"gpt-test","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":7,"total_tokens":19}}`,
		}},
		reply{events: []string{
			`{"id":"c2","model":"gpt-test","choices":[{"index":0,"delta":{"content":"Sunny "}}]}`,
			`{"id":"c2","model":"gpt-test","choices":[{"index":0,"delta":{"content":"in Paris."},"finish_reason":"stop"}]}`,
			`{"id":"c2","model":"gpt-test","choices":[],"usage":{"prompt_tokens":30,"completion_tokens":4}}`,
		}},
	)
	x, _ := testExec(t, Config{Endpoints: map[string]Endpoint{
		"oa": {Provider: ProviderOpenAI, BaseURL: f.URL + "/v1", Models: []string{"gpt-test", "gpt-big"}, Secret: "api_key", MaxTokens: 256},
	}}, env{"API_KEY": "sk-test-123"})
	caps := Capabilities{Models: []string{"oa"}}
	var deltas []string
	budget := NewBudget(Limits{}, nil)
	req := modelReq("oa", "", abi.ModelMessage{Role: abi.RoleSystem, Content: "Be brief."}, abi.ModelMessage{Role: abi.RoleUser, Content: "Weather in Paris?"})
	req.Model.Tools = []abi.ModelTool{{Name: "weather", Description: "Weather of a city", Parameters: json.RawMessage(`{"type":"object","properties":{"city":{"type":"string"}}}`)}}
	out := x.Do(context.Background(), "agent1", caps, req, CallOptions{Budget: budget, IdempotencyKey: "ev1-1", OnDelta: func(s string) { deltas = append(deltas, s) }})
	wantOK(t, out)
	m := out.Result.Model
	if m.StopReason != abi.StopToolUse || m.Message.Content != "Let me look." || len(m.Message.ToolCalls) != 1 {
		t.Fatalf("reply = %+v", m)
	}
	tc := m.Message.ToolCalls[0]
	if tc.ID != "call_1" || tc.Name != "weather" || string(tc.Arguments) != `{"city":"Paris"}` {
		t.Errorf("tool call = %+v (%s)", tc, tc.Arguments)
	}
	if m.Usage != (abi.Usage{InputTokens: 12, OutputTokens: 7}) || out.Usage != m.Usage || m.Model != "gpt-test" {
		t.Errorf("usage %+v model %q", m.Usage, m.Model)
	}
	// Deltas are held back while they could end in a split secret: their
	// text is the reply's, their boundaries are the scrubber's.
	if strings.Join(deltas, "") != "Let me look." {
		t.Errorf("deltas = %q", deltas)
	}
	if out.Destination != "model oa/gpt-test" || out.Status != 200 {
		t.Errorf("destination %q status %d", out.Destination, out.Status)
	}

	// The tool loop: the assistant's tool call and the tool's answer go back.
	req2 := modelReq("oa", "gpt-test",
		abi.ModelMessage{Role: abi.RoleUser, Content: "Weather in Paris?"},
		m.Message,
		abi.ModelMessage{Role: abi.RoleTool, ToolCallID: "call_1", Content: "sunny, 24C"})
	out2 := x.Do(context.Background(), "agent1", caps, req2, CallOptions{Budget: budget, IdempotencyKey: "ev1-2"})
	wantOK(t, out2)
	if r := out2.Result.Model; r.StopReason != abi.StopEndTurn || r.Message.Content != "Sunny in Paris." || len(r.Message.ToolCalls) != 0 {
		t.Errorf("second reply = %+v", r)
	}
	if budget.Tokens() != 12+7+30+4 || budget.Calls() != 2 {
		t.Errorf("budget tokens %d calls %d", budget.Tokens(), budget.Calls())
	}

	reqs := f.requests()
	if len(reqs) != 2 {
		t.Fatalf("%d requests", len(reqs))
	}
	h := reqs[0].header
	if h.Get("Authorization") != "Bearer sk-test-123" || h.Get("Idempotency-Key") != IdempotencyHeader("ev1-1") || !strings.HasPrefix(h.Get("Idempotency-Key"), "paddock-") {
		t.Errorf("headers = %v", h)
	}
	if reqs[1].header.Get("Idempotency-Key") == h.Get("Idempotency-Key") {
		t.Error("two calls share an idempotency key")
	}
	b := reqs[0].body
	if b["model"] != "gpt-test" || b["stream"] != true || b["max_tokens"] != float64(256) {
		t.Errorf("body = %s", reqs[0].raw)
	}
	if so, _ := b["stream_options"].(map[string]any); so["include_usage"] != true {
		t.Errorf("stream_options = %v", b["stream_options"])
	}
	if tools, _ := b["tools"].([]any); len(tools) != 1 || tools[0].(map[string]any)["type"] != "function" {
		t.Errorf("tools = %v", b["tools"])
	}
	msgs := reqs[1].body["messages"].([]any)
	asst := msgs[1].(map[string]any)
	calls := asst["tool_calls"].([]any)
	fn := calls[0].(map[string]any)["function"].(map[string]any)
	if asst["role"] != "assistant" || calls[0].(map[string]any)["id"] != "call_1" || fn["name"] != "weather" || fn["arguments"] != `{"city":"Paris"}` {
		t.Errorf("assistant message = %v", asst)
	}
	if tool := msgs[2].(map[string]any); tool["role"] != "tool" || tool["tool_call_id"] != "call_1" || tool["content"] != "sunny, 24C" {
		t.Errorf("tool message = %v", tool)
	}
}

func TestAnthropicRoundTripWithToolLoop(t *testing.T) {
	f := newFake(t, true,
		reply{events: []string{
			"message_start\n" + `{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-test","content":[],"stop_reason":null,"usage":{"input_tokens":25,"output_tokens":1}}}`,
			"content_block_start\n" + `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
			"ping\n" + `{"type":"ping"}`,
			"content_block_delta\n" + `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Checking"}}`,
			"content_block_delta\n" + `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" now."}}`,
			"content_block_stop\n" + `{"type":"content_block_stop","index":0}`,
			"content_block_start\n" + `{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"toolu_1","name":"weather","input":{}}}`,
			"content_block_delta\n" + `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":""}}`,
			"content_block_delta\n" + `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"city\": \"Par"}}`,
			"content_block_delta\n" + `{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"is\"}"}}`,
			"content_block_stop\n" + `{"type":"content_block_stop","index":1}`,
			"message_delta\n" + `{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":40}}`,
			"message_stop\n" + `{"type":"message_stop"}`,
		}},
		reply{events: []string{
			"message_start\n" + `{"type":"message_start","message":{"id":"msg_2","model":"claude-test","usage":{"input_tokens":80,"output_tokens":1}}}`,
			"content_block_start\n" + `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
			"content_block_delta\n" + `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Sunny."}}`,
			"content_block_stop\n" + `{"type":"content_block_stop","index":0}`,
			"message_delta\n" + `{"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"output_tokens":3}}`,
			"message_stop\n" + `{"type":"message_stop"}`,
		}},
	)
	x, _ := testExec(t, Config{Endpoints: map[string]Endpoint{
		"an": {Provider: ProviderAnthropic, BaseURL: f.URL, Models: []string{"claude-test"}, Secret: "api_key"},
	}}, env{"API_KEY": "sk-ant-xyz"})
	caps := Capabilities{Models: []string{"an"}}
	var deltas []string
	req := modelReq("an", "", abi.ModelMessage{Role: abi.RoleSystem, Content: "Be brief."}, abi.ModelMessage{Role: abi.RoleUser, Content: "Weather in Paris?"})
	req.Model.Tools = []abi.ModelTool{{Name: "weather", Parameters: json.RawMessage(`{"type":"object"}`)}}
	req.Model.Stop = []string{"END"}
	out := x.Do(context.Background(), "a", caps, req, CallOptions{IdempotencyKey: "ev-1", OnDelta: func(s string) { deltas = append(deltas, s) }})
	wantOK(t, out)
	m := out.Result.Model
	if m.StopReason != abi.StopToolUse || m.Message.Content != "Checking now." || len(m.Message.ToolCalls) != 1 || m.Model != "claude-test" {
		t.Fatalf("reply = %+v", m)
	}
	if tc := m.Message.ToolCalls[0]; tc.ID != "toolu_1" || tc.Name != "weather" || string(tc.Arguments) != `{"city": "Paris"}` {
		t.Errorf("tool call = %+v (%s)", tc, tc.Arguments)
	}
	if m.Usage != (abi.Usage{InputTokens: 25, OutputTokens: 40}) {
		t.Errorf("usage = %+v", m.Usage)
	}
	if strings.Join(deltas, "") != "Checking now." {
		t.Errorf("deltas = %q", deltas)
	}
	req2 := modelReq("an", "claude-test",
		abi.ModelMessage{Role: abi.RoleSystem, Content: "Be brief."},
		abi.ModelMessage{Role: abi.RoleUser, Content: "Weather in Paris?"},
		m.Message,
		abi.ModelMessage{Role: abi.RoleTool, ToolCallID: "toolu_1", Content: "sunny"},
		abi.ModelMessage{Role: abi.RoleUser, Content: "Thanks"})
	req2.Model.MaxTokens = 3
	out2 := x.Do(context.Background(), "a", caps, req2, CallOptions{})
	wantOK(t, out2)
	if r := out2.Result.Model; r.StopReason != abi.StopMaxTokens || r.Message.Content != "Sunny." {
		t.Errorf("second reply = %+v", r)
	}

	reqs := f.requests()
	h := reqs[0].header
	if h.Get("x-api-key") != "sk-ant-xyz" || h.Get("anthropic-version") != AnthropicVersion || h.Get("Idempotency-Key") != IdempotencyHeader("ev-1") || h.Get("Authorization") != "" {
		t.Errorf("headers = %v", h)
	}
	b := reqs[0].body
	if b["system"] != "Be brief." || b["stream"] != true || b["max_tokens"] != float64(DefaultMaxTokens) || b["model"] != "claude-test" {
		t.Errorf("body = %s", reqs[0].raw)
	}
	if ss, _ := b["stop_sequences"].([]any); len(ss) != 1 || ss[0] != "END" {
		t.Errorf("stop_sequences = %v", b["stop_sequences"])
	}
	if tools := b["tools"].([]any); tools[0].(map[string]any)["input_schema"] == nil {
		t.Errorf("tools = %v", tools)
	}
	msgs := reqs[1].body["messages"].([]any)
	if len(msgs) != 3 {
		t.Fatalf("messages = %s", reqs[1].raw)
	}
	asst := msgs[1].(map[string]any)
	blocks := asst["content"].([]any)
	tu := blocks[1].(map[string]any)
	if asst["role"] != "assistant" || tu["type"] != "tool_use" || tu["id"] != "toolu_1" || tu["input"].(map[string]any)["city"] != "Paris" {
		t.Errorf("assistant = %v", asst)
	}
	user := msgs[2].(map[string]any)
	ub := user["content"].([]any)
	tr := ub[0].(map[string]any)
	if user["role"] != "user" || len(ub) != 2 || tr["type"] != "tool_result" || tr["tool_use_id"] != "toolu_1" || tr["content"] != "sunny" || ub[1].(map[string]any)["text"] != "Thanks" {
		t.Errorf("tool result turn = %v", user)
	}
	if reqs[1].body["max_tokens"] != float64(3) {
		t.Errorf("max_tokens = %v", reqs[1].body["max_tokens"])
	}
}

func TestModelCallErrors(t *testing.T) {
	f := newFake(t, false,
		reply{status: 429, body: `{"error":{"message":"Rate limit reached","type":"rate_limit"}}`, header: map[string]string{"Retry-After": "3"}},
		reply{status: 500, body: `{"error":{"message":"boom"}}`},
		reply{delay: 2 * time.Second, events: []string{`{"choices":[{"index":0,"delta":{"content":"late"},"finish_reason":"stop"}]}`}},
		reply{hang: true, events: []string{`{"choices":[{"index":0,"delta":{"content":"never ends"}}]}`}},
		reply{events: []string{`{"choices":[{"index":0,"delta":{"content":"` + strings.Repeat("x", 4000) + `"}}]}`}},
	)
	an := newFake(t, true,
		reply{status: 529, body: `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`},
		reply{events: []string{
			"message_start\n" + `{"type":"message_start","message":{"model":"c","usage":{"input_tokens":1}}}`,
			"error\n" + `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}`,
		}},
	)
	x, _ := testExec(t, Config{
		Endpoints: map[string]Endpoint{
			"oa":      {Provider: ProviderOpenAI, BaseURL: f.URL + "/v1", Models: []string{"m1"}, Timeout: 300 * time.Millisecond},
			"an":      {Provider: ProviderAnthropic, BaseURL: an.URL, Models: []string{"c"}},
			"keyless": {Provider: ProviderOpenAI, BaseURL: f.URL + "/v1", Models: []string{"m1"}, Secret: "unset"},
			"nokey":   {Provider: ProviderOpenAI, BaseURL: f.URL + "/v1", Models: []string{"m1"}, Secret: "missing"},
		},
		MaxResponseBytes: 2048,
	}, env{})
	caps := Capabilities{Models: []string{"oa", "an", "keyless", "nokey", "ghost"}}
	user := abi.ModelMessage{Role: abi.RoleUser, Content: "hi"}
	ctx := context.Background()

	e := wantErr(t, x.Do(ctx, "a", caps, modelReq("oa", "", user), CallOptions{}), abi.CallUpstream, "")
	if e.Status != 429 || !strings.Contains(e.Message, "Rate limit reached") || !strings.Contains(e.Message, "retry after 3") {
		t.Errorf("429: %+v", e)
	}
	out := x.Do(ctx, "a", caps, modelReq("oa", "", user), CallOptions{})
	if e := wantErr(t, out, abi.CallUpstream, ""); e.Status != 500 || out.Status != 500 {
		t.Errorf("500: %+v", e)
	}
	start := time.Now()
	wantErr(t, x.Do(ctx, "a", caps, modelReq("oa", "", user), CallOptions{}), abi.CallTimeout, "")
	wantErr(t, x.Do(ctx, "a", caps, modelReq("oa", "", user), CallOptions{}), abi.CallTimeout, "")
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("two 300ms timeouts took %v", d)
	}
	wantErr(t, x.Do(ctx, "a", caps, modelReq("oa", "", user), CallOptions{}), abi.CallTooLarge, "")
	if e := wantErr(t, x.Do(ctx, "a", caps, modelReq("an", "", user), CallOptions{}), abi.CallUpstream, ""); e.Status != 529 {
		t.Errorf("anthropic 529: %+v", e)
	}
	if e := wantErr(t, x.Do(ctx, "a", caps, modelReq("an", "", user), CallOptions{}), abi.CallUpstream, ""); e.Status != 529 || !strings.Contains(e.Message, "Overloaded") {
		t.Errorf("anthropic error event: %+v", e)
	}

	// Refusals, before any request.
	n := len(f.requests())
	wantErr(t, x.Do(ctx, "a", caps, modelReq("oa", "gpt-other", user), CallOptions{}), abi.CallDenied, ReasonModel)
	wantErr(t, x.Do(ctx, "a", Capabilities{Models: []string{"an"}}, modelReq("oa", "", user), CallOptions{}), abi.CallDenied, ReasonEndpoint)
	wantErr(t, x.Do(ctx, "a", Capabilities{}, modelReq("oa", "", user), CallOptions{}), abi.CallDenied, ReasonEndpoint)
	wantErr(t, x.Do(ctx, "a", caps, modelReq("ghost", "", user), CallOptions{}), abi.CallNotConfigured, "")
	wantErr(t, x.Do(ctx, "a", caps, modelReq("keyless", "", user), CallOptions{}), abi.CallNotConfigured, "")
	wantErr(t, x.Do(ctx, "a", caps, modelReq("nokey", "", user), CallOptions{}), abi.CallNotConfigured, "")
	wantErr(t, x.Do(ctx, "a", caps, &abi.CallRequest{Kind: abi.CallKindModel, Model: &abi.ModelRequest{Endpoint: "oa"}}, CallOptions{}), abi.CallInvalid, "")
	if len(f.requests()) != n {
		t.Errorf("refused calls reached the endpoint: %d requests, want %d", len(f.requests()), n)
	}

	// A call after the turn's deadline, and in a cancelled turn.
	dctx, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancel()
	wantErr(t, x.Do(dctx, "a", caps, modelReq("oa", "", user), CallOptions{}), abi.CallTimeout, "")
	cctx, cancel2 := context.WithCancel(ctx)
	cancel2()
	wantErr(t, x.Do(cctx, "a", caps, modelReq("oa", "", user), CallOptions{}), abi.CallCancelled, "")
	if len(f.requests()) != n {
		t.Error("a call after the deadline reached the endpoint")
	}
}

func TestModelBudgetLimits(t *testing.T) {
	usage := `{"choices":[],"usage":{"prompt_tokens":60,"completion_tokens":40}}`
	ok := reply{events: []string{`{"choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":"stop"}]}`, usage}}
	f := newFake(t, false, ok, ok, ok, ok)
	x, _ := testExec(t, Config{Endpoints: map[string]Endpoint{
		"oa": {Provider: ProviderOpenAI, BaseURL: f.URL + "/v1", Models: []string{"m"}, MaxTokens: 1000},
	}}, env{})
	caps := Capabilities{Models: []string{"oa"}}
	user := abi.ModelMessage{Role: abi.RoleUser, Content: "hi"}
	ctx := context.Background()

	b := NewBudget(Limits{TokensPerTurn: 150}, nil)
	wantOK(t, x.Do(ctx, "a", caps, modelReq("oa", "", user), CallOptions{Budget: b}))
	wantOK(t, x.Do(ctx, "a", caps, modelReq("oa", "", user), CallOptions{Budget: b})) // 100 used < 150
	// 50 remain; the prompt ("hi") is estimated at 1 token.
	if got := f.requests()[1].body["max_tokens"]; got != float64(49) {
		t.Errorf("max_tokens clamped to the turn's remaining tokens less the prompt: %v, want 49", got)
	}
	wantErr(t, x.Do(ctx, "a", caps, modelReq("oa", "", user), CallOptions{Budget: b}), abi.CallDenied, ReasonTokensPerTurn)

	today := int64(0)
	day := NewBudget(Limits{TokensPerDay: 100}, func(context.Context) (int64, error) { return today, nil })
	wantOK(t, x.Do(ctx, "a", caps, modelReq("oa", "", user), CallOptions{Budget: day}))
	today = 100
	wantErr(t, x.Do(ctx, "a", caps, modelReq("oa", "", user), CallOptions{Budget: day}), abi.CallDenied, ReasonTokensPerDay)

	calls := NewBudget(Limits{CallsPerTurn: 1}, nil)
	wantOK(t, x.Do(ctx, "a", caps, modelReq("oa", "", user), CallOptions{Budget: calls}))
	wantErr(t, x.Do(ctx, "a", caps, modelReq("oa", "", user), CallOptions{Budget: calls}), abi.CallDenied, ReasonCallsPerTurn)
	if len(f.requests()) != 4 {
		t.Errorf("%d requests, want 4", len(f.requests()))
	}
}

// A model endpoint's redirect is not followed: its key goes nowhere else.
func TestModelEndpointRedirectNotFollowed(t *testing.T) {
	other := newFake(t, false, reply{events: []string{`{"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":"stop"}]}`}})
	redir := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+"/v1/chat/completions", http.StatusTemporaryRedirect)
	}))
	defer redir.Close()
	x, _ := testExec(t, Config{Endpoints: map[string]Endpoint{
		"an": {Provider: ProviderAnthropic, BaseURL: redir.URL, Models: []string{"c"}, Secret: "api_key"},
	}}, env{"API_KEY": "k-redirected"})
	out := x.Do(context.Background(), "a", Capabilities{Models: []string{"an"}}, modelReq("an", "", abi.ModelMessage{Role: abi.RoleUser, Content: "hi"}), CallOptions{})
	if e := wantErr(t, out, abi.CallUpstream, ""); e.Status != http.StatusTemporaryRedirect {
		t.Errorf("status %d", e.Status)
	}
	if len(other.requests()) != 0 {
		t.Error("the redirect was followed with the key")
	}
}

// TestModelToolCallThatIsNotAnObjectIsAnUpstreamError: a provider's tool
// call whose arguments are not a JSON object (or that has no id) would be
// refused when the agent sends the assistant message back: the call fails
// as upstream, naming it, and its tokens still count.
func TestModelToolCallThatIsNotAnObjectIsAnUpstreamError(t *testing.T) {
	f := newFake(t, false,
		reply{body: `{"choices":[{"index":0,"finish_reason":"tool_calls","message":{"role":"assistant","tool_calls":[{"id":"c1","type":"function","function":{"name":"t","arguments":"[1,2]"}}]}}],"usage":{"prompt_tokens":4,"completion_tokens":2}}`},
		reply{body: `{"choices":[{"index":0,"finish_reason":"tool_calls","message":{"role":"assistant","tool_calls":[{"type":"function","function":{"name":"t","arguments":"{}"}}]}}]}`},
	)
	x, _ := testExec(t, Config{Endpoints: map[string]Endpoint{"oa": {Provider: ProviderOpenAI, BaseURL: f.URL + "/v1", Models: []string{"m1"}}}}, env{})
	caps := Capabilities{Models: []string{"oa"}}
	user := abi.ModelMessage{Role: abi.RoleUser, Content: "hi"}
	out := x.Do(context.Background(), "a", caps, modelReq("oa", "", user), CallOptions{})
	if e := wantErr(t, out, abi.CallUpstream, ""); !strings.Contains(e.Message, "arguments must be a JSON object") || out.Usage.InputTokens != 4 {
		t.Errorf("non-object arguments: %+v, usage %+v", e, out.Usage)
	}
	if e := wantErr(t, x.Do(context.Background(), "a", caps, modelReq("oa", "", user), CallOptions{}), abi.CallUpstream, ""); !strings.Contains(e.Message, "id is empty") {
		t.Errorf("no id: %+v", e)
	}
}

// TestDeltasPassThroughWhenNoSecretIsWatched: an endpoint without a key
// (a local model) has no secret to hold deltas back for; each delta goes
// out as it came (found by the host's stream tests: the scrubber indexed
// one past the end when it held nothing back).
func TestDeltasPassThroughWhenNoSecretIsWatched(t *testing.T) {
	f := newFake(t, false, reply{events: []string{
		`{"id":"c1","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"}}]}`,
		`{"id":"c1","model":"m","choices":[{"index":0,"delta":{"content":"lo, wörld"}}]}`,
		`{"id":"c1","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`,
	}})
	x, _ := testExec(t, Config{Endpoints: map[string]Endpoint{
		"local": {Provider: ProviderOpenAI, BaseURL: f.URL + "/v1", Models: []string{"m"}},
	}}, env{})
	var deltas []string
	out := x.Do(context.Background(), "a", Capabilities{Models: []string{"local"}}, modelReq("local", "", abi.ModelMessage{Role: abi.RoleUser, Content: "hi"}),
		CallOptions{OnDelta: func(s string) { deltas = append(deltas, s) }})
	wantOK(t, out)
	if strings.Join(deltas, "|") != "Hel|lo, wörld" {
		t.Errorf("deltas = %q, want each as it came", deltas)
	}
}

// TestAnErrorBodyIsScrubbedBeforeItIsCut: an endpoint's plain-text error
// answer is quoted cut to 512 bytes; a key that the cut would split (here
// from byte 490 on) must not leave its first part in the message (found
// in review), nor may the cut split a character.
func TestAnErrorBodyIsScrubbedBeforeItIsCut(t *testing.T) {
	const key = "sk-PROVIDERSECRET-7d1e9"
	for _, at := range []int{480, 489, 500, 511} {
		body := strings.Repeat("x", at) + " " + key + " tail " + strings.Repeat("é", 400)
		f := newFake(t, false, reply{status: 500, body: body, header: map[string]string{"Content-Type": "text/plain"}})
		x, _ := testExec(t, Config{Endpoints: map[string]Endpoint{
			"oa": {Provider: ProviderOpenAI, BaseURL: f.URL + "/v1", Models: []string{"m1"}, Secret: "api_key"},
		}}, env{"API_KEY": key})
		e := wantErr(t, x.Do(context.Background(), "a", Capabilities{Models: []string{"oa"}},
			modelReq("oa", "", abi.ModelMessage{Role: abi.RoleUser, Content: "hi"}), CallOptions{}), abi.CallUpstream, "")
		for i := 4; i <= len(key); i++ {
			if strings.Contains(e.Message, key[:i]) {
				t.Errorf("key at byte %d: the message holds %q of the key: %q", at, key[:i], e.Message)
				break
			}
		}
		if !utf8.ValidString(e.Message) || !strings.Contains(e.Message, "answered 500") || !strings.HasSuffix(e.Message, "…") {
			t.Errorf("key at byte %d: message %q, want valid UTF-8 naming the status, cut with …", at, e.Message)
		}
		if at < 490 && !strings.Contains(e.Message, "[secret:api_key]") {
			t.Errorf("key at byte %d (within the quoted text): %q, want its placeholder", at, e.Message)
		}
	}
}
