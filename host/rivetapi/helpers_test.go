package rivetapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/host/api"
	"github.com/paddock-dev/paddock/host/rivetapi"
	"github.com/paddock-dev/paddock/host/runner"
	"github.com/paddock-dev/paddock/host/service"
	"github.com/paddock-dev/paddock/store/sqlite"
	"github.com/paddock-dev/paddock/wasm"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

const token = "rivet-test-token"

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

// env is a real host over SQLite with Paddock's API and Rivet's actors API
// on one httptest server, as paddock serve mounts them, behind token.
type env struct {
	t   *testing.T
	svc *service.Service
	h   *host.Host
	url string
}

// newEnv starts the host and registers agents "notes" and "faulty" (pool
// "default"; pool "batch" exists but is no agent's, "gpu" does not exist).
func newEnv(t *testing.T) *env {
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
	pol.Pools = map[string]int{"default": 64, "batch": 4}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	h, err := host.New(host.Options{Store: st, Runner: wr, Policy: pol, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = h.Run(ctx); close(done) }()
	svc := service.New(h, wr, nil)
	for name, pkg := range map[string]string{"notes": wasmtest.Notes, "faulty": wasmtest.Faulty} {
		_, b := wasmtest.BuildExample(t, pkg)
		m, _, err := svc.UploadModule(ctx, b)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := svc.CreateAgent(ctx, name, service.Binding{Module: m.Digest}); err != nil {
			t.Fatal(err)
		}
	}
	v1 := api.New(api.Options{Host: h, Service: svc, AuthToken: token, MaxBodyBytes: 1 << 20, MaxModuleBytes: 32 << 20, Logger: log})
	rv := rivetapi.New(rivetapi.Options{Service: svc, AuthToken: token, Logger: log})
	srv := httptest.NewServer(rv.Mount(v1))
	t.Cleanup(func() { srv.Close(); cancel(); <-done })
	return &env{t: t, svc: svc, h: h, url: srv.URL}
}

// do sends a request with the token and returns the status and the
// decoded JSON body.
func (e *env) do(method, path, body string) (int, map[string]any) {
	e.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = bytes.NewReader([]byte(body))
	}
	req, err := http.NewRequest(method, e.url+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		e.t.Fatalf("%s %s: %d, response is not a JSON object: %s", method, path, resp.StatusCode, raw)
	}
	return resp.StatusCode, out
}
