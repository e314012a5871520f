package host_test

// Attacks on the host-call journal (branch hc-attack).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
)

// usageServer answers "echo: <last message>" with the given usage, and
// counts requests per message.
type usageServer struct {
	*httptest.Server
	mu    sync.Mutex
	count map[string]int
}

func newUsageServer(t *testing.T, in, out int64) *usageServer {
	s := &usageServer{count: map[string]int{}}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Messages []struct {
				Content string `json:"content"`
			} `json:"messages"`
		}
		b, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(b, &req)
		last := req.Messages[len(req.Messages)-1].Content
		s.mu.Lock()
		s.count[last]++
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"model": "m1",
			"choices": []any{map[string]any{"index": 0, "finish_reason": "stop",
				"message": map[string]any{"role": "assistant", "content": "echo: " + last}}},
			"usage": map[string]any{"prompt_tokens": in, "completion_tokens": out},
		})
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *usageServer) total() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, c := range s.count {
		n += c
	}
	return n
}

// Found by attack, fixed: a provider's negative usage is passed to RecordHostCall, which
// refuses it (store.CheckHostCall: ErrInvalid). The call was made and paid,
// but its result is withheld (cancelled), nothing is journaled — so the
// tokens never count toward tokens_per_day — and every retry pays again.
func TestAttackNegativeUsageLeavesAPaidCallUnjournaled(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		srv := newUsageServer(t, -5, 3)
		f := startWithCalls(t, st, map[string]abi.TurnFunc{"neg": func(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
			return &abi.TurnResult{Messages: []abi.Message{{Role: abi.RoleAssistant, Content: ask(ctx, "hello")}}}, nil
		}}, srv.URL)
		key := f.session(f.agent("neg"))
		ev := f.signal(key, "go")
		f.waitFor("the turn to commit", func() bool { return f.get(key).TurnCount == 1 })
		turns := f.transcript(key)
		if got := turns[0].Messages[len(turns[0].Messages)-1].Content; got != `seq 1 "echo: hello" replayed=false` {
			t.Errorf("reply = %q: the paid call's result was withheld", got)
		}
		if rows := f.journal(key, ev.ID); len(rows) != 1 {
			t.Errorf("journal has %d rows, want the paid call recorded", len(rows))
		}
	})
}

// Found by attack, fixed: calls made concurrently by one turn are numbered in arrival
// order. A retry that makes the same calls concurrently numbers them
// differently, so most diverge and are paid again (results are never
// mismatched: each seq is checked by digest).
func TestAttackConcurrentCallsReplayAfterRetry(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		srv := newUsageServer(t, 1, 1)
		const n = 16
		var mu sync.Mutex
		var bad []string
		f := startWithCalls(t, st, map[string]abi.TurnFunc{"fan": func(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
			var wg sync.WaitGroup
			order := make([]int, n)
			for i := range n {
				order[i] = i
			}
			if req.Attempt == 2 {
				sort.Sort(sort.Reverse(sort.IntSlice(order))) // same calls, other start order
			}
			for _, i := range order {
				wg.Add(1)
				go func() {
					defer wg.Done()
					q := fmt.Sprintf("q%02d", i)
					got := ask(ctx, q)
					if !strings.Contains(got, `"echo: `+q+`"`) {
						mu.Lock()
						bad = append(bad, q+" -> "+got)
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			if req.Attempt == 1 {
				return nil, errors.New("crash after the calls")
			}
			return &abi.TurnResult{Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "done"}}}, nil
		}}, srv.URL)
		key := f.session(f.agent("fan"))
		f.signal(key, "go")
		f.waitFor("the retried turn to commit", func() bool { return f.get(key).TurnCount == 1 })
		mu.Lock()
		if len(bad) > 0 {
			t.Errorf("a call got another call's result: %v", bad)
		}
		mu.Unlock()
		if got := srv.total(); got != n {
			t.Errorf("the provider got %d requests for %d distinct calls over two attempts: %d paid twice", got, n, got-n)
		}
	})
}

// Found by attack, fixed: the Idempotency-Key of a model call is derived from (agent,
// event, seq) only. A retry that diverges — a different request at the
// same seq — sends the same key: a provider (or gateway) that honours the
// header answers the new request with the old request's cached reply (or
// refuses it). The key must bind the request too.
func TestAttackIdempotencyKeyIgnoresTheRequest(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		var mu sync.Mutex
		keys := map[string]string{} // last message → Idempotency-Key
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var req struct {
				Messages []struct {
					Content string `json:"content"`
				} `json:"messages"`
			}
			b, _ := io.ReadAll(r.Body)
			_ = json.Unmarshal(b, &req)
			last := req.Messages[len(req.Messages)-1].Content
			mu.Lock()
			keys[last] = r.Header.Get("Idempotency-Key")
			mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(map[string]any{"model": "m1",
				"choices": []any{map[string]any{"index": 0, "finish_reason": "stop", "message": map[string]any{"role": "assistant", "content": "echo: " + last}}},
				"usage":   map[string]any{"prompt_tokens": 1, "completion_tokens": 1}})
		}))
		t.Cleanup(srv.Close)
		f := startWithCalls(t, st, map[string]abi.TurnFunc{"diverge": func(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
			r := ask(ctx, fmt.Sprintf("question %d", req.Attempt))
			if req.Attempt == 1 {
				return nil, errors.New("crash")
			}
			return &abi.TurnResult{Messages: []abi.Message{{Role: abi.RoleAssistant, Content: r}}}, nil
		}}, srv.URL)
		key := f.session(f.agent("diverge"))
		f.signal(key, "go")
		f.waitFor("the diverging turn to commit", func() bool { return f.get(key).TurnCount == 1 })
		mu.Lock()
		defer mu.Unlock()
		k1, k2 := keys["question 1"], keys["question 2"]
		if k1 == "" || k2 == "" {
			t.Fatalf("keys %v", keys)
		}
		if k1 == k2 {
			t.Errorf("two different requests at seq 1 were sent with the same Idempotency-Key %s", k1)
		}
	})
}
