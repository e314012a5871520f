package host

import (
	"context"
	"errors"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/store"
	"github.com/paddock-dev/paddock/tracing"
)

// attemptTrace is the span of one turn attempt (docs/DESIGN.md
// "Tracing"): a child of the traceparent stored with the event, so that
// the attempt joins the trace of the signal's request on whichever host
// and however late it runs. The controller's fail and hold record the
// attempt's outcome on it; end closes it.
type attemptTrace struct {
	span    trace.Span
	sc      trace.SpanContext
	outcome string
	cause   error
	// restore puts back the loggers the attempt replaced by ones that
	// carry trace_id and span_id.
	restore func()
}

// startAttempt starts the span of the attempt of d and makes it the
// controller's current attempt (c.attempt), with loggers that carry its
// trace and span ids.
func (a *activationRun) startAttempt(d store.Dispatch) *attemptTrace {
	parent := tracing.WithTraceparent(context.Background(), d.Event.Traceparent)
	_, span := a.h.tracer.Start(parent, tracing.SpanAttempt, trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(
			tracing.AttrAgent.String(a.agent.Name), tracing.AttrSession.String(d.Session.SessionID),
			tracing.AttrEventID.Int64(d.Event.ID), tracing.AttrEpoch.Int64(d.Delivery.ActorEpoch),
			tracing.AttrAttempt.Int(d.Attempt), tracing.AttrWorkerKind.String(workerKind(d.Delivery.Binding)),
			tracing.AttrPool.String(a.pol.Pool),
		))
	t := &attemptTrace{span: span, sc: span.SpanContext(), restore: func() {}}
	if span.IsRecording() {
		alog, clog := a.log, a.c.log
		ids := tracing.LogAttrs(trace.ContextWithSpan(context.Background(), span))
		a.log, a.c.log = alog.With(ids...), clog.With(ids...)
		t.restore = func() { a.log, a.c.log = alog, clog }
	}
	a.c.attempt = t
	return t
}

// with returns ctx carrying the attempt's span (ctx as is for nil).
func (t *attemptTrace) with(ctx context.Context) context.Context {
	if t == nil {
		return ctx
	}
	return trace.ContextWithSpan(ctx, t.span)
}

// failed records the failure kind (the failed-attempt metric's label) and
// cause of the attempt.
func (t *attemptTrace) failed(kind string, cause error) {
	if t != nil {
		t.outcome, t.cause = kind, cause
	}
}

// fenced records that the store's fences refused the attempt's write.
func (t *attemptTrace) fenced(reason store.FenceReason) {
	if t != nil {
		t.span.SetAttributes(tracing.AttrFenceReason.String(string(reason)))
	}
}

// end closes the attempt's span with its outcome: a recorded failure or
// hold, else "committed" (the turn's outcome in paddock.turn.outcome),
// "cancelled" (the event was cancelled meanwhile) or "fenced" (the
// fences refused the commit; the commit span says why).
func (t *attemptTrace) end(c *controller, turnOutcome string, done bool) {
	if c.attempt == t {
		c.attempt = nil
	}
	t.restore()
	outcome := t.outcome
	switch {
	case outcome != "":
	case turnOutcome != "":
		outcome = "committed"
		t.span.SetAttributes(attribute.String("paddock.turn.outcome", turnOutcome))
	case !done:
		outcome = "cancelled"
	default:
		outcome = "fenced"
	}
	t.span.SetAttributes(tracing.AttrOutcome.String(outcome))
	switch {
	case t.cause != nil:
		t.span.SetStatus(codes.Error, t.cause.Error())
	case outcome == "committed" || outcome == "hold" || outcome == "cancelled":
		t.span.SetStatus(codes.Ok, "")
	default:
		t.span.SetStatus(codes.Error, outcome)
	}
	t.span.End()
}

// workerKind is the kind of worker a binding runs on: remote (a pool
// served by remote workers), plugin, wasm (a module digest), else other
// (an embedder's own Runner).
func workerKind(binding string) string {
	switch {
	case strings.HasPrefix(binding, "pool:"):
		return "remote"
	case strings.HasPrefix(binding, "plugin:"):
		return "plugin"
	case strings.HasPrefix(binding, "sha256:"):
		return "wasm"
	}
	return "other"
}

// startCommit starts the span of a commit (Host.Commit) under ctx's span.
func (h *Host) startCommit(ctx context.Context, ref abi.TurnRef) (context.Context, trace.Span) {
	return h.tracer.Start(ctx, tracing.SpanCommit, trace.WithAttributes(
		tracing.AttrSession.String(ref.SessionID), tracing.AttrEventID.Int64(ref.ActorEventID), tracing.AttrEpoch.Int64(ref.ActorEpoch)))
}

// endCommit ends a commit's span: ok with the turn number, or failed with
// the fence's reason.
func endCommit(span trace.Span, turn store.Turn, err error) {
	var fe *store.FenceError
	if errors.As(err, &fe) {
		span.SetAttributes(tracing.AttrFenceReason.String(string(fe.Reason)))
		span.SetStatus(codes.Error, "fenced: "+string(fe.Reason))
		span.End()
		return
	}
	if err == nil {
		span.SetAttributes(tracing.AttrTurnNo.Int64(turn.TurnNo))
		span.SetStatus(codes.Ok, "")
	}
	tracing.End(span, err)
}

// startHostCall starts the span of host call seq of an attempt whose span
// context is parent, under ctx's deadline and values.
func (h *Host) startHostCall(ctx context.Context, parent trace.SpanContext, seq int, kind string) (context.Context, trace.Span) {
	if parent.IsValid() {
		ctx = trace.ContextWithSpanContext(ctx, parent)
	}
	return h.tracer.Start(ctx, tracing.SpanHostCall, trace.WithAttributes(
		tracing.AttrCallSeq.Int(seq), tracing.AttrCallKind.String(kind)))
}

// endHostCall ends a host call's span with what its result says: replayed
// or live, its error code, a model call's tokens.
func endHostCall(span trace.Span, res *abi.CallResult) {
	span.SetAttributes(tracing.AttrReplayed.Bool(res.Replayed))
	if res.Model != nil {
		span.SetAttributes(tracing.AttrInputTokens.Int64(res.Model.Usage.InputTokens), tracing.AttrOutTokens.Int64(res.Model.Usage.OutputTokens))
	}
	if res.Error != nil {
		span.SetAttributes(tracing.AttrCallError.String(string(res.Error.Code)))
		span.SetStatus(codes.Error, string(res.Error.Code))
	}
	span.End()
}
