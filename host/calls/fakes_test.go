package calls

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/paddock-dev/paddock/abi"
)

// Real HTTP servers that speak the providers' protocols, scripted per
// test: each request takes the next reply; requests are recorded.

// reply is one scripted answer.
type reply struct {
	status int    // non-2xx: an error answer with body
	body   string // error body, or a whole (unstreamed) JSON answer
	// events are SSE events: for OpenAI each is the data of one chunk
	// ("[DONE]" is added), for Anthropic "event\ndata".
	events []string
	delay  time.Duration // before answering
	hang   bool          // after the events, never end the stream
	header map[string]string
}

type recorded struct {
	header http.Header
	body   map[string]any
	raw    []byte
}

type fakeProvider struct {
	*httptest.Server
	mu      sync.Mutex
	replies []reply
	reqs    []recorded
	done    chan struct{}
}

// newFake starts a server; anthropic selects the event framing.
func newFake(t *testing.T, anthropic bool, replies ...reply) *fakeProvider {
	f := &fakeProvider{replies: replies, done: make(chan struct{})}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		var body map[string]any
		_ = json.Unmarshal(raw, &body)
		f.mu.Lock()
		f.reqs = append(f.reqs, recorded{header: r.Header.Clone(), body: body, raw: raw})
		if len(f.replies) == 0 {
			f.mu.Unlock()
			http.Error(w, `{"error":{"message":"no scripted reply"}}`, 500)
			return
		}
		rep := f.replies[0]
		f.replies = f.replies[1:]
		f.mu.Unlock()
		if rep.delay > 0 {
			select {
			case <-time.After(rep.delay):
			case <-r.Context().Done():
				return
			case <-f.done:
				return
			}
		}
		for k, v := range rep.header {
			w.Header().Set(k, v)
		}
		if rep.status != 0 && rep.status/100 != 2 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(rep.status)
			_, _ = io.WriteString(w, rep.body)
			return
		}
		if rep.events == nil {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, rep.body)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		for _, ev := range rep.events {
			if anthropic {
				typ, data, _ := bytes.Cut([]byte(ev), []byte("\n"))
				fmt.Fprintf(w, "event: %s\ndata: %s\n\n", typ, data)
			} else {
				fmt.Fprintf(w, "data: %s\n\n", ev)
			}
			fl.Flush()
		}
		if rep.hang {
			for {
				select {
				case <-r.Context().Done():
					return
				case <-f.done:
					return
				case <-time.After(20 * time.Millisecond):
					_, _ = io.WriteString(w, ": keep-alive\n\n")
					fl.Flush()
				}
			}
		}
		if !anthropic {
			_, _ = io.WriteString(w, "data: [DONE]\n\n")
		}
	}))
	t.Cleanup(func() { close(f.done); f.Close() })
	return f
}

func (f *fakeProvider) requests() []recorded {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]recorded(nil), f.reqs...)
}

func serverPort(t *testing.T, raw string) int {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := strconv.Atoi(u.Port())
	return p
}

// logBuffer captures slog output.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

type env map[string]string

func (e env) lookup(k string) (string, bool) { v, ok := e[k]; return v, ok }

// testExec builds an Executor with a captured log.
func testExec(t *testing.T, cfg Config, vars env) (*Executor, *logBuffer) {
	t.Helper()
	logs := &logBuffer{}
	cfg.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if cfg.Secrets == nil {
		s, err := NewSecrets(SecretsConfig{Declared: map[string]SecretSource{
			"api_key": {Env: "API_KEY"}, "token": {Env: "TOKEN"}, "unset": {Env: "UNSET"},
		}, LookupEnv: vars.lookup})
		if err != nil {
			t.Fatal(err)
		}
		cfg.Secrets = s
	}
	x, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return x, logs
}

// fixedResolver resolves names from a table.
func fixedResolver(table map[string]string) func(ctx context.Context, host string) ([]netip.Addr, error) {
	return func(ctx context.Context, host string) ([]netip.Addr, error) {
		a, ok := table[host]
		if !ok {
			return nil, fmt.Errorf("no such host %s", host)
		}
		return []netip.Addr{netip.MustParseAddr(a)}, nil
	}
}

func modelReq(endpoint, model string, msgs ...abi.ModelMessage) *abi.CallRequest {
	return &abi.CallRequest{Kind: abi.CallKindModel, Model: &abi.ModelRequest{Endpoint: endpoint, Model: model, Messages: msgs}}
}

func httpReq(method, u string, headers map[string]string) *abi.CallRequest {
	return &abi.CallRequest{Kind: abi.CallKindHTTP, HTTP: &abi.HTTPRequest{Method: method, URL: u, Headers: headers}}
}

func wantErr(t *testing.T, out Outcome, code abi.CallErrorCode, reason string) *abi.CallError {
	t.Helper()
	e := out.Result.Error
	if e == nil {
		t.Fatalf("no error, want %s/%s: %+v", code, reason, out.Result)
	}
	if e.Code != code || e.Reason != reason {
		t.Fatalf("error %s/%s (%s), want %s/%s", e.Code, e.Reason, e.Message, code, reason)
	}
	if out.ErrorCode != code {
		t.Fatalf("Outcome.ErrorCode %q, want %q", out.ErrorCode, code)
	}
	return e
}

func wantOK(t *testing.T, out Outcome) {
	t.Helper()
	if out.Result.Error != nil {
		t.Fatalf("error: %+v", out.Result.Error)
	}
}
