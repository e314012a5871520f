package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	dto "github.com/prometheus/client_model/go"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/examples/hasher"
	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/store"
)

// What keeps a bench run honest: its turns answer the peers' unit of work,
// and a run that cannot finish ends with the reason instead of waiting for
// --timeout (15 minutes by default).

// ErrBenchFailing is the cause of a run's context when an event of the
// bench was dead-lettered (watchFailures): the run waits for every event
// to commit, and that one never will.
var ErrBenchFailing = errors.New("bench: the agent's turns fail")

// watchFailures cancels ctx (through cancel) once an event of the bench is
// dead-lettered: its attempts failed --max-attempts times (the agent
// policy's max_attempts, retried with its backoff), so the run cannot
// finish. A flaky turn that succeeds on a retry does not end the run. The
// cause wraps ErrBenchFailing and names the failed attempts by cause, as
// paddock_failed_attempts_total counts them since the run began; the
// host's log above it has each attempt's error. It polls m every tick
// until ctx ends.
func watchFailures(ctx context.Context, cancel context.CancelCauseFunc, m *host.Metrics, tick time.Duration) {
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var dl dto.Metric
		if m.DeadLetters.Write(&dl) != nil || dl.GetCounter().GetValue() == 0 {
			continue // the cheap read, 4 times a second during the measured run
		}
		if failed, causes, dead := failures(m); dead > 0 {
			cancel(fmt.Errorf("%w: %.0f event(s) dead-lettered; %.0f failed attempt(s) in all (%s); see the host's log above",
				ErrBenchFailing, dead, failed, causes))
			return
		}
	}
}

// failing returns err, or the run's cause when watchFailures ended ctx:
// every step of a run that stops for it reports why, not "context
// canceled".
func failing(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); ctx.Err() != nil && errors.Is(cause, ErrBenchFailing) {
		return cause
	}
	return err
}

// failures reads m's failed attempts (their total, and "cause n" pairs
// sorted by cause) and its dead letters.
func failures(m *host.Metrics) (failed float64, causes string, dead float64) {
	mfs, err := m.Registry.Gather()
	if err != nil {
		return 0, "", 0
	}
	var by []string
	for _, mf := range mfs {
		switch mf.GetName() {
		case "paddock_failed_attempts_total":
			for _, c := range mf.GetMetric() {
				v := c.GetCounter().GetValue()
				failed += v
				for _, l := range c.GetLabel() {
					if l.GetName() == "cause" {
						by = append(by, fmt.Sprintf("%s %.0f", l.GetValue(), v))
					}
				}
			}
		case "paddock_dead_letters_total":
			for _, c := range mf.GetMetric() {
				dead += c.GetCounter().GetValue()
			}
		}
	}
	slices.Sort(by)
	return failed, strings.Join(by, ", "), dead
}

// benchJob is what one signal of a run asked: the job's key and seq.
type benchJob struct {
	id  int64
	key string
	seq int
}

// checkAnswers checks that the turn of each job answered the peers' unit
// of work (hasher.Work of its key and seq) as its last assistant message:
// an agent that answers otherwise does not run the bench's workload, and
// its figures compare with no peer's. agentFlag names the flag that chose
// the agent (--module, --plugin) in the error, which names the first wrong
// answer and how many there were. A job whose turn has not committed
// counts as wrong: call it once every job committed.
func (s *benchSink) checkAnswers(jobs []benchJob, agentFlag string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	wrong := 0
	var first string
	for _, j := range jobs {
		got, ok := s.answers[j.id]
		if want := hasher.Work(j.key, j.seq); !ok || got != want {
			if wrong == 0 {
				first = fmt.Sprintf("event %d (key %s, seq %d) answered %q, want %q", j.id, j.key, j.seq, clip(got, 80), want)
			}
			wrong++
		}
	}
	if wrong > 0 {
		return fmt.Errorf("%d of %d turns did not answer the bench's job (is %s the hasher agent?): %s", wrong, len(jobs), agentFlag, first)
	}
	return nil
}

// committedJobs returns the jobs of jobs whose turns have committed.
func (s *benchSink) committedJobs(jobs []benchJob) []benchJob {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []benchJob
	for _, j := range jobs {
		if _, ok := s.committed[j.id]; ok {
			out = append(out, j)
		}
	}
	return out
}

// lastAssistant is the content of t's last assistant message ("" when it
// has none).
func lastAssistant(t store.Turn) string {
	for i := len(t.Messages) - 1; i >= 0; i-- {
		if t.Messages[i].Role == abi.RoleAssistant {
			return t.Messages[i].Content
		}
	}
	return ""
}

// clip shortens s to at most n bytes, cut at a rune's start, marking the
// cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
