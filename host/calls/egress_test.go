package calls

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/paddock-dev/paddock/abi"
)

// destServer is a real HTTP destination that records what it receives.
type destServer struct {
	*httptest.Server
	mu   sync.Mutex
	seen []*http.Request
	done chan struct{}
}

func newDest(t *testing.T) *destServer {
	d := &destServer{done: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("/ok", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Test", "yes")
		w.Header().Add("X-Multi", "a")
		w.Header().Add("X-Multi", "b")
		fmt.Fprint(w, "hello")
	})
	mux.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) {
		b, _ := json.Marshal(r.Header)
		w.Header().Set("X-Echo", r.Header.Get("Authorization")+" "+r.Header.Get("X-Api-Key"))
		_, _ = w.Write(b)
	})
	mux.HandleFunc("/body", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s %s", r.Method, b)
	})
	mux.HandleFunc("/bytes", func(w http.ResponseWriter, r *http.Request) {
		n := 0
		_, _ = fmt.Sscan(r.URL.Query().Get("n"), &n)
		_, _ = io.WriteString(w, strings.Repeat("b", n))
	})
	mux.HandleFunc("/hang", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "start")
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-d.done:
		}
	})
	mux.HandleFunc("/redirect", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, r.URL.Query().Get("to"), http.StatusFound)
	})
	d.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d.mu.Lock()
		d.seen = append(d.seen, r.Clone(context.Background()))
		d.mu.Unlock()
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(func() { close(d.done); d.Close() })
	return d
}

func (d *destServer) requests() []*http.Request {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]*http.Request(nil), d.seen...)
}

// loopbackRule names the test server's address explicitly.
func loopbackRule(t *testing.T, d *destServer, methods ...string) HTTPRule {
	return HTTPRule{Scheme: "http", Host: "127.0.0.1", Port: serverPort(t, d.URL), Methods: methods}
}

func TestHTTPCallAllowedAndDenied(t *testing.T) {
	d := newDest(t)
	port := serverPort(t, d.URL)
	x, _ := testExec(t, Config{Egress: EgressConfig{LookupIP: fixedResolver(map[string]string{
		"localhost": "127.0.0.1", "api.example.test": "127.0.0.1", "svc.example.test": "127.0.0.1",
		"metadata.test": "169.254.169.254", "cgnat.test": "100.64.1.2", "ten.test": "10.1.2.3", "v6.test": "::1",
	})}}, env{})
	ctx := context.Background()
	caps := Capabilities{HTTP: []HTTPRule{loopbackRule(t, d, "GET", "POST")}}

	out := x.Do(ctx, "a", caps, httpReq("", d.URL+"/ok?q=1", nil), CallOptions{})
	wantOK(t, out)
	r := out.Result.HTTP
	if r.Status != 200 || string(r.Body) != "hello" || r.Headers["X-Test"] != "yes" || r.Headers["X-Multi"] != "a, b" {
		t.Errorf("response = %+v", r)
	}
	if out.Destination != "GET "+d.URL+"/ok" || out.Status != 200 || out.ResponseBytes != 5 {
		t.Errorf("outcome = %+v", out)
	}
	post := httpReq("POST", d.URL+"/body", map[string]string{"Content-Type": "text/plain"})
	post.HTTP.Body = []byte("payload")
	if out := x.Do(ctx, "a", caps, post, CallOptions{}); out.Result.Error != nil || string(out.Result.HTTP.Body) != "POST payload" {
		t.Errorf("post = %+v", out.Result)
	}

	n := len(d.requests())
	deny := func(c Capabilities, method, u, reason string) {
		t.Helper()
		wantErr(t, x.Do(ctx, "a", c, httpReq(method, u, nil), CallOptions{}), abi.CallDenied, reason)
	}
	deny(caps, "GET", "http://example.com/", ReasonDestination)                                                              // unlisted host
	deny(caps, "GET", fmt.Sprintf("http://127.0.0.1:%d/ok", port+1), ReasonDestination)                                      // other port
	deny(caps, "GET", fmt.Sprintf("https://127.0.0.1:%d/ok", port), ReasonDestination)                                       // other scheme
	deny(caps, "DELETE", d.URL+"/ok", ReasonMethod)                                                                          // method
	deny(Capabilities{}, "GET", d.URL+"/ok", ReasonDestination)                                                              // zero value denies all
	deny(Capabilities{HTTP: []HTTPRule{{Scheme: "http", Host: "127.0.0.1", Port: port}}}, "POST", d.URL+"/ok", ReasonMethod) // default GET, HEAD
	// 127.0.0.1 when a rule names something else.
	deny(Capabilities{HTTP: []HTTPRule{{Scheme: "http", Host: "localhost", Port: port}}}, "GET", d.URL+"/ok", ReasonDestination)
	// A name resolving to loopback, not named with allow_private.
	deny(Capabilities{HTTP: []HTTPRule{{Scheme: "http", Host: "localhost", Port: port}}}, "GET", fmt.Sprintf("http://localhost:%d/ok", port), ReasonPrivateAddress)
	deny(Capabilities{HTTP: []HTTPRule{{Scheme: "http", Host: "api.example.test", Port: port}}}, "GET", fmt.Sprintf("http://api.example.test:%d/ok", port), ReasonPrivateAddress)
	deny(Capabilities{HTTP: []HTTPRule{{Scheme: "http", Host: "v6.test", Port: port}}}, "GET", fmt.Sprintf("http://v6.test:%d/ok", port), ReasonPrivateAddress)
	// A wildcard never reaches a private address.
	deny(Capabilities{HTTP: []HTTPRule{{Scheme: "http", Host: "*.example.test", Port: port}}}, "GET", fmt.Sprintf("http://svc.example.test:%d/ok", port), ReasonPrivateAddress)
	// Cloud metadata, CGNAT, RFC 1918 behind public-looking names.
	for _, h := range []string{"metadata.test", "cgnat.test", "ten.test"} {
		deny(Capabilities{HTTP: []HTTPRule{{Scheme: "http", Host: h}}}, "GET", "http://"+h+"/latest/meta-data/", ReasonPrivateAddress)
	}
	deny(caps, "GET", "http://169.254.169.254/latest/meta-data/", ReasonDestination)
	if len(d.requests()) != n {
		t.Errorf("denied calls reached the server")
	}

	// Named explicitly: an exact name with allow_private.
	for _, h := range []string{"localhost", "api.example.test"} {
		c := Capabilities{HTTP: []HTTPRule{{Scheme: "http", Host: h, Port: port, AllowPrivate: true}}}
		if out := x.Do(ctx, "a", c, httpReq("GET", fmt.Sprintf("http://%s:%d/ok", h, port), nil), CallOptions{}); out.Result.Error != nil {
			t.Errorf("%s with allow_private: %+v", h, out.Result.Error)
		}
	}

	// Connection failure: upstream, status 0.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().(*net.TCPAddr).Port
	l.Close()
	c := Capabilities{HTTP: []HTTPRule{{Scheme: "http", Host: "127.0.0.1", Port: closed}}}
	out = x.Do(ctx, "a", c, httpReq("GET", fmt.Sprintf("http://127.0.0.1:%d/", closed), nil), CallOptions{})
	if e := wantErr(t, out, abi.CallUpstream, ""); e.Status != 0 {
		t.Errorf("status %d", e.Status)
	}

	// Malformed requests.
	wantErr(t, x.Do(ctx, "a", caps, httpReq("GET", d.URL+"/ok", map[string]string{"X-A": "v\r\nX-Injected: 1"}), CallOptions{}), abi.CallInvalid, "")
	wantErr(t, x.Do(ctx, "a", caps, httpReq("GET", d.URL+"/ok", map[string]string{"X-A\n": "v"}), CallOptions{}), abi.CallInvalid, "")
	wantErr(t, x.Do(ctx, "a", caps, httpReq("GET", d.URL+"/ok", map[string]string{"X-A": "v\x00"}), CallOptions{}), abi.CallInvalid, "")
	wantErr(t, x.Do(ctx, "a", caps, httpReq("get", d.URL+"/ok", nil), CallOptions{}), abi.CallInvalid, "")
	wantErr(t, x.Do(ctx, "a", caps, httpReq("GET", "ftp://127.0.0.1/", nil), CallOptions{}), abi.CallInvalid, "")
	wantErr(t, x.Do(ctx, "a", caps, httpReq("GET", "", nil), CallOptions{}), abi.CallInvalid, "")
	wantErr(t, x.Do(ctx, "a", caps, nil, CallOptions{}), abi.CallInvalid, "")
	big := httpReq("POST", d.URL+"/body", nil)
	big.HTTP.Body = make([]byte, abi.MaxCallRequestBytes+1)
	wantErr(t, x.Do(ctx, "a", caps, big, CallOptions{}), abi.CallTooLarge, "")
}

func TestHTTPCallRedirects(t *testing.T) {
	a, b := newDest(t), newDest(t)
	x, _ := testExec(t, Config{Egress: EgressConfig{LookupIP: fixedResolver(map[string]string{"inner.test": "127.0.0.1"})}}, env{"TOKEN": "tok-planted-9f8e"})
	ctx := context.Background()
	onlyA := Capabilities{HTTP: []HTTPRule{loopbackRule(t, a)}, Secrets: []string{"token"}}
	both := Capabilities{HTTP: []HTTPRule{loopbackRule(t, a), loopbackRule(t, b)}, Secrets: []string{"token"}}

	// A redirect to a host the capabilities do not allow ends the call.
	out := x.Do(ctx, "a", onlyA, httpReq("GET", a.URL+"/redirect?to="+b.URL+"/ok", nil), CallOptions{})
	wantErr(t, out, abi.CallDenied, ReasonDestination)
	if len(b.requests()) != 0 {
		t.Fatal("the denied redirect target was reached")
	}
	// A redirect to a name that resolves to loopback, not named with allow_private.
	inner := Capabilities{HTTP: []HTTPRule{loopbackRule(t, a), {Scheme: "http", Host: "inner.test", Port: serverPort(t, b.URL)}}}
	out = x.Do(ctx, "a", inner, httpReq("GET", a.URL+"/redirect?to="+fmt.Sprintf("http://inner.test:%d/ok", serverPort(t, b.URL)), nil), CallOptions{})
	wantErr(t, out, abi.CallDenied, ReasonPrivateAddress)
	if len(b.requests()) != 0 {
		t.Fatal("the private redirect target was reached")
	}

	// An allowed redirect is followed; secret-filled headers stay behind.
	hdr := map[string]string{"Authorization": "Bearer {{secret:token}}", "X-Api-Key": "{{secret:token}}", "X-Plain": "p"}
	out = x.Do(ctx, "a", both, httpReq("GET", a.URL+"/redirect?to="+b.URL+"/echo", hdr), CallOptions{})
	wantOK(t, out)
	got := b.requests()
	if len(got) != 1 || got[0].Header.Get("Authorization") != "" || got[0].Header.Get("X-Api-Key") != "" || got[0].Header.Get("X-Plain") != "p" {
		t.Errorf("redirect target saw headers %v", got[0].Header)
	}
	if first := a.requests(); first[len(first)-1].Header.Get("X-Api-Key") != "tok-planted-9f8e" {
		t.Error("the granted destination did not get the secret")
	}
	// A same-destination redirect keeps them.
	out = x.Do(ctx, "a", onlyA, httpReq("GET", a.URL+"/redirect?to=/echo", hdr), CallOptions{})
	wantOK(t, out)
	if last := a.requests(); last[len(last)-1].Header.Get("X-Api-Key") != "tok-planted-9f8e" {
		t.Error("a same-origin redirect lost the secret header")
	}
	if strings.Contains(string(out.Result.HTTP.Body), "tok-planted-9f8e") {
		t.Error("the echoed secret reached the result")
	}
	// Too many redirects: the last 3xx is the response.
	loop := a.URL + "/redirect?to=" + a.URL + "/redirect%3Fto%3D" + a.URL + "/redirect%253Fto%253D/redirect%25253Fto%25253D/redirect%2525253Fto%2525253D/redirect%252525253Fto%252525253D/redirect%25252525253Fto%25252525253D/ok"
	out = x.Do(ctx, "a", onlyA, httpReq("GET", loop, nil), CallOptions{})
	wantOK(t, out)
	if out.Result.HTTP.Status != http.StatusFound {
		t.Errorf("status after too many redirects = %d, want 302", out.Result.HTTP.Status)
	}
}

func TestHTTPCallSizeAndTime(t *testing.T) {
	d := newDest(t)
	x, _ := testExec(t, Config{Timeout: time.Second, MaxResponseBytes: 4096}, env{})
	ctx := context.Background()
	caps := Capabilities{HTTP: []HTTPRule{loopbackRule(t, d)}}

	wantOK(t, x.Do(ctx, "a", caps, httpReq("GET", d.URL+"/bytes?n=4096", nil), CallOptions{}))
	wantErr(t, x.Do(ctx, "a", caps, httpReq("GET", d.URL+"/bytes?n=4097", nil), CallOptions{}), abi.CallTooLarge, "")

	// The turn's response bytes lower the per-call cap, then deny.
	b := NewBudget(Limits{ResponseBytesPerTurn: 3000}, nil)
	wantOK(t, x.Do(ctx, "a", caps, httpReq("GET", d.URL+"/bytes?n=2000", nil), CallOptions{Budget: b}))
	wantErr(t, x.Do(ctx, "a", caps, httpReq("GET", d.URL+"/bytes?n=2000", nil), CallOptions{Budget: b}), abi.CallTooLarge, "")
	wantErr(t, x.Do(ctx, "a", caps, httpReq("GET", d.URL+"/bytes?n=10", nil), CallOptions{Budget: b}), abi.CallDenied, ReasonResponseBytesPerTurn)

	cb := NewBudget(Limits{CallsPerTurn: 2}, nil)
	wantOK(t, x.Do(ctx, "a", caps, httpReq("GET", d.URL+"/ok", nil), CallOptions{Budget: cb}))
	wantOK(t, x.Do(ctx, "a", caps, httpReq("GET", d.URL+"/ok", nil), CallOptions{Budget: cb}))
	wantErr(t, x.Do(ctx, "a", caps, httpReq("GET", d.URL+"/ok", nil), CallOptions{Budget: cb}), abi.CallDenied, ReasonCallsPerTurn)

	// A response that never ends: timeout at the call's deadline.
	start := time.Now()
	wantErr(t, x.Do(ctx, "a", caps, httpReq("GET", d.URL+"/hang", nil), CallOptions{}), abi.CallTimeout, "")
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("timeout after %v", el)
	}
	// The turn's deadline when earlier than the call's (10 s here).
	slow, _ := testExec(t, Config{Timeout: 10 * time.Second}, env{})
	tctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	start = time.Now()
	wantErr(t, slow.Do(tctx, "a", caps, httpReq("GET", d.URL+"/hang", nil), CallOptions{}), abi.CallTimeout, "")
	if el := time.Since(start); el > 3*time.Second {
		t.Errorf("the turn's 100ms deadline ended the call after %v", el)
	}
	// After the deadline: no request at all.
	n := len(d.requests())
	wantErr(t, x.Do(tctx, "a", caps, httpReq("GET", d.URL+"/ok", nil), CallOptions{}), abi.CallTimeout, "")
	if len(d.requests()) != n {
		t.Error("a call after the deadline was sent")
	}
}

func TestHTTPCallOwnAPIAddress(t *testing.T) {
	d := newDest(t)
	port := serverPort(t, d.URL)
	x, _ := testExec(t, Config{Egress: EgressConfig{
		OwnAddrs: []netip.AddrPort{netip.MustParseAddrPort(fmt.Sprintf("127.0.0.1:%d", port))},
		LookupIP: fixedResolver(map[string]string{"self.test": "127.0.0.1"}),
	}}, env{})
	ctx := context.Background()
	byName := Capabilities{HTTP: []HTTPRule{{Scheme: "http", Host: "self.test", Port: port, AllowPrivate: true}}}
	wantErr(t, x.Do(ctx, "a", byName, httpReq("GET", fmt.Sprintf("http://self.test:%d/ok", port), nil), CallOptions{}), abi.CallDenied, ReasonPrivateAddress)
	wantOK(t, x.Do(ctx, "a", Capabilities{HTTP: []HTTPRule{loopbackRule(t, d)}}, httpReq("GET", d.URL+"/ok", nil), CallOptions{}))
}

func TestSecretPlaceholdersAndLeaks(t *testing.T) {
	const planted = "PLANTED-s3cr3t-value-7c1d"
	d := newDest(t)
	// A model endpoint that echoes the key in its 401, as some do.
	f := newFake(t, false, reply{status: 401, body: `{"error":{"message":"Incorrect API key provided: ` + planted + `"}}`})
	reg := prometheus.NewRegistry()
	x, logs := testExec(t, Config{
		Endpoints: map[string]Endpoint{"oa": {Provider: ProviderOpenAI, BaseURL: f.URL + "/v1", Models: []string{"m"}, Secret: "api_key"}},
		Timeout:   300 * time.Millisecond,
		Metrics:   NewMetrics(reg),
	}, env{"TOKEN": planted, "API_KEY": planted})
	ctx := context.Background()
	caps := Capabilities{HTTP: []HTTPRule{loopbackRule(t, d)}, Secrets: []string{"token", "unset", "nowhere"}, Models: []string{"oa"}}
	var outs []Outcome
	do := func(req *abi.CallRequest) Outcome {
		out := x.Do(ctx, "agent-x", caps, req, CallOptions{})
		outs = append(outs, out)
		return out
	}

	n := len(d.requests())
	wantErr(t, do(httpReq("GET", d.URL+"/echo", map[string]string{"X-Api-Key": "{{secret:api_key}}"})), abi.CallDenied, ReasonSecret)
	wantErr(t, do(httpReq("GET", d.URL+"/echo", map[string]string{"X-Api-Key": "{{secret:nowhere}}"})), abi.CallNotConfigured, "")
	wantErr(t, do(httpReq("GET", d.URL+"/echo", map[string]string{"X-Api-Key": "{{secret:unset}}"})), abi.CallNotConfigured, "")
	// A rule that lists its secrets refuses the others.
	bound := Capabilities{HTTP: []HTTPRule{{Scheme: "http", Host: "127.0.0.1", Port: serverPort(t, d.URL), Secrets: []string{"other"}}}, Secrets: []string{"token", "other"}}
	if out := x.Do(ctx, "agent-x", bound, httpReq("GET", d.URL+"/echo", map[string]string{"X-Api-Key": "{{secret:token}}"}), CallOptions{}); out.Result.Error == nil || out.Result.Error.Reason != ReasonSecret {
		t.Errorf("a secret the rule does not list: %+v", out.Result)
	}
	// The destination check comes first: a denied destination never
	// resolves the secret.
	wantErr(t, do(httpReq("GET", "http://example.com/", map[string]string{"X-Api-Key": "{{secret:token}}"})), abi.CallDenied, ReasonDestination)
	if len(d.requests()) != n {
		t.Fatal("a refused call was sent")
	}

	out := do(httpReq("GET", d.URL+"/echo", map[string]string{"Authorization": "Bearer {{secret:token}}", "X-Api-Key": "pre-{{secret:token}}-post"}))
	wantOK(t, out)
	last := d.requests()[len(d.requests())-1]
	if last.Header.Get("Authorization") != "Bearer "+planted || last.Header.Get("X-Api-Key") != "pre-"+planted+"-post" {
		t.Fatalf("the destination got %v", last.Header)
	}
	if !strings.Contains(string(out.Result.HTTP.Body), "[secret:token]") {
		t.Errorf("echo not scrubbed into a marker: %s", out.Result.HTTP.Body)
	}
	do(httpReq("GET", d.URL+"/hang", map[string]string{"X-Api-Key": "{{secret:token}}"}))
	wantErr(t, do(modelReq("oa", "", abi.ModelMessage{Role: abi.RoleUser, Content: "hi"})), abi.CallUpstream, "")
	if f.requests()[0].header.Get("Authorization") != "Bearer "+planted {
		t.Fatal("the model endpoint did not get its key")
	}

	for _, o := range outs {
		b, _ := json.Marshal(o)
		if strings.Contains(string(b), planted) {
			t.Errorf("secret in an outcome: %s", b)
		}
		if o.Result.Error != nil && strings.Contains(o.Result.Error.Error(), planted) {
			t.Errorf("secret in an error: %v", o.Result.Error)
		}
	}
	if strings.Contains(logs.String(), planted) {
		t.Errorf("secret in the log:\n%s", logs)
	}
	if !strings.Contains(logs.String(), `"msg":"host call"`) {
		t.Errorf("no call was logged:\n%s", logs)
	}

	// Metrics.
	if v := testutil.ToFloat64(x.metrics.Denied.WithLabelValues("agent-x", ReasonSecret)); v != 2 {
		t.Errorf("denied{secret} = %v", v)
	}
	if v := testutil.ToFloat64(x.metrics.Calls.WithLabelValues("agent-x", "http", "ok")); v != 1 {
		t.Errorf("calls{http,ok} = %v", v)
	}
	if v := testutil.ToFloat64(x.metrics.Calls.WithLabelValues("agent-x", "model", "upstream")); v != 1 {
		t.Errorf("calls{model,upstream} = %v", v)
	}
	if n, err := testutil.GatherAndCount(reg, "paddock_host_calls_total", "paddock_host_call_denied_total"); err != nil || n == 0 {
		t.Errorf("gathered %d series, %v", n, err)
	}
}

func TestIsPrivateAddr(t *testing.T) {
	for _, c := range []struct {
		addr    string
		private bool
	}{
		{"127.0.0.1", true}, {"127.8.9.10", true}, {"::1", true}, {"169.254.169.254", true}, {"fe80::1", true},
		{"10.0.0.1", true}, {"172.16.5.4", true}, {"192.168.1.1", true}, {"fc00::1", true}, {"fd12::1", true},
		{"100.64.0.1", true}, {"100.127.255.254", true}, {"0.0.0.0", true}, {"::", true}, {"224.0.0.1", true},
		{"ff02::1", true}, {"::ffff:127.0.0.1", true}, {"::ffff:169.254.169.254", true}, {"64:ff9b::a9fe:a9fe", true},
		{"8.8.8.8", false}, {"1.1.1.1", false}, {"2606:4700::1111", false}, {"100.128.0.1", false}, {"172.32.0.1", false},
	} {
		if got := IsPrivateAddr(netip.MustParseAddr(c.addr)); got != c.private {
			t.Errorf("IsPrivateAddr(%s) = %v, want %v", c.addr, got, c.private)
		}
	}
}

func TestRuleMatching(t *testing.T) {
	caps := Capabilities{HTTP: []HTTPRule{
		{Scheme: "https", Host: "*.example.com"},
		{Scheme: "https", Host: "API.Other.com", Methods: []string{"POST"}},
		{Scheme: "http", Host: "::1", Port: 8080},
	}}
	for _, c := range []struct {
		method, url, reason string
	}{
		{"GET", "https://a.example.com/x", ""},
		{"HEAD", "https://a.b.example.com/x", ""},
		{"GET", "https://example.com/x", ReasonDestination},
		{"GET", "https://evilexample.com/x", ReasonDestination},
		{"GET", "https://a.example.com:8443/x", ReasonDestination},
		{"GET", "http://a.example.com/x", ReasonDestination},
		{"POST", "https://a.example.com/x", ReasonMethod},
		{"POST", "https://api.other.com/v1", ""},
		{"GET", "https://api.other.com/v1", ReasonMethod},
		{"GET", "http://[::1]:8080/", ""},
		{"GET", "http://[::1]/", ReasonDestination},
	} {
		err := caps.CheckHTTP(c.method, c.url)
		if c.reason == "" && err != nil {
			t.Errorf("%s %s: %v", c.method, c.url, err)
		}
		if c.reason != "" {
			if e, ok := err.(*abi.CallError); !ok || e.Code != abi.CallDenied || e.Reason != c.reason {
				t.Errorf("%s %s: %v, want denied %s", c.method, c.url, err, c.reason)
			}
		}
	}
	for _, bad := range []HTTPRule{
		{Scheme: "ftp", Host: "a.com"}, {Scheme: "https", Host: ""}, {Scheme: "https", Host: "a.*.com"},
		{Scheme: "https", Host: "*.com"}, {Scheme: "https", Host: "*.a.com", AllowPrivate: true},
		{Scheme: "https", Host: "a.com", Port: -1}, {Scheme: "https", Host: "a.com", Methods: []string{"get"}},
		{Scheme: "https", Host: "a b.com"},
	} {
		if ValidateRule(bad) == nil {
			t.Errorf("ValidateRule(%+v) accepted", bad)
		}
	}
	if err := ValidateRule(HTTPRule{Scheme: "http", Host: "10.0.0.5", Port: 9000}); err != nil {
		t.Error(err)
	}
}
