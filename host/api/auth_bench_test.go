package api_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/host/api"
	"github.com/paddock-dev/paddock/host/runner"
	"github.com/paddock-dev/paddock/host/service"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/store/pgtest"
	"github.com/paddock-dev/paddock/store/postgres"
	"github.com/paddock-dev/paddock/store/sqlite"
)

// BenchmarkAuthenticate is the cost of the token check of one request:
// service.Authenticate (a stored token: one primary-key read of its row, a
// sha256 and a constant-time compare; the bootstrap token: a sha256 and a
// compare), and the whole API middleware (authenticate and authorize) in
// front of an empty handler, on each driver.
func BenchmarkAuthenticate(b *testing.B) {
	for _, driver := range []string{"sqlite", "postgres"} {
		b.Run(driver, func(b *testing.B) {
			ctx := context.Background()
			var st store.Store
			var err error
			if driver == "postgres" {
				st, err = postgres.Open(ctx, pgtest.DSN(b))
			} else {
				st, err = sqlite.Open(ctx, filepath.Join(b.TempDir(), "p.db"))
			}
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { st.Close() })
			quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
			h, err := host.New(host.Options{Store: st, Runner: runner.NewWasm(runtime(b), st), Policy: host.DefaultPolicy(), Logger: quiet})
			if err != nil {
				b.Fatal(err)
			}
			svc := service.New(h, nil, nil).WithAuthToken("boot-s3cret")
			tok, err := svc.CreateToken(ctx, service.CreateTokenParams{Role: "reader"})
			if err != nil {
				b.Fatal(err)
			}
			b.Run("stored", func(b *testing.B) {
				for b.Loop() {
					if _, err := svc.Authenticate(ctx, tok.Value); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run("bootstrap", func(b *testing.B) {
				for b.Loop() {
					if _, err := svc.Authenticate(ctx, "boot-s3cret"); err != nil {
						b.Fatal(err)
					}
				}
			})
			// The API's GET /v1/openapi.yaml through the middleware, with
			// and without a token (an open host): the difference is the
			// check's share of a request.
			srv := api.New(api.Options{Host: h, Service: svc, Logger: quiet})
			open := api.New(api.Options{Host: h, Service: service.New(h, nil, nil), Logger: quiet})
			for name, c := range map[string]struct {
				h     http.Handler
				token string
			}{"http-stored": {srv, tok.Value}, "http-open": {open, ""}} {
				b.Run(name, func(b *testing.B) {
					for b.Loop() {
						req := httptest.NewRequest("GET", "/v1/openapi.yaml", nil)
						if c.token != "" {
							req.Header.Set("Authorization", "Bearer "+c.token)
						}
						w := httptest.NewRecorder()
						c.h.ServeHTTP(w, req)
						if w.Code != 200 {
							b.Fatalf("%d %s", w.Code, w.Body)
						}
					}
				})
			}
		})
	}
}
