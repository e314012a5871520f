package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/paddock-dev/paddock/abi"
	"github.com/paddock-dev/paddock/examples/hasher"
	"github.com/paddock-dev/paddock/host"
	"github.com/paddock-dev/paddock/store"
)

// What keeps a bench run honest: its turns answer the peers' unit of work,
// and a run whose turns fail ends with the reason instead of waiting for
// --timeout (15 minutes by default).

// benchStall is how long a run waits without a commit, once turn attempts
// fail, before it gives up: a retried attempt backs off for up to
// seconds, so a shorter wait could end a run that would recover.
const benchStall = 10 * time.Second

// ErrBenchFailing is the cause of a run's context when its turns fail and
// none commits (watchFailures); the error names the causes counted.
var ErrBenchFailing = fmt.Errorf("bench: the agent's turns fail")

// watchFailures cancels ctx (through cancel) once the run cannot finish:
// an event of the bench was dead-lettered, or turn attempts failed and no
// turn committed for stall. It polls m and sink every tick until ctx ends.
// The cause wraps ErrBenchFailing and names the failed attempts by cause,
// as paddock_failed_attempts_total counts them; the host's log above it
// has each attempt's error.
func watchFailures(ctx context.Context, cancel context.CancelCauseFunc, m *host.Metrics, sink *benchSink, stall, tick time.Duration) {
	t := time.NewTicker(tick)
	defer t.Stop()
	// Since the last commit: when it was seen and the failed attempts then.
	lastCount, since := sink.count.Load(), time.Now()
	failedThen, _, _ := failures(m)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		failed, causes, dead := failures(m)
		if dead > 0 {
			cancel(fmt.Errorf("%w: %.0f event(s) dead-lettered after failed attempts (%s); see the host's log above", ErrBenchFailing, dead, causes))
			return
		}
		if count := sink.count.Load(); count != lastCount {
			lastCount, since, failedThen = count, time.Now(), failed
			continue
		}
		if failed > failedThen && time.Since(since) >= stall {
			cancel(fmt.Errorf("%w: no turn committed for %s while %.0f attempt(s) failed (%s); see the host's log above",
				ErrBenchFailing, stall.Round(time.Second), failed-failedThen, causes))
			return
		}
	}
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
// a module that answers otherwise does not run the bench's workload, and
// its figures compare with no peer's. It names the first wrong answer and
// how many there were. Call it once every job committed.
func (s *benchSink) checkAnswers(jobs []benchJob) error {
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
		return fmt.Errorf("%d of %d turns did not answer the bench's job (is --module the hasher agent?): %s", wrong, len(jobs), first)
	}
	return nil
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

// clip shortens s to at most n bytes, marking the cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
