package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/host/api"
	"github.com/paddock-dev/paddock/host/runner"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/store/pgtest"
	"github.com/paddock-dev/paddock/store/postgres"
	"github.com/paddock-dev/paddock/store/sqlite"
	"github.com/paddock-dev/paddock/wasm"
	"github.com/paddock-dev/paddock/wasm/wasmtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var (
	rtOnce sync.Once
	rt     *wasm.Runtime
	rtErr  error
)

// runtime returns one wasm runtime shared by the tests of this binary.
func runtime(t testing.TB) *wasm.Runtime {
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

type env struct {
	t   *testing.T
	st  store.Store
	url string
}

func newEnv(t *testing.T, driver, token string, tweak ...func(*api.Options)) *env {
	t.Helper()
	var st store.Store
	var err error
	if driver == "postgres" {
		st, err = postgres.Open(context.Background(), pgtest.DSN(t))
	} else {
		st, err = sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "p.db"))
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	wr := runner.NewWasm(runtime(t), st)
	pol := host.DefaultPolicy()
	pol.IdleTimeout, pol.ScanInterval, pol.LeaseTTL = time.Second, 100*time.Millisecond, 3*time.Second
	pol.BackoffMin, pol.BackoffMax, pol.MaxAttempts = 20*time.Millisecond, 100*time.Millisecond, 2
	h, err := host.New(host.Options{Store: st, Runner: wr, Policy: pol, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = h.Run(ctx); close(done) }()
	opts := api.Options{
		Host: h, Modules: wr, AuthToken: token, MaxBodyBytes: 4096, MaxModuleBytes: 32 << 20,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	for _, f := range tweak {
		f(&opts)
	}
	srv := httptest.NewServer(api.New(opts))
	t.Cleanup(func() { srv.Close(); cancel(); <-done })
	return &env{t: t, st: st, url: srv.URL}
}

// do sends a request and returns the status and decoded JSON body.
func (e *env) do(method, path, contentType string, body []byte, hdr ...string) (int, map[string]any) {
	e.t.Helper()
	req, err := http.NewRequest(method, e.url+path, bytes.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	raw, _ := io.ReadAll(resp.Body)
	if len(raw) > 0 && strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		if err := json.Unmarshal(raw, &out); err != nil {
			e.t.Fatalf("%s %s: response is not JSON: %s", method, path, raw)
		}
	}
	return resp.StatusCode, out
}

func (e *env) json(method, path, body string) (int, map[string]any) {
	return e.do(method, path, "application/json", []byte(body))
}

// errorOf returns the error object of a response.
func errorOf(body map[string]any) (code, field, msg string) {
	eo, _ := body["error"].(map[string]any)
	code, _ = eo["code"].(string)
	field, _ = eo["field"].(string)
	msg, _ = eo["message"].(string)
	return
}

// setup uploads the notes example and registers agent "notes".
func (e *env) setup() {
	e.t.Helper()
	_, b := wasmtest.BuildExample(e.t, wasmtest.Notes)
	code, m := e.do("POST", "/v1/modules", "application/wasm", b)
	if code != 201 {
		e.t.Fatalf("upload: %d %v", code, m)
	}
	code, m = e.json("POST", "/v1/agents", fmt.Sprintf(`{"name":"notes","module":%q}`, m["digest"]))
	if code != 201 {
		e.t.Fatalf("create agent: %d %v", code, m)
	}
}

func eachDriver(t *testing.T, f func(t *testing.T, driver string)) {
	t.Parallel()
	for _, d := range []string{"sqlite", "postgres"} {
		t.Run(d, func(t *testing.T) {
			t.Parallel()
			f(t, d)
		})
	}
}

// setupFaulty uploads the faulty example and registers agent "faulty".
func (e *env) setupFaulty() {
	e.t.Helper()
	_, b := wasmtest.BuildExample(e.t, wasmtest.Faulty)
	code, m := e.do("POST", "/v1/modules", "application/wasm", b)
	if code != 201 && code != 200 {
		e.t.Fatalf("upload: %d %v", code, m)
	}
	if code, m = e.json("POST", "/v1/agents", fmt.Sprintf(`{"name":"faulty","module":%q}`, m["digest"])); code != 201 {
		e.t.Fatalf("create agent: %d %v", code, m)
	}
}

func (e *env) waitSession(path, what string, cond func(map[string]any) bool) map[string]any {
	e.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		_, s := e.json("GET", path, "")
		if cond(s) {
			return s
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out waiting for %s: %v", what, s)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
