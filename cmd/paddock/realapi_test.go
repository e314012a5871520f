package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/host/api"
	apiclient "github.com/paddock-dev/paddock/host/api/client"
	"github.com/paddock-dev/paddock/host/runner"
	"github.com/paddock-dev/paddock/plugins/pluginhost"
	"github.com/paddock-dev/paddock/store/sqlite"
	"github.com/paddock-dev/paddock/wasm"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

// realAPI is the real API server of a host on SQLite, for CLI tests.
type realAPI struct {
	t       *testing.T
	url     string
	api     *apiclient.Client
	uploads atomic.Int64 // POST /v1/modules requests received
}

// startRealAPI starts a host on SQLite behind the real API (token "tok",
// module uploads capped at maxModule bytes), running wasm modules and
// plugin workers; it stops with the test. Each tune, if any, changes the
// host's policy first.
func startRealAPI(t *testing.T, maxModule int64, tune ...func(*host.Policy)) *realAPI {
	t.Helper()
	ctx := context.Background()
	quiet := slog.New(slog.DiscardHandler)
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "p.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	rt, err := wasm.New(ctx, wasm.Config{CacheDir: wasmtest.CacheDir(t), MemoryLimitPages: 1024, TurnTimeout: time.Minute}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close(ctx) })
	pm := pluginhost.NewManager(quiet, pluginhost.Options{})
	t.Cleanup(func() { _ = pm.Close(context.Background()) })
	wr := runner.New(runner.NewWasm(rt, st), pm, st)
	pol := host.DefaultPolicy()
	for _, f := range tune {
		f(&pol)
	}
	h, err := host.New(host.Options{Store: st, Runner: wr, Policy: pol, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	hctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = h.Run(hctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	ra := &realAPI{t: t}
	handler := api.New(api.Options{Host: h, Modules: wr, Plugins: wr, AuthToken: "tok", MaxBodyBytes: 1 << 20, MaxModuleBytes: maxModule, Logger: quiet})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == "POST" && r.URL.Path == "/v1/modules" {
			ra.uploads.Add(1)
		}
		handler.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	ra.url = srv.URL
	ra.api = apiclient.New(srv.URL, apiclient.WithToken("tok"))
	return ra
}

// run runs the paddock CLI in-process against the server and returns its
// output (stdout and stderr) and error.
func (ra *realAPI) run(ctx context.Context, args ...string) (string, error) {
	root := newRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(append([]string{"--server", ra.url, "--token", "tok"}, args...))
	err := root.ExecuteContext(ctx)
	return out.String(), err
}

// fastRetries retries failed attempts after 20–100 ms, so that a test sees
// retries and dead letters at once.
func fastRetries(p *host.Policy) {
	p.ScanInterval, p.BackoffMin, p.BackoffMax, p.MaxAttempts = 100*time.Millisecond, 20*time.Millisecond, 100*time.Millisecond, 2
}

// faultyAgent uploads the faulty example and registers it as agent name.
func (ra *realAPI) faultyAgent(ctx context.Context, name string) {
	ra.t.Helper()
	_, wasmBytes := wasmtest.BuildExample(ra.t, wasmtest.Faulty)
	m, err := ra.api.UploadModule(ctx, wasmBytes)
	if err != nil {
		ra.t.Fatal(err)
	}
	if _, err := ra.api.CreateAgent(ctx, apiclient.CreateAgentRequest{Name: name, Module: m.Digest}); err != nil {
		ra.t.Fatal(err)
	}
}

// waitEvents polls the session's events until ok accepts them (30 s).
func (ra *realAPI) waitEvents(ctx context.Context, agent, session string, ok func([]apiclient.Event) bool) []apiclient.Event {
	ra.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		evs, err := ra.api.ListEvents(ctx, agent, session, apiclient.ListEventsOptions{Limit: 1000})
		if err == nil && ok(evs) {
			return evs
		}
		if time.Now().After(deadline) {
			ra.t.Fatalf("events of %s/%s: %+v %v", agent, session, evs, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// getJSON GETs path from the API and returns the body re-encoded
// canonically.
func (ra *realAPI) getJSON(path string) []byte {
	ra.t.Helper()
	req, _ := http.NewRequest("GET", ra.url+path, nil)
	req.Header.Set("Authorization", "Bearer tok")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		ra.t.Fatal(err)
	}
	defer resp.Body.Close()
	var v any
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		ra.t.Fatal(err)
	}
	b, _ := json.Marshal(v)
	return b
}

// canonJSON re-encodes the JSON s canonically, failing the test if it is
// not JSON.
func canonJSON(t *testing.T, s string) []byte {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, s)
	}
	b, _ := json.Marshal(v)
	return b
}
