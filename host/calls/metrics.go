package calls

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the host-call counters, registered on the registerer given
// to NewMetrics (the host's registry; no global state).
type Metrics struct {
	// Denied counts denied calls by agent and reason
	// (paddock_host_call_denied_total).
	Denied *prometheus.CounterVec
	// Calls counts calls by agent, kind (http, model) and result ("ok" or
	// the abi.CallErrorCode) (paddock_host_calls_total).
	Calls *prometheus.CounterVec
	// Tokens counts model tokens by agent and direction (input, output)
	// (paddock_model_tokens_total).
	Tokens *prometheus.CounterVec
}

// NewMetrics creates the collectors and registers them on reg (nil:
// unregistered, for tests). Registering twice on one registry panics, as
// prometheus.MustRegister does.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Denied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "paddock_host_call_denied_total", Help: "Host calls denied by the agent's capabilities or limits, by agent and reason.",
		}, []string{"agent", "reason"}),
		Calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "paddock_host_calls_total", Help: "Host calls performed or refused, by agent, kind and result (ok or the error code).",
		}, []string{"agent", "kind", "result"}),
		Tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "paddock_model_tokens_total", Help: "Model tokens of host calls, by agent and direction (input, output).",
		}, []string{"agent", "direction"}),
	}
	if reg != nil {
		reg.MustRegister(m.Denied, m.Calls, m.Tokens)
	}
	return m
}
