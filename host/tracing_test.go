package host_test

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/host/api"
	"github.com/paddock-dev/paddock/host/calls"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/tracing"
)

// otlpReceiver is a real OTLP/HTTP trace receiver: it decodes each
// protobuf ExportTraceServiceRequest POSTed to /v1/traces and keeps its
// spans.
type otlpReceiver struct {
	*httptest.Server
	mu    sync.Mutex
	spans []*tracepb.Span
	bad   []string
}

func newOTLPReceiver(t *testing.T) *otlpReceiver {
	r := &otlpReceiver{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, err := io.ReadAll(req.Body)
		var in coltracepb.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(body, &in)
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if req.URL.Path != "/v1/traces" || req.Header.Get("Content-Type") != "application/x-protobuf" || err != nil {
			r.bad = append(r.bad, fmt.Sprintf("%s %s %s: %v", req.Method, req.URL.Path, req.Header.Get("Content-Type"), err))
			http.Error(w, "bad export", http.StatusBadRequest)
			return
		}
		for _, rs := range in.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				r.spans = append(r.spans, ss.Spans...)
			}
		}
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(r.Close)
	return r
}

// named returns the received spans of that name, in arrival order.
func (r *otlpReceiver) named(name string) []*tracepb.Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*tracepb.Span
	for _, s := range r.spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// attr returns a span attribute's value as a string ("" when absent).
func attr(s *tracepb.Span, key string) string {
	for _, kv := range s.Attributes {
		if kv.Key != key {
			continue
		}
		switch v := kv.Value.GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			return v.StringValue
		case *commonpb.AnyValue_BoolValue:
			return fmt.Sprint(v.BoolValue)
		case *commonpb.AnyValue_IntValue:
			return fmt.Sprint(v.IntValue)
		}
	}
	return ""
}

func hexID(b []byte) string { return hex.EncodeToString(b) }

// TestTheSpanTreeOfASignalWhoseTurnFailsOnceThenCommits: a signal sent
// over HTTP with a W3C traceparent is accepted under a span that is the
// request's child; its event stores the trace; the turn's first attempt
// makes a model call and fails, the second replays the call and commits.
// A real OTLP/HTTP receiver gets, in the request's trace: the acceptance,
// two attempt spans under it (error, then ok), a host-call span under each
// (live, then replayed, with the model's tokens), and the commit under the
// second attempt (docs/DESIGN.md "Tracing").
func TestTheSpanTreeOfASignalWhoseTurnFailsOnceThenCommits(t *testing.T) {
	eachDriver(t, func(t *testing.T, st store.Store) {
		recv := newOTLPReceiver(t)
		tp, err := tracing.New(context.Background(), tracing.Config{Endpoint: recv.URL + "/v1/traces", SampleRatio: 1, HostID: "h1"})
		if err != nil {
			t.Fatal(err)
		}
		chat := newChatServer(t)
		x, err := calls.New(calls.Config{
			Endpoints: map[string]calls.Endpoint{"chat": {Provider: calls.ProviderOpenAI, BaseURL: chat.URL + "/v1", Models: []string{"m1"}}},
			Logger:    quietLogger(),
		})
		if err != nil {
			t.Fatal(err)
		}
		pol := testPolicy()
		pol.Capabilities = calls.Capabilities{Models: []string{"chat"}}
		refs := make(chan abi.TurnRef, 2)
		var logs syncBuffer
		f := runHost(t, host.Options{Store: st, Runner: funcRunner{map[string]abi.TurnFunc{
			"flaky": func(ctx context.Context, req *abi.TurnRequest) (*abi.TurnResult, error) {
				got := ask(ctx, "hello")
				refs <- req.TurnRef
				if req.Attempt == 1 {
					return nil, errors.New("crash after the model answered")
				}
				return &abi.TurnResult{Messages: []abi.Message{{Role: abi.RoleAssistant, Content: got}}}, nil
			},
		}}, Policy: pol, Logger: slog.New(tracing.LogHandler(slog.NewTextHandler(&logs, nil))), Calls: x, Tracing: tp})
		srv := httptest.NewServer(api.New(api.Options{Host: f.h, MaxBodyBytes: 4096, MaxModuleBytes: 1 << 20, Logger: quietLogger()}))
		t.Cleanup(srv.Close)

		a := f.agent("flaky")
		key := f.session(a)
		const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
		req, _ := http.NewRequest("POST", srv.URL+"/v1/agents/"+a.Name+"/sessions/"+key.SessionID+"/signals", strings.NewReader(`{"message":"go"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("traceparent", "00-"+traceID+"-"+parentID+"-01")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("signal: %d %s", resp.StatusCode, b)
		}
		f.waitFor("the retried turn to commit", func() bool { return f.get(key).TurnCount == 1 })
		// A late reply of the first attempt (a zombie worker) is refused by
		// the fences: its commit span records why.
		late := &abi.TurnResult{TurnRef: <-refs, Outcome: abi.OutcomeOK,
			Messages: []abi.Message{{Role: abi.RoleAssistant, Content: "late"}}}
		var fe *store.FenceError
		if _, err := f.h.Commit(context.Background(), late); !errors.As(err, &fe) {
			t.Fatalf("late commit: %v, want a fence rejection", err)
		}
		// The second attempt's span ends just after its commit: flush until
		// the receiver has both attempts and both commits.
		f.waitFor("the spans to arrive", func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := tp.ForceFlush(ctx); err != nil {
				t.Fatal(err)
			}
			return len(recv.named(tracing.SpanAttempt)) >= 2 && len(recv.named(tracing.SpanCommit)) >= 2
		})
		t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

		evs := f.events(key)
		if len(evs) != 1 || !strings.HasPrefix(evs[0].Traceparent, "00-"+traceID+"-") || strings.Contains(evs[0].Traceparent, parentID) {
			t.Fatalf("events = %+v, want one whose traceparent is the acceptance span's, in trace %s", evs, traceID)
		}
		recv.mu.Lock()
		if len(recv.bad) > 0 {
			t.Errorf("the receiver refused exports: %v", recv.bad)
		}
		recv.mu.Unlock()

		sig := recv.named(tracing.SpanSignal)
		if len(sig) != 1 {
			t.Fatalf("got %d %s spans, want 1", len(sig), tracing.SpanSignal)
		}
		s := sig[0]
		if hexID(s.TraceId) != traceID || hexID(s.ParentSpanId) != parentID {
			t.Errorf("acceptance span: trace %s parent %s, want the request's %s / %s", hexID(s.TraceId), hexID(s.ParentSpanId), traceID, parentID)
		}
		if attr(s, "paddock.agent") != a.Name || attr(s, "paddock.event.id") != fmt.Sprint(evs[0].ID) {
			t.Errorf("acceptance span attributes = %v", s.Attributes)
		}
		if want := "00-" + traceID + "-" + hexID(s.SpanId) + "-01"; evs[0].Traceparent != want {
			t.Errorf("stored traceparent = %s, want the acceptance span's %s", evs[0].Traceparent, want)
		}

		atts := recv.named(tracing.SpanAttempt)
		if len(atts) != 2 {
			t.Fatalf("got %d attempt spans, want 2", len(atts))
		}
		byAttempt := map[string]*tracepb.Span{}
		for _, at := range atts {
			byAttempt[attr(at, "paddock.attempt")] = at
			if hexID(at.TraceId) != traceID || hexID(at.ParentSpanId) != hexID(s.SpanId) {
				t.Errorf("attempt %s: trace %s parent %s, want trace %s under the acceptance span %s",
					attr(at, "paddock.attempt"), hexID(at.TraceId), hexID(at.ParentSpanId), traceID, hexID(s.SpanId))
			}
			if attr(at, "paddock.agent") != a.Name || attr(at, "paddock.session") != key.SessionID ||
				attr(at, "paddock.event.id") != fmt.Sprint(evs[0].ID) || attr(at, "paddock.epoch") == "0" || attr(at, "paddock.worker.kind") == "" {
				t.Errorf("attempt span attributes = %v", at.Attributes)
			}
		}
		first, second := byAttempt["1"], byAttempt["2"]
		if first == nil || second == nil {
			t.Fatalf("attempt spans by attempt = %v, want attempts 1 and 2", byAttempt)
		}
		if first.Status.GetCode() != tracepb.Status_STATUS_CODE_ERROR || attr(first, "paddock.outcome") == "committed" ||
			!strings.Contains(first.Status.GetMessage(), "crash after the model answered") {
			t.Errorf("first attempt: status %v, outcome %q; want an error with the cause", first.Status, attr(first, "paddock.outcome"))
		}
		if second.Status.GetCode() != tracepb.Status_STATUS_CODE_OK || attr(second, "paddock.outcome") != "committed" {
			t.Errorf("second attempt: status %v, outcome %q; want ok, committed", second.Status, attr(second, "paddock.outcome"))
		}
		if attr(first, "paddock.epoch") == attr(second, "paddock.epoch") {
			t.Errorf("both attempts ran at epoch %s; the retry takes a new activation", attr(first, "paddock.epoch"))
		}

		var ok, fenced []*tracepb.Span
		for _, c := range recv.named(tracing.SpanCommit) {
			if attr(c, "paddock.fence.reason") != "" {
				fenced = append(fenced, c)
			} else {
				ok = append(ok, c)
			}
		}
		if len(ok) != 1 || hexID(ok[0].ParentSpanId) != hexID(second.SpanId) || hexID(ok[0].TraceId) != traceID ||
			ok[0].Status.GetCode() != tracepb.Status_STATUS_CODE_OK || attr(ok[0], "paddock.turn.no") != "1" {
			t.Errorf("commit spans = %v, want one ok commit of turn 1 under the second attempt %s", ok, hexID(second.SpanId))
		}
		if len(fenced) != 1 || attr(fenced[0], "paddock.fence.reason") != string(fe.Reason) ||
			fenced[0].Status.GetCode() != tracepb.Status_STATUS_CODE_ERROR || attr(fenced[0], "paddock.event.id") != fmt.Sprint(evs[0].ID) {
			t.Errorf("fenced commit spans = %v, want one failed with reason %s", fenced, fe.Reason)
		}

		// The failed attempt's log line carries its trace and span ids.
		failedLine := ""
		for line := range strings.SplitSeq(logs.String(), "\n") {
			if strings.Contains(line, `msg="turn attempt failed"`) {
				failedLine = line
			}
		}
		if !strings.Contains(failedLine, "trace_id="+traceID) || !strings.Contains(failedLine, "span_id="+hexID(first.SpanId)) {
			t.Errorf("the failed attempt's log line %q lacks trace_id=%s span_id=%s", failedLine, traceID, hexID(first.SpanId))
		}

		hc := recv.named(tracing.SpanHostCall)
		if len(hc) != 2 {
			t.Fatalf("got %d host call spans, want 2 (one per attempt)", len(hc))
		}
		for _, c := range hc {
			want, replayed := first, "false"
			if hexID(c.ParentSpanId) == hexID(second.SpanId) {
				want, replayed = second, "true"
			}
			if hexID(c.ParentSpanId) != hexID(want.SpanId) || attr(c, "paddock.call.replayed") != replayed ||
				attr(c, "paddock.call.kind") != "model" || attr(c, "paddock.model.input_tokens") != "7" || attr(c, "paddock.model.output_tokens") != "3" {
				t.Errorf("host call span parent %s attributes %v; want kind model, 7/3 tokens, replayed=%s under attempt %s",
					hexID(c.ParentSpanId), c.Attributes, replayed, attr(want, "paddock.attempt"))
			}
		}
	})
}

// syncBuffer is a strings.Builder safe for concurrent writes (a log sink).
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
