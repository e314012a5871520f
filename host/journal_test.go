package host_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/host/calls"
	"github.com/paddock-dev/paddock/store"
)

// chatServer is a real HTTP server speaking the OpenAI chat-completions
// protocol (unstreamed answers): it answers "echo: <last user message>"
// with usage 7 in / 3 out, or a scripted status for the first requests
// whose user message starts with "fail:". It counts requests per user
// message.
type chatServer struct {
	*httptest.Server
	mu    sync.Mutex
	count map[string]int
}

func newChatServer(t *testing.T) *chatServer {
	s := &chatServer{count: map[string]int{}}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Messages []struct {
				Role    string `json:"role"`
				Content string `json:"content"`
			} `json:"messages"`
		}
		b, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(b, &req); err != nil || len(req.Messages) == 0 {
			http.Error(w, `{"error":{"message":"bad request"}}`, http.StatusBadRequest)
			return
		}
		last := req.Messages[len(req.Messages)-1].Content
		s.mu.Lock()
		s.count[last]++
		n := s.count[last]
		s.mu.Unlock()
		if strings.HasPrefix(last, "fail:") && n == 1 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = io.WriteString(w, `{"error":{"message":"scripted failure"}}`)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"id": "c1", "object": "chat.completion", "model": "m1",
			"choices": []any{map[string]any{"index": 0, "finish_reason": "stop",
				"message": map[string]any{"role": "assistant", "content": "echo: " + last}}},
			"usage": map[string]any{"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
		})
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *chatServer) requests(msg string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.count[msg]
}

// startWithCalls runs a host whose turns make host calls through a real
// executor to the OpenAI-protocol server at url, granted to every agent.
func startWithCalls(t *testing.T, st store.Store, funcs map[string]abi.TurnFunc, url string) *fixture {
	t.Helper()
	x, err := calls.New(calls.Config{
		Endpoints: map[string]calls.Endpoint{"chat": {Provider: calls.ProviderOpenAI, BaseURL: url + "/v1", Models: []string{"m1"}}},
		Logger:    quietLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	pol := testPolicy()
	pol.Capabilities = calls.Capabilities{Models: []string{"chat"}}
	return runHost(t, host.Options{Store: st, Runner: funcRunner{funcs}, Policy: pol, Logger: quietLogger(), Calls: x})
}

// ask makes one model call of msg and describes its result.
func ask(ctx context.Context, msg string) string {
	res := abi.Call(ctx, &abi.CallRequest{Kind: abi.CallKindModel, Model: &abi.ModelRequest{
		Endpoint: "chat", Messages: []abi.ModelMessage{{Role: abi.RoleUser, Content: msg}}}})
	if res.Error != nil {
		return fmt.Sprintf("seq %d error %s", res.Seq, res.Error.Code)
	}
	return fmt.Sprintf("seq %d %q replayed=%v", res.Seq, res.Model.Message.Content, res.Replayed)
}

// journal returns the event's journal rows.
func (f *fixture) journal(key store.ActorKey, event int64) []store.HostCall {
	f.t.Helper()
	rows, err := f.st.HostCalls(context.Background(), key, event)
	if err != nil {
		f.t.Fatal(err)
	}
	return rows
}

// TestARetriedTurnReplaysItsRecordedModelCall: a turn makes a model call
// and then fails; its retry (a new epoch) gets the recorded answer marked
// replayed without a second request, makes its next call live, and the
// committed turn's usage counts each call once (docs/DESIGN.md invariant
// 12).
func TestARetriedTurnReplaysItsRecordedModelCall(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		srv := newChatServer(t)
		var mu sync.Mutex
		var seen []string
		f := startWithCalls(t, st, map[string]abi.TurnFunc{"twice": func(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
			first := ask(ctx, "hello")
			mu.Lock()
			seen = append(seen, fmt.Sprintf("attempt %d: %s", req.Attempt, first))
			mu.Unlock()
			if req.Attempt == 1 {
				return nil, errors.New("crash after the model answered")
			}
			second := ask(ctx, "again")
			return &abi.TurnResult{Messages: []abi.Message{{Role: abi.RoleAssistant, Content: first + " | " + second}}}, nil
		}}, srv.URL)
		a := f.agent("twice")
		key := f.session(a)
		ev := f.signal(key, "go")
		f.waitFor("the retried turn to commit", func() bool { return f.get(key).TurnCount == 1 })

		if n := srv.requests("hello"); n != 1 {
			t.Errorf("the model server got %d requests for the first call, want 1 (the retry replays it)", n)
		}
		if n := srv.requests("again"); n != 1 {
			t.Errorf("the model server got %d requests for the second call, want 1", n)
		}
		mu.Lock()
		want := []string{`attempt 1: seq 1 "echo: hello" replayed=false`, `attempt 2: seq 1 "echo: hello" replayed=true`}
		if strings.Join(seen, "\n") != strings.Join(want, "\n") {
			t.Errorf("the calls saw\n%s\nwant\n%s", strings.Join(seen, "\n"), strings.Join(want, "\n"))
		}
		mu.Unlock()
		turns := f.transcript(key)
		if got := turns[0].Messages[len(turns[0].Messages)-1].Content; got != `seq 1 "echo: hello" replayed=true | seq 2 "echo: again" replayed=false` {
			t.Errorf("reply = %q", got)
		}
		if turns[0].Usage != (abi.Usage{InputTokens: 14, OutputTokens: 6}) {
			t.Errorf("turn usage = %+v, want each call once: 14 in, 6 out", turns[0].Usage)
		}
		rows := f.journal(key, ev.ID)
		if len(rows) != 2 || rows[0].Seq != 1 || rows[1].Seq != 2 || rows[0].SetAside || rows[1].SetAside {
			t.Fatalf("journal = %+v, want live rows at seq 1 and 2", rows)
		}
		if rows[0].Replays != 1 || rows[0].ReplayedEpoch != turns[0].ActorEpoch || rows[0].ActorEpoch >= turns[0].ActorEpoch {
			t.Errorf("seq 1: replays %d by epoch %d, recorded at epoch %d; the commit was at epoch %d",
				rows[0].Replays, rows[0].ReplayedEpoch, rows[0].ActorEpoch, turns[0].ActorEpoch)
		}
		if rows[1].ActorEpoch != turns[0].ActorEpoch || rows[1].Replays != 0 {
			t.Errorf("seq 2 = %+v, want recorded live by the committing epoch %d", rows[1], turns[0].ActorEpoch)
		}
		if rows[0].Kind != "model" || rows[0].Destination == "" || rows[0].InputTokens != 7 || rows[0].OutputTokens != 3 ||
			!strings.HasPrefix(rows[0].RequestDigest, "sha256:") {
			t.Errorf("seq 1 row = %+v", rows[0])
		}
		if got := testutil.ToFloat64(f.h.Metrics().HostCallsReplayed.WithLabelValues(a.Name)); got != 1 {
			t.Errorf("paddock_host_calls_replayed_total = %v, want 1", got)
		}
	})
}

// TestADivergingRetrySetsTheJournalAsideAndGoesLive: a retry that sends a
// different request at a seq is not given the recorded answer: the rows
// from there are set aside (kept) and the call goes live. An error result
// is recorded but never replayed: the retry asks again.
func TestADivergingRetrySetsTheJournalAsideAndGoesLive(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		srv := newChatServer(t)
		f := startWithCalls(t, st, map[string]abi.TurnFunc{
			"diverge": func(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
				r := ask(ctx, fmt.Sprintf("question %d", req.Attempt))
				if req.Attempt == 1 {
					return nil, errors.New("crash")
				}
				return &abi.TurnResult{Messages: []abi.Message{{Role: abi.RoleAssistant, Content: r}}}, nil
			},
			"upstream": func(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
				r := ask(ctx, "fail: once")
				if strings.Contains(r, "error") {
					return nil, errors.New(r)
				}
				return &abi.TurnResult{Messages: []abi.Message{{Role: abi.RoleAssistant, Content: r}}}, nil
			},
		}, srv.URL)

		key := f.session(f.agent("diverge"))
		ev := f.signal(key, "go")
		f.waitFor("the diverging turn to commit", func() bool { return f.get(key).TurnCount == 1 })
		turns := f.transcript(key)
		if got := turns[0].Messages[len(turns[0].Messages)-1].Content; got != `seq 1 "echo: question 2" replayed=false` {
			t.Errorf("reply = %q, want the live answer to the new question", got)
		}
		rows := f.journal(key, ev.ID)
		if len(rows) != 2 || !rows[0].SetAside || rows[1].SetAside || rows[0].Seq != 1 || rows[1].Seq != 1 ||
			rows[0].RequestDigest == rows[1].RequestDigest {
			t.Fatalf("journal = %+v, want attempt 1's row set aside and attempt 2's live, both at seq 1", rows)
		}
		if turns[0].Usage != (abi.Usage{InputTokens: 7, OutputTokens: 3}) {
			t.Errorf("turn usage = %+v, want only the live row's", turns[0].Usage)
		}

		key = f.session(f.agent("upstream"))
		ev = f.signal(key, "go")
		f.waitFor("the turn after an upstream error to commit", func() bool { return f.get(key).TurnCount == 1 })
		if n := srv.requests("fail: once"); n != 2 {
			t.Errorf("the model server got %d requests, want 2: a recorded error is not replayed", n)
		}
		rows = f.journal(key, ev.ID)
		if len(rows) != 2 || !rows[0].SetAside || rows[0].ErrorCode != string(abi.CallUpstream) || rows[0].Status != 500 ||
			rows[1].SetAside || rows[1].ErrorCode != "" {
			t.Fatalf("journal = %+v, want the upstream error set aside and the live answer", rows)
		}
	})
}

// TestHostCallsWithoutAGrantAreDeniedAndJournaled: an agent granted
// nothing gets a denied error (not a trap), the refusal is in the journal,
// and no request leaves the host.
func TestHostCallsWithoutAGrantAreDeniedAndJournaled(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		srv := newChatServer(t)
		f := startWithCalls(t, st, map[string]abi.TurnFunc{"nogrant": func(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
			res := abi.Call(ctx, &abi.CallRequest{Kind: abi.CallKindHTTP, HTTP: &abi.HTTPRequest{URL: srv.URL + "/anything"}})
			out := "no error"
			if res.Error != nil {
				out = string(res.Error.Code) + "/" + res.Error.Reason
			}
			return &abi.TurnResult{Messages: []abi.Message{{Role: abi.RoleAssistant, Content: out}}}, nil
		}}, srv.URL)
		key := f.session(f.agent("nogrant"))
		ev := f.signal(key, "go")
		f.waitFor("the turn to commit", func() bool { return f.get(key).TurnCount == 1 })
		turns := f.transcript(key)
		if got := turns[0].Messages[len(turns[0].Messages)-1].Content; got != "denied/destination" {
			t.Errorf("reply = %q, want denied/destination", got)
		}
		rows := f.journal(key, ev.ID)
		if len(rows) != 1 || rows[0].ErrorCode != string(abi.CallDenied) || rows[0].Kind != "http" {
			t.Fatalf("journal = %+v, want one denied http row", rows)
		}
		srv.mu.Lock()
		n := len(srv.count)
		srv.mu.Unlock()
		if n != 0 {
			t.Errorf("the server got %d distinct requests, want none", n)
		}
	})
}
