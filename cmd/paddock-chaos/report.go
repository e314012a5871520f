package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// Report is the outcome of a run. Its JSON form is the last line of the
// program's output.
type Report struct {
	mu sync.Mutex

	Seed     int64  `json:"seed"`
	Hosts    int    `json:"hosts"`
	Workers  int    `json:"workers"`
	Sessions int    `json:"sessions"`
	Signals  int    `json:"signals"`
	PG       string `json:"postgres"`
	WorkDir  string `json:"work_dir,omitempty"`

	// Faults by kind; pg_restart is 1 by design (0 without an owned
	// cluster). Stalls by target: worker, plugin.
	Faults      map[string]int `json:"faults"`
	FaultTarget map[string]int `json:"faults_wanted"`
	Stalls      map[string]int `json:"stalls_by_target"`
	// PGRestartSkipped: pg_restart was asked for, but the server is
	// DATABASE_URL's, which the run does not own.
	PGRestartSkipped bool `json:"pg_restart_skipped,omitempty"`

	Accepted     int `json:"accepted"`
	NotAccepted  int `json:"not_accepted"`
	Retried      int `json:"sends_retried"`
	Replayed     int `json:"sends_answered_by_idempotency_key"`
	Committed    int `json:"committed"`
	DeadLettered int `json:"dead_lettered"`
	Unexpected   int `json:"cancelled_or_discarded"`
	Unconfirmed  int `json:"events_never_confirmed"`
	Lost         int `json:"lost"`
	Duplicated   int `json:"duplicated"`

	// FenceRejections by reason, from the hosts' logs (complete): late
	// worker replies (FenceRejectedReplies) and late failure reports of
	// attempts already decided (FenceRejectedFailures).
	// FenceRejectionsMetrics are the same from /metrics scrapes (a killed
	// host's last second is missing).
	FenceRejections        map[string]int `json:"fence_rejections"`
	FenceRejectedReplies   map[string]int `json:"fence_rejected_replies"`
	FenceRejectedFailures  map[string]int `json:"fence_rejected_failure_reports"`
	FenceRejectionsMetrics map[string]int `json:"fence_rejections_metrics"`

	CountedAttempts   int            `json:"failed_attempts_counted"`
	UncountedAttempts int            `json:"failed_attempts_uncounted"`
	FailedAttempts    map[string]int `json:"failed_attempts_by_cause"`

	// Latency is acceptance → commit of the committed events, in seconds
	// (p50, p90, p99, max), by the database clock; OwnLatency counts from
	// when the event headed its session's queue (see latencyStats), also
	// per agent. Slowest describes the slowest events by that measure.
	Latency           map[string]float64            `json:"commit_latency_seconds"`
	OwnLatency        map[string]float64            `json:"head_to_commit_seconds"`
	OwnLatencyByAgent map[string]map[string]float64 `json:"head_to_commit_seconds_by_agent"`
	Slowest           []string                      `json:"-"`

	DeadLetters []string `json:"-"`
	// Failures by check; empty when the run passed.
	Failures map[string][]string `json:"failures,omitempty"`

	Times struct {
		Setup, Chaos, Quiesce, Check, Teardown, Total time.Duration
	} `json:"-"`
}

func newReport(cfg Config) *Report {
	return &Report{Seed: cfg.Seed, Hosts: cfg.Hosts, Workers: cfg.Hosts * cfg.WorkersPerHost, Sessions: cfg.Sessions,
		Signals: cfg.Signals, Faults: map[string]int{}, FaultTarget: map[string]int{}, Stalls: map[string]int{},
		Failures: map[string][]string{}}
}

// maxPerCheck bounds the failures kept per check (the count goes on).
const maxPerCheck = 50

func (r *Report) fail(check, where, what string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	msg := what
	if where != "" {
		msg = where + ": " + what
	}
	if len(r.Failures[check]) < maxPerCheck {
		r.Failures[check] = append(r.Failures[check], msg)
	} else if len(r.Failures[check]) == maxPerCheck {
		r.Failures[check] = append(r.Failures[check], "… (more)")
	}
}

// OK reports whether every check passed.
func (r *Report) OK() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.Failures) == 0 && r.Lost == 0 && r.Duplicated == 0
}

func (r *Report) setFaults(in *injector) {
	in.mu.Lock()
	defer in.mu.Unlock()
	for k, t := range in.targets {
		r.FaultTarget[k] = t
		r.Faults[k] = in.counts[k]
		if in.counts[k] < t {
			r.fail(checkRun, "", fmt.Sprintf("%d faults of kind %s injected, %d wanted", in.counts[k], k, t))
		}
	}
	r.PGRestartSkipped = in.e.cluster == nil && contains(in.e.cfg.Kinds, kindPGRestart)
	for k, v := range in.stallsOf {
		r.Stalls[k] = v
	}
	for _, u := range in.unexpected {
		r.fail(checkRun, "", u)
	}
}

func (r *Report) setDriver(d *driver) {
	for _, s := range d.sessions {
		r.NotAccepted += s.notAccepted
		for _, a := range s.accepted {
			if a.retries > 0 {
				r.Retried++
			}
			if !a.created {
				r.Replayed++
			}
		}
	}
	if r.NotAccepted > 0 {
		r.fail(checkDriver, "", fmt.Sprintf("%d signals were never accepted", r.NotAccepted))
	}
	for _, m := range d.refused {
		r.fail(checkDriver, "", m)
	}
	for _, m := range d.outOfOrder {
		r.fail(checkDriver, "", m)
	}
}

func (r *Report) setFences(metrics map[string]int, e *env) {
	r.FenceRejectionsMetrics = metrics
	r.FenceRejectedReplies, r.FenceRejectedFailures = fencesFromLogs(e)
	r.FenceRejections = map[string]int{}
	for _, m := range []map[string]int{r.FenceRejectedReplies, r.FenceRejectedFailures} {
		for k, v := range m {
			r.FenceRejections[k] += v
		}
	}
}

func (r *Report) faultLine() string {
	var parts []string

	for _, k := range AllKinds {
		t, ok := r.FaultTarget[k]
		if !ok {
			continue
		}
		s := fmt.Sprintf("%s=%d", k, r.Faults[k])
		switch k {
		case kindStall:
			s += fmt.Sprintf(" (worker %d, plugin %d)", r.Stalls["worker"], r.Stalls["plugin"])
		case kindPGRestart:
			s += " (once by design)"
		}
		if r.Faults[k] < t {
			s += fmt.Sprintf(" [wanted %d]", t)
		}
		parts = append(parts, s)
	}
	if r.PGRestartSkipped {
		parts = append(parts, "pg_restart skipped (DATABASE_URL: not this run's server to restart)")
	}
	return strings.Join(parts, ", ")
}

func mapLine(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	total := 0
	for _, k := range sortedKeys(m) {
		parts = append(parts, fmt.Sprintf("%s=%d", k, m[k]))
		total += m[k]
	}
	return fmt.Sprintf("%d (%s)", total, strings.Join(parts, ", "))
}

// Print writes the human-readable summary, then the JSON line.
func (r *Report) Print(w io.Writer, runErr error) {
	fmt.Fprintf(w, "paddock-chaos: %d hosts, %d remote workers, %d sessions (%s), %d signals, PostgreSQL %s, seed %d\n",
		r.Hosts, r.Workers, r.Sessions, strings.Join(agentNames, "/"), r.Signals, r.PG, r.Seed)
	fmt.Fprintf(w, "faults injected: %s\n", r.faultLine())
	fmt.Fprintf(w, "signals: accepted %d (not accepted %d; %d needed a retried call, %d answered from the idempotency key), committed %d, dead-lettered %d, cancelled/discarded %d\n",
		r.Accepted, r.NotAccepted, r.Retried, r.Replayed, r.Committed, r.DeadLettered, r.Unexpected)
	fmt.Fprintf(w, "stale replies rejected by the fences, by reason (host logs): %s\n", mapLine(r.FenceRejections))
	fmt.Fprintf(w, "  worker replies: %s; failure reports of attempts already decided: %s\n",
		mapLine(r.FenceRejectedReplies), mapLine(r.FenceRejectedFailures))
	fmt.Fprintf(w, "  from /metrics scrapes (misses what a killed host counted after its last scrape): %s\n", mapLine(nonZero(r.FenceRejectionsMetrics)))
	fmt.Fprintf(w, "failed attempts: %d counted, %d not counted; by cause: %s\n", r.CountedAttempts, r.UncountedAttempts, mapLine(r.FailedAttempts))
	if len(r.Latency) > 0 {
		ql := func(m map[string]float64) string {
			return fmt.Sprintf("p50 %.3f s, p90 %.3f s, p99 %.3f s, max %.3f s", m["p50"], m["p90"], m["p99"], m["max"])
		}
		fmt.Fprintf(w, "acceptance → commit: %s\n", ql(r.Latency))
		fmt.Fprintf(w, "head of its session's queue → commit: %s\n", ql(r.OwnLatency))
		for _, a := range sortedKeys(r.OwnLatencyByAgent) {
			fmt.Fprintf(w, "  %s: %s\n", a, ql(r.OwnLatencyByAgent[a]))
		}
		for _, sl := range r.Slowest {
			fmt.Fprintf(w, "  slow: %s\n", sl)
		}
	}
	for _, d := range r.DeadLetters {
		fmt.Fprintf(w, "  dead letter: %s\n", d)
	}
	fmt.Fprintf(w, "lost = %d, duplicated = %d\n", r.Lost, r.Duplicated)
	var checks []string
	for _, c := range allChecks {
		mark := "ok"
		if len(r.Failures[c]) > 0 {
			mark = "FAILED"
		}
		checks = append(checks, c+" "+mark)
	}
	fmt.Fprintf(w, "checks: %s\n", strings.Join(checks, ", "))
	for _, c := range sortedKeys(r.Failures) {
		for _, f := range r.Failures[c] {
			fmt.Fprintf(w, "FAIL [%s] %s\n", c, f)
		}
	}
	fmt.Fprintf(w, "times: set-up %v, chaos %v, quiescence %v, check %v, teardown %v, total %v\n",
		r.Times.Setup.Round(time.Millisecond), r.Times.Chaos.Round(time.Millisecond), r.Times.Quiesce.Round(time.Millisecond),
		r.Times.Check.Round(time.Millisecond), r.Times.Teardown.Round(time.Millisecond), r.Times.Total.Round(time.Millisecond))
	if runErr != nil {
		fmt.Fprintf(w, "ERROR: %v\n", runErr)
	}
	if r.WorkDir != "" && (!r.OK() || runErr != nil) {
		fmt.Fprintf(w, "logs kept in %s\n", r.WorkDir)
	}
	verdict := "PASS"
	if !r.OK() || runErr != nil {
		verdict = "FAIL"
	}
	fmt.Fprintln(w, verdict)
	r.mu.Lock()
	b, _ := json.Marshal(struct {
		*Report
		Pass    bool              `json:"pass"`
		Seconds map[string]string `json:"seconds"`
		Error   string            `json:"error,omitempty"`
	}{r, verdict == "PASS", map[string]string{
		"setup": secs(r.Times.Setup), "chaos": secs(r.Times.Chaos), "quiesce": secs(r.Times.Quiesce),
		"check": secs(r.Times.Check), "total": secs(r.Times.Total),
	}, errString(runErr)})
	r.mu.Unlock()
	fmt.Fprintln(w, string(b))
}

// nonZero is m without its zero values.
func nonZero(m map[string]int) map[string]int {
	out := map[string]int{}
	for k, v := range m {
		if v != 0 {
			out[k] = v
		}
	}
	return out
}

func secs(d time.Duration) string { return fmt.Sprintf("%.1f", d.Seconds()) }

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// failureCount is the number of failures recorded.
func (r *Report) failureCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, f := range r.Failures {
		n += len(f)
	}
	return n
}
