package calls

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"time"
	"unicode/utf8"

	"github.com/paddock-dev/paddock/abi"
)

// Config configures an Executor (built by the host from host/config).
type Config struct {
	// Endpoints are the named model endpoints (config models:).
	Endpoints map[string]Endpoint
	// Secrets resolves secret names; nil means no secret exists.
	Secrets *Secrets
	// Timeout bounds one call (host_calls.timeout); 0 means
	// DefaultTimeout. An endpoint's own Timeout wins for its calls.
	Timeout time.Duration
	// MaxResponseBytes caps one call's response (host_calls.
	// max_response_bytes); 0 means DefaultMaxResponseBytes. At most
	// MaxResponseBytesCeiling.
	MaxResponseBytes int64
	// Egress configures the outbound client of http calls.
	Egress EgressConfig
	// Metrics, when set, counts calls, denials and tokens.
	Metrics *Metrics
	// Logger receives one line per call (agent, kind, destination, result;
	// never a secret). Nil means slog.Default().
	Logger *slog.Logger
	// ModelClient is the client of model endpoints; nil means a client of
	// its own (no environment proxy, no redirects followed, so the API key
	// reaches only the configured endpoint). A client given here must keep
	// those properties; its own timeouts, if any, add to the call's.
	ModelClient *http.Client
}

// Executor performs host calls for every agent of a host. It is safe for
// concurrent use.
type Executor struct {
	endpoints map[string]Endpoint
	secrets   *Secrets
	timeout   time.Duration
	maxBytes  int64
	egress    *Egress
	metrics   *Metrics
	log       *slog.Logger
	model     *http.Client
}

// New returns an Executor. It refuses an endpoint with an unknown
// provider or a malformed base URL.
func New(cfg Config) (*Executor, error) {
	x := &Executor{endpoints: cfg.Endpoints, secrets: cfg.Secrets, timeout: cfg.Timeout, maxBytes: cfg.MaxResponseBytes,
		metrics: cfg.Metrics, log: cfg.Logger, model: cfg.ModelClient}
	if x.timeout <= 0 {
		x.timeout = DefaultTimeout
	}
	if x.maxBytes <= 0 {
		x.maxBytes = DefaultMaxResponseBytes
	}
	if x.maxBytes > MaxResponseBytesCeiling {
		return nil, fmt.Errorf("max response bytes %d: more than %d (base64 in a CallResult must fit abi.MaxCallResultBytes)", x.maxBytes, MaxResponseBytesCeiling)
	}
	if x.log == nil {
		x.log = slog.Default()
	}
	if cfg.Egress.Logger == nil {
		cfg.Egress.Logger = x.log
	}
	x.egress = NewEgress(cfg.Egress)
	if x.model == nil {
		x.model = &http.Client{
			Transport: &http.Transport{
				Proxy: nil, ForceAttemptHTTP2: true, MaxIdleConnsPerHost: 16,
				IdleConnTimeout: 90 * time.Second, TLSHandshakeTimeout: 15 * time.Second,
			},
			// A redirect is not followed: the API key (x-api-key survives
			// Go's cross-domain header stripping) goes only to the
			// configured endpoint (invariant 13); the 3xx is an upstream
			// error.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	for name, ep := range x.endpoints {
		if ep.Provider != ProviderOpenAI && ep.Provider != ProviderAnthropic {
			return nil, fmt.Errorf("model endpoint %q: provider %q: want openai or anthropic", name, ep.Provider)
		}
		u, err := url.Parse(ep.BaseURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("model endpoint %q: base_url %q: want an absolute http(s) URL", name, ep.BaseURL)
		}
		if len(ep.Models) == 0 {
			return nil, fmt.Errorf("model endpoint %q: list at least one model", name)
		}
	}
	return x, nil
}

// Egress returns the executor's outbound client.
func (x *Executor) Egress() *Egress { return x.egress }

// Outcome is the result of one host call, for the caller and the journal.
type Outcome struct {
	// Result is the call's result, without Seq (the journal numbers it).
	Result *abi.CallResult
	// Destination says where the call went, without secrets or query
	// strings: "GET https://api.example.com:443/path" or
	// "model openai-main/gpt-4o-mini".
	Destination string
	// Status is the HTTP status of the response (also of an upstream
	// error), 0 when none was received.
	Status int
	// Usage is a model call's tokens.
	Usage abi.Usage
	// ErrorCode is Result.Error's code, empty on success.
	ErrorCode abi.CallErrorCode
	// ResponseBytes are the response bytes read (counted by the Budget).
	ResponseBytes int64
}

// Do performs one host call of agent under ctx (the turn's context, whose
// deadline bounds the call): validation (req.Validate and the kind's
// rules), then the Budget counts the call (every valid call counts toward
// calls_per_turn, a denied one too, so an agent looping on refusals is
// bounded), then the capability check and the other limits, then the
// call. It never returns a nil Result and never panics on bad input.
func (x *Executor) Do(ctx context.Context, agent string, caps Capabilities, req *abi.CallRequest, opts CallOptions) Outcome {
	start := time.Now()
	out := x.do(ctx, caps, req, opts)
	kind := "invalid"
	if req != nil && (req.Kind == abi.CallKindHTTP || req.Kind == abi.CallKindModel) {
		kind = string(req.Kind)
	}
	result := "ok"
	if e := out.Result.Error; e != nil {
		out.ErrorCode = e.Code
		result = string(e.Code)
		if out.Status == 0 {
			out.Status = e.Status
		}
	}
	if x.metrics != nil {
		x.metrics.Calls.WithLabelValues(agent, kind, result).Inc()
		if e := out.Result.Error; e != nil && e.Code == abi.CallDenied {
			x.metrics.Denied.WithLabelValues(agent, e.Reason).Inc()
		}
		if out.Usage.InputTokens > 0 || out.Usage.OutputTokens > 0 {
			x.metrics.Tokens.WithLabelValues(agent, "input").Add(float64(out.Usage.InputTokens))
			x.metrics.Tokens.WithLabelValues(agent, "output").Add(float64(out.Usage.OutputTokens))
		}
	}
	attrs := []any{"agent", agent, "kind", kind, "destination", out.Destination, "result", result,
		"status", out.Status, "bytes", out.ResponseBytes, "duration", time.Since(start)}
	if e := out.Result.Error; e != nil {
		attrs = append(attrs, "reason", e.Reason, "error", e.Message)
	}
	x.log.InfoContext(ctx, "host call", attrs...)
	return out
}

func (x *Executor) do(ctx context.Context, caps Capabilities, req *abi.CallRequest, opts CallOptions) Outcome {
	fail := func(err error) Outcome {
		return Outcome{Result: &abi.CallResult{Error: asCallError(err)}}
	}
	if err := req.Validate(); err != nil {
		return fail(callErr(abi.CallInvalid, "%v", err))
	}
	if err := ctx.Err(); err != nil {
		return fail(ctxErr(ctx, err))
	}
	budget := opts.Budget
	if budget == nil {
		budget = NewBudget(Limits{}, nil)
	}
	switch req.Kind {
	case abi.CallKindHTTP:
		return x.doHTTP(ctx, caps, req.HTTP, budget)
	default:
		return x.doModel(ctx, caps, req.Model, opts, budget)
	}
}

func (x *Executor) doHTTP(ctx context.Context, caps Capabilities, r *abi.HTTPRequest, budget *Budget) Outcome {
	out := Outcome{Destination: httpDestination(r)}
	fail := func(err error) Outcome {
		out.Result = &abi.CallResult{Error: asCallError(err)}
		return out
	}
	if cerr := ValidateHTTP(r); cerr != nil {
		return fail(cerr)
	}
	if err := budget.beginCall(); err != nil {
		return fail(err)
	}
	maxBytes, reserved, err := budget.responseCap(x.maxBytes)
	if err != nil {
		return fail(err)
	}
	resp, n, err := x.egress.Do(ctx, HTTPCall{Caps: caps, Request: r, Secrets: x.secrets, MaxResponseBytes: maxBytes, Timeout: x.timeout})
	budget.settleResponseBytes(reserved, n)
	out.ResponseBytes = n
	if err != nil {
		return fail(err)
	}
	out.Status = resp.Status
	out.Result = &abi.CallResult{HTTP: resp}
	return out
}

// httpDestination is the method and URL without user info, query or
// fragment.
func httpDestination(r *abi.HTTPRequest) string {
	m := r.Method
	if m == "" {
		m = http.MethodGet
	}
	u, err := url.Parse(r.URL)
	if err != nil {
		return m + " (malformed URL)"
	}
	u.User, u.RawQuery, u.Fragment, u.RawFragment, u.ForceQuery = nil, "", "", "", false
	return m + " " + u.String()
}

func (x *Executor) doModel(ctx context.Context, caps Capabilities, r *abi.ModelRequest, opts CallOptions, budget *Budget) Outcome {
	out := Outcome{Destination: "model " + r.Endpoint}
	fail := func(err error) Outcome {
		out.Result = &abi.CallResult{Error: asCallError(err)}
		return out
	}
	if err := budget.beginCall(); err != nil {
		return fail(err)
	}
	if err := caps.CheckEndpoint(r.Endpoint); err != nil {
		return fail(err)
	}
	ep, ok := x.endpoints[r.Endpoint]
	if !ok {
		return fail(callErr(abi.CallNotConfigured, "model endpoint %q is not configured on this host", r.Endpoint))
	}
	model, cerr := checkModel(r.Endpoint, ep, r.Model)
	if cerr != nil {
		return fail(cerr)
	}
	out.Destination += "/" + model
	if r.MaxTokens < 0 {
		return fail(callErr(abi.CallInvalid, "model.max_tokens %d: must not be negative", r.MaxTokens))
	}
	tokenCap, err := budget.tokenCap(ctx)
	if err != nil {
		return fail(err)
	}
	maxBytes, reserved, err := budget.responseCap(x.maxBytes)
	if err != nil {
		return fail(err)
	}
	settled := false
	defer func() {
		if !settled { // refused before the request went out
			budget.settleResponseBytes(reserved, 0)
		}
	}()
	mc := &modelCall{ep: ep, name: r.Endpoint, model: model, req: r, maxBytes: maxBytes, opts: opts, scrub: &scrubber{}}
	if ep.Secret != "" {
		// An endpoint's key is the operator's (config models:), never an
		// agent's: it resolves in the default namespace whatever the
		// calling agent's (docs/DESIGN.md "Namespaces").
		key, err := x.secrets.Resolve(ctx, ep.Secret)
		if err != nil {
			return fail(callErr(abi.CallNotConfigured, "model endpoint %q: its API key: %v", r.Endpoint, err))
		}
		mc.apiKey = key
		mc.scrub.add(ep.Secret, key)
	}
	if opts.OnDelta != nil {
		// Deltas are scrubbed like the reply, holding back a tail that
		// could be the start of a secret split across deltas.
		ds := &deltaScrubber{scrub: mc.scrub, out: opts.OnDelta}
		mc.opts.OnDelta = ds.write
		defer ds.flush()
	}
	mc.maxTokens = r.MaxTokens
	if mc.maxTokens == 0 {
		mc.maxTokens = ep.MaxTokens
	}
	if mc.maxTokens == 0 {
		mc.maxTokens = DefaultMaxTokens
	}
	if ep.MaxTokens > 0 && mc.maxTokens > ep.MaxTokens {
		// The endpoint's max_tokens caps what an agent may ask for.
		mc.maxTokens = ep.MaxTokens
	}
	// The prompt is paid too: a call whose estimated input alone would
	// pass the turn's or the day's tokens is refused before it is sent,
	// and the reply gets what remains.
	est := estimateInputTokens(r)
	if tokenCap > 0 {
		if est >= tokenCap {
			return fail(denied(budget.tokenReason(), "the prompt is about %d tokens and %d remain (limits.tokens_per_turn / tokens_per_day)", est, tokenCap))
		}
		if rem := tokenCap - est; int64(mc.maxTokens) > rem {
			mc.maxTokens = int(rem)
		}
	}
	timeout := ep.Timeout
	if timeout <= 0 {
		timeout = x.timeout
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, n, err := doModel(cctx, x.model, mc)
	budget.settleResponseBytes(reserved, n)
	settled = true
	out.ResponseBytes = n
	if err != nil {
		return fail(mapErr(ctx, cctx, err, mc.scrub))
	}
	mc.scrub.model(resp)
	// A provider's negative count would lower the turn's and the day's
	// sums (and the journal refuses it: the paid call would go unrecorded).
	resp.Usage.InputTokens, resp.Usage.OutputTokens = max(resp.Usage.InputTokens, 0), max(resp.Usage.OutputTokens, 0)
	if resp.Usage.InputTokens == 0 && resp.Usage.OutputTokens == 0 {
		// The provider reported no usage (no include_usage support, or a
		// proxy that drops it): charge an estimate — the prompt and the
		// whole reply allowance — so the limits still bind.
		resp.Usage = abi.Usage{InputTokens: est, OutputTokens: int64(mc.maxTokens)}
	}
	out.Usage = resp.Usage
	budget.addTokens(resp.Usage.InputTokens + resp.Usage.OutputTokens)
	for i, tc := range resp.Message.ToolCalls {
		// The agent sends the assistant message back in its next request,
		// which Validate would refuse: the provider's answer is at fault.
		if err := tc.Validate(); err != nil {
			out.Status = http.StatusOK
			return fail(callErr(abi.CallUpstream, "model endpoint %q returned an invalid tool call %d (%s): %v",
				r.Endpoint, i, mc.scrub.str(tc.Name), err))
		}
	}
	out.Status = http.StatusOK
	out.Result = &abi.CallResult{Model: resp}
	return out
}

// asCallError returns err as a *abi.CallError (an unexpected error is
// upstream with status 0).
func asCallError(err error) *abi.CallError {
	var ce *abi.CallError
	if errors.As(err, &ce) {
		return ce
	}
	return &abi.CallError{Code: abi.CallUpstream, Message: err.Error()}
}

// estimateInputTokens estimates a model request's prompt tokens: its text
// (messages, tool calls, tool definitions) in bytes over 4, the usual rule
// of thumb for English with BPE tokenizers; at least 1.
func estimateInputTokens(r *abi.ModelRequest) int64 {
	n := 0
	for _, m := range r.Messages {
		n += len(m.Content) + len(m.ToolCallID)
		for _, tc := range m.ToolCalls {
			n += len(tc.Name) + len(tc.Arguments)
		}
	}
	for _, t := range r.Tools {
		n += len(t.Name) + len(t.Description) + len(t.Parameters)
	}
	return int64(n/4 + 1)
}

// deltaScrubber passes streamed text on scrubbed of secret values: it
// holds back the last bytes that could begin a value split across deltas,
// and flush sends the rest when the stream ends.
type deltaScrubber struct {
	scrub   *scrubber
	out     func(string)
	pending string
}

func (d *deltaScrubber) write(s string) {
	d.pending = d.scrub.str(d.pending + s)
	hold := d.scrub.maxLen() - 1
	if cut := len(d.pending) - max(hold, 0); cut > 0 {
		// cut == len(pending) when nothing is held back (no secret to
		// watch for): everything goes out.
		for cut > 0 && cut < len(d.pending) && !utf8.RuneStart(d.pending[cut]) {
			cut--
		}
		if cut > 0 {
			d.out(d.pending[:cut])
			d.pending = d.pending[cut:]
		}
	}
}

func (d *deltaScrubber) flush() {
	if d.pending != "" {
		d.out(d.scrub.str(d.pending))
		d.pending = ""
	}
}
