package host

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/paddock-dev/paddock/store"
)

// Metrics are one host's Prometheus metrics, registered on their own
// registry (no global state).
type Metrics struct {
	Registry *prometheus.Registry
	// FenceRejections counts replies the fences dropped, by reason
	// (docs/DESIGN.md invariant 3).
	FenceRejections *prometheus.CounterVec
	// Turns counts committed turns by outcome.
	Turns *prometheus.CounterVec
	// FailedAttempts counts failed attempts by cause.
	FailedAttempts *prometheus.CounterVec
	// DeadLetters counts events moved to dead_letter.
	DeadLetters prometheus.Counter
	// TurnSeconds is the worker time of a turn, in seconds.
	TurnSeconds prometheus.Histogram
	// ActivationStartSeconds is a cold start's wait, in seconds: from the
	// controller's look at the session (PeekSession) to its activation
	// claimed (ClaimActivation answered), a slot of the agent's pool taken
	// in between — what a signal to a session without a live activation
	// waits for before its turn can run. Claims refused (another owner,
	// nothing to run) are not observed.
	ActivationStartSeconds prometheus.Histogram
	// QuickStarts counts the cold starts among them claimed without a
	// look at the session: after this host's own append, of an agent it
	// knows, whose turns run in this process (docs/DESIGN.md "Deferred
	// dispatch").
	QuickStarts prometheus.Counter
	// Controllers is the number of live controllers on this host.
	Controllers prometheus.Gauge
	// ControllerPanics counts recovered controller panics.
	ControllerPanics prometheus.Counter
	// LeasesExpired counts activations the watchdog failed.
	LeasesExpired prometheus.Counter
	// AlarmsFired counts alarm events this host appended.
	AlarmsFired prometheus.Counter
	// Cancelled counts in-flight turns aborted by a cancel.
	Cancelled prometheus.Counter
	// Steers counts steers handed to running turns.
	Steers prometheus.Counter
	// SteersHeldBack counts steers not handed to a running turn because its
	// steer channel was full, or because one before them in the same turn
	// was not handed over: the turn, fenced off, reruns with them in its
	// request.
	SteersHeldBack prometheus.Counter
	// Deferred counts turns dispatched deferred (read, not written); of
	// them, Promotions counts those written before their commit
	// (docs/DESIGN.md "Deferred dispatch").
	Deferred, Promotions prometheus.Counter
	// WakeupDispatches counts the deferred turns among Deferred that were
	// dispatched from a wake-up's event, without a read (host/wakedispatch.go).
	WakeupDispatches prometheus.Counter
	// WakeupsDeduplicated counts wake-ups dropped as one of an append's two
	// (host.Host.Appended and the echo of the store's notification): the
	// other woke the controller after the commit (host/wakeups.go).
	WakeupsDeduplicated prometheus.Counter
	// PendingSessions is the number of sessions waiting for capacity.
	PendingSessions prometheus.Gauge
	// HostCallsReplayed counts host calls answered from the journal
	// instead of being sent again, by agent (docs/DESIGN.md invariant 12).
	HostCallsReplayed *prometheus.CounterVec
	// HostCallsFenced counts host-call results refused by the journal's
	// fences (a zombie attempt's), by reason.
	HostCallsFenced *prometheus.CounterVec
	// StreamFrames counts chunk frames this host wrote to session streams.
	StreamFrames prometheus.Counter
	// WaitsExpired counts waits this host expired.
	WaitsExpired prometheus.Counter
	// ApprovalHolds counts attempts ended to wait for an approval.
	ApprovalHolds prometheus.Counter
	// APIRefused counts requests refused by the front doors'
	// authentication or authorization, by reason: unauthenticated (401),
	// role or namespace (403) (docs/DESIGN.md "Tokens, roles and the audit
	// log").
	APIRefused *prometheus.CounterVec
	// QuotaRefused counts work refused over a namespace's quota (429), by
	// namespace and quota (live_sessions, signals_per_minute,
	// model_tokens_per_day); namespaces are the config's, so the labels
	// stay few (docs/DESIGN.md "Namespaces").
	QuotaRefused *prometheus.CounterVec
}

// NewMetrics creates and registers the metrics.
func NewMetrics() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		FenceRejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "paddock_fence_rejections_total", Help: "Worker replies rejected by the fences, by reason.",
		}, []string{"reason"}),
		Turns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "paddock_turns_committed_total", Help: "Committed turns by outcome.",
		}, []string{"outcome"}),
		FailedAttempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "paddock_failed_attempts_total", Help: "Failed turn attempts by cause.",
		}, []string{"cause"}),
		DeadLetters: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "paddock_dead_letters_total", Help: "Events moved to dead_letter.",
		}),
		TurnSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "paddock_turn_seconds", Help: "Worker time of one turn.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		ActivationStartSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "paddock_activation_start_seconds", Help: "A cold start: the session's look, a slot and the activation's claim.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		QuickStarts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "paddock_activation_quick_starts_total", Help: "Cold starts claimed without a look at the session (after this host's own append).",
		}),
		Controllers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "paddock_controllers", Help: "Live session controllers on this host.",
		}),
		ControllerPanics: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "paddock_controller_panics_total", Help: "Recovered controller panics.",
		}),
		LeasesExpired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "paddock_leases_expired_total", Help: "Activations failed by the lease watchdog.",
		}),
		AlarmsFired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "paddock_alarms_fired_total", Help: "Alarm events appended by this host.",
		}),
		Cancelled: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "paddock_turns_cancelled_total", Help: "In-flight turns aborted by a cancel.",
		}),
		SteersHeldBack: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "paddock_steers_held_back_total", Help: "Steers not handed to a running turn (its steer channel full, or an earlier steer of the turn held back); the turn reruns with them.",
		}),
		Steers: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "paddock_steers_delivered_total", Help: "Steers handed to running turns.",
		}),
		Deferred: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "paddock_turns_deferred_total", Help: "Turns of in-process workers dispatched by a read, written with their commit or promoted.",
		}),
		Promotions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "paddock_turns_promoted_total", Help: "Deferred turns written before their commit (a host call, a stream write, a failure, or promote_after).",
		}),
		WakeupDispatches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "paddock_turns_dispatched_from_wakeup_total", Help: "Deferred turns dispatched from the event of the wake-up that this host's own append sent, without a read.",
		}),
		WakeupsDeduplicated: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "paddock_wakeups_deduplicated_total", Help: "Wake-ups dropped as one of an append's two (the in-process report, and the store notification's echo); the other woke the controller.",
		}),
		HostCallsReplayed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "paddock_host_calls_replayed_total", Help: "Host calls answered from the event's journal instead of being sent again, by agent.",
		}, []string{"agent"}),
		HostCallsFenced: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "paddock_host_calls_fenced_total", Help: "Host-call results the journal's fences refused (a zombie attempt's), by reason.",
		}, []string{"reason"}),
		StreamFrames: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "paddock_stream_chunk_frames_total", Help: "Chunk frames (batches of emitted chunks) written to session streams.",
		}),
		WaitsExpired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "paddock_waits_expired_total", Help: "Waits expired by this host.",
		}),
		ApprovalHolds: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "paddock_approval_holds_total", Help: "Turn attempts ended to wait for an approver's decision on a host call.",
		}),
		PendingSessions: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "paddock_pending_sessions", Help: "Sessions waiting for pool capacity on this host.",
		}),
		APIRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "paddock_api_refused_total", Help: "Requests refused by authentication (unauthenticated) or authorization (role, namespace).",
		}, []string{"reason"}),
		QuotaRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "paddock_quota_refused_total", Help: "Sessions and signals refused over a namespace's quota (429), by namespace and quota.",
		}, []string{"namespace", "quota"}),
	}
	for _, r := range []string{"unauthenticated", "role", "namespace"} {
		m.APIRefused.WithLabelValues(r)
	}
	for _, r := range store.FenceReasons() {
		m.HostCallsFenced.WithLabelValues(string(r))
		m.FenceRejections.WithLabelValues(string(r))
	}
	m.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.Registry.MustRegister(m.FenceRejections, m.Turns, m.FailedAttempts, m.DeadLetters,
		m.TurnSeconds, m.ActivationStartSeconds, m.QuickStarts, m.Controllers, m.ControllerPanics, m.LeasesExpired, m.AlarmsFired, m.Cancelled, m.Steers, m.SteersHeldBack, m.Deferred, m.Promotions, m.WakeupDispatches, m.WakeupsDeduplicated, m.PendingSessions,
		m.HostCallsReplayed, m.HostCallsFenced, m.StreamFrames, m.WaitsExpired, m.ApprovalHolds, m.APIRefused, m.QuotaRefused)
	return m
}
