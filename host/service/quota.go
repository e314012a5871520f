package service

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/paddock-dev/paddock/host"
)

// Quotas of a namespace (config namespaces.NAME.quotas, host.Quotas;
// docs/DESIGN.md "Namespaces"). Over a quota new work is refused with a
// *QuotaError (429 with Retry-After at the API) before anything is
// written; work already accepted is never dropped. They are checked by the
// operations that accept work:
//
//   - live_sessions: CreateSession and GetOrCreateSession of a new session
//     (a get-or-create of an existing one always answers). A count read
//     before the insert: hosts creating at the same instant may together
//     pass the quota by their number.
//   - signals_per_minute: Signal, a token bucket per namespace held by this
//     Service in memory, so each host counts its own signals (N hosts
//     admit up to N times the quota).
//   - model_tokens_per_day: Signal refuses new signals once the
//     namespace's agents used the quota's model tokens of the UTC day
//     (store.NamespaceTokensSince); a turn already running finishes.
const (
	QuotaLiveSessions      = "live_sessions"
	QuotaSignalsPerMinute  = "signals_per_minute"
	QuotaModelTokensPerDay = "model_tokens_per_day"
)

// quotaRetryLiveSessions is the Retry-After of a live_sessions refusal:
// nothing says when a session will be destroyed.
const quotaRetryLiveSessions = 60

// overQuota counts e (paddock_quota_refused_total) and returns it.
func (s *Service) overQuota(e *QuotaError) *QuotaError {
	if m := s.h.Metrics(); m != nil && m.QuotaRefused != nil {
		m.QuotaRefused.WithLabelValues(e.Namespace, e.Quota).Inc()
	}
	return e
}

// countQuota counts err when it is a *QuotaError, and returns it.
func (s *Service) countQuota(err error) error {
	if q, ok := errors.AsType[*QuotaError](err); ok {
		s.overQuota(q)
	}
	return err
}

// quotas returns the quotas of namespace ns (zero: none).
func (s *Service) quotas(ns string) host.Quotas {
	return s.h.Policy().Namespaces[ns].Quotas
}

// checkLiveSessions refuses a new session of namespace ns over its
// live_sessions quota (not counted: the caller counts the refusal it
// answers, countQuota — a get-or-create of an existing key is answered).
func (s *Service) checkLiveSessions(ctx context.Context, ns string) error {
	q := s.quotas(ns).LiveSessions
	if q <= 0 {
		return nil
	}
	n, err := s.st.LiveSessionsUpTo(ctx, ns, q)
	if err != nil {
		return wrap("live sessions quota", err)
	}
	if n >= q {
		return &QuotaError{Namespace: ns, Quota: QuotaLiveSessions, RetryAfter: quotaRetryLiveSessions,
			Message: fmt.Sprintf("namespace %q has %d live sessions, its quota (live_sessions); destroy one first", ns, q)}
	}
	return nil
}

// checkSignal refuses a signal of namespace ns over its
// signals_per_minute or model_tokens_per_day quota; it takes one signal
// of the minute's budget.
func (s *Service) checkSignal(ctx context.Context, ns string) error {
	q := s.quotas(ns)
	if q.ModelTokensPerDay > 0 {
		now := time.Now().UTC()
		day := time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC)
		used, err := s.st.NamespaceTokensSince(ctx, ns, day)
		if err != nil {
			return wrap("model tokens quota", err)
		}
		if used >= q.ModelTokensPerDay {
			return s.overQuota(&QuotaError{Namespace: ns, Quota: QuotaModelTokensPerDay,
				RetryAfter: int64(math.Ceil(day.Add(24 * time.Hour).Sub(now).Seconds())),
				Message:    fmt.Sprintf("namespace %q used its %d model tokens of the day (model_tokens_per_day); new signals are accepted from 00:00 UTC", ns, q.ModelTokensPerDay)})
		}
	}
	if q.SignalsPerMinute > 0 {
		if wait := s.signals.take(ns, q.SignalsPerMinute, time.Now()); wait > 0 {
			return s.overQuota(&QuotaError{Namespace: ns, Quota: QuotaSignalsPerMinute, RetryAfter: int64(math.Ceil(wait.Seconds())),
				Message: fmt.Sprintf("namespace %q sent its %d signals of the minute (signals_per_minute)", ns, q.SignalsPerMinute)})
		}
	}
	return nil
}

// signalBuckets are the signals_per_minute token buckets of one Service,
// by namespace (golang.org/x/time/rate): each holds up to the quota and
// refills at quota per minute; a reloaded quota applies from its reload.
type signalBuckets struct {
	mu sync.Mutex
	m  map[string]*rate.Limiter
}

// take takes one signal of ns's bucket (perMinute its quota, > 0) at now;
// it returns 0, or how long until one is available (nothing taken).
func (b *signalBuckets) take(ns string, perMinute int64, now time.Time) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil {
		b.m = map[string]*rate.Limiter{}
	}
	limit, burst := rate.Limit(float64(perMinute)/60), int(min(perMinute, math.MaxInt32))
	lim := b.m[ns]
	switch {
	case lim == nil:
		lim = rate.NewLimiter(limit, burst)
		b.m[ns] = lim
	case lim.Limit() != limit || lim.Burst() != burst:
		lim.SetLimitAt(now, limit)
		lim.SetBurstAt(now, burst)
	}
	r := lim.ReserveN(now, 1)
	if !r.OK() {
		return time.Minute
	}
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return d
	}
	return 0
}
