package main

import (
	"bytes"
	"context"
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
// module uploads capped at maxModule bytes); it stops with the test.
func startRealAPI(t *testing.T, maxModule int64) *realAPI {
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
	wr := runner.NewWasm(rt, st)
	h, err := host.New(host.Options{Store: st, Runner: wr, Policy: host.DefaultPolicy(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	hctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = h.Run(hctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	ra := &realAPI{t: t}
	handler := api.New(api.Options{Host: h, Modules: wr, AuthToken: "tok", MaxBodyBytes: 1 << 20, MaxModuleBytes: maxModule, Logger: quiet})
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
