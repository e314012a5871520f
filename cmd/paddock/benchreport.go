package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"
)

// peerLine is the part of a peers' or `paddock bench` JSON line the report
// reads (../shared/peers/internal/bench.Result and BenchResult).
type peerLine struct {
	Peer      string   `json:"peer"`
	Mode      string   `json:"mode"`
	Tuning    string   `json:"tuning"`
	Worker    string   `json:"worker"`
	Module    string   `json:"module"`
	Store     string   `json:"store"`
	Signal    string   `json:"signal_path"`
	JobsPerS  float64  `json:"jobs_per_s"`
	TPS       float64  `json:"tps"`
	Latency   benchPct `json:"latency_ms"`
	N         int      `json:"n"`
	Completed int      `json:"completed"`
	RTs       *float64 `json:"db_round_trips_per_turn"`
	Xacts     *float64 `json:"db_transactions_per_turn"`
	RSS       *float64 `json:"peak_rss_mb"`
	HostCPU   *float64 `json:"host_cpu_ms_per_turn"`
	DBCPU     *float64 `json:"db_cpu_ms_per_turn"`
	DBBusiest *float64 `json:"db_busiest_process_cores"`
	// Round is the round of make bench-peers the line belongs to (1, 2,
	// …; 0 when the file has no rounds): a round runs River's tuned single
	// insert and Paddock one after the other, so that their ratio compares
	// runs minutes apart at most on a machine whose speed drifts.
	Round int `json:"round"`
}

// isRiverTuned reports whether l is River's tuned single-insert run, the
// goal's reference.
func (l peerLine) isRiverTuned() bool {
	return l.Peer == "river" && l.Mode == "single" && strings.Contains(l.Tuning, "fetch_cooldown=10ms")
}

func (l peerLine) name() string {
	switch l.Peer {
	case "paddock":
		worker := l.Worker
		if m := strings.TrimSuffix(l.Module, ".wasm"); m != "" && m != "hasher" {
			// Another bench agent than the Go one: hasher-rust → wasm(rust).
			worker += "(" + strings.TrimPrefix(m, "hasher-") + ")"
		}
		name := fmt.Sprintf("paddock %s %s/%s", l.Store, worker, l.Signal)
		if l.Mode != "" && l.Mode != "single" {
			name += " " + l.Mode
		}
		return name
	case "pgbench":
		return "pgbench -N (ceiling)"
	}
	return strings.TrimSpace(fmt.Sprintf("%s %s %s", l.Peer, l.Mode, l.Tuning))
}

func newBenchReportCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "report RESULTS.jsonl",
		Short: "Print Paddock's bench figures beside the peers' (River, DBOS, pgbench) from one JSON-lines file, with the ratios",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := os.Open(args[0])
			if err != nil {
				return err
			}
			defer f.Close()
			return benchReport(f, cmd.OutOrStdout())
		},
	}
}

// benchReport reads JSON lines and writes the comparison table and the
// issue's goals: turns/s ≥ 1.0 × (beyond it 1.5 ×) River's best single-insert run
// (fetch_cooldown=10ms) and ≥ 0.8 × pgbench's TPS. With rounds (the lines'
// round field, make bench-peers' ROUNDS), each Paddock run is also put
// beside the River run of its own round, and each Paddock configuration
// gets the median of those ratios over the rounds (roundRatios).
func benchReport(r io.Reader, w io.Writer) error {
	var lines []peerLine
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		t := strings.TrimSpace(sc.Text())
		if !strings.HasPrefix(t, "{") {
			continue
		}
		var l peerLine
		if err := json.Unmarshal([]byte(t), &l); err != nil {
			return fmt.Errorf("results: %w in %.80s", err, t)
		}
		if l.Peer == "paddock" && l.N == 0 {
			continue // a memory-phase run: no turns/s to compare
		}
		lines = append(lines, l)
	}
	if err := sc.Err(); err != nil {
		return err
	}
	var riverBest, pgTPS float64
	riverOf := map[int]float64{} // River's tuned run by round
	rounds := 0
	for _, l := range lines {
		rounds = max(rounds, l.Round)
		if l.isRiverTuned() {
			riverBest = max(riverBest, l.JobsPerS)
			riverOf[l.Round] = l.JobsPerS
		}
		if l.Peer == "pgbench" {
			pgTPS = l.TPS
		}
	}
	// label names a line, with its round when the file has several.
	label := func(l peerLine) string {
		if rounds > 1 {
			return fmt.Sprintf("%s #%d", l.name(), l.Round)
		}
		return l.name()
	}
	fmt.Fprintf(w, "%-40s %10s %10s %10s %10s %8s %8s %8s %13s %11s %11s\n", "run", "turns/s", "p50 ms", "p99 ms", "max ms", "rt/turn", "tx/turn", "RSS MB",
		"host cpu ms/t", "db cpu ms/t", "db busiest")
	optf := func(format string, p *float64) string {
		if p == nil || *p < 0 {
			return "-"
		}
		return fmt.Sprintf(format, *p)
	}
	opt := func(p *float64) string { return optf("%.1f", p) }
	two := func(p *float64) string { return optf("%.2f", p) }
	for _, l := range lines {
		rate := l.JobsPerS
		if l.Peer == "pgbench" {
			rate = l.TPS
		}
		fmt.Fprintf(w, "%-40s %10.0f %10.1f %10.1f %10.1f %8s %8s %8s %13s %11s %11s\n", label(l), rate, l.Latency.P50, l.Latency.P99, l.Latency.Max,
			opt(l.RTs), opt(l.Xacts), opt(l.RSS), two(l.HostCPU), two(l.DBCPU), two(l.DBBusiest))
	}
	fmt.Fprintln(w)
	if riverBest == 0 && pgTPS == 0 {
		fmt.Fprintln(w, "no River (single, fetch_cooldown=10ms) or pgbench results: no ratios (make bench-peers runs them)")
		return nil
	}
	for _, l := range lines {
		if l.Peer != "paddock" {
			continue
		}
		var parts []string
		if riverBest > 0 {
			parts = append(parts, fmt.Sprintf("%.2f× River single fetch_cooldown=10ms (goal ≥ 1.0, beyond it 1.5)", l.JobsPerS/riverBest))
		}
		if river := riverOf[l.Round]; rounds > 1 && river > 0 {
			parts = append(parts, fmt.Sprintf("%.2f× River of its round", l.JobsPerS/river))
		}
		if pgTPS > 0 {
			parts = append(parts, fmt.Sprintf("%.2f× pgbench TPS (goal ≥ 0.8)", l.JobsPerS/pgTPS))
		}
		if l.Completed < l.N {
			parts = append(parts, fmt.Sprintf("INCOMPLETE: %d of %d turns", l.Completed, l.N))
		}
		fmt.Fprintf(w, "%-40s %s\n", label(l)+":", strings.Join(parts, "; "))
	}
	if rounds > 1 {
		fmt.Fprintln(w)
		for _, rr := range roundRatios(lines, riverOf) {
			fmt.Fprintf(w, "%-40s %s\n", rr.name+":", rr.summary())
		}
	}
	return nil
}

// roundRatio is one Paddock configuration's ratios to the River run of
// the same round, in round order.
type roundRatio struct {
	name   string
	ratios []float64
	// noRiver counts the configuration's runs in rounds without a River
	// tuned run, left out of ratios.
	noRiver int
}

// summary is the report's line for r: the median over three rounds or
// more (with fewer, the ratios alone), how many reach the goal, and the
// runs left out.
func (r roundRatio) summary() string {
	n := len(r.ratios)
	var b strings.Builder
	switch {
	case n >= 3:
		fmt.Fprintf(&b, "median %.2f× River of its round over %d rounds (%s); ", median(r.ratios), n, r.list())
	case n > 0:
		fmt.Fprintf(&b, "%s× River of its round (%d round%s: too few for a median); ", r.list(), n, plural(n))
	}
	fmt.Fprintf(&b, "%d of %d ≥ 1.0", r.atLeast(1), n)
	if r.noRiver > 0 {
		fmt.Fprintf(&b, "; %d run%s in a round without a River tuned run left out", r.noRiver, plural(r.noRiver))
	}
	return b.String()
}

// plural is "s" unless n is 1.
func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// roundRatios gives each Paddock configuration (by name, in the order of
// first appearance) its ratios to River's tuned run of the same round (the
// round's last, if it has several), over the rounds that have both.
func roundRatios(lines []peerLine, riverOf map[int]float64) []roundRatio {
	var out []roundRatio
	at := map[string]int{}
	for _, l := range lines {
		if l.Peer != "paddock" {
			continue
		}
		i, ok := at[l.name()]
		if !ok {
			i = len(out)
			at[l.name()] = i
			out = append(out, roundRatio{name: l.name()})
		}
		if river := riverOf[l.Round]; river > 0 {
			out[i].ratios = append(out[i].ratios, l.JobsPerS/river)
		} else {
			out[i].noRiver++
		}
	}
	return out
}

// list writes the ratios as "0.91, 1.02, 0.88".
func (r roundRatio) list() string {
	parts := make([]string, len(r.ratios))
	for i, x := range r.ratios {
		parts[i] = fmt.Sprintf("%.2f", x)
	}
	return strings.Join(parts, ", ")
}

// atLeast counts the ratios of at least floor.
func (r roundRatio) atLeast(floor float64) int {
	n := 0
	for _, x := range r.ratios {
		if x >= floor {
			n++
		}
	}
	return n
}

// median is the middle of xs (the mean of the two middle ones for an even
// count); 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
