package main

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/paddock-dev/paddock/fabric"
	"github.com/paddock-dev/paddock/host/service"
)

// fabricCollector exports the broker's counters on the host's /metrics:
// dropped messages by reason (unauthenticated, forged, replayed, …), lost
// worker sessions by reason, live workers and late results.
type fabricCollector struct {
	b                              *fabric.Broker
	dropped, lost, workers, late   *prometheus.Desc
	turns, busy, acceptTO, stalled *prometheus.Desc
}

func newFabricCollector(b *fabric.Broker) *fabricCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("paddock_fabric_"+name, help, labels, nil)
	}
	return &fabricCollector{
		b:        b,
		dropped:  d("dropped_messages_total", "Messages from the fabric socket dropped, by reason.", "reason"),
		lost:     d("workers_lost_total", "Worker sessions ended, by reason.", "reason"),
		workers:  d("workers", "Admitted worker sessions now."),
		late:     d("late_results_total", "Results that arrived for no waiting turn (handed to the fences)."),
		turns:    d("turns_total", "Turns dispatched to remote workers."),
		busy:     d("busy_total", "BUSY answers from workers."),
		acceptTO: d("accept_timeouts_total", "Turns that got no accepted receipt in time."),
		stalled:  d("send_stalls_total", "Socket sends that took longer than the send timeout."),
	}
}

func (c *fabricCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.dropped, c.lost, c.workers, c.late, c.turns, c.busy, c.acceptTO, c.stalled} {
		ch <- d
	}
}

func (c *fabricCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.b.Stats()
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	for reason, v := range map[string]uint64{
		"oversized": st.Dropped.Oversized, "malformed": st.Dropped.Malformed, "unknown_version": st.Dropped.UnknownVersion,
		"unauthenticated": st.Dropped.Unauthenticated, "forged": st.Dropped.Forged, "replayed": st.Dropped.Replayed,
		"flood": st.Dropped.Flood, "unknown_session": st.Dropped.UnknownSession, "stale_session": st.Dropped.StaleSession,
	} {
		counter(c.dropped, v, reason)
	}
	for reason, v := range map[string]uint64{
		"heartbeat_timeout": st.Lost.HeartbeatTimeout, "ping_timeout": st.Lost.PingTimeout, "not_reading": st.Lost.NotReading,
		"goodbye": st.Lost.Goodbye, "superseded": st.Lost.Superseded, "send_stalled": st.Lost.SendStalled, "rejected": st.Lost.Rejected,
	} {
		counter(c.lost, v, reason)
	}
	ch <- prometheus.MustNewConstMetric(c.workers, prometheus.GaugeValue, float64(st.LiveWorkers))
	counter(c.late, st.LateResults)
	counter(c.turns, st.Turns)
	counter(c.busy, st.Busy)
	counter(c.acceptTO, st.AcceptTimeouts)
	counter(c.stalled, st.SendStalls)
}

// remoteWorkers lists the broker's admitted workers for the console's
// overview (service.WithWorkers).
func remoteWorkers(b *fabric.Broker) []service.RemoteWorker {
	ws := b.Workers()
	out := make([]service.RemoteWorker, 0, len(ws))
	for _, w := range ws {
		out = append(out, service.RemoteWorker{ID: w.ID, Pools: w.Pools, Capacity: w.Capacity, InFlight: w.InFlight,
			Free: w.Free, Running: w.Running, LastHeard: w.LastHeard})
	}
	return out
}
