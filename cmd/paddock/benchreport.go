package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
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
// (fetch_cooldown=10ms) and ≥ 0.8 × pgbench's TPS.
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
	for _, l := range lines {
		if l.Peer == "river" && l.Mode == "single" && strings.Contains(l.Tuning, "fetch_cooldown=10ms") {
			riverBest = max(riverBest, l.JobsPerS)
		}
		if l.Peer == "pgbench" {
			pgTPS = l.TPS
		}
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
		fmt.Fprintf(w, "%-40s %10.0f %10.1f %10.1f %10.1f %8s %8s %8s %13s %11s %11s\n", l.name(), rate, l.Latency.P50, l.Latency.P99, l.Latency.Max,
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
		if pgTPS > 0 {
			parts = append(parts, fmt.Sprintf("%.2f× pgbench TPS (goal ≥ 0.8)", l.JobsPerS/pgTPS))
		}
		if l.Completed < l.N {
			parts = append(parts, fmt.Sprintf("INCOMPLETE: %d of %d turns", l.Completed, l.N))
		}
		fmt.Fprintf(w, "%-40s %s\n", l.name()+":", strings.Join(parts, "; "))
	}
	return nil
}
