package tracing_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/paddock-dev/paddock/tracing"
)

// TestTraceparentRoundTrips: a traceparent taken into a context comes out
// the same; an empty or malformed one leaves the context without a span.
func TestTraceparentRoundTrips(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	if got := tracing.Traceparent(tracing.WithTraceparent(context.Background(), tp)); got != tp {
		t.Errorf("round trip = %q, want %q", got, tp)
	}
	for _, bad := range []string{"", "00-xyz", "00-00000000000000000000000000000000-00f067aa0ba902b7-01"} {
		if got := tracing.Traceparent(tracing.WithTraceparent(context.Background(), bad)); got != "" {
			t.Errorf("%q gave %q, want none", bad, got)
		}
	}
}

// TestLogHandlerAddsTheIDsOfTheActiveSpan: a record logged with a context
// carrying a span context gets trace_id and span_id; one without, none.
func TestLogHandlerAddsTheIDsOfTheActiveSpan(t *testing.T) {
	var b strings.Builder
	log := slog.New(tracing.LogHandler(slog.NewTextHandler(&b, nil))).With("k", "v")
	ctx := tracing.WithTraceparent(context.Background(), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	log.InfoContext(ctx, "with")
	log.Info("without")
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "trace_id=4bf92f3577b34da6a3ce929d0e0e4736 span_id=00f067aa0ba902b7") ||
		strings.Contains(lines[1], "trace_id") {
		t.Errorf("log = %q", b.String())
	}
}

// BenchmarkSpansPerTurn is the tracing work of one turn without a host
// call: the acceptance span and its traceparent, the attempt span started
// from the stored traceparent with its attributes, the commit span; "on"
// exports them over OTLP/HTTP to a loopback receiver that drops them.
func BenchmarkSpansPerTurn(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.Copy(io.Discard, r.Body) }))
	defer srv.Close()
	for _, mode := range []string{"off", "on"} {
		b.Run(mode, func(b *testing.B) {
			p := tracing.Off()
			if mode == "on" {
				var err error
				if p, err = tracing.New(context.Background(), tracing.Config{Endpoint: srv.URL + "/v1/traces", SampleRatio: 1}); err != nil {
					b.Fatal(err)
				}
				defer p.Shutdown(context.Background())
			}
			tr := p.Tracer()
			b.ReportAllocs()
			for b.Loop() {
				ctx, s := tr.Start(context.Background(), tracing.SpanSignal, trace.WithAttributes(tracing.AttrAgent.String("a"), tracing.AttrSession.String("s")))
				stored := tracing.Traceparent(ctx)
				s.End()
				_, at := tr.Start(tracing.WithTraceparent(context.Background(), stored), tracing.SpanAttempt, trace.WithAttributes(
					tracing.AttrAgent.String("a"), tracing.AttrSession.String("s"), tracing.AttrEventID.Int64(1), tracing.AttrEpoch.Int64(2),
					tracing.AttrAttempt.Int(1), tracing.AttrWorkerKind.String("wasm"), tracing.AttrPool.String("default")))
				_, c := tr.Start(trace.ContextWithSpan(context.Background(), at), tracing.SpanCommit, trace.WithAttributes(tracing.AttrEventID.Int64(1)))
				c.End()
				at.SetAttributes(tracing.AttrOutcome.String("committed"))
				at.End()
			}
		})
	}
}
