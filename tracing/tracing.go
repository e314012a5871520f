// Package tracing is Paddock's OpenTelemetry plumbing (docs/DESIGN.md
// "Tracing"): the OTLP/HTTP trace exporter built from the config's
// tracing: section, the W3C traceparent helpers that carry a trace from a
// signal's request to the event row, plugin processes and remote workers,
// and a slog handler that adds trace_id and span_id to a record logged
// under an active span.
//
// Spans are named paddock.*; their attributes are the Attr* keys below.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// TracerName is the instrumentation scope of Paddock's spans.
const TracerName = "github.com/paddock-dev/paddock"

// Span names.
const (
	// SpanSignal is the acceptance of a signal (host/service Signal).
	SpanSignal = "paddock.signal"
	// SpanAttempt is one attempt of a turn (the host controller).
	SpanAttempt = "paddock.turn.attempt"
	// SpanHostCall is one host call of an attempt's journal.
	SpanHostCall = "paddock.host_call"
	// SpanCommit is a turn's commit through the store's fences.
	SpanCommit = "paddock.commit"
)

// Attribute keys of Paddock's spans.
const (
	AttrAgent       = attribute.Key("paddock.agent")
	AttrSession     = attribute.Key("paddock.session")
	AttrEventID     = attribute.Key("paddock.event.id")
	AttrSignalKind  = attribute.Key("paddock.signal.kind")
	AttrCreated     = attribute.Key("paddock.signal.created")
	AttrEpoch       = attribute.Key("paddock.epoch")
	AttrAttempt     = attribute.Key("paddock.attempt")
	AttrWorkerKind  = attribute.Key("paddock.worker.kind")
	AttrPool        = attribute.Key("paddock.pool")
	AttrOutcome     = attribute.Key("paddock.outcome")
	AttrCallSeq     = attribute.Key("paddock.call.seq")
	AttrCallKind    = attribute.Key("paddock.call.kind")
	AttrReplayed    = attribute.Key("paddock.call.replayed")
	AttrCallError   = attribute.Key("paddock.call.error")
	AttrInputTokens = attribute.Key("paddock.model.input_tokens")
	AttrOutTokens   = attribute.Key("paddock.model.output_tokens")
	AttrFenceReason = attribute.Key("paddock.fence.reason")
	AttrTurnNo      = attribute.Key("paddock.turn.no")
)

// Config is the tracing: section of the host configuration.
type Config struct {
	// Endpoint is the OTLP/HTTP traces URL (http or https), e.g.
	// http://collector:4318/v1/traces. Empty: tracing is off.
	Endpoint string
	// Headers are sent with every export (e.g. an Authorization header);
	// secrets, never logged.
	Headers map[string]string
	// SampleRatio is the share of new traces recorded, 0 to 1; a span
	// whose parent (a request's traceparent) was sampled or not follows
	// its parent.
	SampleRatio float64
	// ServiceName is the resource's service.name (default "paddock").
	ServiceName string
	// HostID is the resource's service.instance.id.
	HostID string
}

// Provider is a tracer provider and its shutdown.
type Provider struct {
	trace.TracerProvider
	sdk *sdktrace.TracerProvider
}

// Off returns the provider of tracing off: its spans record nothing and
// cost next to nothing, but carry an incoming traceparent through.
func Off() *Provider {
	return &Provider{TracerProvider: noop.NewTracerProvider()}
}

// Enabled says whether spans are exported.
func (p *Provider) Enabled() bool { return p != nil && p.sdk != nil }

// Shutdown flushes the spans still queued and stops the exporter (at most
// until ctx ends). It is a no-op for Off.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p == nil || p.sdk == nil {
		return nil
	}
	return p.sdk.Shutdown(ctx)
}

// ForceFlush exports the spans ended so far (at most until ctx ends). It is
// a no-op for Off.
func (p *Provider) ForceFlush(ctx context.Context) error {
	if p == nil || p.sdk == nil {
		return nil
	}
	return p.sdk.ForceFlush(ctx)
}

// Tracer returns Paddock's tracer of p (of Off when p is nil).
func (p *Provider) Tracer() trace.Tracer {
	if p == nil {
		return noop.NewTracerProvider().Tracer(TracerName)
	}
	return p.TracerProvider.Tracer(TracerName)
}

// CheckEndpoint validates an OTLP/HTTP endpoint URL.
func CheckEndpoint(endpoint string) error {
	u, err := url.Parse(endpoint)
	if err != nil {
		return fmt.Errorf("not a URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return errors.New("must be an http:// or https:// URL (OTLP/HTTP), e.g. http://localhost:4318/v1/traces")
	}
	if u.Host == "" {
		return errors.New("has no host")
	}
	return nil
}

// New returns the provider of cfg: Off when cfg.Endpoint is empty, else
// an SDK provider that batches spans to the OTLP/HTTP endpoint (protobuf).
func New(ctx context.Context, cfg Config) (*Provider, error) {
	if cfg.Endpoint == "" {
		return Off(), nil
	}
	if err := CheckEndpoint(cfg.Endpoint); err != nil {
		return nil, fmt.Errorf("tracing: endpoint: %w", err)
	}
	opts := []otlptracehttp.Option{otlptracehttp.WithEndpointURL(cfg.Endpoint), otlptracehttp.WithTimeout(10 * time.Second)}
	if len(cfg.Headers) > 0 {
		opts = append(opts, otlptracehttp.WithHeaders(cfg.Headers))
	}
	exp, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("tracing: exporter: %w", err)
	}
	name := cfg.ServiceName
	if name == "" {
		name = "paddock"
	}
	attrs := []attribute.KeyValue{semconv.ServiceName(name)}
	if cfg.HostID != "" {
		attrs = append(attrs, semconv.ServiceInstanceID(cfg.HostID))
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(cfg.SampleRatio))),
		sdktrace.WithResource(resource.NewSchemaless(attrs...)),
	)
	return &Provider{TracerProvider: tp, sdk: tp}, nil
}

// propagator is the W3C trace context propagator (traceparent, tracestate).
var propagator = propagation.TraceContext{}

// Traceparent returns the W3C traceparent of ctx's span context
// ("00-<trace id>-<span id>-<flags>"), or "" when ctx has none.
func Traceparent(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return ""
	}
	c := propagation.MapCarrier{}
	propagator.Inject(ctx, c)
	return c["traceparent"]
}

// WithTraceparent returns ctx with the remote span context of a W3C
// traceparent as the parent of the next span started from it; ctx as it
// was when tp is empty or malformed.
func WithTraceparent(ctx context.Context, tp string) context.Context {
	if tp == "" {
		return ctx
	}
	return propagator.Extract(ctx, propagation.MapCarrier{"traceparent": tp})
}

// Middleware makes the W3C traceparent (and tracestate) of a request the
// parent of the spans its handler starts.
func Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("traceparent") != "" {
			r = r.WithContext(propagator.Extract(r.Context(), propagation.HeaderCarrier(r.Header)))
		}
		next.ServeHTTP(w, r)
	})
}

// End ends span, first marking it failed with err when err is not nil.
func End(span trace.Span, err error) {
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// LogHandler wraps h: a record logged with a context that carries a valid
// span context gets trace_id and span_id attributes.
func LogHandler(h slog.Handler) slog.Handler { return logHandler{h} }

type logHandler struct{ slog.Handler }

func (l logHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return l.Handler.Handle(ctx, r)
}

func (l logHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return logHandler{l.Handler.WithAttrs(as)}
}

func (l logHandler) WithGroup(name string) slog.Handler {
	return logHandler{l.Handler.WithGroup(name)}
}

// LogAttrs returns trace_id and span_id of ctx's span context as logger
// arguments (for slog.Logger.With), or nil when it has none.
func LogAttrs(ctx context.Context) []any {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return nil
	}
	return []any{"trace_id", sc.TraceID().String(), "span_id", sc.SpanID().String()}
}
