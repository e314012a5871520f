package console_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/host/api"
	"github.com/paddock-dev/paddock/host/console"
	"github.com/paddock-dev/paddock/host/runner"
	"github.com/paddock-dev/paddock/host/service"
	"github.com/paddock-dev/paddock/host/stream"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/store/sqlite"
	"github.com/paddock-dev/paddock/wasm"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

var (
	rtOnce sync.Once
	rt     *wasm.Runtime
	rtErr  error
)

// runtime returns one wasm runtime shared by the tests of this binary.
func runtime(t *testing.T) *wasm.Runtime {
	rtOnce.Do(func() {
		rt, rtErr = wasm.New(context.Background(), wasm.Config{
			CacheDir: wasmtest.CacheDir(t), MemoryLimitPages: 1024, TurnTimeout: time.Minute,
		}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	})
	if rtErr != nil {
		t.Fatal(rtErr)
	}
	return rt
}

// env is a real host on a SQLite store behind the API and the console, as
// paddock serve mounts them (console.Handler).
type env struct {
	t     *testing.T
	st    store.Store
	h     *host.Host
	svc   *service.Service
	url   string
	token string
}

func newEnv(t *testing.T, token string) *env {
	t.Helper()
	return newEnvNS(t, token)
}

// newEnvNS is newEnv on a host whose config declares namespaces.
func newEnvNS(t *testing.T, token string, namespaces ...string) *env {
	t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "p.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	wr := runner.NewWasm(runtime(t), st)
	pol := host.DefaultPolicy()
	pol.IdleTimeout, pol.ScanInterval, pol.LeaseTTL = time.Second, 100*time.Millisecond, 3*time.Second
	pol.BackoffMin, pol.BackoffMax, pol.MaxAttempts = 20*time.Millisecond, 100*time.Millisecond, 2
	pol.Namespaces = map[string]host.NamespacePolicy{}
	for _, ns := range namespaces {
		pol.Namespaces[ns] = host.NamespacePolicy{}
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	hub := stream.New(stream.Options{Store: st, PollInterval: 50 * time.Millisecond, Logger: logger})
	h, err := host.New(host.Options{Store: st, Runner: wr, Policy: pol, Logger: logger, StreamNotify: hub.Poke})
	if err != nil {
		t.Fatal(err)
	}
	svc := service.New(h, wr, nil).WithStream(hub)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = h.Run(ctx); close(done) }()
	ui, err := console.New(console.Options{Service: svc, AuthToken: token, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(ui.Handler(api.New(api.Options{
		Host: h, Service: svc, AuthToken: token, MaxBodyBytes: 1 << 20, MaxModuleBytes: 32 << 20, Logger: logger,
	})))
	// Open streams (live.js) end when the hub closes, before the server
	// waits for its connections.
	srv.Config.RegisterOnShutdown(hub.Close)
	srv.Start()
	t.Cleanup(func() { hub.Close(); srv.CloseClientConnections(); srv.Close(); cancel(); <-done })
	return &env{t: t, st: st, h: h, svc: svc, url: srv.URL, token: token}
}

// agent uploads an example module and registers it as agent name.
func (e *env) agent(name, example string) store.Agent {
	e.t.Helper()
	return e.agentIn(service.DefaultNamespace, name, example)
}

// agentIn is agent in namespace ns.
func (e *env) agentIn(ns, name, example string) store.Agent {
	e.t.Helper()
	ctx := service.WithNamespace(context.Background(), ns)
	_, b := wasmtest.BuildExample(e.t, example)
	m, _, err := e.svc.UploadModule(ctx, b)
	if err != nil {
		e.t.Fatal(err)
	}
	a, err := e.svc.CreateAgent(ctx, name, service.Binding{Module: m.Digest})
	if err != nil {
		e.t.Fatal(err)
	}
	return a
}

// session creates a session of a.
func (e *env) session(a store.Agent, key string) store.Session {
	e.t.Helper()
	x, err := e.svc.CreateSession(service.WithNamespace(context.Background(), a.Namespace), a, service.SessionParams{Key: key})
	if err != nil {
		e.t.Fatal(err)
	}
	return x
}

// signal sends a message and waits until the session has committed turns
// turns, or the event is dead-lettered.
func (e *env) signal(a store.Agent, x store.Session, msg string) store.Event {
	e.t.Helper()
	res, err := e.svc.Signal(context.Background(), a, x.SessionID, service.SignalParams{Message: msg})
	if err != nil {
		e.t.Fatal(err)
	}
	return e.waitEvent(x, res.Event.ID, func(ev store.Event) bool { return ev.Status != store.EventOpen })
}

// waitEvent polls event id of x until cond holds (a minute at most).
func (e *env) waitEvent(x store.Session, id int64, cond func(store.Event) bool) store.Event {
	e.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		ev, _, err := e.svc.GetEvent(context.Background(), x, id)
		if err != nil {
			e.t.Fatal(err)
		}
		if cond(ev) {
			return ev
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out waiting for event %d: %+v", id, ev)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// browser is an HTTP client with a cookie jar, as a browser would be.
type browser struct {
	t    *testing.T
	e    *env
	http *http.Client
}

func (e *env) browser() *browser {
	jar, err := cookiejar.New(nil)
	if err != nil {
		e.t.Fatal(err)
	}
	return &browser{t: e.t, e: e, http: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}}
}

// get fetches a path and returns the response and body.
func (b *browser) get(path string) (*http.Response, string) {
	b.t.Helper()
	resp, err := b.http.Get(b.e.url + path)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

// post sends a form, with the extra headers hdr (name, value, …).
func (b *browser) post(path string, form url.Values, hdr ...string) (*http.Response, string) {
	b.t.Helper()
	req, err := http.NewRequest("POST", b.e.url+path, strings.NewReader(form.Encode()))
	if err != nil {
		b.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := b.http.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrf returns the CSRF token of the page at path (which sets the cookie).
func (b *browser) csrf(path string) string {
	b.t.Helper()
	_, body := b.get(path)
	m := csrfRE.FindStringSubmatch(body)
	if m == nil {
		b.t.Fatalf("%s has no csrf field:\n%s", path, body)
	}
	return m[1]
}

// login logs in with the env's token.
func (b *browser) login() {
	b.t.Helper()
	resp, body := b.post("/ui/login", url.Values{"csrf": {b.csrf("/ui/login")}, "token": {b.e.token}})
	if resp.StatusCode != http.StatusSeeOther {
		b.t.Fatalf("login: %d\n%s", resp.StatusCode, body)
	}
}

// sessionPath is the console path of x's page.
func sessionPath(a store.Agent, x store.Session) string {
	return "/ui/agents/" + a.Name + "/sessions/" + x.SessionID
}
