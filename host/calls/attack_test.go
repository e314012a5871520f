package calls

// Attacks on host calls (branch hc-attack). Each test states what it
// tries and what the host must do; a failing test is a finding.

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/abi"
)

const attackSecret = "PLANTED-atk-s3cr3t-4b2e91"

// echoServer reflects the request's X-Api-Key header in the ways real
// APIs do (an error page, a debug endpoint): raw, gzip-compressed when the
// client asks for it, base64, and with Range support (http.ServeContent).
func echoServer(t *testing.T) *httptest.Server {
	mux := http.NewServeMux()
	mux.HandleFunc("/raw", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "you sent %s", r.Header.Get("X-Api-Key"))
	})
	mux.HandleFunc("/gzip", func(w http.ResponseWriter, r *http.Request) {
		msg := "you sent " + r.Header.Get("X-Api-Key")
		if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			w.Header().Set("Content-Encoding", "gzip")
			zw := gzip.NewWriter(w)
			_, _ = io.WriteString(zw, msg)
			_ = zw.Close()
			return
		}
		_, _ = io.WriteString(w, msg)
	})
	mux.HandleFunc("/b64", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, base64.StdEncoding.EncodeToString([]byte(r.Header.Get("X-Api-Key"))))
	})
	mux.HandleFunc("/range", func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "echo.txt", time.Time{}, strings.NewReader("you sent "+r.Header.Get("X-Api-Key")))
	})
	s := httptest.NewServer(mux)
	t.Cleanup(s.Close)
	return s
}

// Found by attack, fixed: the scrubber replaces only the exact secret value in the body,
// so an agent that may send a secret to a destination that reflects it can
// read it back: by asking for gzip (Go does not decompress when the caller
// sets Accept-Encoding), by Range requests that split the value, or from a
// reflected encoding (base64). Invariant 13: the agent never sees a value.
func TestAttackSecretEchoBypassesScrubber(t *testing.T) {
	s := echoServer(t)
	x, _ := testExec(t, Config{}, env{"TOKEN": attackSecret})
	caps := Capabilities{HTTP: []HTTPRule{{Scheme: "http", Host: "127.0.0.1", Port: serverPort(t, s.URL)}}, Secrets: []string{"token"}}
	ctx := context.Background()
	get := func(path string, extra map[string]string) []byte {
		h := map[string]string{"X-Api-Key": "{{secret:token}}"}
		for k, v := range extra {
			h[k] = v
		}
		out := x.Do(ctx, "a", caps, httpReq("GET", s.URL+path, h), CallOptions{})
		wantOK(t, out)
		return out.Result.HTTP.Body
	}
	if b := get("/raw", nil); bytes.Contains(b, []byte(attackSecret)) {
		t.Fatalf("baseline: raw echo not scrubbed: %q", b)
	}
	t.Run("gzip", func(t *testing.T) {
		b := get("/gzip", map[string]string{"Accept-Encoding": "gzip"})
		plain := b
		if zr, err := gzip.NewReader(bytes.NewReader(b)); err == nil {
			plain, _ = io.ReadAll(zr)
		}
		if bytes.Contains(plain, []byte(attackSecret)) {
			t.Errorf("the agent read the secret from a gzip-compressed echo: %q", plain)
		}
	})
	t.Run("range", func(t *testing.T) {
		off := len("you sent ")
		half := len(attackSecret) / 2
		a := get("/range", map[string]string{"Range": fmt.Sprintf("bytes=%d-%d", off, off+half-1)})
		b := get("/range", map[string]string{"Range": fmt.Sprintf("bytes=%d-", off+half)})
		if string(a)+string(b) == attackSecret {
			t.Errorf("the agent read the secret in two Range halves: %q + %q", a, b)
		}
	})
	t.Run("base64", func(t *testing.T) {
		b := get("/b64", nil)
		dec, _ := base64.StdEncoding.DecodeString(string(b))
		if string(dec) == attackSecret {
			t.Errorf("the agent read the secret base64-encoded: %q", b)
		}
	})
}

// The Host header an agent sets is not where the request goes, and does
// not reach the destination either (Go writes the URL's host).
func TestAttackHostHeaderOverride(t *testing.T) {
	var seen []string
	var mu sync.Mutex
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Host)
		mu.Unlock()
	}))
	defer s.Close()
	x, _ := testExec(t, Config{}, env{})
	caps := Capabilities{HTTP: []HTTPRule{{Scheme: "http", Host: "127.0.0.1", Port: serverPort(t, s.URL)}}}
	for _, h := range []string{"169.254.169.254", "internal", "metadata.google.internal"} {
		out := x.Do(context.Background(), "a", caps, httpReq("GET", s.URL+"/", map[string]string{"Host": h, "X-Forwarded-Host": h}), CallOptions{})
		wantOK(t, out)
	}
	for _, h := range seen {
		if !strings.HasPrefix(h, "127.0.0.1:") {
			t.Errorf("the destination saw Host %q", h)
		}
	}
}

// URL forms of loopback and the metadata address, against a host with
// rules for public names only: every one is refused before any dial.
func TestAttackSSRFURLForms(t *testing.T) {
	x, _ := testExec(t, Config{Egress: EgressConfig{LookupIP: func(ctx context.Context, host string) ([]netip.Addr, error) {
		return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil // every name rebinds to loopback
	}}}, env{"TOKEN": attackSecret})
	caps := Capabilities{HTTP: []HTTPRule{
		{Scheme: "http", Host: "*.example.com"}, {Scheme: "https", Host: "*.example.com"},
		{Scheme: "http", Host: "allowed.example"},
	}, Secrets: []string{"token"}}
	for _, u := range []string{
		"http://2130706433/", "http://0x7f.1/", "http://127.1/", "http://[::1]/", "http://[::ffff:127.0.0.1]/",
		"http://[::ffff:a9fe:a9fe]/", "http://0.0.0.0/", "http://localhost./", "http://[fe80::1%25lo]/",
		"http://allowed.example@127.0.0.1/", "http://127.0.0.1#@allowed.example/", "http://example.com.evil.net/",
		"http://evilexample.com/", "http://EXAMPLE.COM/", "http://allowed.example:8080/", "file:///etc/passwd",
		"gopher://allowed.example/", "ftp://allowed.example/", "http://a.example.com/", "http://A.EXAMPLE.COM./",
		"http://allowed.example./", "http://ALLOWED.EXAMPLE/", "http://[::127.0.0.1]/", "http://%61llowed.example/",
	} {
		out := x.Do(context.Background(), "a", caps, httpReq("GET", u, map[string]string{"X-Api-Key": "{{secret:token}}"}), CallOptions{})
		if out.Result.Error == nil {
			t.Errorf("%s: reached (%d)", u, out.Result.HTTP.Status)
			continue
		}
		if e := out.Result.Error; e.Code != abi.CallDenied && e.Code != abi.CallInvalid {
			t.Errorf("%s: %s/%s %s", u, e.Code, e.Reason, e.Message)
		}
	}
}

// Found by attack, fixed (defense in depth): IPv6 forms that embed IPv4 addresses beyond
// ::ffff:0:0/96 and 64:ff9b::/96, and deprecated site-local fec0::/10, are
// not private. On a host with a NAT64 of the local-use prefix
// 64:ff9b:1::/48 (RFC 8215) or SIIT (::ffff:0:0:0/96), a name the
// operator allowed resolving to such an address reaches an internal IPv4
// address, the metadata service included.
func TestAttackIsPrivateAddrEmbeddedIPv4(t *testing.T) {
	for _, s := range []string{
		"::127.0.0.1",          // IPv4-compatible (deprecated ::/96)
		"::ffff:0:7f00:1",      // IPv4-translated (RFC 2765 SIIT)
		"::ffff:0:a9fe:a9fe",   // IPv4-translated 169.254.169.254
		"64:ff9b:1::a9fe:a9fe", // local-use NAT64 (RFC 8215)
		"fec0::1",              // site-local (deprecated, RFC 3879)
		"2002:7f00:1::1",       // 6to4 of 127.0.0.1
		"2002:a9fe:a9fe::1",    // 6to4 of 169.254.169.254
		"240.0.0.1",            // reserved 240/4
	} {
		if !IsPrivateAddr(netip.MustParseAddr(s)) {
			t.Errorf("IsPrivateAddr(%s) = false", s)
		}
	}
}

// Nested, escaped and odd placeholders, and placeholders outside headers:
// none is filled beyond one granted secret in a header.
func TestAttackPlaceholderTricks(t *testing.T) {
	var got []*http.Request
	var mu sync.Mutex
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, r)
		mu.Unlock()
		fmt.Fprintf(w, "%s|%s|%s", r.URL.String(), body, r.Header.Get("X-A"))
	}))
	defer s.Close()
	x, _ := testExec(t, Config{}, env{"TOKEN": attackSecret, "API_KEY": "other-key-77"})
	caps := Capabilities{HTTP: []HTTPRule{{Scheme: "http", Host: "127.0.0.1", Port: serverPort(t, s.URL), Methods: []string{"POST", "GET"}}}, Secrets: []string{"token"}}
	ctx := context.Background()
	// In the URL and body: never filled.
	out := x.Do(ctx, "a", caps, &abi.CallRequest{Kind: abi.CallKindHTTP, HTTP: &abi.HTTPRequest{Method: "POST",
		URL: s.URL + "/{{secret:token}}?k={{secret:token}}", Body: []byte("{{secret:token}}")}}, CallOptions{})
	wantOK(t, out)
	// Nesting: the inner is filled, the outer is not re-scanned.
	out = x.Do(ctx, "a", caps, httpReq("GET", s.URL+"/", map[string]string{"X-A": "{{secret:{{secret:token}}}}"}), CallOptions{})
	wantOK(t, out)
	// A name that is not granted inside another.
	wantErr(t, x.Do(ctx, "a", caps, httpReq("GET", s.URL+"/", map[string]string{"X-A": "{{secret:api_key}}"}), CallOptions{}), abi.CallDenied, ReasonSecret)
	// A placeholder in a header name is not filled.
	out = x.Do(ctx, "a", caps, httpReq("GET", s.URL+"/", map[string]string{"X-{{secret:token}}": "v"}), CallOptions{})
	if out.Result.Error == nil && out.Result.HTTP == nil {
		t.Fatalf("a placeholder in a header name: no result and no error")
	}
	mu.Lock()
	defer mu.Unlock()
	for _, r := range got {
		if strings.Contains(r.URL.String(), attackSecret) || strings.Contains(r.URL.String(), "other-key") {
			t.Errorf("a secret was filled into the URL: %s", r.URL)
		}
		for k := range r.Header {
			if strings.Contains(k, attackSecret) {
				t.Errorf("a secret was filled into a header name: %s", k)
			}
		}
	}
	if len(got) > 0 && got[1].Header.Get("X-A") != "{{secret:"+attackSecret+"}}" {
		t.Logf("nested: X-A = %q", got[1].Header.Get("X-A"))
	}
}

// oaStream is an OpenAI stream of one text chunk and the given usage.
func oaStream(usage string) reply {
	ev := []string{`{"choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":"stop"}]}`}
	if usage != "" {
		ev = append(ev, `{"choices":[],"usage":`+usage+`}`)
	}
	return reply{events: ev}
}

// Found by attack, fixed: a provider's negative token counts are taken as they are: they
// lower the turn's count (and, recorded in the journal, the day's sum), so
// tokens_per_turn and tokens_per_day are exceeded.
func TestAttackNegativeUsageRefundsBudget(t *testing.T) {
	f := newFake(t, false, oaStream(`{"prompt_tokens":-100000,"completion_tokens":5}`), oaStream(`{"prompt_tokens":60,"completion_tokens":40}`))
	x, _ := testExec(t, Config{Endpoints: map[string]Endpoint{"oa": {Provider: ProviderOpenAI, BaseURL: f.URL + "/v1", Models: []string{"m"}}}}, env{})
	caps := Capabilities{Models: []string{"oa"}}
	b := NewBudget(Limits{TokensPerTurn: 100}, nil)
	user := abi.ModelMessage{Role: abi.RoleUser, Content: "hi"}
	out := x.Do(context.Background(), "a", caps, modelReq("oa", "", user), CallOptions{Budget: b})
	wantOK(t, out)
	if out.Usage.InputTokens < 0 || out.Usage.OutputTokens < 0 || b.Tokens() < 0 {
		t.Errorf("negative usage accepted: outcome %+v, budget %d", out.Usage, b.Tokens())
	}
}

// A model call whose provider reports no usage (an endpoint without
// stream_options.include_usage support, or a proxy dropping the chunk) is
// charged an estimate — the prompt and the whole reply allowance — so
// tokens_per_turn still binds: the calls stop at the limit.
func TestAttackMissingUsageCountsNothing(t *testing.T) {
	f := newFake(t, false, oaStream(""), oaStream(""), oaStream(""))
	x, _ := testExec(t, Config{Endpoints: map[string]Endpoint{"oa": {Provider: ProviderOpenAI, BaseURL: f.URL + "/v1", Models: []string{"m"}, MaxTokens: 50}}}, env{})
	caps := Capabilities{Models: []string{"oa"}}
	b := NewBudget(Limits{TokensPerTurn: 60}, nil)
	user := abi.ModelMessage{Role: abi.RoleUser, Content: "hi"}
	var outs []Outcome
	for range 3 {
		outs = append(outs, x.Do(context.Background(), "a", caps, modelReq("oa", "", user), CallOptions{Budget: b}))
	}
	if outs[0].Result.Error != nil || outs[0].Usage != (abi.Usage{InputTokens: 1, OutputTokens: 50}) {
		t.Errorf("first call: %+v, usage %+v; want it charged the estimate 1 in / 50 out", outs[0].Result.Error, outs[0].Usage)
	}
	if outs[2].Result.Error == nil || outs[2].Result.Error.Reason != ReasonTokensPerTurn {
		t.Errorf("third call: %+v, want denied tokens_per_turn", outs[2].Result)
	}
	if b.Tokens() > 60 {
		t.Errorf("the budget counted %d tokens under a 60-token turn limit", b.Tokens())
	}
	if n := len(f.requests()); n > 2 {
		t.Errorf("%d requests reached the provider, want at most 2", n)
	}
}

// Found by attack, fixed: tokens_per_turn / tokens_per_day clamp only max_tokens (the
// output): an agent with 10 tokens left sends a prompt of ~1M input tokens
// and the call goes out; the limit is only noticed after it was paid.
func TestAttackInputTokensUnbounded(t *testing.T) {
	f := newFake(t, false, oaStream(`{"prompt_tokens":1000000,"completion_tokens":10}`))
	x, _ := testExec(t, Config{Endpoints: map[string]Endpoint{"oa": {Provider: ProviderOpenAI, BaseURL: f.URL + "/v1", Models: []string{"m"}}}}, env{})
	caps := Capabilities{Models: []string{"oa"}}
	today := int64(990)
	b := NewBudget(Limits{TokensPerDay: 1000}, func(context.Context) (int64, error) { return today, nil })
	huge := abi.ModelMessage{Role: abi.RoleUser, Content: strings.Repeat("word ", 800_000)} // 4 MB
	out := x.Do(context.Background(), "a", caps, modelReq("oa", "", huge), CallOptions{Budget: b})
	if out.Result.Error == nil && len(f.requests()) == 1 {
		t.Errorf("a ~1M-token prompt was sent with 10 tokens of the day left (usage %+v)", out.Usage)
	}
}

// Found by attack, fixed (low; the journal serialises a hosted turn's calls): Budget is
// documented safe for concurrent use, but responseCap hands every
// concurrent call the whole remainder, so N concurrent calls receive up
// to N× response_bytes_per_turn.
func TestAttackConcurrentCallsOverrunResponseBytes(t *testing.T) {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(50 * time.Millisecond)
		_, _ = io.WriteString(w, strings.Repeat("x", 900))
	}))
	defer s.Close()
	x, _ := testExec(t, Config{}, env{})
	caps := Capabilities{HTTP: []HTTPRule{{Scheme: "http", Host: "127.0.0.1", Port: serverPort(t, s.URL)}}}
	b := NewBudget(Limits{ResponseBytesPerTurn: 1000, CallsPerTurn: 16}, nil)
	var wg sync.WaitGroup
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			x.Do(context.Background(), "a", caps, httpReq("GET", s.URL+"/", nil), CallOptions{Budget: b})
		}()
	}
	wg.Wait()
	if b.Calls() != 16 {
		t.Fatalf("calls counted %d", b.Calls())
	}
	if b.ResponseBytes() > 1000 {
		t.Errorf("16 concurrent calls received %d bytes under a 1000-byte turn limit", b.ResponseBytes())
	}
}

// Model streams that misbehave end within the call's caps.
func TestAttackHostileModelStreams(t *testing.T) {
	big := strings.Repeat("A", 6<<20)
	f := newFake(t, false,
		reply{events: []string{`{"choices":[{"index":0,"delta":{"content":"x"}}]}`}, hang: true},                                                             // never [DONE]
		reply{events: []string{`{"choices":[{"index":0,"delta":{"content":"` + big + `"}}]}`}},                                                               // giant line
		reply{events: []string{`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":-7,"function":{"arguments":"{"}}]},"finish_reason":"tool_calls"}]}`}}, // malformed tool call
		reply{events: []string{`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":2147483647,"id":"c","function":{"name":"t","arguments":"{}"}}]},"finish_reason":"tool_calls"}]}`}},
	)
	// The hanging stream meets a short deadline; the others get a long one so a
	// slow (race-instrumented, shared) machine reading 6 MB cannot turn
	// too_large into timeout.
	cfg := func(timeout time.Duration) Config {
		return Config{Timeout: timeout, MaxResponseBytes: 1 << 20,
			Endpoints: map[string]Endpoint{"oa": {Provider: ProviderOpenAI, BaseURL: f.URL + "/v1", Models: []string{"m"}}}}
	}
	short, _ := testExec(t, cfg(500*time.Millisecond), env{})
	x, _ := testExec(t, cfg(time.Minute), env{})
	caps := Capabilities{Models: []string{"oa"}}
	user := abi.ModelMessage{Role: abi.RoleUser, Content: "hi"}
	wantErr(t, short.Do(context.Background(), "a", caps, modelReq("oa", "", user), CallOptions{}), abi.CallTimeout, "")
	do := func() Outcome { return x.Do(context.Background(), "a", caps, modelReq("oa", "", user), CallOptions{}) }
	wantErr(t, do(), abi.CallTooLarge, "")
	wantErr(t, do(), abi.CallUpstream, "")
	if out := do(); out.Result.Error == nil {
		if err := out.Result.Model.Message.ToolCalls[0].Validate(); err != nil {
			t.Errorf("invalid tool call returned: %v", err)
		}
	}
}

// Redirects to other schemes and to loopback/metadata forms are refused,
// and a name that re-resolves to loopback at the redirect is refused at
// the dial (the dialer connects only to the address it checked).
func TestAttackRedirectTargets(t *testing.T) {
	a := newDest(t)
	lookups := 0
	var mu sync.Mutex
	x, _ := testExec(t, Config{Egress: EgressConfig{LookupIP: func(ctx context.Context, host string) ([]netip.Addr, error) {
		mu.Lock()
		defer mu.Unlock()
		lookups++
		return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
	}}}, env{"TOKEN": attackSecret})
	port := serverPort(t, a.URL)
	caps := Capabilities{HTTP: []HTTPRule{loopbackRule(t, a), {Scheme: "http", Host: "rebind.example", Port: port},
		{Scheme: "http", Host: "*.example.org", Port: port}}, Secrets: []string{"token"}}
	for _, to := range []string{
		"file:///etc/passwd", "gopher://127.0.0.1:" + fmt.Sprint(port) + "/", "ftp://127.0.0.1/",
		"http://169.254.169.254/latest/meta-data/", "http://[::ffff:a9fe:a9fe]/", "http://127.1:" + fmt.Sprint(port) + "/ok",
		// (http://[::ffff:127.0.0.1]:port is followed: it is the address the
		// literal rule names; the secret header is dropped, the host differs.)
		fmt.Sprintf("http://rebind.example:%d/ok", port),
		fmt.Sprintf("http://x.example.org:%d/ok", port), fmt.Sprintf("http://localhost:%d/ok", port),
	} {
		n := len(a.requests())
		out := x.Do(context.Background(), "a", caps, httpReq("GET", a.URL+"/redirect?to="+to, map[string]string{"X-Api-Key": "{{secret:token}}"}), CallOptions{})
		if out.Result.Error == nil {
			t.Errorf("redirect to %s followed: %d %q", to, out.Result.HTTP.Status, out.Result.HTTP.Body)
		}
		if len(a.requests()) != n+1 {
			t.Errorf("redirect to %s: the server got %d more requests, want only the first", to, len(a.requests())-n)
		}
	}
}

// Found by attack, fixed (configuration footgun): HTTPRule.Secrets "binds a credential to
// the destination it is meant for", but only for requests that rule
// matches first: a broader rule without a Secrets list (a wildcard for a
// shared domain, *.amazonaws.com with attacker-owned buckets) fills the
// same secret for any other destination it matches.
func TestAttackSecretBindingBypassedByBroaderRule(t *testing.T) {
	var got []string
	var mu sync.Mutex
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Host+" "+r.Header.Get("X-Api-Key"))
		mu.Unlock()
	}))
	defer s.Close()
	port := serverPort(t, s.URL)
	x, _ := testExec(t, Config{Egress: EgressConfig{LookupIP: fixedResolver(map[string]string{
		"bedrock.example.com": "127.0.0.1", "attacker-bucket.example.com": "127.0.0.1"})}}, env{"TOKEN": attackSecret})
	caps := Capabilities{HTTP: []HTTPRule{
		{Scheme: "http", Host: "bedrock.example.com", Port: port, AllowPrivate: true, Secrets: []string{"token"}},
		// Another destination's rule without a Secrets list (a wildcard
		// behaves the same; an exact name with allow_private here because the
		// test's resolver answers loopback).
		{Scheme: "http", Host: "attacker-bucket.example.com", Port: port, AllowPrivate: true},
	}, Secrets: []string{"token"}}
	out := x.Do(context.Background(), "a", caps, httpReq("GET", fmt.Sprintf("http://attacker-bucket.example.com:%d/", port),
		map[string]string{"X-Api-Key": "{{secret:token}}"}), CallOptions{})
	mu.Lock()
	defer mu.Unlock()
	for _, g := range got {
		if strings.Contains(g, attackSecret) && strings.HasPrefix(g, "attacker-bucket") {
			t.Errorf("a secret bound to bedrock.example.com by its rule was sent to %q (%v)", g, out.Result.Error)
		}
	}
}

// Found by attack, fixed: Limits' doc says that without limits of the agent's own "the
// host-wide caps still hold (… the endpoint's max_tokens per model
// call)", but the endpoint's max_tokens is only a default: an agent's
// request for 1,000,000 tokens reaches the provider as asked.
func TestAttackMaxTokensAboveTheEndpointsCap(t *testing.T) {
	f := newFake(t, false, oaStream(`{"prompt_tokens":1,"completion_tokens":1}`))
	x, _ := testExec(t, Config{Endpoints: map[string]Endpoint{"oa": {Provider: ProviderOpenAI, BaseURL: f.URL + "/v1", Models: []string{"m"}, MaxTokens: 256}}}, env{})
	req := modelReq("oa", "", abi.ModelMessage{Role: abi.RoleUser, Content: "hi"})
	req.Model.MaxTokens = 1_000_000
	wantOK(t, x.Do(context.Background(), "a", Capabilities{Models: []string{"oa"}}, req, CallOptions{}))
	if got := f.requests()[0].body["max_tokens"]; got != float64(256) {
		t.Errorf("max_tokens sent = %v, want the endpoint's cap 256", got)
	}
}

// Found by attack (fixed; latent: no host caller sets OnDelta yet — streams
// would): OnDelta receives the provider's text before the scrubber runs,
// so an endpoint that echoes its API key streams it out unscrubbed, while
// the final result is scrubbed.
func TestAttackOnDeltaIsNotScrubbed(t *testing.T) {
	f := newFake(t, false, reply{events: []string{
		`{"choices":[{"index":0,"delta":{"content":"key is ` + attackSecret[:7] + `"}}]}`,
		`{"choices":[{"index":0,"delta":{"content":"` + attackSecret[7:] + ` end"},"finish_reason":"stop"}]}`,
		`{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}`}})
	x, _ := testExec(t, Config{Endpoints: map[string]Endpoint{"oa": {Provider: ProviderOpenAI, BaseURL: f.URL + "/v1", Models: []string{"m"}, Secret: "api_key"}}}, env{"API_KEY": attackSecret})
	var deltas strings.Builder
	out := x.Do(context.Background(), "a", Capabilities{Models: []string{"oa"}}, modelReq("oa", "", abi.ModelMessage{Role: abi.RoleUser, Content: "hi"}),
		CallOptions{OnDelta: func(s string) { deltas.WriteString(s) }})
	wantOK(t, out)
	if strings.Contains(out.Result.Model.Message.Content, attackSecret) {
		t.Fatal("the result holds the key")
	}
	if strings.Contains(deltas.String(), attackSecret) {
		t.Errorf("OnDelta received the key: %q", deltas.String())
	}
}

// Found by attack, fixed: approval rules were checked only against the URL
// the agent sent (by the journal, before the call went out); a redirect is
// checked against the capabilities alone. An agent that may call any
// allowed destination without approval asks one that answers with a
// redirect (307 keeps a POST and its body) to the destination an approval
// rule guards, and the guarded call goes out with nobody asked. A redirect
// to a destination that needs approval is refused (denied, reason
// approval) unless it is the very destination the call was approved for.
func TestAttackRedirectDodgesApproval(t *testing.T) {
	a, b := newDest(t), newDest(t)
	x, _ := testExec(t, Config{}, env{})
	caps := Capabilities{HTTP: []HTTPRule{loopbackRule(t, a), loopbackRule(t, b)},
		Approval: ApprovalRules{HTTP: []ApprovalHTTPRule{{Host: "127.0.0.1", PathPrefix: "/ok"}}}}
	first := httpReq("GET", a.URL+"/redirect?to="+b.URL+"/ok", nil)
	if what, ok := caps.Approval.NeedsApproval(first); ok {
		t.Fatalf("setup: the first request needs approval (%s)", what)
	}
	out := x.Do(context.Background(), "a", caps, first, CallOptions{})
	wantErr(t, out, abi.CallDenied, ReasonApproval)
	if n := len(b.requests()); n != 0 {
		t.Fatalf("the guarded destination got %d requests through a redirect", n)
	}
	// A call approved for its destination may be redirected there again
	// (a same-destination redirect of an approved call).
	approved := httpReq("GET", b.URL+"/redirect?to=/ok", nil)
	caps.Approval.HTTP[0].PathPrefix = "/"
	out = x.Do(context.Background(), "a", caps, approved, CallOptions{})
	wantErr(t, out, abi.CallDenied, ReasonApproval) // /ok is not /redirect: not what was approved
	same := httpReq("GET", b.URL+"/ok", nil)
	out = x.Do(context.Background(), "a", caps, same, CallOptions{})
	wantOK(t, out)
}
